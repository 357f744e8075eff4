// tc attachment of BPF programs to a network device, both ways the kernel
// offers, optionally in another network namespace (netns.h: a short-lived
// thread joins it, so no Node thread ever changes namespace):
//
//   clsact + cls_bpf in direct-action mode (libbpf's bpf_tc_*): every kernel.
//     tcAttach(progFd, ifindex, dir, handle, priority, replace, netnsFd?) -> { progId }
//     tcQuery(ifindex, dir, handle, priority, netnsFd?) -> progId | 0 (none there)
//     tcDetach(ifindex, dir, handle, priority, netnsFd?)
//   A filter is named by (handle, priority): replace=true swaps the program
//   of an existing filter atomically (BPF_TC_F_REPLACE); replace=false
//   fails with EEXIST when that filter exists, so a caller never takes over
//   a filter it did not check first.
//
//   tcx links (6.6+): tcxAttach(progFd, ifindex, attachType, flags, pinPath, netnsFd?) -> { linkId }
//   (any bpf_link_create attach type: XDP links, BPF_XDP 37, go through it too)
//   A bpf_link (BPF_TCX_INGRESS 46 / BPF_TCX_EGRESS 47), pinned so it
//   outlives the process; flags BPF_F_BEFORE (8) with no anchor puts the
//   program at the head. Replaced in place with pinnedLinkUpdate.
//
// Generic: no lbctl knowledge; the caller picks handles, priorities, pins.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/pkt_cls.h>

#include <cerrno>
#include <string>

#include "common.h"
#include "errors.h"
#include "netns.h"

namespace lbn {

namespace {

int optNetns(const Napi::CallbackInfo& info, size_t i) {
  if (info.Length() <= i || info[i].IsUndefined()) return -1;
  return argI32(info, i, "netnsFd");
}

enum bpf_tc_attach_point direction(const Napi::CallbackInfo& info, size_t i) {
  std::string d = argString(info, i, "direction");
  if (d == "ingress") return BPF_TC_INGRESS;
  if (d == "egress") return BPF_TC_EGRESS;
  throwArgError(info.Env(), "direction must be 'ingress' or 'egress'");
}

ErrCtx where(uint32_t ifindex, const char* dir, uint32_t handle, uint32_t prio) {
  ErrCtx c;
  c.detail = std::string("ifindex ") + std::to_string(ifindex) + " " + dir + ", handle " + std::to_string(handle) +
             ", priority " + std::to_string(prio);
  return c;
}

// A filter named by (ifindex, direction, handle, priority) as the arguments
// at `i`..`i + 3` give it, plus the optional namespace fd after them.
struct Filter {
  uint32_t ifindex;
  enum bpf_tc_attach_point dir;
  uint32_t handle;
  uint32_t prio;
  int nsFd;
  ErrCtx ctx() const { return where(ifindex, dir == BPF_TC_INGRESS ? "ingress" : "egress", handle, prio); }
};

Filter filterArgs(const Napi::CallbackInfo& info, size_t i) {
  return Filter{argU32(info, i, "ifindex"), direction(info, i + 1), argU32(info, i + 2, "handle"),
                argU32(info, i + 3, "priority"), optNetns(info, i + 4)};
}

// Runs fn in netnsFd's namespace (or here), mapping a failed setns to its errno.
int inNetns(int nsFd, const std::function<int()>& fn) {
  NetnsResult r = runInNetns(nsFd, fn);
  return r.setnsErr != 0 ? -r.setnsErr : r.value;
}

Napi::Value TcAttach(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int progFd = argI32(info, 0, "progFd");
  uint32_t ifindex = argU32(info, 1, "ifindex");
  enum bpf_tc_attach_point dir = direction(info, 2);
  uint32_t handle = argU32(info, 3, "handle");
  uint32_t prio = argU32(info, 4, "priority");
  if (handle == 0 || prio == 0 || prio > 0xffff) throwArgError(env, "handle must be > 0 and priority in 1..65535");
  bool replace = info.Length() > 5 && info[5].ToBoolean();
  int nsFd = optNetns(info, 6);
  uint32_t progId = 0;
  const char* op = "bpf_tc_hook_create";
  int r = inNetns(nsFd, [&] {
    DECLARE_LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = static_cast<int>(ifindex), .attach_point = dir);
    int e = bpf_tc_hook_create(&hook);  // the clsact qdisc; EEXIST when it is there already
    if (e != 0 && e != -EEXIST) return e;
    op = "bpf_tc_attach";
    DECLARE_LIBBPF_OPTS(bpf_tc_opts, opts, .prog_fd = progFd, .flags = replace ? static_cast<__u32>(BPF_TC_F_REPLACE) : 0u,
                        .handle = handle, .priority = prio);
    e = bpf_tc_attach(&hook, &opts);
    if (e == 0) progId = opts.prog_id;
    return e;
  });
  if (r != 0) throwBpfError(env, op, errFromRet(r), where(ifindex, dir == BPF_TC_INGRESS ? "ingress" : "egress", handle, prio));
  Napi::Object o = Napi::Object::New(env);
  o.Set("progId", progId);
  return o;
}

Napi::Value TcQuery(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Filter f = filterArgs(info, 0);
  uint32_t progId = 0;
  int r = inNetns(f.nsFd, [&] {
    DECLARE_LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = static_cast<int>(f.ifindex), .attach_point = f.dir);
    DECLARE_LIBBPF_OPTS(bpf_tc_opts, opts, .handle = f.handle, .priority = f.prio);
    int e = bpf_tc_query(&hook, &opts);
    if (e == 0) progId = opts.prog_id;
    return e;
  });
  // No qdisc, or no such filter: nothing there.
  if (r == -ENOENT || r == -EINVAL) return Napi::Number::New(env, 0);
  if (r != 0) throwBpfError(env, "bpf_tc_query", errFromRet(r), f.ctx());
  return Napi::Number::New(env, progId);
}

