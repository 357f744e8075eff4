// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Socket-level service load balancing, attached to one cgroup v2 path.
 *
 * connect/sendmsg translate a service address to a backend before the
 * kernel routes anything, so no packet ever carries the service address.
 * recvmsg/getpeername translate back, so the application only ever sees the
 * service. Entries are thin: each picks a verdict from a __ helper that
 * returns 0 or -errno and works on plain addresses (so IPv4-mapped IPv6
 * sockets reuse the IPv4 path, and tests can drive the helpers directly).
 *
 * NodePorts from the node and its pods (docs/socket-lb.md): a destination
 * that is no frontend but a node address, loopback or 0.0.0.0/:: on a
 * nodePort is balanced through the NodePort surrogate, and post_bind keeps
 * nodePorts free of local listeners. A frontend with two scopes is served
 * to these clients from its internal-scope twin.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/errno.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "include/lb_types.h"
#include "include/lb_maps.h"
#include "lib/addr.h"
#include "lib/lb.h"

/* Verdicts of cgroup sock_addr programs. */
#define SYS_REJECT	0
#define SYS_PROCEED	1

/* Not a service address: leave the socket alone. */
#define LB_NOT_SERVICE	ENXIO

/* The socket's identity; BPF unit tests (tc vehicles) define their own. */
#ifndef lb_sock_cookie
#define lb_sock_cookie(ctx)	bpf_get_socket_cookie(ctx)
#endif
#ifndef lb_netns_cookie
#define lb_netns_cookie(ctx)	bpf_get_netns_cookie(ctx)
#endif

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/*
 * Not SCTP: no kernel runs the connect, sendmsg, recvmsg, bind or post_bind
 * hooks for an SCTP socket (docs/kernels.md, "SCTP"; test/e2e/sctp.ts
 * measures it), so there is nothing to translate, and nothing for
 * getpeername (which does run) to translate back.
 */
static __always_inline bool proto_is_balanced(__u32 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP;
}

static __always_inline __be16 ctx_dst_port(const struct bpf_sock_addr *ctx)
{
	volatile __u32 port = ctx->user_port; /* 4-byte load, see kernel docs */

	return (__be16)port;
}

/*
 * bpf_set_retval exists from 5.18 on. The compat build (sock_compat.bpf.o,
 * LB_HAVE_SET_RETVAL=0) leaves it out, and the loader falls back to it on
 * kernels that reject the helper: refusals there are EPERM.
 */
#ifndef LB_HAVE_SET_RETVAL
#define LB_HAVE_SET_RETVAL 1
#endif

/*
 * Refuse the syscall with `err` (ECONNREFUSED for connect and sendmsg, as
 * kube-proxy's REJECT rule does; EADDRINUSE for bind). Without
 * bpf_set_retval the kernel turns a rejection into EPERM.
 */
static __always_inline int sys_refuse(int err)
{
#if LB_HAVE_SET_RETVAL
	bpf_set_retval(-err);
#endif
	return SYS_REJECT;
}

/*
 * Where a socket's rev-NAT goes. A TCP socket connects to one backend,
 * once (again only after a failed connect, which overwrites it): its entry
 * is a slot of lb*_sock_peer, an array indexed by the socket's cookie,
 * written at connect and cleared at sock_release in place, without a lock.
 * An LRU entry costs an update at connect and a delete at close, each
 * under the bucket's and the LRU's irq-saving spin locks, and socket-local
 * storage an allocation and a free under such locks: on this 6.18 build
 * (a nested guest) the LRU pair was the whole of lbctl's cost over a
 * minimal socket LB, and socket storage saved a fifth of it
 * (bench/sock-floor.ts, docs/benchmarks.md).
 *
 * A socket has two candidate slots: its cookie's low bits (cookies are
 * handed out in sequence, so live sockets seldom meet there) and a
 * multiplicative hash of it (so a socket that outlives LB_SOCK_PEER_SLOTS
 * newer ones is not pushed out by the one that wraps onto it). It takes a
 * free one, else the one whose socket is older. A reader accepts a slot
 * only while it holds its own cookie before and after the copy; a writer
 * frees the slot first and names the socket last.
 *
 * UDP keeps the LRU (lb*_sock_revnat, keyed by socket cookie and backend):
 * an unconnected socket sends to several backends, and the agent finds the
 * connected sockets of a removed backend by their entries (sock_diag gives
 * it cookies, not sockets). An entry is written only when it is missing or
 * says something else, as Cilium's sock4_update_revnat does: an
 * unconnected UDP socket records the same entry for every datagram it
 * sends to a backend, and an LRU hash update replaces the element even
 * when the value is the same (a new element from the free list, the old
 * one freed). The lookup itself marks the entry as recently used, so the
 * LRU keeps it as before. LB_REVNAT_ALWAYS_WRITE=1 builds the old
 * unconditional write: the benchmark's baseline, never loaded by lbctl.
 */
