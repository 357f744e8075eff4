#include "bpf_object.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "bpf_link.h"
#include "bpf_map.h"
#include "common.h"
#include "errors.h"
#include "netns.h"

namespace lbn {

namespace {

// bpf_object__load on the libuv pool; settles a Promise on the JS thread.
class LoadWorker : public Napi::AsyncWorker {
 public:
  LoadWorker(Napi::Env env, std::shared_ptr<ObjState> st)
      : Napi::AsyncWorker(env, "lbctl.bpf_object__load"),
        deferred_(Napi::Promise::Deferred::New(env)),
        st_(std::move(st)),
        obj_(st_->obj),
        path_(st_->path),
        pinRoot_(st_->pinRoot) {}

  Napi::Promise Promise() { return deferred_.Promise(); }

  void Execute() override {
    LogCapture cap;
    if (!pinRoot_.empty()) {
      if (int e = mkdirAll(pinRoot_)) {
        fail("mkdir", e, pinRoot_, "");
        return;
      }
    }
    int r = bpf_object__load(obj_);
    if (r != 0) fail("bpf_object__load", errFromRet(r), path_, cap.tail());
  }

  void OnOK() override {
    bool closed = finish();
    if (!closed) st_->loaded = true;
    deferred_.Resolve(Env().Undefined());
  }

  void OnError(const Napi::Error&) override {
    finish();
    ErrCtx c;
    c.path = errPath_;
    c.log = log_;
    deferred_.Reject(makeBpfError(Env(), op_, err_, c).Value());
  }

 private:
  void fail(const char* op, int err, const std::string& path, std::string log) {
    op_ = op;
    err_ = err;
    errPath_ = path;
    log_ = std::move(log);
    SetError(op_);
  }
  // Back on the JS thread: honour a close() that arrived during the load.
  bool finish() {
    st_->loading = false;
    if (st_->closeRequested) {
      st_->close();
      return true;
    }
    return false;
  }

