// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The tc datapath (bpf/nodeport.c, maps unpinned as in
 * bpf/tests/nodeport_test.c) with the entry points bench/nodeport-tc.ts
 * times under BPF_PROG_TEST_RUN with repeat = many.
 *
 * A test run with repeat runs the program again and again on the same
 * skb, so a packet the datapath translates would be another packet from
 * the second run on (a DNATed packet is no longer addressed to the
 * service). The bench_np_* programs therefore save the headers, run the
 * datapath's own IPv4 entry (what lb_nodeport_ingress / egress call for an
 * IPv4 packet) and write the headers back, by direct packet access (two
 * copies of 54 bytes, through a per-CPU map); bench_wrapped_empty does the same around a function
 * that does nothing. The figures are over bench_empty (an empty tc
 * program: the floor of a test run itself), the wrapper's own cost
 * (bench_wrapped_empty over bench_empty) included and reported beside
 * them. Built by the bench (clang, into build/bench/), never loaded by the
 * agent.
 *
 * -DNP_XDP: the XDP build (nodeport_xdp.bpf.o's code): bench_xdp_empty,
 * bench_xdp_wrapped_empty and bench_xdp_ingress, the same wrapper around
 * the XDP build's IPv4 entry, its answer turned into an XDP action as
 * lb_nodeport_xdp turns it. No primitives.
 *
 * -DBENCH_NO_FIB: bpf_fib_lookup replaced by a stub that answers what the
 * bench namespace's FIB answers for the measured flows (route to np0 via
 * the peer or the gateway, their MACs), to measure the FIB lookup's share.
 */
#define LB_MAP_PINNING LIBBPF_PIN_NONE

#ifdef BENCH_NO_FIB
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* bench/nodeport-tc.ts fills it: the answer of the real lookup for each destination. */
struct bench_fib_answer {
	__u32 ifindex;
	__u8 smac[6];
	__u8 dmac[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);	/* ipv4_dst, network order */
	__type(value, struct bench_fib_answer);
} bench_fib SEC(".maps");

static __always_inline long bench_fib_lookup(struct bpf_fib_lookup *p)
{
	struct bench_fib_answer *a = bpf_map_lookup_elem(&bench_fib, &p->ipv4_dst);

	if (!a)
		return BPF_FIB_LKUP_RET_NOT_FWDED;
	p->ifindex = a->ifindex;
	__builtin_memcpy(p->smac, a->smac, 6);
	__builtin_memcpy(p->dmac, a->dmac, 6);
	return BPF_FIB_LKUP_RET_SUCCESS;
}
#define bpf_fib_lookup(skb, params, len, flags) bench_fib_lookup(params)
#endif

#include "../bpf/nodeport.c"

/* Ethernet + IPv4 + TCP without options: every header the datapath rewrites. */
#define BENCH_HDR (14 + 20 + 20)

static __noinline int bench_nothing(struct np_ctx *skb)
{
	return skb->data == skb->data_end ? TC_ACT_SHOT : TC_ACT_UNSPEC;
}

/* Where the wrapper keeps the headers during a run: not its stack, which the datapath's frames leave no room in. */
struct bench_hdr {
	__u64 w[6];
	__u32 w32;
	__u16 w16;
};

_Static_assert(6 * 8 + 4 + 2 == BENCH_HDR, "bench_hdr covers the headers");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bench_hdr);
} bench_saved SEC(".maps");

/* 54 bytes in words (a memcpy from a packet pointer, of unknown alignment, is 54 byte loads and stores) */
static __always_inline void bench_copy(void *to, const void *from)
{
	int i;

#pragma unroll
	for (i = 0; i < 6; i++)
		((__u64 *)to)[i] = ((const __u64 *)from)[i];
	*(__u32 *)(to + 48) = *(const __u32 *)(from + 48);
	*(__u16 *)(to + 52) = *(const __u16 *)(from + 52);
}

/* The headers as they came, put back after the run (the datapath may have rewritten them). */
#define BENCH_WRAP(fn)							\
	void *data = (void *)(long)skb->data;				\
	void *end = (void *)(long)skb->data_end;			\
	struct bench_hdr *saved;					\
	__u32 zero = 0;							\
	int rc;								\
									\
	saved = bpf_map_lookup_elem(&bench_saved, &zero);		\
	if (!saved || data + BENCH_HDR > end)				\
		return TC_ACT_SHOT;					\
	bench_copy(saved, data);					\
	rc = fn(skb);							\
	data = (void *)(long)skb->data;					\
	end = (void *)(long)skb->data_end;				\
	if (data + BENCH_HDR > end)					\
		return TC_ACT_SHOT;					\
	bench_copy(data, saved);					\
	return rc;

#ifdef NP_XDP
SEC("xdp")
int bench_xdp_empty(struct xdp_md *skb)
{
	return XDP_PASS;
}

static __noinline int bench_xdp_np(struct xdp_md *skb)
{
	return np_xdp_verdict(np_ingress4(skb));
}

SEC("xdp")
int bench_xdp_wrapped_empty(struct xdp_md *skb)
{
	BENCH_WRAP(bench_nothing)
}

SEC("xdp")
int bench_xdp_ingress(struct xdp_md *skb)
{
	BENCH_WRAP(bench_xdp_np)
}
#else
SEC("tc")
int bench_empty(struct __sk_buff *skb)
{
	return TC_ACT_UNSPEC;
}

SEC("tc")
int bench_wrapped_empty(struct __sk_buff *skb)
{
	BENCH_WRAP(bench_nothing)
}

SEC("tc")
int bench_np_ingress(struct __sk_buff *skb)
{
	BENCH_WRAP(np_ingress4)
}

