// ICMP echo: one socket that sends echo requests and hands the replies, and
// the errors the network returns about them, to a JS callback. Generic (no
// nodes, no mesh); timeouts are the caller's.
//
// Ping sockets first (SOCK_DGRAM, IPPROTO_ICMP/ICMPV6): no privilege needed
// when net.ipv4.ping_group_range holds our group, and the kernel writes the
// identifier (the socket's "port", read back after an explicit bind) and the
// checksum, and delivers only replies carrying that identifier. The range is
// "1 0" (nobody, root included) in every new network namespace and on many
// hosts, so "auto" falls back to SOCK_RAW (CAP_NET_RAW): a random identifier
// of ours, the IPv4 checksum ours, IPv4 reads start with the IP header, and
// every raw ICMP socket sees every reply (ICMP_FILTER/ICMP6_FILTER keep echo
// replies, other identifiers are dropped here).
// IP_RECVERR/IPV6_RECVERR queue each ICMP error about a request we sent on
// the socket's error queue (sock_extended_err: errno, ICMP type/code, the
// router, and the start of our request, so its sequence): "unreachable" is
// told from silence. libuv takes POLLERR (a non-empty error queue) as fatal
// and stops the poll handle: the callback drains the queue and restarts it.
// One uv_poll on the main loop, no thread, unref'd (an idle socket keeps no
// process alive); close(), GC and environment teardown close the fd.
//
//   new IcmpSocket(family 4|6, onMessages(msgs[]), { kind: 'auto'|'dgram'|'raw', netnsFd })
//     .family .kind ('dgram'|'raw') .id .closed
//     .send(address, seq, payload?)   sendto(2); throws on a synchronous failure
//     .close()
#include <arpa/inet.h>
#include <net/if.h>  // before the linux/ headers: libc-compat then skips its IFF_* duplicates
#include <linux/errqueue.h>
#include <linux/icmp.h>
#include <netinet/icmp6.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <uv.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "errors.h"
#include "netns.h"

namespace lbn {

namespace {

constexpr uint8_t kEchoRequest4 = 8;
constexpr uint8_t kEchoReply4 = 0;
constexpr uint8_t kEchoRequest6 = 128;
constexpr uint8_t kEchoReply6 = 129;
constexpr size_t kIcmpHeader = 8;
// Largest payload of one echo request (an IPv4 datagram's 65535 minus headers).
constexpr size_t kMaxPayload = 65507 - kIcmpHeader;
// Messages read from each queue per wake-up; more wait for the next (level-triggered).
constexpr int kMaxPerWake = 256;
// Consecutive wake-ups with POLLERR and nothing to read before giving up.
constexpr int kMaxEmptyErrors = 64;
constexpr int kReceiveBuffer = 1 << 20;

uint16_t inetChecksum(const uint8_t* p, size_t n) {
  uint32_t s = 0;
  for (size_t i = 0; i + 1 < n; i += 2) s += (uint32_t(p[i]) << 8) | p[i + 1];
  if (n & 1) s += uint32_t(p[n - 1]) << 8;
  while (s >> 16) s = (s & 0xffff) + (s >> 16);
  return static_cast<uint16_t>(~s);
}

std::string addrText(const struct sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = "";
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof text);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, text, sizeof text);
  }
  return text;
}

