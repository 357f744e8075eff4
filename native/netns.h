// Work inside another network namespace without moving any of Node's
// threads: a short-lived thread joins the namespace (setns CLONE_NEWNET is
// per thread), runs one step and exits, so its namespace dies with it.
// Namespace-scoped objects made there (a socket iterator, a netlink socket)
// keep their namespace and are used by the thread that asked afterwards.
//
// The calls that may block (an iterator run, an inet_diag dump or destroy)
// run off the JavaScript thread as PromiseWorkers: Execute() on a libuv
// pool thread, which starts the short-lived namespace thread and waits for
// it. The pool thread itself never changes namespace either (other pool
// work, fs or getaddrinfo, must keep running in the agent's namespace).
#pragma once

#include <napi.h>

#include <functional>
#include <string>

#include "common.h"
#include "errors.h"

namespace lbn {

struct NetnsResult {
  int setnsErr = 0;  // positive errno when joining the namespace failed (fn did not run)
  int value = 0;     // fn's return value
};

// nsFd < 0: fn runs on the calling thread, in the caller's namespace.
// fn must not throw.
NetnsResult runInNetns(int nsFd, const std::function<int()>& fn);

// A duplicate of fd (close-on-exec) that a worker owns while it runs, so
// the caller closing its fd meanwhile cannot hand the number to something
// else. -1 stays -1; a failed dup throws.
UniqueFd dupFdOrThrow(Napi::Env env, int fd, const char* what);

// An AsyncWorker that settles a Promise. Run() works on the libuv pool and
// reports failure through Fail(); Result() builds the value on the JS thread.
class PromiseWorker : public Napi::AsyncWorker {
 public:
  PromiseWorker(Napi::Env env, const char* resourceName)
      : Napi::AsyncWorker(env, resourceName), deferred_(Napi::Promise::Deferred::New(env)) {}

  // Queues the worker and returns its Promise (the worker deletes itself when settled).
  Napi::Promise Start() {
    Napi::Promise p = deferred_.Promise();
    Queue();
    return p;
  }

 protected:
  virtual void Run() = 0;
  virtual Napi::Value Result(Napi::Env env) = 0;
  void Fail(std::string op, int err, ErrCtx ctx) {
    op_ = std::move(op);
    err_ = err;
    ctx_ = std::move(ctx);
    SetError(op_);
  }

 private:
  void Execute() override { Run(); }
  void OnOK() override {
    try {
      deferred_.Resolve(Result(Env()));
    } catch (const Napi::Error& e) {
      deferred_.Reject(e.Value());
    }
  }
  // A C++ exception out of Execute (no thread, no memory) reaches here with
  // its what() and no op_: reject with that message rather than an empty one.
  void OnError(const Napi::Error& e) override {
    if (op_.empty()) deferred_.Reject(e.Value());
    else deferred_.Reject(makeBpfError(Env(), op_, err_, ctx_).Value());
  }

  Napi::Promise::Deferred deferred_;
  std::string op_;
  int err_ = 0;
  ErrCtx ctx_;
};

void InitNetns(Napi::Env env, Napi::Object exports);

}  // namespace lbn