#ifndef LB_REVNAT_ALWAYS_WRITE
#define LB_REVNAT_ALWAYS_WRITE 0
#endif

/* Orders the slot's cookie against its other fields (both sides run on one CPU each). */
#define lb_barrier()	asm volatile("" ::: "memory")

/* A socket's two candidate slots in lb*_sock_peer. */
static __always_inline __u32 sock_peer_slot(__u64 cookie, int way)
{
	if (!way)
		return (__u32)cookie & (LB_SOCK_PEER_SLOTS - 1);
	return (__u32)((cookie * 0x9e3779b97f4a7c15ULL) >> 32) & (LB_SOCK_PEER_SLOTS - 1);
}

/*
 * The slot a socket's entry goes to: its first slot when that is free or
 * its own, else its second when that is, else the one of the older socket
 * (smaller cookie). The first slots of sockets made one after the other
 * are neighbours, so the common case touches memory the last connect
 * touched; the second slot is a cache (and TLB) miss, paid only when the
 * first is taken. Works for either family's array (the cookie is every
 * value's first field).
 */
static __always_inline __u64 *sock_peer_claim(void *map, __u64 cookie)
{
	__u32 a = sock_peer_slot(cookie, 0), b = sock_peer_slot(cookie, 1);
	__u64 *pa, *pb;

	pa = bpf_map_lookup_elem(map, &a);
	if (!pa)
		return NULL;
	if (!*pa || *pa == cookie)
		return pa;
	pb = bpf_map_lookup_elem(map, &b);
	if (!pb)
		return NULL;
	if (!*pb || *pb == cookie)
		return pb;
	return *pa < *pb ? pa : pb;
}

/* The slot holding the socket's entry, or NULL. */
static __always_inline __u64 *sock_peer_find(void *map, __u64 cookie)
{
	__u32 a = sock_peer_slot(cookie, 0), b = sock_peer_slot(cookie, 1);
	__u64 *p;

	p = bpf_map_lookup_elem(map, &a);
	if (p && *p == cookie)
		return p;
	p = bpf_map_lookup_elem(map, &b);
	if (p && *p == cookie)
		return p;
	return NULL;
}

/* ------------------------------------------------------------------ IPv4 */

static __always_inline bool sock4_revnat_same(const struct lb4_sock_revnat *a, const struct lb4_sock_revnat *b)
{
	return a->address == b->address && a->port == b->port && a->rev_nat_index == b->rev_nat_index;
}

/*
 * 0 when the entry is in place (written or already there), else -errno.
 * `dialled` is the address the socket asked for, which replies and
 * getpeername() report: the frontend's own address, or for a NodePort the
 * node or loopback address it was dialled on (never the surrogate's 0.0.0.0).
 */
