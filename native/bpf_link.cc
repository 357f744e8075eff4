#include "bpf_link.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "common.h"
#include "errors.h"

namespace lbn {

// The name of a program's main function in the BTF the kernel keeps with it
// (bpf_prog_info.btf_id, and func_info[0], whose insn_off is 0): whole, where
// bpf_prog_info.name keeps 15 characters (BPF_OBJ_NAME_LEN). This is what
// bpftool prints as the program's name. "" for a program loaded without BTF.
static std::string progFuncName(Napi::Env env, int fd, const struct bpf_prog_info& pi, const ErrCtx& ctx) {
  if (pi.btf_id == 0 || pi.nr_func_info == 0) return "";
  struct bpf_func_info fi;
  std::memset(&fi, 0, sizeof fi);
  struct bpf_prog_info q;
  std::memset(&q, 0, sizeof q);
  q.nr_func_info = 1;
  q.func_info_rec_size = sizeof fi;
  q.func_info = reinterpret_cast<__u64>(&fi);
  __u32 len = sizeof q;
  int r = bpf_obj_get_info_by_fd(fd, &q, &len);
  if (r != 0) throwBpfError(env, "bpf_obj_get_info_by_fd", errFromRet(r), ctx);
  errno = 0;
  struct btf* btf = btf__load_from_kernel_by_id(pi.btf_id);
  if (btf == nullptr) {
    ErrCtx c = ctx;
    c.detail += (c.detail.empty() ? "" : ", ") + std::string("btf id ") + std::to_string(pi.btf_id);
    throwBpfError(env, "btf__load_from_kernel_by_id", errFromErrno(), c);
  }
  std::unique_ptr<struct btf, void (*)(struct btf*)> guard(btf, btf__free);
  const struct btf_type* t = btf__type_by_id(btf, fi.type_id);
  if (t == nullptr || !btf_is_func(t)) return "";
  const char* name = btf__name_by_offset(btf, t->name_off);
  return name != nullptr ? name : "";
}

Napi::Object progInfoObject(Napi::Env env, int fd, const ErrCtx& ctx) {
  struct bpf_prog_info pi;
  std::memset(&pi, 0, sizeof pi);
  __u32 len = sizeof pi;
  int r = bpf_obj_get_info_by_fd(fd, &pi, &len);
  if (r != 0) throwBpfError(env, "bpf_obj_get_info_by_fd", errFromRet(r), ctx);
  char tag[BPF_TAG_SIZE * 2 + 1];
  for (int i = 0; i < BPF_TAG_SIZE; i++) snprintf(tag + 2 * i, 3, "%02x", pi.tag[i]);
  Napi::Object o = Napi::Object::New(env);
  o.Set("id", Napi::Number::New(env, pi.id));
  o.Set("name", Napi::String::New(env, pi.name));
  o.Set("tag", Napi::String::New(env, tag));
  o.Set("type", Napi::Number::New(env, pi.type));
  std::string func = progFuncName(env, fd, pi, ctx);
  if (!func.empty()) o.Set("funcName", Napi::String::New(env, func));
  return o;
}

namespace {

// Owns a struct bpf_link*. By default destroying it detaches the link (for
// fd-based links that is: close the fd). After keep(), it is released instead:
// disconnected so libbpf does not detach it, and our fd closed by hand —
// libbpf's bpf_link__destroy only closes the fd in ->detach, which it skips
// for a disconnected link, so without the close() the fd would leak.
class LinkHolder {
 public:
  explicit LinkHolder(struct bpf_link* l) : link_(l) {}
  ~LinkHolder() {
    if (link_ == nullptr) return;
    if (keep_) {
      int fd = bpf_link__fd(link_);
      bpf_link__disconnect(link_);
      bpf_link__destroy(link_);
      if (fd >= 0) ::close(fd);
    } else {
      bpf_link__destroy(link_);
    }
  }
  LinkHolder(const LinkHolder&) = delete;
  LinkHolder& operator=(const LinkHolder&) = delete;
  struct bpf_link* get() const { return link_; }
  void keep() { keep_ = true; }

