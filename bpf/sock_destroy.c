// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Stale connected UDP sockets. connect() on a UDP socket to a service is
 * balanced once (cgroup/connect4/6 rewrote the destination), so the socket
 * stays connected to that backend for its whole life. When the backend
 * leaves the service, the agent runs this socket iterator in each client
 * network namespace and destroys exactly the sockets that
 *   - are UDP and connected (protocol IPPROTO_UDP, state TCP_ESTABLISHED),
 *   - are connected to a backend in lb4_sock_term / lb6_sock_term (the
 *     backends a sync just removed), and
 *   - were sent there by lbctl: their socket rev-NAT entry {cookie, backend}
 *     exists, so a socket that dialled the backend's address by itself is
 *     left alone.
 * bpf_sock_destroy() (Linux 6.5+) makes the socket's next recv()/send() fail
 * with ECONNABORTED and disconnects it. The cookie of each destroyed socket
 * is written to the iterator's output, and its rev-NAT entry is removed (a
 * disconnected socket has no destination left for sock_release to find).
 *
 * This object is apart from sock.c because libbpf refuses a whole object
 * whose kfunc the kernel lacks ("extern ... not found in kernel or module
 * BTFs"), before the verifier runs. Without it, the agent falls back to
 * SOCK_DESTROY over inet_diag netlink with the same filter
 * (src/datapath/terminate.ts).
 *
 * No vmlinux.h: the few kernel socket fields read here are declared locally
 * with preserve_access_index (CO-RE), so libbpf fixes their offsets up
 * against the running kernel's BTF.
 */
#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/errno.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "include/lb_types.h"
#include "lib/addr.h"

/* sk_state of a connected UDP socket */
#define LB_TCP_ESTABLISHED	1

/* Backends handled per iterator run; the agent sends more in batches. */
#define LB_SOCK_TERM_MAX	1024

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* removed UDP backend {address, port, IPPROTO_UDP, state 0} -> 1 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_backend);
	__type(value, __u32);
	__uint(max_entries, LB_SOCK_TERM_MAX);
} lb4_sock_term SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb6_backend);
	__type(value, __u32);
	__uint(max_entries, LB_SOCK_TERM_MAX);
} lb6_sock_term SEC(".maps");

/*
 * The datapath's socket rev-NAT maps (bpf/include/lb_maps.h). The agent
 * hands this object the datapath's own maps (bpf_map__reuse_fd) before
 * load, so these definitions only give the types; unpinned, so a test that
 * loads the object alone gets maps of its own.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_sock_key);
	__type(value, struct lb4_sock_revnat);
	__uint(max_entries, LB_SOCK_TERM_MAX);
} lb4_sock_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb6_sock_key);
	__type(value, struct lb6_sock_revnat);
	__uint(max_entries, LB_SOCK_TERM_MAX);
} lb6_sock_revnat SEC(".maps");

/* What the filter needs of a socket, as plain values (tests build their own). */
struct lb_sock_view {
	__u64 cookie;		/* bpf_get_socket_cookie() */
	__be32 daddr[4];	/* AF_INET: daddr[0]; AF_INET6: all four */
	__be16 dport;
	__u16 family;		/* AF_INET or AF_INET6 */
	__u16 protocol;		/* IPPROTO_UDP */
	__u8 state;		/* LB_TCP_ESTABLISHED when connected */
	__u8 pad;
};

/* 0 when lbctl sent socket `cookie` to the removed IPv4 backend addr:port. */
static __always_inline int __sock4_term_match(__u64 cookie, __be32 addr, __be16 port)
{
	struct lb4_backend be = {
		.address = addr,
		.port = port,
		.proto = IPPROTO_UDP,
	};
	struct lb4_sock_key key = {
		.cookie = cookie,
		.address = addr,
		.port = port,
	};

	if (!bpf_map_lookup_elem(&lb4_sock_term, &be))
		return -ENOENT;		/* not a backend being removed */
	if (!bpf_map_lookup_elem(&lb4_sock_revnat, &key))
		return -ESRCH;		/* connected there, but not by lbctl */
	return 0;
}

static __always_inline int __sock6_term_match(__u64 cookie, const __be32 *addr, __be16 port)
{
	struct lb6_backend be = {
		.address = { addr[0], addr[1], addr[2], addr[3] },
		.port = port,
		.proto = IPPROTO_UDP,
	};
	struct lb6_sock_key key = {
		.cookie = cookie,
		.address = { addr[0], addr[1], addr[2], addr[3] },
		.port = port,
	};

	if (!bpf_map_lookup_elem(&lb6_sock_term, &be))
		return -ENOENT;
	if (!bpf_map_lookup_elem(&lb6_sock_revnat, &key))
		return -ESRCH;
	return 0;
}

