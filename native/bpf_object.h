// RawBpfObject: a bpf_object opened from an ELF file.
#pragma once

#include <bpf/libbpf.h>
#include <napi.h>

#include <memory>
#include <string>

namespace lbn {

// The libbpf object, shared by the JS wrapper, its maps and an in-flight load.
// bpf_object__close runs exactly once: on explicit close() or when the last
// holder goes away.
struct ObjState {
  struct bpf_object* obj = nullptr;
  std::string path;
  std::string pinRoot;
  bool loaded = false;
  bool loading = false;         // a LoadWorker is running on the thread pool
  bool closeRequested = false;  // close() arrived during load: close when it ends
  ObjState() = default;
  ObjState(const ObjState&) = delete;
  ObjState& operator=(const ObjState&) = delete;
  ~ObjState() { close(); }
  void close() {
    if (obj != nullptr) {
      bpf_object__close(obj);
      obj = nullptr;
    }
  }
};

class BpfObject : public Napi::ObjectWrap<BpfObject> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit BpfObject(const Napi::CallbackInfo& info);

 private:
  // Throws EBADF after close, EBUSY during load, EINVAL before load if needLoaded.
  struct bpf_object* require(const char* op, bool needLoaded);
  struct bpf_program* findProg(const char* op, const std::string& name, bool needLoaded);

  Napi::Value GetPath(const Napi::CallbackInfo& info);
  Napi::Value Load(const Napi::CallbackInfo& info);
  Napi::Value MapNames(const Napi::CallbackInfo& info);
  Napi::Value ProgramNames(const Napi::CallbackInfo& info);
  Napi::Value Map(const Napi::CallbackInfo& info);
  Napi::Value MapLayout(const Napi::CallbackInfo& info);
  Napi::Value ProgFd(const Napi::CallbackInfo& info);
  Napi::Value ProgInfo(const Napi::CallbackInfo& info);
  Napi::Value AttachCgroup(const Napi::CallbackInfo& info);
  Napi::Value RunIter(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);

  std::shared_ptr<ObjState> st_;
};

}  // namespace lbn