static __always_inline int sock4_record_revnat(void *ctx, const struct lb4_backend *backend, __be32 dialled,
					       const struct lb4_key *svc_key, __u32 rev_nat_index)
{
	struct lb4_sock_key key = {
		.address = backend->address,
		.port = backend->port,
	};
	struct lb4_sock_revnat val = {
		.address = dialled,
		.port = svc_key->dport,
		.rev_nat_index = rev_nat_index,
	};
	struct lb4_sock_revnat *old;
	struct lb4_sock_peer *peer;

	key.cookie = lb_sock_cookie(ctx);
	if (svc_key->proto == IPPROTO_TCP) {
		peer = (struct lb4_sock_peer *)sock_peer_claim(&lb4_sock_peer, key.cookie);
		if (!peer)
			return -ENOMEM;
		peer->cookie = 0;
		lb_barrier();
		peer->backend = backend->address;
		peer->backend_port = backend->port;
		peer->address = dialled;
		peer->port = svc_key->dport;
		peer->rev_nat_index = rev_nat_index;
		lb_barrier();
		peer->cookie = key.cookie;
		return 0;
	}
	if (!LB_REVNAT_ALWAYS_WRITE) {
		old = bpf_map_lookup_elem(&lb4_sock_revnat, &key);
		if (old && sock4_revnat_same(old, &val))
			return 0;
	}
	return bpf_map_update_elem(&lb4_sock_revnat, &key, &val, BPF_ANY);
}

#define LB_LOOPBACK4		bpf_htonl(0x7f000001)	/* 127.0.0.1 */
#define LB_LOOPBACK4_NET	bpf_htonl(0x7f000000)	/* 127.0.0.0/8 */
#define LB_LOOPBACK4_MASK	bpf_htonl(0xff000000)

/*
 * Where the NodePort surrogate answers a socket of the node or a pod: the
 * node's addresses (lb_node_addrs) and loopback (127.0.0.0/8, as Cilium
 * and kube-proxy's LOCAL address type). 0.0.0.0 needs no check: it is the
 * surrogate's own key, found by the first lookup.
 */
static __always_inline bool sock4_nodeport_dst(__be32 addr)
{
	return (addr & LB_LOOPBACK4_MASK) == LB_LOOPBACK4_NET || lb4_is_node_addr(addr);
}

/*
 * A frontend miss: the NodePort surrogate for the port and protocol when
 * the destination is this node; key->address is 0 then. Checking the
 * surrogate first keeps non-service traffic at one lookup more: few
 * destination ports are nodePorts, so lb_node_addrs is seldom consulted.
 */
static __always_inline struct lb_service *sock4_lookup_nodeport(struct lb4_key *key)
{
	__be32 dst = key->address;
	struct lb_service *svc;

	svc = lb4_lookup_surrogate(key);
	if (!svc || sock4_nodeport_dst(dst))
		return svc;
	key->address = dst;
	return NULL;
}

/*
 * Service address -> backend, in place. Returns 0 when translated,
 * -LB_NOT_SERVICE when the address is no service (three lookups at most,
 * and lb_node_addrs when the port is a nodePort), -ECONNREFUSED when the
 * caller must refuse the syscall.
 */
static __always_inline int __sock4_xlate_fwd(void *ctx, __u32 proto, __be32 *addr, __be16 *port)
{
	struct lb4_key key = {
		.address = *addr,
		.dport = *port,
		.proto = proto,
	};
	/* connect() to 0.0.0.0 reaches the local host: report loopback, as the kernel would */
	__be32 dialled = *addr ? *addr : LB_LOOPBACK4;
	struct lb4_backend *backend;
	struct lb_service *svc;
	__u32 backend_id = 0;

	if (!proto_is_balanced(proto))
		return -LB_NOT_SERVICE;

	svc = lb4_lookup_service(&key);
	if (!svc) {
		if (lb4_lookup_wildcard(&key)) {
			lb_count(LB_MTR_NO_SERVICE_PORT);
			return -ECONNREFUSED;
		}
		svc = sock4_lookup_nodeport(&key);
		if (!svc)
			return -LB_NOT_SERVICE;
	}
	svc = lb4_client_view(&key, svc);
	if (!lb_svc_has_backends(svc)) {
		lb_count(LB_MTR_NO_BACKEND);
		return -ECONNREFUSED;
	}
	backend = lb4_select_backend(&key, svc, lb_netns_cookie(ctx), &backend_id);
	if (!backend) {
		lb_count(LB_MTR_BACKEND_MISSING);
		return -ECONNREFUSED;
	}

	/*
	 * Replies to UDP and getpeername() on any socket are translated back
	 * from this entry. Without it a UDP client would drop every reply, so
	 * UDP refuses rather than proceed; TCP only loses getpeername.
	 */
	if (sock4_record_revnat(ctx, backend, dialled, &key,
				svc->rev_nat_index) < 0) {
		lb_count(LB_MTR_REVNAT_UPDATE_FAIL);
		if (proto == IPPROTO_UDP)
			return -ECONNREFUSED;
	}

	*addr = backend->address;
	*port = backend->port;
	lb_count(LB_MTR_XLATE_FWD);
	return 0;
}