 private:
  struct bpf_link* link_;
  bool keep_ = false;
};

int linkInfoByFd(int fd, struct bpf_link_info* li) {
  std::memset(li, 0, sizeof *li);
  __u32 len = sizeof *li;
  int r = bpf_obj_get_info_by_fd(fd, li, &len);
  return r != 0 ? errFromRet(r) : 0;
}

// Open a pinned object and insist it is a BPF link.
UniqueFd openPinnedLink(Napi::Env env, const std::string& path) {
  int r = bpf_obj_get(path.c_str());
  ErrCtx c;
  c.path = path;
  if (r < 0) throwBpfError(env, "bpf_obj_get", errFromRet(r), c);
  UniqueFd fd(r);
  std::string kind = bpfFdKind(fd.get());
  if (kind != "bpf-link") {
    c.reason = "pinned object is " + (kind.empty() ? std::string("unknown") : kind) + ", not a BPF link";
    throwBpfError(env, "bpf_obj_get", EINVAL, c);
  }
  return fd;
}

Napi::Object linkInfoObject(Napi::Env env, const struct bpf_link_info& li) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("id", Napi::Number::New(env, li.id));
  o.Set("progId", Napi::Number::New(env, li.prog_id));
  o.Set("type", Napi::Number::New(env, li.type));
  if (li.type == BPF_LINK_TYPE_CGROUP) {
    o.Set("attachType", Napi::Number::New(env, li.cgroup.attach_type));
    o.Set("cgroupId", Napi::Number::New(env, static_cast<double>(li.cgroup.cgroup_id)));
  }
  return o;
}

Napi::Value PinnedLinkInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = argString(info, 0, "path");
  UniqueFd fd = openPinnedLink(env, path);
  struct bpf_link_info li;
  if (int e = linkInfoByFd(fd.get(), &li)) {
    ErrCtx c;
    c.path = path;
    throwBpfError(env, "bpf_obj_get_info_by_fd", e, c);
  }
  return linkInfoObject(env, li);
}

// progInfoById(id): progInfoObject() of any loaded program, or null when no
// program has that id (it was freed). Generic: callers use it to tell their
// own programs from others' (a tc filter's program, by its BTF name).
Napi::Value ProgInfoById(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t id = static_cast<uint32_t>(argI32(info, 0, "id"));
  int raw = bpf_prog_get_fd_by_id(id);
  if (raw < 0) {
    if (errno == ENOENT) return env.Null();
    ErrCtx c;
    c.detail = "program id " + std::to_string(id);
    throwBpfError(env, "bpf_prog_get_fd_by_id", errno, c);
  }
  UniqueFd fd(raw);
  ErrCtx c;
  c.detail = "program id " + std::to_string(id);
  return progInfoObject(env, fd.get(), c);
}

Napi::Value PinnedLinkUpdate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = argString(info, 0, "path");
  int progFd = argI32(info, 1, "progFd");
  UniqueFd fd = openPinnedLink(env, path);
  int r = bpf_link_update(fd.get(), progFd, nullptr);
  if (r != 0) {
    ErrCtx c;
    c.path = path;
    throwBpfError(env, "bpf_link_update", errFromRet(r), c);
  }
  return env.Undefined();
}

// ---- held links: what a link ran before a switch, kept so it can be restored ----

// A pinned link and the program it ran when it was held, both by fd: the fd on
// the program keeps it alive after the link is switched away from it (without
// one, the kernel frees a program once its last link lets go, and there would
// be nothing to switch back to).
struct HeldLink {
  UniqueFd link;
  UniqueFd prog;
  std::string path;
  uint32_t progId = 0;
};