// Opens and configures one socket inside nsFd's namespace (or here): the fd, or a negative errno.
int openIcmp(int family, bool raw, int nsFd) {
  NetnsResult made = runInNetns(nsFd, [family, raw] {
    int fd = ::socket(family == 4 ? AF_INET : AF_INET6, (raw ? SOCK_RAW : SOCK_DGRAM) | SOCK_NONBLOCK | SOCK_CLOEXEC,
                      family == 4 ? int(IPPROTO_ICMP) : int(IPPROTO_ICMPV6));
    return fd >= 0 ? fd : -errno;
  });
  if (made.setnsErr != 0) return -made.setnsErr;
  if (made.value < 0) return made.value;
  UniqueFd fd(made.value);
  const int one = 1;
  int rc = family == 4 ? ::setsockopt(fd.get(), SOL_IP, IP_RECVERR, &one, sizeof one)
                       : ::setsockopt(fd.get(), SOL_IPV6, IPV6_RECVERR, &one, sizeof one);
  if (rc != 0) return -errno;
  // Best effort: a burst of replies (a mesh probing hundreds of nodes) fits; capped by rmem_max.
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &kReceiveBuffer, sizeof kReceiveBuffer);
  if (raw && family == 4) {
    struct icmp_filter f;
    f.data = ~(1U << ICMP_ECHOREPLY);  // a set bit blocks that type
    if (::setsockopt(fd.get(), SOL_RAW, ICMP_FILTER, &f, sizeof f) != 0) return -errno;
  } else if (raw) {
    struct icmp6_filter f;
    ICMP6_FILTER_SETBLOCKALL(&f);
    ICMP6_FILTER_SETPASS(ICMP6_ECHO_REPLY, &f);
    if (::setsockopt(fd.get(), IPPROTO_ICMPV6, ICMP6_FILTER, &f, sizeof f) != 0) return -errno;
  } else {
    // Bind now, so the identifier the kernel gives this ping socket is known before the first send.
    struct sockaddr_storage ss;
    std::memset(&ss, 0, sizeof ss);
    ss.ss_family = family == 4 ? AF_INET : AF_INET6;
    socklen_t len = family == 4 ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) return -errno;
  }
  return fd.release();
}

class IcmpSocket;

// What the poll handle needs; outlives the wrapper until uv_close's callback.
struct PollState {
  uv_poll_t poll;
  UniqueFd fd;
  IcmpSocket* owner = nullptr;  // null once closed
  int emptyErrors = 0;
};

void OnPoll(uv_poll_t* handle, int status, int events);

class IcmpSocket : public Napi::ObjectWrap<IcmpSocket> {
 public:
  static Napi::Function Class(Napi::Env env) {
    return DefineClass(env, "IcmpSocket",
                       {
                           InstanceAccessor<&IcmpSocket::Family>("family"),
                           InstanceAccessor<&IcmpSocket::Kind>("kind"),
                           InstanceAccessor<&IcmpSocket::Id>("id"),
                           InstanceAccessor<&IcmpSocket::Closed>("closed"),
                           InstanceMethod<&IcmpSocket::Send>("send"),
                           InstanceMethod<&IcmpSocket::CloseJs>("close"),
                       });
  }