SEC("tc")
int bench_np_egress(struct __sk_buff *skb)
{
	BENCH_WRAP(np_egress4)
}

/*
 * Primitives: one of each operation the datapath's packet paths are made
 * of, on the packet as it is (writes put back the value already there), to
 * be measured over bench_empty: what the paths cost is mostly how many of
 * these they do.
 */
SEC("tc")
int bench_prim_load3(struct __sk_buff *skb)
{
	struct iphdr ip;
	__u32 ports;
	__u8 flags;

	/* as np4_parse: the IPv4 header, the ports, the TCP flags */
	if (bpf_skb_load_bytes(skb, NP_L3_OFF, &ip, sizeof(ip)) < 0 ||
	    bpf_skb_load_bytes(skb, NP_L3_OFF + 20, &ports, sizeof(ports)) < 0 ||
	    bpf_skb_load_bytes(skb, NP_L3_OFF + 20 + 13, &flags, 1) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_UNSPEC;
}

/* The packet's destination address and port, read with one 4-byte load each (not timed apart). */
static __always_inline int bench_dst(struct __sk_buff *skb, __be32 *daddr, __be16 *dport)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + NP_L3_OFF;
	struct tcphdr *th = data + NP_L3_OFF + sizeof(*ip);

	if ((void *)(th + 1) > end)
		return -1;
	*daddr = ip->daddr;
	*dport = th->dest;
	return 0;
}

SEC("tc")
int bench_prim_svc_lookup(struct __sk_buff *skb)
{
	struct lb4_key key = { .proto = IPPROTO_TCP, .scope = LB_SCOPE_EXT };

	if (bench_dst(skb, &key.address, &key.dport) < 0)
		return TC_ACT_SHOT;
	return bpf_map_lookup_elem(&lb4_services, &key) ? TC_ACT_OK : TC_ACT_UNSPEC;
}

SEC("tc")
int bench_prim_nodeaddr(struct __sk_buff *skb)
{
	struct lb_node_addr_key k = { .family = 4 };
	__be16 port;

	if (bench_dst(skb, &k.address[0], &port) < 0)
		return TC_ACT_SHOT;
	return bpf_map_lookup_elem(&lb_node_addrs, &k) ? TC_ACT_OK : TC_ACT_UNSPEC;
}

SEC("tc")
int bench_prim_ct_lookup(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + NP_L3_OFF;
	struct tcphdr *th = data + NP_L3_OFF + sizeof(*ip);
	struct lb4_ct_key k = { .proto = IPPROTO_TCP, .dir = LB_CT_ORIG };

	if ((void *)(th + 1) > end)
		return TC_ACT_SHOT;
	k.saddr = ip->saddr;
	k.daddr = ip->daddr;
	k.sport = th->source;
	k.dport = th->dest;
	return bpf_map_lookup_elem(&lb4_ct, &k) ? TC_ACT_OK : TC_ACT_UNSPEC;
}

SEC("tc")
int bench_prim_ktime(struct __sk_buff *skb)
{
	return np_now() == 0 ? TC_ACT_SHOT : TC_ACT_UNSPEC;
}

SEC("tc")
int bench_prim_ktime_coarse(struct __sk_buff *skb)
{
	return bpf_ktime_get_coarse_ns() == 0 ? TC_ACT_SHOT : TC_ACT_UNSPEC;
}

/* As np4_parse: the IPv4 header, the ports and the TCP flags, read in place. */
SEC("tc")
int bench_prim_direct3(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + NP_L3_OFF;
	__u8 *l4;

	if ((void *)(ip + 1) > end)
		return TC_ACT_SHOT;
	l4 = (void *)ip + ip->ihl * 4;
	if ((void *)(l4 + 14) > end)
		return TC_ACT_SHOT;
	return (ip->daddr ^ *(__u32 *)l4 ^ l4[13]) == 1 ? TC_ACT_SHOT : TC_ACT_UNSPEC;
}

/* One bpf_l4_csum_replace by a bpf_csum_diff-style sum (0: the checksum stays), as the rewrites do. */
SEC("tc")
int bench_prim_l4_csum_diff(struct __sk_buff *skb)
{
	bpf_l4_csum_replace(skb, NP_L3_OFF + 20 + offsetof(struct tcphdr, check), 0, 0, BPF_F_PSEUDO_HDR);
	return TC_ACT_UNSPEC;
}

SEC("tc")
int bench_prim_store4(struct __sk_buff *skb)
{
	__be32 daddr;
	__be16 port;

	if (bench_dst(skb, &daddr, &port) < 0)
		return TC_ACT_SHOT;
	bpf_skb_store_bytes(skb, NP_L3_OFF + offsetof(struct iphdr, daddr), &daddr, sizeof(daddr), 0);
	return TC_ACT_UNSPEC;
}

SEC("tc")
int bench_prim_l4_csum(struct __sk_buff *skb)
{
	__be32 daddr;
	__be16 port;

	if (bench_dst(skb, &daddr, &port) < 0)
		return TC_ACT_SHOT;
	/* from == to: the checksum stays, the helper's work is done */
	bpf_l4_csum_replace(skb, NP_L3_OFF + 20 + offsetof(struct tcphdr, check), daddr, daddr, BPF_F_PSEUDO_HDR | sizeof(daddr));
	return TC_ACT_UNSPEC;
}

SEC("tc")
int bench_prim_l3_csum(struct __sk_buff *skb)
{
	__be32 daddr;
	__be16 port;

	if (bench_dst(skb, &daddr, &port) < 0)
		return TC_ACT_SHOT;
	bpf_l3_csum_replace(skb, NP_L3_OFF + offsetof(struct iphdr, check), daddr, daddr, sizeof(daddr));
	return TC_ACT_UNSPEC;
}
#endif /* NP_XDP */
