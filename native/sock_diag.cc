// inet_diag over NETLINK_SOCK_DIAG: list a protocol's sockets (what `ss`
// shows) and destroy sockets exactly (SOCK_DESTROY, what `ss -K` sends;
// needs CONFIG_INET_DIAG_DESTROY). Either runs in another network namespace
// when given its fd: the netlink socket is made there (see netns.h), and a
// sock_diag socket only ever sees its own namespace. Both are asynchronous
// (PromiseWorker): the netlink exchange runs on the libuv pool, never on the
// JavaScript thread. Generic: no lbctl knowledge; the caller chooses which
// sockets to destroy.
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

// Seconds one recv() on the netlink socket may wait (a dump reads many).
constexpr time_t kReceiveTimeoutSec = 5;

struct DiagRequest {
  struct nlmsghdr nlh;
  struct inet_diag_req_v2 r;
};

int optNetnsFd(const Napi::CallbackInfo& info, size_t i) {
  if (info.Length() <= i || info[i].IsUndefined()) return -1;
  return argI32(info, i, "netnsFd");
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

std::string detailOf(uint8_t family, uint8_t protocol, int nsFd) {
  return "family " + std::to_string(family) + ", protocol " + std::to_string(protocol) +
         (nsFd >= 0 ? ", netns fd " + std::to_string(nsFd) : "");
}

// The netlink socket, made in the namespace (0 or a positive errno; op names what failed).
int openDiagSocket(int nsFd, UniqueFd* out, const char** op) {
  NetnsResult made = runInNetns(nsFd, [] {
    int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    return fd >= 0 ? fd : -errno;
  });
  if (made.setnsErr != 0) {
    *op = "setns";
    return made.setnsErr;
  }
  if (made.value < 0) {
    *op = "socket(NETLINK_SOCK_DIAG)";
    return -made.value;
  }
  out->reset(made.value);
  // A reply that never comes must not hold the worker forever.
  struct timeval tv = {kReceiveTimeoutSec, 0};
  ::setsockopt(out->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return 0;
}

// inetDiagDump(family, protocol, states, netnsFd?, limit?) -> Promise<{ sockets, truncated }>:
// the sockets (what `ss` lists) in `states` (a 1 << TCP_* mask), in
// netnsFd's namespace when given. sockets: [{ family, state, sport, dport,
// src, dst (16-byte Buffers, network order; IPv4 in the first 4), ifindex,
// cookie (BigInt), uid, inode, id (the raw inet_diag_sockid, for
// inetDiagDestroy) }]. At most `limit` sockets are kept; truncated says the
// dump had more (the rest is not read: closing the socket ends the dump).
class DumpWorker : public PromiseWorker {
 public:
  DumpWorker(Napi::Env env, const struct inet_diag_req_v2& r, UniqueFd ns, int callerNsFd, uint64_t limit)
      : PromiseWorker(env, "lbctl.inet_diag_dump"), r_(r), ns_(std::move(ns)), limit_(limit) {
    ctx_.detail = detailOf(r.sdiag_family, r.sdiag_protocol, callerNsFd);
  }

 protected:
  void Run() override {
    UniqueFd fd;
    const char* op = "";
    if (int e = openDiagSocket(ns_.get(), &fd, &op)) return Fail(op, e, ctx_);
    const uint32_t seq = 1;
    if (int e = sendRequest(fd.get(), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, r_)) {
      return Fail("inet_diag dump", e, ctx_);
    }
    std::vector<uint8_t> buf(64 * 1024);
    for (bool done = false; !done;) {
      ssize_t n = 0;
      if (int e = receive(fd.get(), buf, &n)) return Fail("inet_diag dump", e, ctx_);
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
          if (e != 0) return Fail("inet_diag dump", e, ctx_);
          continue;
        }
        if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg))) continue;
        if (found_.size() >= limit_) {
          truncated_ = true;
          done = true;
          break;
        }
        found_.push_back(*reinterpret_cast<const struct inet_diag_msg*>(NLMSG_DATA(h)));
      }
    }
  }

  Napi::Value Result(Napi::Env env) override {
    Napi::Array arr = Napi::Array::New(env, found_.size());
    for (size_t i = 0; i < found_.size(); i++) {
      const struct inet_diag_msg& m = found_[i];
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
      arr.Set(i, o);
    }
    Napi::Object out = Napi::Object::New(env);
    out.Set("sockets", arr);
    out.Set("truncated", Napi::Boolean::New(env, truncated_));
    return out;
  }

 private:
  struct inet_diag_req_v2 r_;
  UniqueFd ns_;
  uint64_t limit_;
  ErrCtx ctx_;
  std::vector<struct inet_diag_msg> found_;
  bool truncated_ = false;
};

