// Error construction for lb_native: every failure becomes a JS Error carrying
// code (errno name), errno (positive), op, and optional map/prog/path/log.
#pragma once

#include <napi.h>

#include <string>

namespace lbn {

struct ErrCtx {
  std::string map;
  std::string prog;
  std::string path;
  std::string log;     // libbpf log tail (verifier output), also appended to the message
  std::string reason;  // replaces strerror() text in the message when set
  std::string detail;  // appended to the message after the errno part
};

// "ENOENT", "ENOTSUPP" (524), ... or "E<n>" when the number has no name.
std::string errnoName(int err);
// Human text: strerror()/libbpf_strerror(), with kernel-internal codes covered.
std::string errnoText(int err);

Napi::Error makeBpfError(Napi::Env env, const std::string& op, int err, const ErrCtx& ctx = {});
[[noreturn]] void throwBpfError(Napi::Env env, const std::string& op, int err, const ErrCtx& ctx = {});
// Size-check failure: code EINVAL, op "size-check", names the map and both sizes.
[[noreturn]] void throwSizeError(Napi::Env env, const std::string& map, const char* what,
                                 size_t expected, size_t given);
// Bad argument: code EINVAL, op "argument".
[[noreturn]] void throwArgError(Napi::Env env, const std::string& message);

// Normalise a libbpf return: negative error codes (libbpf 1.x strict mode)
// or -1 with errno. Returns a positive errno (EINVAL if nothing better known).
int errFromRet(int ret);
int errFromErrno();

// libbpf log capture. The print callback is process-global (installed once);
// a LogCapture on the current thread collects WARN/INFO lines while alive.
void installLibbpfPrint();
class LogCapture {
 public:
  LogCapture();
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  // The last `maxLines` lines / `maxBytes` bytes of what was captured.
  std::string tail(size_t maxLines = 60, size_t maxBytes = 64 * 1024) const;
  const std::string& all() const { return buf_; }

 private:
  std::string buf_;
  std::string* prev_;
};

}  // namespace lbn