/*
 * Whether the frontend a socket rev-NAT entry names still exists under the
 * same rev-NAT id: the entry at the recorded address (its internal twin's
 * id counts too), else, for a NodePort recorded at the node or loopback
 * address it was dialled on, the surrogate. A live ClusterIP costs one
 * lookup, as before.
 */
static __always_inline bool sock4_revnat_live(const struct lb4_sock_revnat *val, __u32 proto)
{
	struct lb4_key key = {
		.address = val->address,
		.dport = val->port,
		.proto = proto,
	};
	struct lb_service *svc;

	svc = lb4_lookup_service(&key);
	if (svc && lb4_frontend_has_revnat(&key, svc, val->rev_nat_index))
		return true;
	svc = lb4_lookup_surrogate(&key);
	return svc && lb4_frontend_has_revnat(&key, svc, val->rev_nat_index);
}

/*
 * Backend -> service address, in place, for the socket the entry was
 * recorded for. A stale entry (service gone or re-created under another
 * rev-NAT id) is removed as it is read. Never fails the syscall.
 */
static __always_inline int __sock4_xlate_rev(void *ctx, __u32 proto, __be32 *addr, __be16 *port)
{
	struct lb4_sock_key key = {
		.cookie = lb_sock_cookie(ctx),
		.address = *addr,
		.port = *port,
	};
	struct lb4_sock_revnat *val, peer_val;
	struct lb4_sock_peer *peer;
	__be32 backend;
	__be16 backend_port;

	if (proto == IPPROTO_TCP) {
		peer = (struct lb4_sock_peer *)sock_peer_find(&lb4_sock_peer, key.cookie);
		if (peer) {
			backend = peer->backend;
			backend_port = peer->backend_port;
			peer_val.address = peer->address;
			peer_val.port = peer->port;
			peer_val.rev_nat_index = peer->rev_nat_index;
			lb_barrier();
			if (peer->cookie != key.cookie || backend != *addr || backend_port != *port)
				return -ENOENT;
			if (!sock4_revnat_live(&peer_val, proto)) {
				peer->cookie = 0;
				lb_count(LB_MTR_REVNAT_STALE);
				return -ENOENT;
			}
			*addr = peer_val.address;
			*port = peer_val.port;
			lb_count(LB_MTR_XLATE_REV);
			return 0;
		}
		/* else: a socket connected before lb4_sock_peer existed, in the LRU */
	}
	val = bpf_map_lookup_elem(&lb4_sock_revnat, &key);
	if (!val)
		return -ENOENT;

	if (!sock4_revnat_live(val, proto)) {
		bpf_map_delete_elem(&lb4_sock_revnat, &key);
		lb_count(LB_MTR_REVNAT_STALE);
		return -ENOENT;
	}

	*addr = val->address;
	*port = val->port;
	lb_count(LB_MTR_XLATE_REV);
	return 0;
}

/* ------------------------------------------------------------------ IPv6 */

static __always_inline bool sock6_revnat_same(const struct lb6_sock_revnat *a, const struct lb6_sock_revnat *b)
{
	return a->address[0] == b->address[0] && a->address[1] == b->address[1] &&
	       a->address[2] == b->address[2] && a->address[3] == b->address[3] &&
	       a->port == b->port && a->rev_nat_index == b->rev_nat_index;
}

