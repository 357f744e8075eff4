// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Unit tests of the stale-UDP-socket filter of bpf/sock_destroy.c, run
 * through BPF_PROG_TEST_RUN. Iterator programs cannot be test-run, and the
 * bpf_sock_destroy kfunc would keep this object off kernels before 6.5, so
 * the iterator entry is left out (LB_SOCK_TERM_TEST) and tc programs drive
 * __sock_term_match/__sock_term_forget with socket views built here. Each
 * test returns 0, or the line of its first failed check
 * (test/bpf/sock-destroy.ts runs every `test_*` program).
 */
#define LB_SOCK_TERM_TEST
#include "../sock_destroy.c"

#define CHECK(cond)                     \
	do {                            \
		if (!(cond))            \
			return __LINE__; \
	} while (0)

#define BE_IP		bpf_htonl(0x0af40102)	/* 10.244.1.2, being removed */
#define OTHER_IP	bpf_htonl(0x0af40103)	/* 10.244.1.3, staying */
#define BE_PORT		bpf_htons(9000)
#define SVC_IP		bpf_htonl(0x0a600014)	/* 10.96.0.20 */
#define SVC_PORT	bpf_htons(53)
#define COOKIE		4242
#define TCP_CLOSE	7

/* fd00:244::1:2 */
#define BE6_0	bpf_htonl(0xfd000244)
#define BE6_3	bpf_htonl(0x00010002)

static __always_inline void term4(__be32 addr, __be16 port, bool on)
{
	struct lb4_backend be = { .address = addr, .port = port, .proto = IPPROTO_UDP };
	__u32 one = 1;

	if (on)
		bpf_map_update_elem(&lb4_sock_term, &be, &one, BPF_ANY);
	else
		bpf_map_delete_elem(&lb4_sock_term, &be);
}

static __always_inline void revnat4(__u64 cookie, __be32 addr, __be16 port, bool on)
{
	struct lb4_sock_key key = { .cookie = cookie, .address = addr, .port = port };
	struct lb4_sock_revnat val = { .address = SVC_IP, .port = SVC_PORT, .rev_nat_index = 1 };

	if (on)
		bpf_map_update_elem(&lb4_sock_revnat, &key, &val, BPF_ANY);
	else
		bpf_map_delete_elem(&lb4_sock_revnat, &key);
}

static __always_inline bool has_revnat4(__u64 cookie, __be32 addr, __be16 port)
{
	struct lb4_sock_key key = { .cookie = cookie, .address = addr, .port = port };

	return bpf_map_lookup_elem(&lb4_sock_revnat, &key) != NULL;
}

static __always_inline void term6(bool on)
{
	struct lb6_backend be = { .address = { BE6_0, 0, 0, BE6_3 }, .port = BE_PORT, .proto = IPPROTO_UDP };
	__u32 one = 1;

	if (on)
		bpf_map_update_elem(&lb6_sock_term, &be, &one, BPF_ANY);
	else
		bpf_map_delete_elem(&lb6_sock_term, &be);
}

static __always_inline void revnat6(__u64 cookie, bool on)
{
	struct lb6_sock_key key = { .cookie = cookie, .address = { BE6_0, 0, 0, BE6_3 }, .port = BE_PORT };
	struct lb6_sock_revnat val = { .port = SVC_PORT, .rev_nat_index = 1 };

	if (on)
		bpf_map_update_elem(&lb6_sock_revnat, &key, &val, BPF_ANY);
	else
		bpf_map_delete_elem(&lb6_sock_revnat, &key);
}

static __always_inline bool has_revnat6(__u64 cookie)
{
	struct lb6_sock_key key = { .cookie = cookie, .address = { BE6_0, 0, 0, BE6_3 }, .port = BE_PORT };

	return bpf_map_lookup_elem(&lb6_sock_revnat, &key) != NULL;
}

/* A connected UDP IPv4 socket to addr:port. */
static __always_inline void view4(struct lb_sock_view *v, __u64 cookie, __be32 addr, __be16 port)
{
	v->cookie = cookie;
	v->daddr[0] = addr;
	v->dport = port;
	v->family = AF_INET;
	v->protocol = IPPROTO_UDP;
	v->state = LB_TCP_ESTABLISHED;
}

static __always_inline void clear(void)
{
	term4(BE_IP, BE_PORT, false);
	term4(OTHER_IP, BE_PORT, false);
	revnat4(COOKIE, BE_IP, BE_PORT, false);
	revnat4(COOKIE + 1, BE_IP, BE_PORT, false);
	revnat4(COOKIE, OTHER_IP, BE_PORT, false);
	term6(false);
	revnat6(COOKIE, false);
}