Napi::Value TcDetach(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Filter f = filterArgs(info, 0);
  int r = inNetns(f.nsFd, [&] {
    DECLARE_LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = static_cast<int>(f.ifindex), .attach_point = f.dir);
    DECLARE_LIBBPF_OPTS(bpf_tc_opts, opts, .handle = f.handle, .priority = f.prio);
    return bpf_tc_detach(&hook, &opts);
  });
  if (r != 0) throwBpfError(env, "bpf_tc_detach", errFromRet(r), f.ctx());
  return env.Undefined();
}

Napi::Value TcxAttach(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int progFd = argI32(info, 0, "progFd");
  uint32_t ifindex = argU32(info, 1, "ifindex");
  uint32_t attachType = argU32(info, 2, "attachType");
  uint32_t flags = argU32(info, 3, "flags");
  std::string pin = argString(info, 4, "pinPath");
  int nsFd = optNetns(info, 5);
  ErrCtx c;
  c.path = pin;
  c.detail = "ifindex " + std::to_string(ifindex) + ", attach type " + std::to_string(attachType);
  // The link is made in the device's namespace (ifindexes are per namespace); its fd then works anywhere.
  int fd = inNetns(nsFd, [&] {
    DECLARE_LIBBPF_OPTS(bpf_link_create_opts, opts, .flags = flags);
    int r = bpf_link_create(progFd, static_cast<int>(ifindex), static_cast<enum bpf_attach_type>(attachType), &opts);
    return r < 0 ? -errFromRet(r) : r;
  });
  if (fd < 0) throwBpfError(env, "bpf_link_create", -fd, c);
  UniqueFd link(fd);
  std::string dir = pin.substr(0, pin.find_last_of('/'));
  if (int e = mkdirAll(dir)) throwBpfError(env, "mkdir", e, c);
  if (bpf_obj_pin(link.get(), pin.c_str()) != 0) throwBpfError(env, "bpf_obj_pin", errFromErrno(), c);
  struct bpf_link_info li = {};
  __u32 len = sizeof li;
  uint32_t id = bpf_obj_get_info_by_fd(link.get(), &li, &len) == 0 ? li.id : 0;
  Napi::Object o = Napi::Object::New(env);
  o.Set("linkId", id);
  return o;
}

}  // namespace

void InitTc(Napi::Env env, Napi::Object exports) {
  exports.Set("tcAttach", Napi::Function::New(env, TcAttach, "tcAttach"));
  exports.Set("tcQuery", Napi::Function::New(env, TcQuery, "tcQuery"));
  exports.Set("tcDetach", Napi::Function::New(env, TcDetach, "tcDetach"));
  exports.Set("tcxAttach", Napi::Function::New(env, TcxAttach, "tcxAttach"));
}

}  // namespace lbn