/* As sock4_record_revnat. */
static __always_inline int sock6_record_revnat(void *ctx, const struct lb6_backend *backend, const __be32 *dialled,
					       const struct lb6_key *svc_key, __u32 rev_nat_index)
{
	struct lb6_sock_key key = {
		.port = backend->port,
	};
	struct lb6_sock_revnat val = {
		.port = svc_key->dport,
		.rev_nat_index = rev_nat_index,
	};
	struct lb6_sock_revnat *old;
	struct lb6_sock_peer *peer;

	key.cookie = lb_sock_cookie(ctx);
	if (svc_key->proto == IPPROTO_TCP) {
		peer = (struct lb6_sock_peer *)sock_peer_claim(&lb6_sock_peer, key.cookie);
		if (!peer)
			return -ENOMEM;
		peer->cookie = 0;
		lb_barrier();
		ip6_copy(peer->backend, backend->address);
		ip6_copy(peer->address, dialled);
		peer->backend_port = backend->port;
		peer->port = svc_key->dport;
		peer->rev_nat_index = rev_nat_index;
		lb_barrier();
		peer->cookie = key.cookie;
		return 0;
	}
	ip6_copy(key.address, backend->address);
	ip6_copy(val.address, dialled);
	if (!LB_REVNAT_ALWAYS_WRITE) {
		old = bpf_map_lookup_elem(&lb6_sock_revnat, &key);
		if (old && sock6_revnat_same(old, &val))
			return 0;
	}
	return bpf_map_update_elem(&lb6_sock_revnat, &key, &val, BPF_ANY);
}

static __always_inline bool ip6_is_zero(const __be32 *a)
{
	return !(a[0] | a[1] | a[2] | a[3]);
}

/* ::1 */
static __always_inline bool ip6_is_loopback(const __be32 *a)
{
	return !(a[0] | a[1] | a[2]) && a[3] == bpf_htonl(1);
}

/* As sock4_nodeport_dst: the node's addresses and ::1 (:: is the surrogate's own key). */
static __always_inline bool sock6_nodeport_dst(const __be32 *addr)
{
	return ip6_is_loopback(addr) || lb6_is_node_addr(addr);
}

/* As sock4_lookup_nodeport. */
static __always_inline struct lb_service *sock6_lookup_nodeport(struct lb6_key *key)
{
	struct lb_service *svc;
	__be32 dst[4];

	ip6_copy(dst, key->address);
	svc = lb6_lookup_surrogate(key);
	if (!svc || sock6_nodeport_dst(dst))
		return svc;
	ip6_copy(key->address, dst);
	return NULL;
}

static __always_inline int __sock6_xlate_fwd(void *ctx, __u32 proto, __be32 *addr, __be16 *port)
{
	struct lb6_key key = {
		.dport = *port,
		.proto = proto,
	};
	struct lb6_backend *backend;
	struct lb_service *svc;
	__u32 backend_id = 0;
	__be32 dialled[4];

	if (!proto_is_balanced(proto))
		return -LB_NOT_SERVICE;

	ip6_copy(key.address, addr);
	svc = lb6_lookup_service(&key);
	if (!svc) {
		if (lb6_lookup_wildcard(&key)) {
			lb_count(LB_MTR_NO_SERVICE_PORT);
			return -ECONNREFUSED;
		}
		svc = sock6_lookup_nodeport(&key);
		if (!svc)
			return -LB_NOT_SERVICE;
	}
	svc = lb6_client_view(&key, svc);
	/* connect() to :: reaches the local host: report ::1, as the kernel would */
	ip6_copy(dialled, addr);
	if (ip6_is_zero(dialled))
		dialled[3] = bpf_htonl(1);
	if (!lb_svc_has_backends(svc)) {
		lb_count(LB_MTR_NO_BACKEND);
		return -ECONNREFUSED;
	}
	backend = lb6_select_backend(&key, svc, lb_netns_cookie(ctx), &backend_id);
	if (!backend) {
		lb_count(LB_MTR_BACKEND_MISSING);
		return -ECONNREFUSED;
	}
	if (sock6_record_revnat(ctx, backend, dialled, &key,
				svc->rev_nat_index) < 0) {
		lb_count(LB_MTR_REVNAT_UPDATE_FAIL);
		if (proto == IPPROTO_UDP)
			return -ECONNREFUSED;
	}

	ip6_copy(addr, backend->address);
	*port = backend->port;
	lb_count(LB_MTR_XLATE_FWD);
	return 0;
}

