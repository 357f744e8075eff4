// Shared plumbing for the lb_native addon: fd ownership, per-env class
// constructors, argument helpers. Generic: knows nothing of lbctl's maps.
#pragma once

#include <napi.h>

#include <cstdint>
#include <string>
#include <unistd.h>

namespace lbn {

// Owns one file descriptor; closes it exactly once.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Per-environment data: the constructors of the wrapped classes.
struct AddonData {
  Napi::FunctionReference objectCtor;
  Napi::FunctionReference mapCtor;
};

inline AddonData& addonData(Napi::Env env) {
  return *env.GetInstanceData<AddonData>();
}

// Argument helpers; all throw EINVAL-coded errors (op "argument").
std::string argString(const Napi::CallbackInfo& info, size_t i, const char* what);
uint32_t argU32(const Napi::CallbackInfo& info, size_t i, const char* what);
int32_t argI32(const Napi::CallbackInfo& info, size_t i, const char* what);
// Optional numeric argument: `def` when absent/undefined.
uint64_t argOptU64(const Napi::CallbackInfo& info, size_t i, const char* what, uint64_t def);
Napi::Uint8Array argBytes(const Napi::CallbackInfo& info, size_t i, const char* what);

// mkdir -p; returns 0 or a positive errno.
int mkdirAll(const std::string& path, mode_t mode = 0755);
// "bpf-map", "bpf-link", "bpf-prog", ... for an anon-inode bpf fd; "" otherwise.
std::string bpfFdKind(int fd);

// Module-level registration hooks (one per .cc).
void InitObject(Napi::Env env, Napi::Object exports);
void InitMap(Napi::Env env, Napi::Object exports);
void InitLink(Napi::Env env, Napi::Object exports);
void InitSockDiag(Napi::Env env, Napi::Object exports);
void InitRtnl(Napi::Env env, Napi::Object exports);
void InitTc(Napi::Env env, Napi::Object exports);

}  // namespace lbn
