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

/* Refuse the syscall with ECONNREFUSED, as kube-proxy's REJECT rule does. */
static __always_inline int sys_refuse(void)
{
#if LB_HAVE_SET_RETVAL
	bpf_set_retval(-ECONNREFUSED);
#endif
	return SYS_REJECT;
}

/*
 * A UDP socket's rev-NAT entry is written only when it is missing or says
 * something else, as Cilium's sock4_update_revnat does. An unconnected UDP
 * socket records the same entry for every datagram it sends to a backend,
 * and an LRU hash update replaces the element even when the value is the
 * same (a new element from the free list, the old one freed). The lookup
 * itself marks the entry as recently used, so the LRU keeps it as before.
 * A TCP socket connects once (again only after a failed connect, which
 * BPF_ANY covers), so its entry is always missing: the lookup would only
 * add its cost (bench/revnat.ts measured connect4 1.13x slower with it),
 * and the entry is written straight away. LB_REVNAT_ALWAYS_WRITE=1 builds
 * the old unconditional write for UDP as well: the benchmark's baseline,
 * never loaded by lbctl.
 */
#ifndef LB_REVNAT_ALWAYS_WRITE
#define LB_REVNAT_ALWAYS_WRITE 0
#endif

/* ------------------------------------------------------------------ IPv4 */

static __always_inline bool sock4_revnat_same(const struct lb4_sock_revnat *a, const struct lb4_sock_revnat *b)
{
	return a->address == b->address && a->port == b->port && a->rev_nat_index == b->rev_nat_index;
}

/* 0 when the entry is in place (written or already there), else -errno. */
static __always_inline int sock4_record_revnat(__u64 cookie, const struct lb4_backend *backend,
					       const struct lb4_key *svc_key, __u32 rev_nat_index)
{
	struct lb4_sock_key key = {
		.cookie = cookie,
		.address = backend->address,
		.port = backend->port,
	};
	struct lb4_sock_revnat val = {
		.address = svc_key->address,
		.port = svc_key->dport,
		.rev_nat_index = rev_nat_index,
	};
	struct lb4_sock_revnat *old;

	if (!LB_REVNAT_ALWAYS_WRITE && svc_key->proto == IPPROTO_UDP) {
		old = bpf_map_lookup_elem(&lb4_sock_revnat, &key);
		if (old && sock4_revnat_same(old, &val))
			return 0;
	}
	return bpf_map_update_elem(&lb4_sock_revnat, &key, &val, BPF_ANY);
}

/*
 * Service address -> backend, in place. Returns 0 when translated,
 * -LB_NOT_SERVICE when the address is no service (one or two lookups),
 * -ECONNREFUSED when the caller must refuse the syscall.
 */