// holdPinnedLink(path): { id, progId, type, attachType?, cgroupId?, restore(), close() }.
// restore() switches the link back to progId (bpf_link_update); close()
// releases both fds (also done when the object is collected).
Napi::Value HoldPinnedLink(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = argString(info, 0, "path");
  auto held = std::make_shared<HeldLink>();
  held->path = path;
  held->link = openPinnedLink(env, path);
  struct bpf_link_info li;
  ErrCtx c;
  c.path = path;
  if (int e = linkInfoByFd(held->link.get(), &li)) throwBpfError(env, "bpf_obj_get_info_by_fd", e, c);
  int pfd = bpf_prog_get_fd_by_id(li.prog_id);
  if (pfd < 0) {
    c.detail = "prog id " + std::to_string(li.prog_id);
    throwBpfError(env, "bpf_prog_get_fd_by_id", errFromRet(pfd), c);
  }
  held->prog.reset(pfd);
  held->progId = li.prog_id;
  Napi::Object o = linkInfoObject(env, li);
  o.Set("restore", Napi::Function::New(env, [held](const Napi::CallbackInfo& ci) -> Napi::Value {
    ErrCtx rc;
    rc.path = held->path;
    rc.detail = "back to prog id " + std::to_string(held->progId);
    if (!held->link.valid()) {
      rc.reason = "held link is closed";
      throwBpfError(ci.Env(), "bpf_link_update", EBADF, rc);
    }
    int r = bpf_link_update(held->link.get(), held->prog.get(), nullptr);
    if (r != 0) throwBpfError(ci.Env(), "bpf_link_update", errFromRet(r), rc);
    return ci.Env().Undefined();
  }, "restore"));
  o.Set("close", Napi::Function::New(env, [held](const Napi::CallbackInfo& ci) -> Napi::Value {
    held->link.reset();
    held->prog.reset();
    return ci.Env().Undefined();
  }, "close"));
  // Collecting the object releases the fds (the functions' own references may
  // outlive it; they then report EBADF).
  o.AddFinalizer(
      [](Napi::Env, std::shared_ptr<HeldLink>* h) {
        (*h)->link.reset();
        (*h)->prog.reset();
        delete h;
      },
      new std::shared_ptr<HeldLink>(held));
  return o;
}

// holdProgram(id): { id, fd, close() } -- a loaded program held by fd, so it
// outlives the attachments it has now (a tc filter replaced by another
// program lets go of it) and can be attached again; null when no program has
// that id. close() releases it (also done when the object is collected).
Napi::Value HoldProgram(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t id = static_cast<uint32_t>(argI32(info, 0, "id"));
  int raw = bpf_prog_get_fd_by_id(id);
  if (raw < 0) {
    if (errno == ENOENT) return env.Null();
    ErrCtx c;
    c.detail = "program id " + std::to_string(id);
    throwBpfError(env, "bpf_prog_get_fd_by_id", errno, c);
  }
  auto fd = std::make_shared<UniqueFd>(raw);
  Napi::Object o = Napi::Object::New(env);
  o.Set("id", Napi::Number::New(env, id));
  o.Set("fd", Napi::Number::New(env, raw));
  o.Set("close", Napi::Function::New(env, [fd](const Napi::CallbackInfo& ci) -> Napi::Value {
    fd->reset();
    return ci.Env().Undefined();
  }, "close"));
  o.AddFinalizer(
      [](Napi::Env, std::shared_ptr<UniqueFd>* f) {
        (*f)->reset();
        delete f;
      },
      new std::shared_ptr<UniqueFd>(fd));
  return o;
}

Napi::Value Unpin(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = argString(info, 0, "path");
  if (::unlink(path.c_str()) != 0) {
    ErrCtx c;
    c.path = path;
    throwBpfError(env, "unlink", errFromErrno(), c);
  }
  return env.Undefined();
}

}  // namespace

