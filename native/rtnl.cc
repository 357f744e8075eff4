// rtnetlink (NETLINK_ROUTE) in the caller's network namespace: the links
// and addresses `ip link` and `ip addr` show, and a watch that says when
// either changed. Read from the kernel, not /sys/class/net, which shows the
// namespace that mounted /sys (the host's, under `nsenter --net`).
// Generic: no lbctl knowledge; the caller decides which devices it wants.
//
// Each takes an optional network namespace fd (last argument): the netlink
// socket is then made there, as sock_diag.cc does.
//
//   rtnlLinks() -> [{ index, name, flags, mtu, type, kind, slaveKind, master, operstate, address }]
//   rtnlAddrs() -> [{ index, family, address, prefixLen, scope, flags }], in
//     the kernel's order (IPv4: primaries before their secondaries)
//   rtnlRoutes() -> [{ family, table, type, scope, dst, dstLen, oif, gateway,
//     prefsrc, priority }]: one per next hop ('' where a route has none)
//   rtnlWatch(callback) -> { close() }: callback(messages) after each burst
//     of link, address or route events (messages: how many; -1 after an
//     overrun, when events were lost). The caller lists again: events only
//     say when.
//
// Dumps are synchronous: the kernel answers from memory at once (no I/O to
// wait on), with a receive timeout so a reply that never comes cannot hold
// the thread. The watch is a libuv poll handle on the main loop: no thread.
#include <arpa/inet.h>
#include <linux/if.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if_arp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <uv.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <vector>

#include "common.h"
#include "errors.h"
#include "netns.h"

namespace lbn {

namespace {

constexpr time_t kReceiveTimeoutSec = 5;

// 0 or a positive errno. nsFd >= 0: the socket is made in that network
// namespace (and keeps it), by a short-lived thread (netns.h).
int openRoute(int nsFd, UniqueFd* out, unsigned groups, bool nonblock) {
  NetnsResult made = runInNetns(nsFd, [nonblock] {
    int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), NETLINK_ROUTE);
    return fd >= 0 ? fd : -errno;
  });
  if (made.setnsErr != 0) return made.setnsErr;
  if (made.value < 0) return -made.value;
  int fd = made.value;
  out->reset(fd);
  struct sockaddr_nl sa;
  std::memset(&sa, 0, sizeof sa);
  sa.nl_family = AF_NETLINK;
  sa.nl_groups = groups;
  if (::bind(fd, reinterpret_cast<struct sockaddr*>(&sa), sizeof sa) != 0) return errno;
  if (!nonblock) {
    struct timeval tv = {kReceiveTimeoutSec, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  return 0;
}

// One dump request (RTM_GETLINK, RTM_GETADDR, RTM_GETROUTE); each message of the reply
// goes to onMessage. 0 or a positive errno.
int dump(int nsFd, uint16_t type, const std::function<void(const struct nlmsghdr*)>& onMessage) {
  UniqueFd fd;
  if (int e = openRoute(nsFd, &fd, 0, false)) return e;
  struct {
    struct nlmsghdr nlh;
    struct rtgenmsg g;
  } req;
  std::memset(&req, 0, sizeof req);
  req.nlh.nlmsg_len = NLMSG_LENGTH(sizeof(struct rtgenmsg));
  req.nlh.nlmsg_type = type;
  req.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  req.nlh.nlmsg_seq = 1;
  req.g.rtgen_family = AF_UNSPEC;
  for (;;) {
    if (::send(fd.get(), &req, req.nlh.nlmsg_len, 0) >= 0) break;
    if (errno != EINTR) return errno;
  }
  std::vector<uint8_t> buf(64 * 1024);
  for (;;) {
    ssize_t n = ::recv(fd.get(), buf.data(), buf.size(), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return 0;
    int len = static_cast<int>(n);
    for (auto* h = reinterpret_cast<struct nlmsghdr*>(buf.data()); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_seq != 1) continue;
      if (h->nlmsg_type == NLMSG_DONE) return 0;
      if (h->nlmsg_type == NLMSG_ERROR) {
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct nlmsgerr))) return EBADMSG;
        int e = -reinterpret_cast<const struct nlmsgerr*>(NLMSG_DATA(h))->error;
        if (e != 0) return e;
        continue;
      }
      onMessage(h);
    }
  }
}