static __always_inline int __sock4_xlate_fwd(void *ctx, __u32 proto, __be32 *addr, __be16 *port)
{
	struct lb4_key key = {
		.address = *addr,
		.dport = *port,
		.proto = proto,
	};
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
		return -LB_NOT_SERVICE;
	}
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
	if (sock4_record_revnat(lb_sock_cookie(ctx), backend, &key,
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
	struct lb4_sock_revnat *val;
	struct lb4_key svc_key = {};
	struct lb_service *svc;

	val = bpf_map_lookup_elem(&lb4_sock_revnat, &key);
	if (!val)
		return -ENOENT;

	svc_key.address = val->address;
	svc_key.dport = val->port;
	svc_key.proto = proto;
	svc = lb4_lookup_service(&svc_key);
	if (!svc || svc->rev_nat_index != val->rev_nat_index) {
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
static __always_inline int sock6_record_revnat(__u64 cookie, const struct lb6_backend *backend,
					       const struct lb6_key *svc_key, __u32 rev_nat_index)
{
	struct lb6_sock_key key = {
		.cookie = cookie,
		.port = backend->port,
	};
	struct lb6_sock_revnat val = {
		.port = svc_key->dport,
		.rev_nat_index = rev_nat_index,
	};
	struct lb6_sock_revnat *old;

	ip6_copy(key.address, backend->address);
	ip6_copy(val.address, svc_key->address);
	if (!LB_REVNAT_ALWAYS_WRITE && svc_key->proto == IPPROTO_UDP) {
		old = bpf_map_lookup_elem(&lb6_sock_revnat, &key);
		if (old && sock6_revnat_same(old, &val))
			return 0;
	}
	return bpf_map_update_elem(&lb6_sock_revnat, &key, &val, BPF_ANY);
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

	if (!proto_is_balanced(proto))
		return -LB_NOT_SERVICE;

	ip6_copy(key.address, addr);
	svc = lb6_lookup_service(&key);
	if (!svc) {
		if (lb6_lookup_wildcard(&key)) {
			lb_count(LB_MTR_NO_SERVICE_PORT);
			return -ECONNREFUSED;
		}
		return -LB_NOT_SERVICE;
	}
	if (!lb_svc_has_backends(svc)) {
		lb_count(LB_MTR_NO_BACKEND);
		return -ECONNREFUSED;
	}
	backend = lb6_select_backend(&key, svc, lb_netns_cookie(ctx), &backend_id);
	if (!backend) {
		lb_count(LB_MTR_BACKEND_MISSING);
		return -ECONNREFUSED;
	}
	if (sock6_record_revnat(lb_sock_cookie(ctx), backend, &key,
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

static __always_inline int __sock6_xlate_rev(void *ctx, __u32 proto, __be32 *addr, __be16 *port)
{
	struct lb6_sock_key key = {
		.cookie = lb_sock_cookie(ctx),
		.port = *port,
	};
	struct lb6_sock_revnat *val;
	struct lb6_key svc_key = {};
	struct lb_service *svc;

	ip6_copy(key.address, addr);
	val = bpf_map_lookup_elem(&lb6_sock_revnat, &key);
	if (!val)
		return -ENOENT;

	ip6_copy(svc_key.address, val->address);
	svc_key.dport = val->port;
	svc_key.proto = proto;
	svc = lb6_lookup_service(&svc_key);
	if (!svc || svc->rev_nat_index != val->rev_nat_index) {
		bpf_map_delete_elem(&lb6_sock_revnat, &key);
		lb_count(LB_MTR_REVNAT_STALE);
		return -ENOENT;
	}

	ip6_copy(addr, val->address);
	*port = val->port;
	lb_count(LB_MTR_XLATE_REV);
	return 0;
}

/* ------------------------------------------------- ctx <-> address glue */

static __always_inline int sock4_fwd(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = ctx_dst_port(ctx);
	int err;

	err = __sock4_xlate_fwd(ctx, ctx->protocol, &addr, &port);
	if (err == -ECONNREFUSED)
		return sys_refuse();
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
	if (ip6_is_v4mapped(addr))
		err = __sock4_xlate_fwd(ctx, ctx->protocol, &addr[3], &port);
	else
		err = __sock6_xlate_fwd(ctx, ctx->protocol, addr, &port);
	if (err == -ECONNREFUSED)
		return sys_refuse();
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
	if (ip6_is_v4mapped(addr))
		err = __sock4_xlate_rev(ctx, ctx->protocol, &addr[3], &port);
	else
		err = __sock6_xlate_rev(ctx, ctx->protocol, addr, &port);
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

/*
 * A closing socket takes its rev-NAT entry with it. The kernel shows the
 * connected destination here, which is the backend, so connected sockets
 * (all TCP, connected UDP) are covered. An unconnected UDP socket has no
 * destination at close: its entries (one per backend it sent to) are left
 * to LRU eviction and to the stale check in recvmsg.
 */
SEC("cgroup/sock_release")
int lb_sock_release(struct bpf_sock *sk)
{
	__u32 family = sk->family;
	__u64 cookie;

	if (!proto_is_balanced(sk->protocol))
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