/* As sock4_revnat_live. */
static __always_inline bool sock6_revnat_live(const struct lb6_sock_revnat *val, __u32 proto)
{
	struct lb6_key key = {
		.dport = val->port,
		.proto = proto,
	};
	struct lb_service *svc;

	ip6_copy(key.address, val->address);
	svc = lb6_lookup_service(&key);
	if (svc && lb6_frontend_has_revnat(&key, svc, val->rev_nat_index))
		return true;
	svc = lb6_lookup_surrogate(&key);
	return svc && lb6_frontend_has_revnat(&key, svc, val->rev_nat_index);
}

static __always_inline int __sock6_xlate_rev(void *ctx, __u32 proto, __be32 *addr, __be16 *port)
{
	struct lb6_sock_key key = {
		.cookie = lb_sock_cookie(ctx),
		.port = *port,
	};
	struct lb6_sock_revnat *val, peer_val;
	struct lb6_sock_peer *peer;
	__be32 backend[4];
	__be16 backend_port;

	if (proto == IPPROTO_TCP) {
		peer = (struct lb6_sock_peer *)sock_peer_find(&lb6_sock_peer, key.cookie);
		if (peer) {
			ip6_copy(backend, peer->backend);
			backend_port = peer->backend_port;
			ip6_copy(peer_val.address, peer->address);
			peer_val.port = peer->port;
			peer_val.rev_nat_index = peer->rev_nat_index;
			lb_barrier();
			if (peer->cookie != key.cookie || backend_port != *port || backend[0] != addr[0] ||
			    backend[1] != addr[1] || backend[2] != addr[2] || backend[3] != addr[3])
				return -ENOENT;
			if (!sock6_revnat_live(&peer_val, proto)) {
				peer->cookie = 0;
				lb_count(LB_MTR_REVNAT_STALE);
				return -ENOENT;
			}
			ip6_copy(addr, peer_val.address);
			*port = peer_val.port;
			lb_count(LB_MTR_XLATE_REV);
			return 0;
		}
	}
	ip6_copy(key.address, addr);
	val = bpf_map_lookup_elem(&lb6_sock_revnat, &key);
	if (!val)
		return -ENOENT;

	if (!sock6_revnat_live(val, proto)) {
		bpf_map_delete_elem(&lb6_sock_revnat, &key);
		lb_count(LB_MTR_REVNAT_STALE);
		return -ENOENT;
	}

	ip6_copy(addr, val->address);
	*port = val->port;
	lb_count(LB_MTR_XLATE_REV);
	return 0;
}

/*
 * An IPv6 socket's destination, either way: ::ffff:a.b.c.d goes through the
 * IPv4 tables (and comes back as ::ffff:<backend>), the rest through IPv6.
 */
static __always_inline int __sock6_fwd(void *ctx, __u32 proto, __be32 *addr, __be16 *port)
{
	if (ip6_is_v4mapped(addr))
		return __sock4_xlate_fwd(ctx, proto, &addr[3], port);
	return __sock6_xlate_fwd(ctx, proto, addr, port);
}

static __always_inline int __sock6_rev(void *ctx, __u32 proto, __be32 *addr, __be16 *port)
{
	if (ip6_is_v4mapped(addr))
		return __sock4_xlate_rev(ctx, proto, &addr[3], port);
	return __sock6_xlate_rev(ctx, proto, addr, port);
}