int optNetns(const Napi::CallbackInfo& info, size_t i) {
  if (info.Length() <= i || info[i].IsUndefined()) return -1;
  return argI32(info, i, "netnsFd");
}

std::string attrString(const struct rtattr* a) {
  const char* p = static_cast<const char*>(RTA_DATA(a));
  size_t n = RTA_PAYLOAD(a);
  return std::string(p, strnlen(p, n));
}

uint32_t attrU32(const struct rtattr* a) {
  uint32_t v = 0;
  if (RTA_PAYLOAD(a) >= sizeof v) std::memcpy(&v, RTA_DATA(a), sizeof v);
  return v;
}

const char* operstateName(uint8_t s) {
  switch (s) {
    case IF_OPER_NOTPRESENT: return "notpresent";
    case IF_OPER_DOWN: return "down";
    case IF_OPER_LOWERLAYERDOWN: return "lowerlayerdown";
    case IF_OPER_TESTING: return "testing";
    case IF_OPER_DORMANT: return "dormant";
    case IF_OPER_UP: return "up";
    default: return "unknown";
  }
}

std::string macString(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; i++) {
    if (i) s += ':';
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}

Napi::Value RtnlLinks(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Array out = Napi::Array::New(env);
  uint32_t i = 0;
  int e = dump(optNetns(info, 0), RTM_GETLINK, [&](const struct nlmsghdr* h) {
    if (h->nlmsg_type != RTM_NEWLINK || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct ifinfomsg))) return;
    const auto* ifi = static_cast<const struct ifinfomsg*>(NLMSG_DATA(h));
    Napi::Object o = Napi::Object::New(env);
    o.Set("index", ifi->ifi_index);
    o.Set("flags", ifi->ifi_flags);
    o.Set("type", ifi->ifi_type);
    o.Set("name", "");
    o.Set("kind", "");
    o.Set("slaveKind", "");
    o.Set("master", 0);
    o.Set("mtu", 0);
    o.Set("operstate", "unknown");
    o.Set("address", "");
    int len = static_cast<int>(IFLA_PAYLOAD(h));
    for (auto* a = IFLA_RTA(ifi); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
      switch (a->rta_type) {
        case IFLA_IFNAME: o.Set("name", attrString(a)); break;
        case IFLA_MTU: o.Set("mtu", attrU32(a)); break;
        case IFLA_MASTER: o.Set("master", attrU32(a)); break;
        case IFLA_OPERSTATE:
          if (RTA_PAYLOAD(a) >= 1) o.Set("operstate", operstateName(*static_cast<const uint8_t*>(RTA_DATA(a))));
          break;
        case IFLA_ADDRESS:
          o.Set("address", macString(static_cast<const uint8_t*>(RTA_DATA(a)), RTA_PAYLOAD(a)));
          break;
        case IFLA_LINKINFO: {
          int ilen = static_cast<int>(RTA_PAYLOAD(a));
          for (auto* n = static_cast<const struct rtattr*>(RTA_DATA(a)); RTA_OK(n, ilen); n = RTA_NEXT(n, ilen)) {
            if (n->rta_type == IFLA_INFO_KIND) o.Set("kind", attrString(n));
            if (n->rta_type == IFLA_INFO_SLAVE_KIND) o.Set("slaveKind", attrString(n));
          }
          break;
        }
        default: break;
      }
    }
    out.Set(i++, o);
  });
  if (e != 0) throwBpfError(env, "rtnetlink RTM_GETLINK dump", e);
  return out;
}