/*
 * 0 when the socket must be destroyed: a connected UDP socket that lbctl
 * sent to a backend being removed. IPv4-mapped destinations of AF_INET6
 * sockets were balanced through the IPv4 tables, so they match there.
 */
static __always_inline int __sock_term_match(const struct lb_sock_view *v)
{
	if (v->protocol != IPPROTO_UDP)
		return -EPROTONOSUPPORT;
	if (v->state != LB_TCP_ESTABLISHED)
		return -ENOTCONN;
	if (v->family == AF_INET)
		return __sock4_term_match(v->cookie, v->daddr[0], v->dport);
	if (v->family != AF_INET6)
		return -EAFNOSUPPORT;
	if (ip6_is_v4mapped(v->daddr))
		return __sock4_term_match(v->cookie, v->daddr[3], v->dport);
	return __sock6_term_match(v->cookie, v->daddr, v->dport);
}

/* A destroyed socket's rev-NAT entry goes with it. */
static __always_inline void __sock_term_forget(const struct lb_sock_view *v)
{
	if (v->family == AF_INET || ip6_is_v4mapped(v->daddr)) {
		struct lb4_sock_key key = {
			.cookie = v->cookie,
			.address = v->family == AF_INET ? v->daddr[0] : v->daddr[3],
			.port = v->dport,
		};

		bpf_map_delete_elem(&lb4_sock_revnat, &key);
	} else {
		struct lb6_sock_key key = {
			.cookie = v->cookie,
			.address = { v->daddr[0], v->daddr[1], v->daddr[2], v->daddr[3] },
			.port = v->dport,
		};

		bpf_map_delete_elem(&lb6_sock_revnat, &key);
	}
}

/* BPF unit tests (bpf/tests/sock_destroy_test.c) drive the helpers above only. */
#ifndef LB_SOCK_TERM_TEST

/* The kernel's socket, as far as the filter reads it (CO-RE). */
struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	__u16 sk_protocol;
} __attribute__((preserve_access_index));

/*
 * The iter/udp context, laid out as the kernel's bpf_iter__udp
 * (net/ipv4/udp.c): pointers are 64-bit __bpf_md_ptr fields, and uid and
 * bucket are each __aligned(8), so bucket is at offset 24, not 20.
 * test/bpf/sock-destroy.ts compares this layout with the running kernel's BTF.
 */
struct bpf_iter_meta {
	struct seq_file *seq;
	__u64 session_id;
	__u64 seq_num;
};

struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	struct sock *udp_sk;	/* struct udp_sock *, which begins with its struct sock */
	__u32 uid __attribute__((aligned(8)));
	int bucket __attribute__((aligned(8)));
};

extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

static __always_inline void sock_view_load(struct sock *sk, struct lb_sock_view *v)
{
	const struct sock_common *skc = &sk->__sk_common;

	v->family = skc->skc_family;
	v->state = skc->skc_state;
	v->protocol = sk->sk_protocol;
	v->dport = skc->skc_dport;
	if (v->family == AF_INET) {
		v->daddr[0] = skc->skc_daddr;
	} else {
		v->daddr[0] = skc->skc_v6_daddr.in6_u.u6_addr32[0];
		v->daddr[1] = skc->skc_v6_daddr.in6_u.u6_addr32[1];
		v->daddr[2] = skc->skc_v6_daddr.in6_u.u6_addr32[2];
		v->daddr[3] = skc->skc_v6_daddr.in6_u.u6_addr32[3];
	}
	v->cookie = bpf_get_socket_cookie(sk);
}

/* One call per UDP socket of the network namespace the iterator was created in. */
SEC("iter/udp")
int lb_udp_destroy(struct bpf_iter__udp *ctx)
{
	struct sock *sk = ctx->udp_sk;
	struct lb_sock_view v = {};

	if (!sk)
		return 0;
	sock_view_load(sk, &v);
	if (__sock_term_match(&v))
		return 0;
	if (bpf_sock_destroy(&sk->__sk_common))
		return 0;
	__sock_term_forget(&v);
	bpf_seq_write(ctx->meta->seq, &v.cookie, sizeof(v.cookie));
	return 0;
}

#endif /* LB_SOCK_TERM_TEST */
