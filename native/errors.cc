#include "errors.h"

#include <bpf/libbpf.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace lbn {

namespace {

// Kernel-internal codes (include/linux/errno.h) that leak out of bpf(2).
const char* kernelErrnoName(int err) {
  switch (err) {
    case 512: return "ERESTARTSYS";
    case 513: return "ERESTARTNOINTR";
    case 514: return "ERESTARTNOHAND";
    case 515: return "ENOIOCTLCMD";
    case 516: return "ERESTART_RESTARTBLOCK";
    case 517: return "EPROBE_DEFER";
    case 518: return "EOPENSTALE";
    case 519: return "ENOPARAM";
    case 521: return "EBADHANDLE";
    case 522: return "ENOTSYNC";
    case 523: return "EBADCOOKIE";
    case 524: return "ENOTSUPP";
    case 525: return "ETOOSMALL";
    case 526: return "ESERVERFAULT";
    case 527: return "EBADTYPE";
    case 528: return "EJUKEBOX";
    case 529: return "EIOCBQUEUED";
    case 530: return "ERECALLCONFLICT";
    default: return nullptr;
  }
}

const char* kernelErrnoText(int err) {
  switch (err) {
    case 524: return "Operation is not supported";
    case 525: return "Buffer or request is too small";
    case 515: return "No ioctl command";
    default: return nullptr;
  }
}

// Last `maxLines` lines (and at most maxBytes bytes) of s, trailing newline trimmed.
std::string tailOf(const std::string& s, size_t maxLines, size_t maxBytes) {
  size_t end = s.size();
  while (end > 0 && (s[end - 1] == '\n' || s[end - 1] == '\r')) end--;
  size_t start = end;
  size_t lines = 0;
  while (start > 0 && end - start < maxBytes) {
    if (s[start - 1] == '\n' && ++lines >= maxLines) break;
    start--;
  }
  std::string out = s.substr(start, end - start);
  if (start > 0) out = "...\n" + out;
  return out;
}

thread_local std::string* tlCapture = nullptr;
constexpr size_t kCaptureCap = 4 * 1024 * 1024;

int libbpfPrint(enum libbpf_print_level level, const char* fmt, va_list ap) {
  std::string* buf = tlCapture;
  if (buf == nullptr) {
    // Nobody is listening on this thread: stay quiet unless asked.
    static const bool verbose = std::getenv("LBCTL_LIBBPF_VERBOSE") != nullptr;
    if (verbose && level != LIBBPF_DEBUG) return std::vfprintf(stderr, fmt, ap);
    return 0;
  }
  if (level == LIBBPF_DEBUG) return 0;
  va_list ap2;
  va_copy(ap2, ap);
  char small[512];
  int n = std::vsnprintf(small, sizeof small, fmt, ap);
  if (n < 0) {
    va_end(ap2);
    return n;
  }
  if (static_cast<size_t>(n) < sizeof small) {
    buf->append(small, static_cast<size_t>(n));
  } else {
    std::string big(static_cast<size_t>(n) + 1, '\0');
    std::vsnprintf(big.data(), big.size(), fmt, ap2);
    big.resize(static_cast<size_t>(n));
    buf->append(big);
  }
  va_end(ap2);
  if (buf->size() > kCaptureCap) buf->erase(0, buf->size() - kCaptureCap / 2);
  return n;
}

}  // namespace

std::string errnoName(int err) {
  if (const char* k = kernelErrnoName(err)) return k;
  if (err > 0 && err < 512) {
    if (const char* n = strerrorname_np(err)) return n;
  }
  return "E" + std::to_string(err);
}

std::string errnoText(int err) {
  if (const char* k = kernelErrnoText(err)) return k;
  char buf[256];
  if (libbpf_strerror(err, buf, sizeof buf) == 0) return buf;
  return "Unknown error " + std::to_string(err);
}

Napi::Error makeBpfError(Napi::Env env, const std::string& op, int err, const ErrCtx& ctx) {
  if (err < 0) err = -err;
  if (err == 0) err = EINVAL;
  const std::string code = errnoName(err);
  const std::string& subject = !ctx.map.empty() ? ctx.map : !ctx.prog.empty() ? ctx.prog : ctx.path;
  std::string msg = op;
  if (!subject.empty()) msg += "(" + subject + ")";
  msg += ": " + (ctx.reason.empty() ? errnoText(err) : ctx.reason) + " (" + code + ")";
  if (!ctx.detail.empty()) msg += ": " + ctx.detail;
  if (!ctx.log.empty()) msg += "\n" + tailOf(ctx.log, 30, 8 * 1024);

  Napi::Error e = Napi::Error::New(env, msg);
  Napi::Object o = e.Value();
  o.Set("code", code);
  o.Set("errno", Napi::Number::New(env, err));
  o.Set("op", op);
  if (!ctx.map.empty()) o.Set("map", ctx.map);
  if (!ctx.prog.empty()) o.Set("prog", ctx.prog);
  if (!ctx.path.empty()) o.Set("path", ctx.path);
  if (!ctx.log.empty()) o.Set("log", ctx.log);
  return e;
}

void throwBpfError(Napi::Env env, const std::string& op, int err, const ErrCtx& ctx) {
  throw makeBpfError(env, op, err, ctx);
}

void throwSizeError(Napi::Env env, const std::string& map, const char* what, size_t expected,
                    size_t given) {
  ErrCtx c;
  c.map = map;
  c.reason = std::string(what) + " is " + std::to_string(given) + " bytes, expected " +
             std::to_string(expected);
  throwBpfError(env, "size-check", EINVAL, c);
}

void throwArgError(Napi::Env env, const std::string& message) {
  ErrCtx c;
  c.reason = message;
  throwBpfError(env, "argument", EINVAL, c);
}

int errFromRet(int ret) {
  if (ret < -1) return -ret;
  if (ret == -1 && errno > 0) return errno;
  if (ret < 0) return -ret;
  return errno > 0 ? errno : EINVAL;
}

int errFromErrno() { return errno > 0 ? errno : EINVAL; }

void installLibbpfPrint() {
  static std::once_flag once;
  std::call_once(once, [] { libbpf_set_print(libbpfPrint); });
}

LogCapture::LogCapture() : prev_(tlCapture) { tlCapture = &buf_; }
LogCapture::~LogCapture() { tlCapture = prev_; }

std::string LogCapture::tail(size_t maxLines, size_t maxBytes) const {
  return tailOf(buf_, maxLines, maxBytes);
}

}  // namespace lbn
