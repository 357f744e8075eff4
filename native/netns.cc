#include "netns.h"

#include <bpf/bpf.h>
#include <fcntl.h>
#include <sched.h>

#include <cerrno>
#include <thread>
#include <vector>

namespace lbn {

NetnsResult runInNetns(int nsFd, const std::function<int()>& fn) {
  NetnsResult r;
  if (nsFd < 0) {
    r.value = fn();
    return r;
  }
  std::thread t([&] {
    if (::setns(nsFd, CLONE_NEWNET) != 0) {
      r.setnsErr = errno != 0 ? errno : EINVAL;
      return;
    }
    r.value = fn();
  });
  t.join();
  return r;
}

UniqueFd dupFdOrThrow(Napi::Env env, int fd, const char* what) {
  if (fd < 0) return UniqueFd();
  int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (d < 0) {
    ErrCtx c;
    c.detail = std::string(what) + " " + std::to_string(fd);
    throwBpfError(env, "dup", errFromErrno(), c);
  }
  return UniqueFd(d);
}

namespace {

// iterRun(progFd, netnsFd?) -> Promise<Buffer>: one run of a loaded iterator
// program (attached through a bpf_link that lives for the run), its iterator
// created inside netnsFd's network namespace when given (socket iterators
// walk the namespace they were created in), read to EOF on the pool.
// Resolves with what the program wrote (bpf_seq_write/printf).
class IterRunWorker : public PromiseWorker {
 public:
  IterRunWorker(Napi::Env env, UniqueFd prog, UniqueFd ns, int callerNsFd)
      : PromiseWorker(env, "lbctl.iter_run"), prog_(std::move(prog)), ns_(std::move(ns)) {
    if (callerNsFd >= 0) ctx_.detail = "netns fd " + std::to_string(callerNsFd);
  }

 protected:
  void Run() override {
    LogCapture cap;
    int link = bpf_link_create(prog_.get(), 0, BPF_TRACE_ITER, nullptr);
    if (link < 0) {
      ctx_.log = cap.tail();
      Fail("bpf_link_create(BPF_TRACE_ITER)", errFromRet(link), ctx_);
      return;
    }
    UniqueFd linkFd(link);
    NetnsResult made = runInNetns(ns_.get(), [l = linkFd.get()] {
      int fd = bpf_iter_create(l);
      return fd >= 0 ? fd : -errFromRet(fd);
    });
    if (made.setnsErr != 0) return Fail("setns", made.setnsErr, ctx_);
    if (made.value < 0) return Fail("bpf_iter_create", -made.value, ctx_);
    UniqueFd iter(made.value);
    uint8_t buf[4096];
    for (;;) {
      ssize_t n = ::read(iter.get(), buf, sizeof buf);
      if (n > 0) {
        out_.insert(out_.end(), buf, buf + n);
        continue;
      }
      if (n == 0) break;
      if (errno == EINTR) continue;
      return Fail("read", errFromErrno(), ctx_);
    }
  }

  Napi::Value Result(Napi::Env env) override { return Napi::Buffer<uint8_t>::Copy(env, out_.data(), out_.size()); }

 private:
  UniqueFd prog_;
  UniqueFd ns_;
  ErrCtx ctx_;
  std::vector<uint8_t> out_;
};

Napi::Value IterRun(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const int progFd = argI32(info, 0, "progFd");
  const int nsFd = info.Length() > 1 && !info[1].IsUndefined() ? argI32(info, 1, "netnsFd") : -1;
  if (progFd < 0) throwArgError(env, "progFd must be a file descriptor");
  UniqueFd prog = dupFdOrThrow(env, progFd, "progFd");
  UniqueFd ns = dupFdOrThrow(env, nsFd, "netnsFd");
  return (new IterRunWorker(env, std::move(prog), std::move(ns), nsFd))->Start();
}

}  // namespace

void InitNetns(Napi::Env env, Napi::Object exports) {
  exports.Set("iterRun", Napi::Function::New(env, IterRun, "iterRun"));
}

}  // namespace lbn
