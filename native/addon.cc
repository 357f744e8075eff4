// lb_native: a small, generic binding over libbpf. Module entry point,
// shared argument helpers and the process-level functions.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <napi.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "errors.h"
#include "netns.h"

namespace lbn {

void InitIcmp(Napi::Env env, Napi::Object exports);  // native/icmp.cc

std::string argString(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsString()) throwArgError(info.Env(), std::string(what) + " must be a string");
  return info[i].As<Napi::String>().Utf8Value();
}

static double argNumber(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsNumber()) throwArgError(info.Env(), std::string(what) + " must be a number");
  double d = info[i].As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d) || std::trunc(d) != d) throwArgError(info.Env(), std::string(what) + " must be an integer");
  return d;
}

uint32_t argU32(const Napi::CallbackInfo& info, size_t i, const char* what) {
  double d = argNumber(info, i, what);
  if (d < 0 || d > UINT32_MAX) throwArgError(info.Env(), std::string(what) + " must fit in a u32");
  return static_cast<uint32_t>(d);
}

int32_t argI32(const Napi::CallbackInfo& info, size_t i, const char* what) {
  double d = argNumber(info, i, what);
  if (d < INT32_MIN || d > INT32_MAX) throwArgError(info.Env(), std::string(what) + " must fit in an i32");
  return static_cast<int32_t>(d);
}

uint64_t argOptU64(const Napi::CallbackInfo& info, size_t i, const char* what, uint64_t def) {
  if (info.Length() <= i || info[i].IsUndefined()) return def;
  double d = argNumber(info, i, what);
  if (d < 0 || d > 9007199254740991.0) throwArgError(info.Env(), std::string(what) + " must be a non-negative safe integer");
  return static_cast<uint64_t>(d);
}

Napi::Uint8Array argBytes(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsTypedArray() ||
      info[i].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    throwArgError(info.Env(), std::string(what) + " must be a Buffer/Uint8Array");
  }
  return info[i].As<Napi::Uint8Array>();
}

int mkdirAll(const std::string& path, mode_t mode) {
  if (path.empty()) return 0;
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty() || cur == "/") continue;
    if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) return errno;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno;
  return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

std::string bpfFdKind(int fd) {
  char link[64];
  char target[128];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = ::readlink(link, target, sizeof target - 1);
  if (n <= 0) return "";
  target[n] = '\0';
  const std::string t(target);
  const std::string prefix = "anon_inode:";
  if (t.compare(0, prefix.size(), prefix) != 0) return "";
  return t.substr(prefix.size());
}

static Napi::Value LibbpfVersion(const Napi::CallbackInfo& info) {
  return Napi::String::New(info.Env(), std::to_string(libbpf_major_version()) + "." +
                                           std::to_string(libbpf_minor_version()));
}

static Napi::Value NumPossibleCpus(const Napi::CallbackInfo& info) {
  int n = libbpf_num_possible_cpus();
  if (n < 0) throwBpfError(info.Env(), "libbpf_num_possible_cpus", -n);
  return Napi::Number::New(info.Env(), n);
}

// BPF_ENABLE_STATS (5.8+): every program's run_time_ns and run_cnt counted
// while the returned fd is open, without the kernel.bpf_stats_enabled
// sysctl; closing it (or the process ending) stops it.
static Napi::Value EnableRunTimeStats(const Napi::CallbackInfo& info) {
  int fd = bpf_enable_stats(BPF_STATS_RUN_TIME);
  if (fd < 0) throwBpfError(info.Env(), "bpf_enable_stats", errno);
  return Napi::Number::New(info.Env(), fd);
}

}  // namespace lbn

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  lbn::installLibbpfPrint();
  env.SetInstanceData<lbn::AddonData>(new lbn::AddonData());
  exports.Set("libbpfVersion", Napi::Function::New(env, lbn::LibbpfVersion, "libbpfVersion"));
  exports.Set("numPossibleCpus", Napi::Function::New(env, lbn::NumPossibleCpus, "numPossibleCpus"));
  exports.Set("enableRunTimeStats", Napi::Function::New(env, lbn::EnableRunTimeStats, "enableRunTimeStats"));
  lbn::InitMap(env, exports);
  lbn::InitObject(env, exports);
  lbn::InitLink(env, exports);
  lbn::InitSockDiag(env, exports);
  lbn::InitNetns(env, exports);
  lbn::InitRtnl(env, exports);
  lbn::InitTc(env, exports);
  lbn::InitIcmp(env, exports);
  return exports;
}

NODE_API_MODULE(lb_native, Init)