/*
 * bind() to a nodePort: refused with -EADDRINUSE whatever the address, so
 * no process of the node (or of a pod, docs/socket-lb.md) holds a port that
 * the service owns on every node address. A nodePort is the service's in
 * both families (the API server allocates it once), so both surrogates are
 * checked. Port 0 is a socket bound with IP_BIND_ADDRESS_NO_PORT: allowed.
 * `port` is in network order.
 */
static __always_inline int __sock_post_bind(__u32 proto, __be16 port)
{
	struct lb4_key k4 = { .dport = port, .proto = proto };
	struct lb6_key k6 = { .dport = port, .proto = proto };
	struct lb_service *svc;

	if (!proto_is_balanced(proto) || !port)
		return 0;
	svc = lb4_lookup_service(&k4);
	if (!svc || !lb_svc_is_nodeport(svc)) {
		svc = lb6_lookup_service(&k6);
		if (!svc || !lb_svc_is_nodeport(svc))
			return 0;
	}
	lb_count(LB_MTR_BIND_REFUSED);
	return -EADDRINUSE;
}

/* ------------------------------------------------- ctx <-> address glue */

static __always_inline int sock4_fwd(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = ctx_dst_port(ctx);
	int err;

	err = __sock4_xlate_fwd(ctx, ctx->protocol, &addr, &port);
	if (err == -ECONNREFUSED)
		return sys_refuse(ECONNREFUSED);
	if (!err) {
		ctx->user_ip4 = addr;
		ctx->user_port = (__u32)port;
	}
	return SYS_PROCEED;
}

static __always_inline void sock4_rev(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = ctx_dst_port(ctx);

	if (!__sock4_xlate_rev(ctx, ctx->protocol, &addr, &port)) {
		ctx->user_ip4 = addr;
		ctx->user_port = (__u32)port;
	}
}

static __always_inline void ctx_load_ip6(const struct bpf_sock_addr *ctx, __be32 *a)
{
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
}

static __always_inline void ctx_store_ip6(struct bpf_sock_addr *ctx, const __be32 *a)
{
	ctx->user_ip6[0] = a[0];
	ctx->user_ip6[1] = a[1];
	ctx->user_ip6[2] = a[2];
	ctx->user_ip6[3] = a[3];
}

/* IPv6 sockets; ::ffff:a.b.c.d destinations go through the IPv4 tables. */
static __always_inline int sock6_fwd(struct bpf_sock_addr *ctx)
{
	__be16 port = ctx_dst_port(ctx);
	__be32 addr[4];
	int err;

	ctx_load_ip6(ctx, addr);
	err = __sock6_fwd(ctx, ctx->protocol, addr, &port);
	if (err == -ECONNREFUSED)
		return sys_refuse(ECONNREFUSED);
	if (!err) {
		ctx_store_ip6(ctx, addr);
		ctx->user_port = (__u32)port;
	}
	return SYS_PROCEED;
}

static __always_inline void sock6_rev(struct bpf_sock_addr *ctx)
{
	__be16 port = ctx_dst_port(ctx);
	__be32 addr[4];
	int err;

	ctx_load_ip6(ctx, addr);
	err = __sock6_rev(ctx, ctx->protocol, addr, &port);
	if (!err) {
		ctx_store_ip6(ctx, addr);
		ctx->user_port = (__u32)port;
	}
}

/* --------------------------------------------------------------- entries */

SEC("cgroup/connect4")
int lb_connect4(struct bpf_sock_addr *ctx)
{
	return sock4_fwd(ctx);
}

SEC("cgroup/sendmsg4")
int lb_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock4_fwd(ctx);
}