Napi::Value RtnlAddrs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Array out = Napi::Array::New(env);
  uint32_t i = 0;
  int e = dump(optNetns(info, 0), RTM_GETADDR, [&](const struct nlmsghdr* h) {
    if (h->nlmsg_type != RTM_NEWADDR || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct ifaddrmsg))) return;
    const auto* ifa = static_cast<const struct ifaddrmsg*>(NLMSG_DATA(h));
    if (ifa->ifa_family != AF_INET && ifa->ifa_family != AF_INET6) return;
    const void* addr = nullptr;
    const void* local = nullptr;
    uint32_t flags = ifa->ifa_flags;
    int len = static_cast<int>(IFA_PAYLOAD(h));
    for (auto* a = IFA_RTA(ifa); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
      size_t want = ifa->ifa_family == AF_INET ? 4 : 16;
      if (a->rta_type == IFA_ADDRESS && RTA_PAYLOAD(a) >= want) addr = RTA_DATA(a);
      if (a->rta_type == IFA_LOCAL && RTA_PAYLOAD(a) >= want) local = RTA_DATA(a);
      if (a->rta_type == IFA_FLAGS) flags = attrU32(a);
    }
    // IFA_LOCAL is the interface's own address (they differ on point-to-point links).
    const void* mine = local ? local : addr;
    if (!mine) return;
    char text[INET6_ADDRSTRLEN];
    if (!inet_ntop(ifa->ifa_family, mine, text, sizeof text)) return;
    Napi::Object o = Napi::Object::New(env);
    o.Set("index", ifa->ifa_index);
    o.Set("family", ifa->ifa_family == AF_INET ? 4 : 6);
    o.Set("address", text);
    o.Set("prefixLen", ifa->ifa_prefixlen);
    o.Set("scope", ifa->ifa_scope);
    o.Set("flags", flags);
    out.Set(i++, o);
  });
  if (e != 0) throwBpfError(env, "rtnetlink RTM_GETADDR dump", e);
  return out;
}

std::string addrString(int family, const struct rtattr* a) {
  size_t want = family == AF_INET ? 4 : 16;
  char text[INET6_ADDRSTRLEN];
  if (RTA_PAYLOAD(a) < want || !inet_ntop(family, RTA_DATA(a), text, sizeof text)) return "";
  return text;
}

Napi::Value RtnlRoutes(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Array out = Napi::Array::New(env);
  uint32_t i = 0;
  int e = dump(optNetns(info, 0), RTM_GETROUTE, [&](const struct nlmsghdr* h) {
    if (h->nlmsg_type != RTM_NEWROUTE || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct rtmsg))) return;
    const auto* rtm = static_cast<const struct rtmsg*>(NLMSG_DATA(h));
    if (rtm->rtm_family != AF_INET && rtm->rtm_family != AF_INET6) return;
    uint32_t table = rtm->rtm_table, oif = 0, priority = 0;
    std::string dst, gateway, prefsrc;
    const struct rtattr* multipath = nullptr;
    int len = static_cast<int>(RTM_PAYLOAD(h));
    for (auto* a = RTM_RTA(rtm); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
      switch (a->rta_type) {
        case RTA_TABLE: table = attrU32(a); break;
        case RTA_DST: dst = addrString(rtm->rtm_family, a); break;
        case RTA_OIF: oif = attrU32(a); break;
        case RTA_GATEWAY: gateway = addrString(rtm->rtm_family, a); break;
        case RTA_PREFSRC: prefsrc = addrString(rtm->rtm_family, a); break;
        case RTA_PRIORITY: priority = attrU32(a); break;
        case RTA_MULTIPATH: multipath = a; break;
      }
    }
    auto emit = [&](uint32_t hopOif, const std::string& hopGateway) {
      Napi::Object o = Napi::Object::New(env);
      o.Set("family", rtm->rtm_family == AF_INET ? 4 : 6);
      o.Set("table", table);
      o.Set("type", rtm->rtm_type);
      o.Set("scope", rtm->rtm_scope);
      o.Set("dst", dst);
      o.Set("dstLen", rtm->rtm_dst_len);
      o.Set("oif", hopOif);
      o.Set("gateway", hopGateway);
      o.Set("prefsrc", prefsrc);
      o.Set("priority", priority);
      out.Set(i++, o);
    };
    if (!multipath) {
      emit(oif, gateway);
      return;
    }
    int left = static_cast<int>(RTA_PAYLOAD(multipath));
    for (auto* nh = static_cast<const struct rtnexthop*>(RTA_DATA(multipath)); RTNH_OK(nh, left); left -= NLMSG_ALIGN(nh->rtnh_len), nh = RTNH_NEXT(nh)) {
      std::string hopGateway;
      int alen = static_cast<int>(nh->rtnh_len) - static_cast<int>(sizeof(struct rtnexthop));
      for (auto* a = RTNH_DATA(nh); RTA_OK(a, alen); a = RTA_NEXT(a, alen))
        if (a->rta_type == RTA_GATEWAY) hopGateway = addrString(rtm->rtm_family, a);
      emit(static_cast<uint32_t>(nh->rtnh_ifindex), hopGateway);
    }
  });
  if (e != 0) throwBpfError(env, "rtnetlink RTM_GETROUTE dump", e);
  return out;
}