  Napi::Promise::Deferred deferred_;
  std::shared_ptr<ObjState> st_;
  struct bpf_object* obj_;
  std::string path_;
  std::string pinRoot_;
  std::string op_;
  int err_ = 0;
  std::string errPath_;
  std::string log_;
};

}  // namespace

Napi::Function BpfObject::Define(Napi::Env env) {
  return DefineClass(env, "RawBpfObject",
                     {
                         InstanceAccessor<&BpfObject::GetPath>("path"),
                         InstanceMethod<&BpfObject::Load>("load"),
                         InstanceMethod<&BpfObject::MapNames>("mapNames"),
                         InstanceMethod<&BpfObject::ProgramNames>("programNames"),
                         InstanceMethod<&BpfObject::Map>("map"),
                         InstanceMethod<&BpfObject::MapLayout>("mapLayout"),
                         InstanceMethod<&BpfObject::ProgFd>("progFd"),
                         InstanceMethod<&BpfObject::ProgInfo>("progInfo"),
                         InstanceMethod<&BpfObject::AttachCgroup>("attachCgroup"),
                         InstanceMethod<&BpfObject::RunIter>("runIter"),
                         InstanceMethod<&BpfObject::Close>("close"),
                     });
}

// new RawBpfObject(path, { pinRoot?, maxEntries?, reuseMaps? }): bpf_object__open_file,
// then bpf_map__set_max_entries for each override and bpf_map__reuse_fd for
// each map to be shared with another object (the fd is duplicated).
BpfObject::BpfObject(const Napi::CallbackInfo& info)
    : Napi::ObjectWrap<BpfObject>(info), st_(std::make_shared<ObjState>()) {
  Napi::Env env = info.Env();
  st_->path = argString(info, 0, "path");
  std::vector<std::pair<std::string, uint32_t>> maxEntries;
  std::vector<std::pair<std::string, int>> reuseMaps;
  std::vector<std::string> programs;
  bool onlyPrograms = false;
  if (info.Length() > 1 && !info[1].IsUndefined() && !info[1].IsNull()) {
    if (!info[1].IsObject()) throwArgError(env, "options must be an object");
    Napi::Object o = info[1].As<Napi::Object>();
    Napi::Value pr = o.Get("pinRoot");
    if (!pr.IsUndefined()) {
      if (!pr.IsString()) throwArgError(env, "options.pinRoot must be a string");
      st_->pinRoot = pr.As<Napi::String>().Utf8Value();
    }
    Napi::Value me = o.Get("maxEntries");
    if (!me.IsUndefined()) {
      if (!me.IsObject()) throwArgError(env, "options.maxEntries must be an object");
      Napi::Object mo = me.As<Napi::Object>();
      Napi::Array names = mo.GetPropertyNames();
      for (uint32_t i = 0; i < names.Length(); i++) {
        std::string name = names.Get(i).ToString().Utf8Value();
        Napi::Value v = mo.Get(name);
        double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
        if (!(d >= 1 && d <= 4294967295.0) || static_cast<double>(static_cast<uint32_t>(d)) != d) {
          throwArgError(env, "options.maxEntries." + name + " must be an integer in [1, 2^32)");
        }
        maxEntries.emplace_back(name, static_cast<uint32_t>(d));
      }
    }
    Napi::Value rm = o.Get("reuseMaps");
    if (!rm.IsUndefined()) {
      if (!rm.IsObject()) throwArgError(env, "options.reuseMaps must be an object");
      Napi::Object ro = rm.As<Napi::Object>();
      Napi::Array names = ro.GetPropertyNames();
      for (uint32_t i = 0; i < names.Length(); i++) {
        std::string name = names.Get(i).ToString().Utf8Value();
        Napi::Value v = ro.Get(name);
        double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
        if (!(d >= 0 && d <= 2147483647.0) || static_cast<double>(static_cast<int>(d)) != d) {
          throwArgError(env, "options.reuseMaps." + name + " must be a file descriptor");
        }
        reuseMaps.emplace_back(name, static_cast<int>(d));
      }
    }
    Napi::Value pg = o.Get("programs");
    if (!pg.IsUndefined()) {
      if (!pg.IsArray()) throwArgError(env, "options.programs must be an array of program names");
      Napi::Array a = pg.As<Napi::Array>();
      for (uint32_t i = 0; i < a.Length(); i++) {
        Napi::Value v = a.Get(i);
        if (!v.IsString()) throwArgError(env, "options.programs must be an array of program names");
        programs.push_back(v.As<Napi::String>().Utf8Value());
      }
      onlyPrograms = true;
    }
  }

  LogCapture cap;
  LIBBPF_OPTS(bpf_object_open_opts, oo);
  if (!st_->pinRoot.empty()) oo.pin_root_path = st_->pinRoot.c_str();
  errno = 0;
  st_->obj = bpf_object__open_file(st_->path.c_str(), &oo);
  if (st_->obj == nullptr) {
    ErrCtx c;
    c.path = st_->path;
    c.log = cap.tail();
    throwBpfError(env, "bpf_object__open_file", errFromErrno(), c);
  }
  if (st_->pinRoot.empty()) {
    // No pin root: nothing is pinned. libbpf would pin a map declared with
    // LIBBPF_PIN_BY_NAME under /sys/fs/bpf itself, where another agent's or
    // another run's maps are, and leave it there after the process ends.
    struct bpf_map* m;
    bpf_object__for_each_map(m, st_->obj) {
      if (bpf_map__pin_path(m) != nullptr) bpf_map__set_pin_path(m, nullptr);
    }
  }
  for (const auto& [name, n] : maxEntries) {
    struct bpf_map* m = bpf_object__find_map_by_name(st_->obj, name.c_str());
    ErrCtx c;
    c.map = name;
    c.path = st_->path;
    if (m == nullptr) {
      c.reason = "no map named '" + name + "' in " + st_->path;
      st_->close();
      throwBpfError(env, "bpf_map__set_max_entries", ENOENT, c);
    }
    int r = bpf_map__set_max_entries(m, n);
    if (r != 0) {
      c.log = cap.tail();
      st_->close();
      throwBpfError(env, "bpf_map__set_max_entries", errFromRet(r), c);
    }
  }
  for (const auto& [name, fd] : reuseMaps) {
    struct bpf_map* m = bpf_object__find_map_by_name(st_->obj, name.c_str());
    ErrCtx c;
    c.map = name;
    c.path = st_->path;
    if (m == nullptr) {
      c.reason = "no map named '" + name + "' in " + st_->path;
      st_->close();
      throwBpfError(env, "bpf_map__reuse_fd", ENOENT, c);
    }
    int r = bpf_map__reuse_fd(m, fd);
    if (r != 0) {
      c.log = cap.tail();
      st_->close();
      throwBpfError(env, "bpf_map__reuse_fd", errFromRet(r), c);
    }
  }
  if (onlyPrograms) {
    // Only the named programs are loaded (bpf_program__set_autoload): one
    // object can hold programs that some kernels refuse, loaded one by one.
    for (const auto& name : programs) {
      if (bpf_object__find_program_by_name(st_->obj, name.c_str()) == nullptr) {
        ErrCtx c;
        c.prog = name;
        c.path = st_->path;
        c.reason = "no program named '" + name + "' in " + st_->path;
        st_->close();
        throwBpfError(env, "bpf_program__set_autoload", ENOENT, c);
      }
    }
    struct bpf_program* prog;
    bpf_object__for_each_program(prog, st_->obj) {
      bool wanted = std::find(programs.begin(), programs.end(), bpf_program__name(prog)) != programs.end();
      bpf_program__set_autoload(prog, wanted);
    }
  }
}

struct bpf_object* BpfObject::require(const char* op, bool needLoaded) {
  ErrCtx c;
  c.path = st_->path;
  if (st_->obj == nullptr) {
    c.reason = "BPF object is closed";
    throwBpfError(Env(), op, EBADF, c);
  }
  if (st_->loading) {
    c.reason = "BPF object is being loaded";
    throwBpfError(Env(), op, EBUSY, c);
  }
  if (needLoaded && !st_->loaded) {
    c.reason = "BPF object is not loaded (await load() first)";
    throwBpfError(Env(), op, EINVAL, c);
  }
  return st_->obj;
}

struct bpf_program* BpfObject::findProg(const char* op, const std::string& name, bool needLoaded) {
  struct bpf_object* obj = require(op, needLoaded);
  struct bpf_program* p = bpf_object__find_program_by_name(obj, name.c_str());
  if (p == nullptr) {
    ErrCtx c;
    c.prog = name;
    c.path = st_->path;
    c.reason = "no program named '" + name + "' in " + st_->path;
    throwBpfError(Env(), "bpf_object__find_program_by_name", ENOENT, c);
  }
  return p;
}

Napi::Value BpfObject::GetPath(const Napi::CallbackInfo& info) {
  return Napi::String::New(info.Env(), st_->path);
}

Napi::Value BpfObject::Load(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  ErrCtx c;
  c.path = st_->path;
  int err = 0;
  if (st_->obj == nullptr) {
    c.reason = "BPF object is closed";
    err = EBADF;
  } else if (st_->loading) {
    c.reason = "BPF object is already being loaded";
    err = EBUSY;
  } else if (st_->loaded) {
    c.reason = "BPF object is already loaded";
    err = EALREADY;
  }
  if (err != 0) {
    auto d = Napi::Promise::Deferred::New(env);
    d.Reject(makeBpfError(env, "bpf_object__load", err, c).Value());
    return d.Promise();
  }
  st_->loading = true;
  auto* w = new LoadWorker(env, st_);
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

Napi::Value BpfObject::MapNames(const Napi::CallbackInfo& info) {
  struct bpf_object* obj = require("bpf_object__next_map", false);
  Napi::Array out = Napi::Array::New(info.Env());
  uint32_t i = 0;
  struct bpf_map* m;
  bpf_object__for_each_map(m, obj) out.Set(i++, bpf_map__name(m));
  return out;
}

Napi::Value BpfObject::ProgramNames(const Napi::CallbackInfo& info) {
  struct bpf_object* obj = require("bpf_object__next_program", false);
  Napi::Array out = Napi::Array::New(info.Env());
  uint32_t i = 0;
  struct bpf_program* p;
  bpf_object__for_each_program(p, obj) out.Set(i++, bpf_program__name(p));
  return out;
}

Napi::Value BpfObject::Map(const Napi::CallbackInfo& info) {
  std::string name = argString(info, 0, "name");
  struct bpf_object* obj = require("bpf_object__find_map_by_name", true);
  struct bpf_map* m = bpf_object__find_map_by_name(obj, name.c_str());
  if (m == nullptr) {
    ErrCtx c;
    c.map = name;
    c.path = st_->path;
    c.reason = "no map named '" + name + "' in " + st_->path;
    throwBpfError(info.Env(), "bpf_object__find_map_by_name", ENOENT, c);
  }
  return BpfMap::FromObject(info.Env(), st_, m);
}

// mapLayout(name): the BTF layouts of a map's key and value as this object
// declares them ({ key, value, type, flags }; key and value null without BTF). Works before load,
// so a loader can compare them with pinned maps before libbpf reuses those.
Napi::Value BpfObject::MapLayout(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string name = argString(info, 0, "name");
  struct bpf_object* obj = require("bpf_object__btf", false);
  struct bpf_map* m = bpf_object__find_map_by_name(obj, name.c_str());
  if (m == nullptr) {
    ErrCtx c;
    c.map = name;
    c.path = st_->path;
    c.reason = "no map named '" + name + "' in " + st_->path;
    throwBpfError(env, "bpf_object__find_map_by_name", ENOENT, c);
  }
  const struct btf* btf = bpf_object__btf(obj);
  Napi::Object o = Napi::Object::New(env);
  o.Set("key", btfTypeLayout(env, btf, bpf_map__btf_key_type_id(m)));
  o.Set("value", btfTypeLayout(env, btf, bpf_map__btf_value_type_id(m)));
  o.Set("type", Napi::Number::New(env, bpf_map__type(m)));
  o.Set("flags", Napi::Number::New(env, bpf_map__map_flags(m)));
  o.Set("maxEntries", Napi::Number::New(env, bpf_map__max_entries(m)));
  return o;
}

static int progFdOrThrow(Napi::Env env, struct bpf_program* p, const std::string& path) {
  int fd = bpf_program__fd(p);
  if (fd < 0) {
    ErrCtx c;
    c.prog = bpf_program__name(p);
    c.path = path;
    c.reason = "program is not loaded (autoload off?)";
    throwBpfError(env, "bpf_program__fd", EBADF, c);
  }
  return fd;
}

Napi::Value BpfObject::ProgFd(const Napi::CallbackInfo& info) {
  std::string name = argString(info, 0, "name");
  struct bpf_program* p = findProg("bpf_program__fd", name, true);
  return Napi::Number::New(info.Env(), progFdOrThrow(info.Env(), p, st_->path));
}

Napi::Value BpfObject::ProgInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string name = argString(info, 0, "name");
  struct bpf_program* p = findProg("bpf_obj_get_info_by_fd", name, true);
  int fd = progFdOrThrow(env, p, st_->path);
  ErrCtx c;
  c.prog = name;
  return progInfoObject(env, fd, c);
}

Napi::Value BpfObject::AttachCgroup(const Napi::CallbackInfo& info) {
  std::string progName = argString(info, 0, "progName");
  std::string cgroupPath = argString(info, 1, "cgroupPath");
  std::string linkPinPath = argString(info, 2, "linkPinPath");
  struct bpf_program* p = findProg("attachCgroup", progName, true);
  progFdOrThrow(info.Env(), p, st_->path);
  return attachCgroupLink(info.Env(), p, cgroupPath, linkPinPath);
}

// runIter(progName, netnsFd?): attach an iterator program (bpf_link), create
// one iterator (inside network namespace netnsFd when given: socket
// iterators walk the namespace they were created in), read it to EOF, and
// release both. Returns what the program wrote (bpf_seq_write/printf).
Napi::Value BpfObject::RunIter(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string progName = argString(info, 0, "progName");
  int nsFd = -1;
  if (info.Length() > 1 && !info[1].IsUndefined()) nsFd = argI32(info, 1, "netnsFd");
  struct bpf_program* p = findProg("runIter", progName, true);
  progFdOrThrow(env, p, st_->path);
  ErrCtx c;
  c.prog = progName;
  if (nsFd >= 0) c.detail = "netns fd " + std::to_string(nsFd);

  LogCapture cap;
  errno = 0;
  struct bpf_link* link = bpf_program__attach_iter(p, nullptr);
  if (link == nullptr) {
    c.log = cap.tail();
    throwBpfError(env, "bpf_program__attach_iter", errFromErrno(), c);
  }
  std::unique_ptr<struct bpf_link, int (*)(struct bpf_link*)> linkGuard(link, bpf_link__destroy);
  const int linkFd = bpf_link__fd(link);
  NetnsResult made = runInNetns(nsFd, [linkFd] {
    int fd = bpf_iter_create(linkFd);
    return fd >= 0 ? fd : -errFromRet(fd);
  });
  if (made.setnsErr != 0) throwBpfError(env, "setns", made.setnsErr, c);
  if (made.value < 0) throwBpfError(env, "bpf_iter_create", -made.value, c);
  UniqueFd iter(made.value);

  std::vector<uint8_t> out;
  uint8_t buf[4096];
  for (;;) {
    ssize_t n = ::read(iter.get(), buf, sizeof buf);
    if (n > 0) {
      out.insert(out.end(), buf, buf + n);
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    throwBpfError(env, "read", errFromErrno(), c);
  }
  return Napi::Buffer<uint8_t>::Copy(env, out.data(), out.size());
}

Napi::Value BpfObject::Close(const Napi::CallbackInfo& info) {
  if (st_->loading) {
    st_->closeRequested = true;  // LoadWorker closes it when the load settles
  } else {
    st_->close();
  }
  return info.Env().Undefined();
}

// progTestRun(progFd, { data?, ctx?, repeat?, dataSizeOut? }): bpf_prog_test_run_opts.
static Napi::Value ProgTestRun(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int32_t progFd = argI32(info, 0, "progFd");
  Napi::Object o = Napi::Object::New(env);
  if (info.Length() > 1 && !info[1].IsUndefined()) {
    if (!info[1].IsObject()) throwArgError(env, "options must be an object");
    o = info[1].As<Napi::Object>();
  }
  auto bytes = [&](const char* key, Napi::Uint8Array* out) {
    Napi::Value v = o.Get(key);
    if (v.IsUndefined()) return false;
    if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
      throwArgError(env, std::string("options.") + key + " must be a Buffer/Uint8Array");
    }
    *out = v.As<Napi::Uint8Array>();
    return true;
  };
  auto u32 = [&](const char* key, uint32_t def) {
    Napi::Value v = o.Get(key);
    if (v.IsUndefined()) return def;
    double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
    if (!(d >= 0 && d <= 4294967295.0) || static_cast<double>(static_cast<uint32_t>(d)) != d) {
      throwArgError(env, std::string("options.") + key + " must be a u32");
    }
    return static_cast<uint32_t>(d);
  };

  Napi::Uint8Array data, ctx;
  bool hasData = bytes("data", &data);
  bool hasCtx = bytes("ctx", &ctx);
  uint32_t repeat = u32("repeat", 0);
  uint32_t dataSizeOut = u32("dataSizeOut", hasData ? static_cast<uint32_t>(data.ByteLength()) + 256 : 0);

  std::vector<uint8_t> dataOut(dataSizeOut);
  std::vector<uint8_t> ctxOut(hasCtx ? ctx.ByteLength() : 0);
  LIBBPF_OPTS(bpf_test_run_opts, t);
  if (hasData) {
    t.data_in = data.Data();
    t.data_size_in = static_cast<__u32>(data.ByteLength());
  }
  if (dataSizeOut > 0) {
    t.data_out = dataOut.data();
    t.data_size_out = dataSizeOut;
  }
  if (hasCtx) {
    t.ctx_in = ctx.Data();
    t.ctx_size_in = static_cast<__u32>(ctx.ByteLength());
    if (!ctxOut.empty()) {
      t.ctx_out = ctxOut.data();
      t.ctx_size_out = static_cast<__u32>(ctxOut.size());
    }
  }
  t.repeat = static_cast<int>(repeat);
  int r = bpf_prog_test_run_opts(progFd, &t);
  if (r != 0) {
    ErrCtx c;
    c.detail = "prog fd " + std::to_string(progFd);
    throwBpfError(env, "bpf_prog_test_run_opts", errFromRet(r), c);
  }
  Napi::Object res = Napi::Object::New(env);
  res.Set("retval", Napi::Number::New(env, t.retval));
  res.Set("duration", Napi::Number::New(env, t.duration));
  size_t dn = std::min<size_t>(t.data_size_out, dataOut.size());
  res.Set("data", Napi::Buffer<uint8_t>::Copy(env, dataOut.data(), dn));
  if (hasCtx) {
    size_t cn = std::min<size_t>(t.ctx_size_out, ctxOut.size());
    res.Set("ctx", Napi::Buffer<uint8_t>::Copy(env, ctxOut.data(), cn));
  }
  return res;
}

static Napi::Value OpenObject(const Napi::CallbackInfo& info) {
  std::vector<napi_value> args;
  for (size_t i = 0; i < info.Length() && i < 2; i++) args.push_back(info[i]);
  return addonData(info.Env()).objectCtor.New(args);
}

// linkCreateProbe(progFd, target, attachType): BPF_LINK_CREATE, and the link
// closed again at once. Whether (and how) the kernel accepts an attachment;
// the error carries the kernel's errno (EINVAL for an attach type it does not
// know, ENODEV for a device that does not exist, ...).
static Napi::Value LinkCreateProbe(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int32_t progFd = argI32(info, 0, "progFd");
  uint32_t target = argU32(info, 1, "target");
  uint32_t attachType = argU32(info, 2, "attachType");
  int fd = bpf_link_create(progFd, static_cast<int>(target), static_cast<enum bpf_attach_type>(attachType), nullptr);
  if (fd < 0) {
    ErrCtx c;
    c.reason = "attach type " + std::to_string(attachType) + ", target " + std::to_string(target);
    throwBpfError(env, "bpf_link_create", errFromRet(fd), c);
  }
  UniqueFd link(fd);
  return env.Undefined();
}

void InitObject(Napi::Env env, Napi::Object exports) {
  Napi::Function ctor = BpfObject::Define(env);
  addonData(env).objectCtor = Napi::Persistent(ctor);
  exports.Set("RawBpfObject", ctor);
  exports.Set("openObject", Napi::Function::New(env, OpenObject, "openObject"));
  exports.Set("progTestRun", Napi::Function::New(env, ProgTestRun, "progTestRun"));
  exports.Set("linkCreateProbe", Napi::Function::New(env, LinkCreateProbe, "linkCreateProbe"));
}

}  // namespace lbn