Napi::Value InetDiagDump(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  struct inet_diag_req_v2 r;
  std::memset(&r, 0, sizeof r);
  r.sdiag_family = u8Arg(info, 0, "family");
  r.sdiag_protocol = u8Arg(info, 1, "protocol");
  r.idiag_states = argU32(info, 2, "states");
  const int nsFd = optNetnsFd(info, 3);
  const uint64_t limit = argOptU64(info, 4, "limit", UINT64_MAX);
  UniqueFd ns = dupFdOrThrow(env, nsFd, "netnsFd");
  return (new DumpWorker(env, r, std::move(ns), nsFd, limit))->Start();
}

// inetDiagDestroy(family, protocol, ids, netnsFd?) -> Promise<number[]>:
// SOCK_DESTROY (what `ss -K` sends) of each socket whose inet_diag_sockid
// (cookie included) is in `ids`, over one netlink socket; one errno per id,
// 0 when destroyed. The kernel looks each socket up by its addresses and
// refuses (ENOENT) unless the cookie matches too, so a socket closed and
// replaced in between is never hit. EOPNOTSUPP: the kernel lacks
// CONFIG_INET_DIAG_DESTROY. Rejects only when the netlink socket cannot be
// made; when it fails later (a send, or no answer within the receive
// timeout), the ids not answered yet get that errno.
class DestroyWorker : public PromiseWorker {
 public:
  DestroyWorker(Napi::Env env, const struct inet_diag_req_v2& r, std::vector<struct inet_diag_sockid> ids, UniqueFd ns,
                int callerNsFd)
      : PromiseWorker(env, "lbctl.inet_diag_destroy"), r_(r), ids_(std::move(ids)), ns_(std::move(ns)) {
    ctx_.detail = detailOf(r.sdiag_family, r.sdiag_protocol, callerNsFd);
  }

 protected:
  void Run() override {
    UniqueFd fd;
    const char* op = "";
    if (int e = openDiagSocket(ns_.get(), &fd, &op)) return Fail(op, e, ctx_);
    std::vector<uint8_t> buf(8192);
    for (size_t i = 0; i < ids_.size(); i++) {
      const uint32_t seq = static_cast<uint32_t>(i + 1);
      struct inet_diag_req_v2 r = r_;
      r.id = ids_[i];
      if (int e = sendRequest(fd.get(), SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, seq, r)) return giveUp(e);
      for (bool acked = false; !acked;) {
        ssize_t n = 0;
        if (int e = receive(fd.get(), buf, &n)) return giveUp(e);
        if (n == 0) return giveUp(EPIPE);
        int len = static_cast<int>(n);
        for (auto* h = reinterpret_cast<struct nlmsghdr*>(buf.data()); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
          if (h->nlmsg_seq != seq || h->nlmsg_type != NLMSG_ERROR) continue;
          errs_.push_back(nlError(h));
          acked = true;
          break;
        }
      }
    }
  }

  // The netlink socket failed: the sockets not yet answered get its errno
  // (those destroyed before stay reported as destroyed).
  void giveUp(int e) { errs_.resize(ids_.size(), e); }

  Napi::Value Result(Napi::Env env) override {
    Napi::Array out = Napi::Array::New(env, errs_.size());
    for (size_t i = 0; i < errs_.size(); i++) out.Set(i, Napi::Number::New(env, errs_[i]));
    return out;
  }

 private:
  struct inet_diag_req_v2 r_;
  std::vector<struct inet_diag_sockid> ids_;
  UniqueFd ns_;
  ErrCtx ctx_;
  std::vector<int> errs_;
};

Napi::Value InetDiagDestroy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  struct inet_diag_req_v2 r;
  std::memset(&r, 0, sizeof r);
  r.sdiag_family = u8Arg(info, 0, "family");
  r.sdiag_protocol = u8Arg(info, 1, "protocol");
  r.idiag_states = ~0U;
  if (info.Length() <= 2 || !info[2].IsArray()) throwArgError(env, "ids must be an array of Buffers");
  Napi::Array arr = info[2].As<Napi::Array>();
  std::vector<struct inet_diag_sockid> ids(arr.Length());
  for (uint32_t i = 0; i < arr.Length(); i++) {
    Napi::Value v = arr.Get(i);
    if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array ||
        v.As<Napi::Uint8Array>().ByteLength() != sizeof(struct inet_diag_sockid)) {
      throwArgError(env, "each id must be a " + std::to_string(sizeof(struct inet_diag_sockid)) +
                             "-byte Buffer (struct inet_diag_sockid)");
    }
    std::memcpy(&ids[i], v.As<Napi::Uint8Array>().Data(), sizeof ids[i]);
  }
  const int nsFd = optNetnsFd(info, 3);
  UniqueFd ns = dupFdOrThrow(env, nsFd, "netnsFd");
  return (new DestroyWorker(env, r, std::move(ids), std::move(ns), nsFd))->Start();
}

}  // namespace

void InitSockDiag(Napi::Env env, Napi::Object exports) {
  exports.Set("inetDiagDump", Napi::Function::New(env, InetDiagDump, "inetDiagDump"));
  exports.Set("inetDiagDestroy", Napi::Function::New(env, InetDiagDestroy, "inetDiagDestroy"));
}

}  // namespace lbn