SEC("tc")
int test_connected_udp_to_removed_backend_matches(struct __sk_buff *skb)
{
	struct lb_sock_view v = {};

	clear();
	term4(BE_IP, BE_PORT, true);
	revnat4(COOKIE, BE_IP, BE_PORT, true);
	view4(&v, COOKIE, BE_IP, BE_PORT);
	CHECK(__sock_term_match(&v) == 0);
	__sock_term_forget(&v);
	CHECK(!has_revnat4(COOKIE, BE_IP, BE_PORT));
	clear();
	return 0;
}

SEC("tc")
int test_backend_not_removed_is_left_alone(struct __sk_buff *skb)
{
	struct lb_sock_view v = {};

	clear();
	term4(BE_IP, BE_PORT, true);
	revnat4(COOKIE, OTHER_IP, BE_PORT, true);
	view4(&v, COOKIE, OTHER_IP, BE_PORT);
	CHECK(__sock_term_match(&v) == -ENOENT);
	clear();
	return 0;
}

SEC("tc")
int test_other_port_of_removed_address_is_left_alone(struct __sk_buff *skb)
{
	struct lb_sock_view v = {};

	clear();
	term4(BE_IP, BE_PORT, true);
	view4(&v, COOKIE, BE_IP, bpf_htons(9001));
	CHECK(__sock_term_match(&v) == -ENOENT);
	clear();
	return 0;
}

SEC("tc")
int test_socket_lbctl_did_not_balance_is_left_alone(struct __sk_buff *skb)
{
	struct lb_sock_view v = {};

	clear();
	term4(BE_IP, BE_PORT, true);
	revnat4(COOKIE + 1, BE_IP, BE_PORT, true);	/* another socket's entry */
	view4(&v, COOKIE, BE_IP, BE_PORT);
	CHECK(__sock_term_match(&v) == -ESRCH);
	clear();
	return 0;
}

SEC("tc")
int test_unconnected_or_not_udp_is_left_alone(struct __sk_buff *skb)
{
	struct lb_sock_view v = {};

	clear();
	term4(BE_IP, BE_PORT, true);
	revnat4(COOKIE, BE_IP, BE_PORT, true);
	view4(&v, COOKIE, BE_IP, BE_PORT);
	v.state = TCP_CLOSE;
	CHECK(__sock_term_match(&v) == -ENOTCONN);
	view4(&v, COOKIE, BE_IP, BE_PORT);
	v.protocol = IPPROTO_TCP;
	CHECK(__sock_term_match(&v) == -EPROTONOSUPPORT);
	view4(&v, COOKIE, BE_IP, BE_PORT);
	v.family = 1; /* AF_UNIX */
	CHECK(__sock_term_match(&v) == -EAFNOSUPPORT);
	CHECK(has_revnat4(COOKIE, BE_IP, BE_PORT));
	clear();
	return 0;
}

SEC("tc")
int test_v4_mapped_destination_of_v6_socket_matches_v4_backend(struct __sk_buff *skb)
{
	struct lb_sock_view v = {};

	clear();
	term4(BE_IP, BE_PORT, true);
	revnat4(COOKIE, BE_IP, BE_PORT, true);
	v.cookie = COOKIE;
	v.daddr[2] = bpf_htonl(0x0000ffff);
	v.daddr[3] = BE_IP;
	v.dport = BE_PORT;
	v.family = AF_INET6;
	v.protocol = IPPROTO_UDP;
	v.state = LB_TCP_ESTABLISHED;
	CHECK(__sock_term_match(&v) == 0);
	__sock_term_forget(&v);
	CHECK(!has_revnat4(COOKIE, BE_IP, BE_PORT));
	clear();
	return 0;
}

SEC("tc")
int test_v6_connected_udp_to_removed_backend_matches(struct __sk_buff *skb)
{
	struct lb_sock_view v = {};

	clear();
	v.cookie = COOKIE;
	v.daddr[0] = BE6_0;
	v.daddr[3] = BE6_3;
	v.dport = BE_PORT;
	v.family = AF_INET6;
	v.protocol = IPPROTO_UDP;
	v.state = LB_TCP_ESTABLISHED;
	revnat6(COOKIE, true);
	CHECK(__sock_term_match(&v) == -ENOENT);	/* not being removed yet */
	term6(true);
	CHECK(__sock_term_match(&v) == 0);
	revnat6(COOKIE, false);
	CHECK(__sock_term_match(&v) == -ESRCH);
	revnat6(COOKIE, true);
	__sock_term_forget(&v);
	CHECK(!has_revnat6(COOKIE));
	clear();
	return 0;
}