  explicit IcmpSocket(const Napi::CallbackInfo& info) : Napi::ObjectWrap<IcmpSocket>(info) {
    Napi::Env env = info.Env();
    const int32_t family = argI32(info, 0, "family");
    if (family != 4 && family != 6) throwArgError(env, "family must be 4 or 6");
    if (info.Length() < 2 || !info[1].IsFunction()) throwArgError(env, "onMessages must be a function");
    std::string kind = "auto";
    int nsFd = -1;
    if (info.Length() > 2 && !info[2].IsUndefined()) {
      if (!info[2].IsObject()) throwArgError(env, "options must be an object");
      Napi::Object o = info[2].As<Napi::Object>();
      Napi::Value k = o.Get("kind");
      if (!k.IsUndefined()) {
        if (!k.IsString()) throwArgError(env, "kind must be 'auto', 'dgram' or 'raw'");
        kind = k.As<Napi::String>().Utf8Value();
        if (kind != "auto" && kind != "dgram" && kind != "raw") throwArgError(env, "kind must be 'auto', 'dgram' or 'raw'");
      }
      Napi::Value n = o.Get("netnsFd");
      if (!n.IsUndefined()) {
        if (!n.IsNumber() || n.As<Napi::Number>().Int32Value() < 0) throwArgError(env, "netnsFd must be a file descriptor");
        nsFd = n.As<Napi::Number>().Int32Value();
      }
    }
    family_ = family;
    int fd = -1;
    int dgramErr = 0;
    if (kind != "raw") {
      fd = openIcmp(family, false, nsFd);
      if (fd < 0) {
        dgramErr = -fd;
        if (kind == "dgram") {
          ErrCtx c;
          c.detail = dgramErr == EACCES ? "the process's group is outside net.ipv4.ping_group_range" : "";
          throwBpfError(env, family == 4 ? "socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)" : "socket(AF_INET6, SOCK_DGRAM, IPPROTO_ICMPV6)",
                        dgramErr, c);
        }
      }
    }
    if (fd < 0) {
      fd = openIcmp(family, true, nsFd);
      if (fd < 0) {
        ErrCtx c;
        if (dgramErr != 0) c.detail = "and no ping socket either (" + errnoName(dgramErr) + ")";
        throwBpfError(env, family == 4 ? "socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)" : "socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6)", -fd, c);
      }
      raw_ = true;
    }
    UniqueFd owned(fd);
    if (raw_) {
      uint16_t r = 0;
      while (r == 0) {
        if (::getrandom(&r, sizeof r, 0) != sizeof r) r = static_cast<uint16_t>(::getpid() ^ fd);
      }
      id_ = r;
    } else {
      struct sockaddr_storage ss;
      socklen_t len = sizeof ss;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) throwBpfError(env, "getsockname", errFromErrno());
      id_ = ntohs(family == 4 ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    }
    uv_loop_t* loop = nullptr;
    if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == nullptr) throwBpfError(env, "napi_get_uv_event_loop", EINVAL);
    auto* st = new PollState();
    if (int e = uv_poll_init(loop, &st->poll, fd)) {
      delete st;
      throwBpfError(env, "uv_poll_init", -e);
    }
    st->fd = std::move(owned);
    st->owner = this;
    st->poll.data = st;
    uv_unref(reinterpret_cast<uv_handle_t*>(&st->poll));
    st_ = st;
    buf_.resize(kMaxPayload + kIcmpHeader + 60);
    // The callback is held by the JS object itself, not by a persistent
    // reference: a callback closing over its socket would otherwise keep
    // both alive forever, and the finalizer would never close the fd.
    info.This().As<Napi::Object>().DefineProperty(
        Napi::PropertyDescriptor::Value("onMessages", info[1], napi_default));
    context_ = new Napi::AsyncContext(env, "lbctl.icmp");
    uv_poll_start(&st->poll, UV_READABLE, OnPoll);
  }

  ~IcmpSocket() override { Close(); }

  // Reads both queues (errors first: they say why a reply will not come) and
  // delivers what it read in one call.
  void Drain(int status) {
    PollState* st = st_;
    Napi::Env env = Env();
    Napi::HandleScope scope(env);
    Napi::Array out = Napi::Array::New(env);
    uint32_t n = 0;
    int read = 0;
    for (int i = 0; i < kMaxPerWake && ReadError(env, out, &n) == 0; i++) read++;
    for (int i = 0; i < kMaxPerWake && ReadReply(env, out, &n) == 0; i++) read++;
    if (status < 0) {
      // POLLERR: libuv has stopped the handle. Drained, it is no error for us.
      st->emptyErrors = read == 0 ? st->emptyErrors + 1 : 0;
      if (st->emptyErrors < kMaxEmptyErrors) {
        uv_poll_start(&st->poll, UV_READABLE, OnPoll);
      } else {
        Napi::Object m = Napi::Object::New(env);
        m.Set("type", "fatal");
        m.Set("errno", errnoName(status == UV_EBADF ? EBADF : -status));
        m.Set("detail", "the socket keeps reporting an error with nothing to read; no longer polled");
        out.Set(n++, m);
      }
    } else {
      st->emptyErrors = 0;
    }
    if (n == 0) return;
    Napi::Object self = Value();
    if (self.IsEmpty()) return;  // collected, finalizer pending
    Napi::Value cb = self.Get("onMessages");
    if (!cb.IsFunction()) return;
    try {
      cb.As<Napi::Function>().MakeCallback(self, {out}, *context_);
    } catch (const Napi::Error& e) {
      // Nowhere to return it to: the process's uncaughtException, as for any callback.
      napi_fatal_exception(env, e.Value());
    }
  }

  void Close() {
    if (st_ == nullptr) return;
    PollState* st = st_;
    st_ = nullptr;
    st->owner = nullptr;
    // uv_close takes the fd out of epoll at once; the state goes with the handle.
    uv_close(reinterpret_cast<uv_handle_t*>(&st->poll), [](uv_handle_t* h) { delete static_cast<PollState*>(h->data); });
    st->fd.reset();
    delete context_;
    context_ = nullptr;
  }

 private:
  Napi::Value Family(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), family_); }
  Napi::Value Kind(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), raw_ ? "raw" : "dgram"); }
  Napi::Value Id(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), id_); }
  Napi::Value Closed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), st_ == nullptr); }

  Napi::Value CloseJs(const Napi::CallbackInfo& info) {
    Close();
    return info.Env().Undefined();
  }

  Napi::Value Send(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const std::string address = argString(info, 0, "address");
    const uint32_t seq = argU32(info, 1, "seq");
    if (seq > 0xffff) throwArgError(env, "seq must fit in a u16");
    const uint8_t* payload = nullptr;
    size_t payloadLen = 0;
    if (info.Length() > 2 && !info[2].IsUndefined()) {
      Napi::Uint8Array p = argBytes(info, 2, "payload");
      payload = p.Data();
      payloadLen = p.ByteLength();
      if (payloadLen > kMaxPayload) throwArgError(env, "payload must be at most " + std::to_string(kMaxPayload) + " bytes");
    }
    if (st_ == nullptr) {
      ErrCtx c;
      c.reason = "the socket is closed";
      throwBpfError(env, "send", EBADF, c);
    }

    struct sockaddr_storage ss;
    std::memset(&ss, 0, sizeof ss);
    socklen_t salen;
    if (family_ == 4) {
      auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
      sin->sin_family = AF_INET;
      if (inet_pton(AF_INET, address.c_str(), &sin->sin_addr) != 1) throwArgError(env, "not an IPv4 address: " + address);
      salen = sizeof *sin;
    } else {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
      sin6->sin6_family = AF_INET6;
      std::string host = address;
      size_t pct = host.find('%');
      if (pct != std::string::npos) {  // fe80::1%eth0: a link-local address names its link
        std::string zone = host.substr(pct + 1);
        host.resize(pct);
        sin6->sin6_scope_id = if_nametoindex(zone.c_str());
        if (sin6->sin6_scope_id == 0) throwArgError(env, "no such interface: " + zone);
      }
      if (inet_pton(AF_INET6, host.c_str(), &sin6->sin6_addr) != 1) throwArgError(env, "not an IPv6 address: " + address);
      salen = sizeof *sin6;
    }

    std::vector<uint8_t> pkt(kIcmpHeader + payloadLen);
    pkt[0] = family_ == 4 ? kEchoRequest4 : kEchoRequest6;
    pkt[1] = 0;
    pkt[4] = static_cast<uint8_t>(id_ >> 8);  // a ping socket overwrites it with its own (the same)
    pkt[5] = static_cast<uint8_t>(id_);
    pkt[6] = static_cast<uint8_t>(seq >> 8);
    pkt[7] = static_cast<uint8_t>(seq);
    if (payloadLen) std::memcpy(pkt.data() + kIcmpHeader, payload, payloadLen);
    // The kernel sums ping sockets and ICMPv6 (pseudo-header) itself; a raw IPv4 socket sends what it is given.
    if (raw_ && family_ == 4) {
      uint16_t c = inetChecksum(pkt.data(), pkt.size());
      pkt[2] = static_cast<uint8_t>(c >> 8);
      pkt[3] = static_cast<uint8_t>(c);
    }
    for (;;) {
      ssize_t n = ::sendto(st_->fd.get(), pkt.data(), pkt.size(), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&ss), salen);
      if (n >= 0) break;
      if (errno == EINTR) continue;
      ErrCtx c;
      c.path = address;
      throwBpfError(env, "sendto", errFromErrno(), c);
    }
    return env.Undefined();
  }

  // Parses an ICMP header at p: type, id, seq, and the payload after it.
  static void setEcho(Napi::Env env, Napi::Object m, const uint8_t* p, size_t len) {
    m.Set("id", (p[4] << 8) | p[5]);
    m.Set("seq", (p[6] << 8) | p[7]);
    m.Set("payload", Napi::Buffer<uint8_t>::Copy(env, p + kIcmpHeader, len - kIcmpHeader));
  }

  // One message of the error queue: 0 (delivered or skipped) or -1 (empty / failed).
  int ReadError(Napi::Env env, Napi::Array out, uint32_t* n) {
    struct sockaddr_storage to;
    char control[512];
    struct iovec iov = {buf_.data(), buf_.size()};
    struct msghdr msg;
    std::memset(&msg, 0, sizeof msg);
    msg.msg_name = &to;
    msg.msg_namelen = sizeof to;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t len = ::recvmsg(st_->fd.get(), &msg, MSG_ERRQUEUE | MSG_DONTWAIT);
    if (len < 0) return errno == EINTR ? 0 : -1;
    const struct sock_extended_err* ee = nullptr;
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if ((c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
          (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR)) {
        ee = reinterpret_cast<const sock_extended_err*>(CMSG_DATA(c));
      }
    }
    if (ee == nullptr) return 0;
    const uint8_t* p = buf_.data();
    const size_t plen = std::min(static_cast<size_t>(len), buf_.size());
    const bool icmp = ee->ee_origin == SO_EE_ORIGIN_ICMP || ee->ee_origin == SO_EE_ORIGIN_ICMP6;
    // The start of what we sent: ours only if it is an echo request with our identifier
    // (a raw socket is told about every ICMP socket's packets).
    if (plen >= kIcmpHeader) {
      const uint8_t req = family_ == 4 ? kEchoRequest4 : kEchoRequest6;
      if (p[0] != req || ((p[4] << 8) | p[5]) != id_) return 0;
    } else if (raw_ && icmp) {
      return 0;
    }
    Napi::Object m = Napi::Object::New(env);
    m.Set("type", "error");
    m.Set("errno", errnoName(static_cast<int>(ee->ee_errno)));
    m.Set("origin", icmp ? "icmp" : ee->ee_origin == SO_EE_ORIGIN_LOCAL ? "local" : "other");
    m.Set("icmpType", ee->ee_type);
    m.Set("icmpCode", ee->ee_code);
    m.Set("info", ee->ee_info);  // the next-hop MTU of a "fragmentation needed"/"packet too big"
    m.Set("to", msg.msg_namelen > 0 ? addrText(reinterpret_cast<sockaddr*>(&to)) : "");
    m.Set("offender", icmp ? addrText(SO_EE_OFFENDER(ee)) : "");
    if (plen >= kIcmpHeader) setEcho(env, m, p, plen);
    out.Set((*n)++, m);
    return 0;
  }

  // One echo reply: 0 (delivered or skipped) or -1 (empty / failed).
  int ReadReply(Napi::Env env, Napi::Array out, uint32_t* n) {
    struct sockaddr_storage from;
    struct iovec iov = {buf_.data(), buf_.size()};
    struct msghdr msg;
    std::memset(&msg, 0, sizeof msg);
    msg.msg_name = &from;
    msg.msg_namelen = sizeof from;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    ssize_t len = ::recvmsg(st_->fd.get(), &msg, MSG_DONTWAIT);
    if (len < 0) {
      // EAGAIN: drained. A pending socket error (a ping socket's last ICMP error,
      // already read from the error queue) is returned once and cleared: go on.
      if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
      return errno == EINTR || errno == EHOSTUNREACH || errno == ENETUNREACH || errno == ECONNREFUSED ||
                     errno == EACCES || errno == EMSGSIZE || errno == EPROTO || errno == ENOPROTOOPT ||
                     errno == ETIMEDOUT
                 ? 0
                 : -1;
    }
    const uint8_t* p = buf_.data();
    size_t plen = std::min(static_cast<size_t>(len), buf_.size());
    if (raw_ && family_ == 4) {  // a raw IPv4 socket reads the IP header too
      if (plen < 20 || (p[0] >> 4) != 4) return 0;
      const size_t ihl = static_cast<size_t>(p[0] & 15) * 4;
      if (ihl < 20 || plen < ihl) return 0;
      p += ihl;
      plen -= ihl;
    }
    if (plen < kIcmpHeader) return 0;
    if (p[0] != (family_ == 4 ? kEchoReply4 : kEchoReply6) || p[1] != 0) return 0;
    if (((p[4] << 8) | p[5]) != id_) return 0;  // another raw socket's reply
    Napi::Object m = Napi::Object::New(env);
    m.Set("type", "reply");
    m.Set("from", addrText(reinterpret_cast<sockaddr*>(&from)));
    setEcho(env, m, p, plen);
    out.Set((*n)++, m);
    return 0;
  }

  int family_ = 4;
  bool raw_ = false;
  uint16_t id_ = 0;
  PollState* st_ = nullptr;
  Napi::AsyncContext* context_ = nullptr;
  std::vector<uint8_t> buf_;
};

void OnPoll(uv_poll_t* handle, int status, int) {
  auto* st = static_cast<PollState*>(handle->data);
  if (st->owner != nullptr) st->owner->Drain(status);
}

}  // namespace

void InitIcmp(Napi::Env env, Napi::Object exports) {
  exports.Set("IcmpSocket", IcmpSocket::Class(env));
}

}  // namespace lbn
