// inet_diag over NETLINK_SOCK_DIAG: list a protocol's sockets (what `ss`
// shows) and destroy one exactly (SOCK_DESTROY, what `ss -K` sends; needs
// CONFIG_INET_DIAG_DESTROY). Either runs in another network namespace when
// given its fd: the netlink socket is made there (see netns.h), and a
// sock_diag socket only ever sees its own namespace. Generic: no lbctl
// knowledge; the caller chooses which sockets to destroy.
#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common.h"
#include "errors.h"
#include "netns.h"

namespace lbn {

namespace {

struct DiagRequest {
  struct nlmsghdr nlh;
  struct inet_diag_req_v2 r;
};

int optNetnsFd(const Napi::CallbackInfo& info, size_t i) {
  if (info.Length() <= i || info[i].IsUndefined()) return -1;
  return argI32(info, i, "netnsFd");
}

UniqueFd openDiagSocket(Napi::Env env, int nsFd, const ErrCtx& c) {
  NetnsResult made = runInNetns(nsFd, [] {
    int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    return fd >= 0 ? fd : -errno;
  });
  if (made.setnsErr != 0) throwBpfError(env, "setns", made.setnsErr, c);
  if (made.value < 0) throwBpfError(env, "socket(NETLINK_SOCK_DIAG)", -made.value, c);
  UniqueFd fd(made.value);
  // A reply that never comes must not hang the agent.
  struct timeval tv = {5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// 0 or a positive errno.
int sendRequest(int fd, uint16_t type, uint16_t flags, uint32_t seq, const struct inet_diag_req_v2& r) {
  DiagRequest msg;
  std::memset(&msg, 0, sizeof msg);
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = type;
  msg.nlh.nlmsg_flags = flags;
  msg.nlh.nlmsg_seq = seq;
  msg.r = r;
  struct sockaddr_nl sa;
  std::memset(&sa, 0, sizeof sa);
  sa.nl_family = AF_NETLINK;
  for (;;) {
    ssize_t n = ::sendto(fd, &msg, sizeof msg, 0, reinterpret_cast<struct sockaddr*>(&sa), sizeof sa);
    if (n >= 0) return 0;
    if (errno != EINTR) return errno;
  }
}

// 0 or a positive errno; n is set to the bytes received.
int receive(int fd, std::vector<uint8_t>& buf, ssize_t* n) {
  for (;;) {
    *n = ::recv(fd, buf.data(), buf.size(), 0);
    if (*n >= 0) return 0;
    if (errno != EINTR) return errno;
  }
}

int nlError(const struct nlmsghdr* h) {
  if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct nlmsgerr))) return EBADMSG;
  return -reinterpret_cast<const struct nlmsgerr*>(NLMSG_DATA(h))->error;
}

uint8_t u8Arg(const Napi::CallbackInfo& info, size_t i, const char* what) {
  uint32_t v = argU32(info, i, what);
  if (v > 255) throwArgError(info.Env(), std::string(what) + " must fit in a u8");
  return static_cast<uint8_t>(v);
}

// inetDiagDump(family, protocol, states, netnsFd?) -> [{ family, state, sport, dport,
// src, dst (16-byte Buffers, network order; IPv4 in the first 4), ifindex, cookie
// (BigInt), uid, inode, id (the raw inet_diag_sockid, for inetDiagDestroy) }]
Napi::Value InetDiagDump(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  struct inet_diag_req_v2 r;
  std::memset(&r, 0, sizeof r);
  r.sdiag_family = u8Arg(info, 0, "family");
  r.sdiag_protocol = u8Arg(info, 1, "protocol");
  r.idiag_states = argU32(info, 2, "states");
  const int nsFd = optNetnsFd(info, 3);
  ErrCtx c;
  c.detail = "family " + std::to_string(r.sdiag_family) + ", protocol " + std::to_string(r.sdiag_protocol) +
             (nsFd >= 0 ? ", netns fd " + std::to_string(nsFd) : "");

  UniqueFd fd = openDiagSocket(env, nsFd, c);
  const uint32_t seq = 1;
  if (int e = sendRequest(fd.get(), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, r)) {
    throwBpfError(env, "inet_diag dump", e, c);
  }

  std::vector<struct inet_diag_msg> found;
  std::vector<uint8_t> buf(64 * 1024);
  for (bool done = false; !done;) {
    ssize_t n = 0;
    if (int e = receive(fd.get(), buf, &n)) throwBpfError(env, "inet_diag dump", e, c);
    if (n == 0) break;
    int len = static_cast<int>(n);
    for (auto* h = reinterpret_cast<struct nlmsghdr*>(buf.data()); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_seq != seq) continue;
      if (h->nlmsg_type == NLMSG_DONE) {
        done = true;
        break;
      }
      if (h->nlmsg_type == NLMSG_ERROR) {
        int e = nlError(h);
        if (e != 0) throwBpfError(env, "inet_diag dump", e, c);
        continue;
      }
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg))) continue;
      found.push_back(*reinterpret_cast<const struct inet_diag_msg*>(NLMSG_DATA(h)));
    }
  }

  Napi::Array out = Napi::Array::New(env, found.size());
  for (size_t i = 0; i < found.size(); i++) {
    const struct inet_diag_msg& m = found[i];
    Napi::Object o = Napi::Object::New(env);
    o.Set("family", Napi::Number::New(env, m.idiag_family));
    o.Set("state", Napi::Number::New(env, m.idiag_state));
    o.Set("sport", Napi::Number::New(env, ntohs(m.id.idiag_sport)));
    o.Set("dport", Napi::Number::New(env, ntohs(m.id.idiag_dport)));
    o.Set("src", Napi::Buffer<uint8_t>::Copy(env, reinterpret_cast<const uint8_t*>(m.id.idiag_src), 16));
    o.Set("dst", Napi::Buffer<uint8_t>::Copy(env, reinterpret_cast<const uint8_t*>(m.id.idiag_dst), 16));
    o.Set("ifindex", Napi::Number::New(env, m.id.idiag_if));
    const uint64_t cookie = static_cast<uint64_t>(m.id.idiag_cookie[0]) | (static_cast<uint64_t>(m.id.idiag_cookie[1]) << 32);
    o.Set("cookie", Napi::BigInt::New(env, cookie));
    o.Set("uid", Napi::Number::New(env, m.idiag_uid));
    o.Set("inode", Napi::Number::New(env, m.idiag_inode));
    o.Set("id", Napi::Buffer<uint8_t>::Copy(env, reinterpret_cast<const uint8_t*>(&m.id), sizeof m.id));
    out.Set(i, o);
  }
  return out;
}