SEC("cgroup/recvmsg4")
int lb_recvmsg4(struct bpf_sock_addr *ctx)
{
	sock4_rev(ctx);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername4")
int lb_getpeername4(struct bpf_sock_addr *ctx)
{
	sock4_rev(ctx);
	return SYS_PROCEED;
}

SEC("cgroup/connect6")
int lb_connect6(struct bpf_sock_addr *ctx)
{
	return sock6_fwd(ctx);
}

SEC("cgroup/sendmsg6")
int lb_sendmsg6(struct bpf_sock_addr *ctx)
{
	return sock6_fwd(ctx);
}

SEC("cgroup/recvmsg6")
int lb_recvmsg6(struct bpf_sock_addr *ctx)
{
	sock6_rev(ctx);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername6")
int lb_getpeername6(struct bpf_sock_addr *ctx)
{
	sock6_rev(ctx);
	return SYS_PROCEED;
}

/* bpf_sock.src_port is in host order; a refusal is EADDRINUSE (EPERM without bpf_set_retval). */
static __always_inline int sock_post_bind(struct bpf_sock *sk)
{
	if (__sock_post_bind(sk->protocol, bpf_htons((__u16)sk->src_port)) == -EADDRINUSE)
		return sys_refuse(EADDRINUSE);
	return SYS_PROCEED;
}

SEC("cgroup/post_bind4")
int lb_post_bind4(struct bpf_sock *sk)
{
	return sock_post_bind(sk);
}

SEC("cgroup/post_bind6")
int lb_post_bind6(struct bpf_sock *sk)
{
	return sock_post_bind(sk);
}

/*
 * A closing socket takes its rev-NAT entry with it. A TCP socket frees its
 * lb*_sock_peer slot (in place: a cookie compared, a word written; the LRU
 * entry of one connected before those arrays existed is left to
 * eviction). For UDP the kernel shows the connected destination here,
 * which is the backend, so connected sockets are covered. An unconnected
 * UDP socket has no destination at close: its entries (one per backend it
 * sent to) are left to LRU eviction and to the stale check in recvmsg.
 */
SEC("cgroup/sock_release")
int lb_sock_release(struct bpf_sock *sk)
{
	__u32 family = sk->family;
	__u64 cookie, *peer;

	if (sk->protocol == IPPROTO_TCP) {
		cookie = bpf_get_socket_cookie(sk);
		/* an IPv6 socket's is in the IPv4 array when it dialled ::ffff:a.b.c.d */
		peer = sock_peer_find(&lb4_sock_peer, cookie);
		if (!peer && family == AF_INET6)
			peer = sock_peer_find(&lb6_sock_peer, cookie);
		if (peer) {
			*peer = 0;
			lb_count(LB_MTR_SOCK_RELEASE);
		}
		return SYS_PROCEED;
	}
	if (sk->protocol != IPPROTO_UDP)
		return SYS_PROCEED;

	if (family == AF_INET) {
		struct lb4_sock_key key = {
			.address = sk->dst_ip4,
			.port = sk->dst_port,
		};

		if (!key.address)
			return SYS_PROCEED;
		key.cookie = bpf_get_socket_cookie(sk);
		if (!bpf_map_delete_elem(&lb4_sock_revnat, &key))
			lb_count(LB_MTR_SOCK_RELEASE);
	} else if (family == AF_INET6) {
		__be32 addr[4] = {
			sk->dst_ip6[0], sk->dst_ip6[1], sk->dst_ip6[2], sk->dst_ip6[3],
		};
		__be16 port = sk->dst_port;

		if (!(addr[0] | addr[1] | addr[2] | addr[3]))
			return SYS_PROCEED;
		cookie = bpf_get_socket_cookie(sk);
		if (ip6_is_v4mapped(addr)) {
			struct lb4_sock_key key = {
				.cookie = cookie,
				.address = addr[3],
				.port = port,
			};

			if (!bpf_map_delete_elem(&lb4_sock_revnat, &key))
				lb_count(LB_MTR_SOCK_RELEASE);
		} else {
			struct lb6_sock_key key = {
				.cookie = cookie,
				.port = port,
			};

			ip6_copy(key.address, addr);
			if (!bpf_map_delete_elem(&lb6_sock_revnat, &key))
				lb_count(LB_MTR_SOCK_RELEASE);
		}
	}
	return SYS_PROCEED;
}