Napi::Object attachCgroupLink(Napi::Env env, struct bpf_program* prog, const std::string& cgroupPath,
                              const std::string& linkPinPath) {
  const std::string progName = bpf_program__name(prog);
  ErrCtx c;
  c.prog = progName;
  c.path = linkPinPath;

  size_t slash = linkPinPath.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    std::string parent = linkPinPath.substr(0, slash);
    if (int e = mkdirAll(parent)) {
      ErrCtx pc;
      pc.path = parent;
      throwBpfError(env, "mkdir", e, pc);
    }
  }

  UniqueFd cg(::open(cgroupPath.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cg.valid()) {
    ErrCtx cc;
    cc.path = cgroupPath;
    throwBpfError(env, "open", errFromErrno(), cc);
  }
  struct stat cst;
  if (::fstat(cg.get(), &cst) != 0) {
    ErrCtx cc;
    cc.path = cgroupPath;
    throwBpfError(env, "fstat", errFromErrno(), cc);
  }
  const uint64_t cgroupId = cst.st_ino;  // cgroup v2: the kernfs id is the inode number

  LogCapture cap;
  Napi::Object out = Napi::Object::New(env);
  struct bpf_link_info li;

  errno = 0;
  struct bpf_link* existing = bpf_link__open(linkPinPath.c_str());
  if (existing != nullptr) {
    LinkHolder h(existing);
    h.keep();  // never detach a pinned link we merely opened
    std::string kind = bpfFdKind(bpf_link__fd(existing));
    if (kind != "bpf-link") {
      c.reason = "pinned object is " + (kind.empty() ? std::string("unknown") : kind) + ", not a BPF link";
      throwBpfError(env, "bpf_link__open", EEXIST, c);
    }
    if (int e = linkInfoByFd(bpf_link__fd(existing), &li)) throwBpfError(env, "bpf_obj_get_info_by_fd", e, c);
    if (li.type != BPF_LINK_TYPE_CGROUP) {
      c.reason = "pinned link is of type " + std::to_string(li.type) + ", not a cgroup link";
      throwBpfError(env, "attachCgroup", EEXIST, c);
    }
    if (li.cgroup.cgroup_id != cgroupId) {
      c.reason = "pinned link is attached to cgroup id " + std::to_string(li.cgroup.cgroup_id) + ", not " +
                 cgroupPath + " (id " + std::to_string(cgroupId) + "); unpin it first";
      throwBpfError(env, "attachCgroup", EEXIST, c);
    }
    const uint32_t want = bpf_program__expected_attach_type(prog);
    if (li.cgroup.attach_type != want) {
      c.reason = "pinned link has attach type " + std::to_string(li.cgroup.attach_type) + ", program expects " +
                 std::to_string(want);
      throwBpfError(env, "attachCgroup", EINVAL, c);
    }
    int r = bpf_link__update_program(existing, prog);
    if (r != 0) {
      c.log = cap.tail();
      throwBpfError(env, "bpf_link__update_program", errFromRet(r), c);
    }
    out.Set("linkId", Napi::Number::New(env, li.id));
    out.Set("updated", Napi::Boolean::New(env, true));
    return out;
  }
  int openErr = errFromErrno();
  if (openErr != ENOENT) {
    c.log = cap.tail();
    throwBpfError(env, "bpf_link__open", openErr, c);
  }

  errno = 0;
  struct bpf_link* link = bpf_program__attach_cgroup(prog, cg.get());
  if (link == nullptr) {
    ErrCtx ac;
    ac.prog = progName;
    ac.path = cgroupPath;
    ac.log = cap.tail();
    throwBpfError(env, "bpf_program__attach_cgroup", errFromErrno(), ac);
  }
  LinkHolder h(link);  // until pinned, going out of scope detaches it
  int r = bpf_link__pin(link, linkPinPath.c_str());
  if (r != 0) {
    c.log = cap.tail();
    throwBpfError(env, "bpf_link__pin", errFromRet(r), c);
  }
  h.keep();
  if (int e = linkInfoByFd(bpf_link__fd(link), &li)) throwBpfError(env, "bpf_obj_get_info_by_fd", e, c);
  out.Set("linkId", Napi::Number::New(env, li.id));
  out.Set("updated", Napi::Boolean::New(env, false));
  return out;
}

void InitLink(Napi::Env env, Napi::Object exports) {
  exports.Set("pinnedLinkInfo", Napi::Function::New(env, PinnedLinkInfo, "pinnedLinkInfo"));
  exports.Set("progInfoById", Napi::Function::New(env, ProgInfoById, "progInfoById"));
  exports.Set("pinnedLinkUpdate", Napi::Function::New(env, PinnedLinkUpdate, "pinnedLinkUpdate"));
  exports.Set("unpin", Napi::Function::New(env, Unpin, "unpin"));
  exports.Set("holdPinnedLink", Napi::Function::New(env, HoldPinnedLink, "holdPinnedLink"));
  exports.Set("holdProgram", Napi::Function::New(env, HoldProgram, "holdProgram"));
}

}  // namespace lbn