// inetDiagDestroy(family, protocol, id, netnsFd?): SOCK_DESTROY of the one
// socket whose inet_diag_sockid (cookie included) is `id`. The kernel looks
// the socket up by its addresses and refuses (ENOENT) unless the cookie
// matches too, so a socket closed and replaced in between is never hit.
// EOPNOTSUPP: the kernel lacks CONFIG_INET_DIAG_DESTROY.
Napi::Value InetDiagDestroy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  struct inet_diag_req_v2 r;
  std::memset(&r, 0, sizeof r);
  r.sdiag_family = u8Arg(info, 0, "family");
  r.sdiag_protocol = u8Arg(info, 1, "protocol");
  Napi::Uint8Array id = argBytes(info, 2, "id");
  if (id.ByteLength() != sizeof r.id) {
    throwArgError(env, "id must be " + std::to_string(sizeof r.id) + " bytes (struct inet_diag_sockid)");
  }
  std::memcpy(&r.id, id.Data(), sizeof r.id);
  r.idiag_states = ~0U;
  const int nsFd = optNetnsFd(info, 3);
  ErrCtx c;
  c.detail = "family " + std::to_string(r.sdiag_family) + ", protocol " + std::to_string(r.sdiag_protocol) +
             (nsFd >= 0 ? ", netns fd " + std::to_string(nsFd) : "");

  UniqueFd fd = openDiagSocket(env, nsFd, c);
  const uint32_t seq = 1;
  if (int e = sendRequest(fd.get(), SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, seq, r)) {
    throwBpfError(env, "SOCK_DESTROY", e, c);
  }
  std::vector<uint8_t> buf(8192);
  for (;;) {
    ssize_t n = 0;
    if (int e = receive(fd.get(), buf, &n)) throwBpfError(env, "SOCK_DESTROY", e, c);
    if (n == 0) throwBpfError(env, "SOCK_DESTROY", EPIPE, c);
    int len = static_cast<int>(n);
    for (auto* h = reinterpret_cast<struct nlmsghdr*>(buf.data()); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_seq != seq || h->nlmsg_type != NLMSG_ERROR) continue;
      int e = nlError(h);
      if (e != 0) throwBpfError(env, "SOCK_DESTROY", e, c);
      return env.Undefined();
    }
  }
}

}  // namespace

void InitSockDiag(Napi::Env env, Napi::Object exports) {
  exports.Set("inetDiagDump", Napi::Function::New(env, InetDiagDump, "inetDiagDump"));
  exports.Set("inetDiagDestroy", Napi::Function::New(env, InetDiagDestroy, "inetDiagDestroy"));
}

}  // namespace lbn