// A subscription to link, address and route events, drained on the main loop.
struct Watch {
  uv_poll_t poll;
  UniqueFd fd;
  Napi::FunctionReference callback;
  Napi::AsyncContext* context = nullptr;
  bool closed = false;
};

void OnReadable(uv_poll_t* handle, int status, int) {
  auto* w = static_cast<Watch*>(handle->data);
  if (w->closed) return;
  int messages = 0;
  bool overrun = status < 0;
  std::vector<uint8_t> buf(64 * 1024);
  for (;;) {
    ssize_t n = ::recv(w->fd.get(), buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ENOBUFS) {  // the kernel dropped events: the caller must list again
        overrun = true;
        continue;
      }
      break;  // EAGAIN: drained
    }
    if (n == 0) break;
    int len = static_cast<int>(n);
    for (auto* h = reinterpret_cast<struct nlmsghdr*>(buf.data()); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) messages++;
  }
  if (messages == 0 && !overrun) return;
  Napi::Env env = w->callback.Env();
  Napi::HandleScope scope(env);
  w->callback.MakeCallback(env.Global(), {Napi::Number::New(env, overrun ? -1 : messages)}, *w->context);
}

Napi::Value RtnlWatch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsFunction()) throwArgError(env, "rtnlWatch(callback): callback must be a function");
  auto* w = new Watch();
  if (int e = openRoute(optNetns(info, 1), &w->fd, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE, true)) {
    delete w;
    throwBpfError(env, "rtnetlink subscribe", e);
  }
  uv_loop_t* loop = nullptr;
  if (napi_get_uv_event_loop(env, &loop) != napi_ok || uv_poll_init(loop, &w->poll, w->fd.get()) != 0) {
    delete w;
    throwBpfError(env, "uv_poll_init", EINVAL);
  }
  w->poll.data = w;
  w->callback = Napi::Persistent(info[0].As<Napi::Function>());
  w->context = new Napi::AsyncContext(env, "lbctl.rtnl_watch");
  uv_poll_start(&w->poll, UV_READABLE, OnReadable);
  Napi::Object handle = Napi::Object::New(env);
  handle.Set("close", Napi::Function::New(env, [w](const Napi::CallbackInfo& ci) -> Napi::Value {
    if (!w->closed) {
      w->closed = true;
      uv_poll_stop(&w->poll);
      delete w->context;
      w->context = nullptr;
      w->callback.Reset();
      uv_close(reinterpret_cast<uv_handle_t*>(&w->poll), [](uv_handle_t* h) { delete static_cast<Watch*>(h->data); });
    }
    return ci.Env().Undefined();
  }));
  return handle;
}

}  // namespace

void InitRtnl(Napi::Env env, Napi::Object exports) {
  exports.Set("rtnlLinks", Napi::Function::New(env, RtnlLinks, "rtnlLinks"));
  exports.Set("rtnlAddrs", Napi::Function::New(env, RtnlAddrs, "rtnlAddrs"));
  exports.Set("rtnlRoutes", Napi::Function::New(env, RtnlRoutes, "rtnlRoutes"));
  exports.Set("rtnlWatch", Napi::Function::New(env, RtnlWatch, "rtnlWatch"));
}

}  // namespace lbn
