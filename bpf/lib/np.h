/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Packet plumbing of the tc datapath: header offsets, rewrites with their
 * checksum updates, TTL, FIB forwarding. Nothing here knows services; see
 * bpf/nodeport.c for what is rewritten and why.
 */
#ifndef __NP_LIB_H
#define __NP_LIB_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>
#include "addr.h"
#include "sctp.h"

#ifndef offsetof
#define offsetof(type, member)	__builtin_offsetof(type, member)
#endif

/* tc verdicts; TC_ACT_UNSPEC is also tcx's TCX_NEXT: the next program runs. */
#ifndef TC_ACT_UNSPEC
#define TC_ACT_UNSPEC	(-1)
#endif

/*
 * Where the IP header starts. nodeport.bpf.o serves the devices that carry
 * Ethernet frames; nodeport_l3.bpf.o, the same source built with
 * NP_L3_DEVICE, the layer-3 tunnels (ipip, sit, ip6tnl, gre, wireguard),
 * whose packets start with it (src/datapath/devices.ts).
 */
#ifdef NP_L3_DEVICE
#define NP_L3_OFF	0
#else
#define NP_L3_OFF	ETH_HLEN
#endif

/*
 * The program context: a socket buffer at tc; nodeport_xdp.bpf.o, the same
 * source built with NP_XDP, runs the ingress path at XDP on the driver's
 * frame (xdp_md, whose data and data_end read as skb's do), and hands what
 * it cannot finish to tc unchanged (bpf/nodeport.c, lb_nodeport_xdp()).
 */
#ifdef NP_XDP
#define np_ctx xdp_md
#else
#define np_ctx __sk_buff
#endif

#define IP_DF		0x4000
#define IP_MF		0x2000
#define IP_OFFSET	0x1fff
#define IP6_OFFSET	0xfff8	/* the fragment header's offset, in 8-byte units above its 3 flag bits */

#define NEXTHDR_HOP	0
#define NEXTHDR_ROUTING	43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_AUTH	51
#define NEXTHDR_DEST	60
#define NP_IPV6_EXT_MAX	4	/* extension headers walked before giving up */

/*
 * ICMP (RFC 792) and ICMPv6 (RFC 4443): an error quotes the packet that
 * caused it (its IP header and at least 8 bytes of what follows) after a
 * header of NP_ICMP_HLEN bytes. The types below are those the datapath
 * sends or translates.
 */
#define NP_ICMP_HLEN		8	/* type, code, checksum, 4 bytes of the type's own */
#define NP_ICMP_CSUM		2	/* the checksum's offset in that header */
#define ICMP_DEST_UNREACH	3
#define ICMP_PORT_UNREACH	3
#define ICMP_FRAG_NEEDED	4
#define ICMP_TIME_EXCEEDED	11
#define ICMP_PARAMETERPROB	12
#define ICMPV6_DEST_UNREACH	1
#define ICMPV6_PKT_TOOBIG	2
#define ICMPV6_TIME_EXCEED	3
#define ICMPV6_PARAMPROB	4
#define ICMPV6_PORT_UNREACH	4
#define IPTOS_PREC_INTERNETCONTROL 0xc0	/* the TOS Linux gives the errors it sends */

struct np_icmphdr {
	__u8 type;
	__u8 code;
	__sum16 check;
	__be32 rest;		/* 0 in a port unreachable; the next-hop MTU in frag-needed (low 16 bits) and packet too big */
};

static __always_inline bool np6_addr_eq(const __be32 *a, const __be32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

/* Offsets in the packet of the fields a translation rewrites. */
struct np_l4 {
	__u32 l4_off;		/* transport header */
	__u32 csum_off;		/* transport checksum (0: none to update: SCTP's covers no address) */
	__u16 l4_len;		/* the transport segment's length, from the IP header (SCTP's CRC32c update needs it) */
	__u8 proto;
	/*
	 * TCP: the flags byte. SCTP, its first chunk as the TCP flag it is to
	 * connection tracking: INIT a SYN, ABORT and SHUTDOWN COMPLETE a reset
	 * (an association has no TIME_WAIT), anything else an ACK.
	 */
	__u8 tcp_flags;
	bool has_ports;		/* false for a non-first IPv4 fragment */
	bool udp_zero_csum;	/* a UDP datagram sent without a checksum */
};

/*
 * Headers are read, and at ingress written, in place (skb->data): the
 * furthest offset a header may start at for that (IPv6 extension headers
 * included), a bound the verifier needs on a packet pointer's offset.
 */
#define NP_HDR_OFF_MAX	0x3000

/*
 * Makes the packet's first `len` bytes (all of it, when it is shorter)
 * linear, pulling them in (bpf_skb_pull_data) only when they are not: a
 * GRO'd or header-split skb may hold its headers in its pages. Never more
 * than the headers the parse reads: a pull into a cloned skb copies its
 * head, and at egress every TCP segment of the node's own is a clone whose
 * head holds its headers and nothing more. Every packet pointer is invalid
 * after it.
 */
static __always_inline void np_pull(struct np_ctx *skb, __u32 len)
{
#ifndef NP_XDP
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;

	if (len > skb->len)
		len = skb->len;
	if (len > NP_HDR_OFF_MAX)
		return;
	if (data + len > end)
		bpf_skb_pull_data(skb, len);
#endif
	/* XDP: a frame is linear (no multi-buffer program) */
}

/*
 * `len` bytes at `off` in the packet's linear part (np_pull() made the
 * headers so), read and at ingress written in place; NULL when they are
 * not there (the packet is shorter). Good until the next helper that may
 * change the packet.
 */
static __always_inline void *np_header(struct np_ctx *skb, __u32 off, __u32 len)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	void *p;

	if (off > NP_HDR_OFF_MAX)
		return NULL;
	p = data + off;
	if (p + len > end)
		return NULL;
	return p;
}

/*
 * The rewrites' checksum arithmetic (RFC 1624), over the words as they sit
 * in the packet: a change's sum is the old words' complements plus the new
 * words, accumulated in 64 bits and folded; the checksum it is applied to
 * is updated once per packet, however many words changed.
 */
static __always_inline __u64 np_csum_add32(__u64 sum, __u32 old, __u32 new)
{
	return sum + (__u32)~old + new;
}

static __always_inline __u64 np_csum_add16(__u64 sum, __u16 old, __u16 new)
{
	return sum + (__u16)~old + new;
}

/* A change's sum as bpf_l4_csum_replace() takes it (a __wsum, its size argument 0). */
static __always_inline __u32 np_csum_fold32(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	return (__u32)sum;
}

/* A 16-bit checksum field after a change whose sum is `sum` (the kernel's csum_replace4: csum_fold(~check + sum)). */
static __always_inline __u16 np_csum_apply(__u16 check, __u64 sum)
{
	__u32 s = np_csum_fold32(sum + (__u16)~check);

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/*
 * The kernel's update of a transport checksum field `check` by a change
 * whose sum is `diff` (inet_proto_csum_replace_by_diff(), what
 * bpf_l4_csum_replace() does with size 0), bit for bit, both ways it keeps
 * a field: np_csum_by_diff() for a field holding the whole checksum
 * (csum_fold(csum_add(diff, ~csum_unfold(check)))), np_csum_by_diff_partial()
 * for a CHECKSUM_PARTIAL one holding the pseudo header's sum only
 * (~csum_fold(csum_add(diff, csum_unfold(check)))).
 */
static __always_inline __u32 np_wsum_add(__u32 a, __u32 b)
{
	__u32 r = a + b;

	return r + (r < b);
}

static __always_inline __u16 np_wsum_fold(__u32 s)	/* csum_fold() */
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

static __always_inline __u16 np_csum_by_diff(__u16 check, __u32 diff)
{
	return np_wsum_fold(np_wsum_add(diff, ~(__u32)check));
}

static __always_inline __u16 np_csum_by_diff_partial(__u16 check, __u32 diff)
{
	return (__u16)~np_wsum_fold(np_wsum_add(diff, check));
}

/* UDP's checksum 0 means none: a computed 0 is sent as 0xffff (BPF_F_MARK_MANGLED_0, CSUM_MANGLED_0). */
static __always_inline __u16 np_csum_mangle0(__u16 check, bool udp)
{
	return udp && !check ? 0xffff : check;
}

enum { NP_CSUM_UNKNOWN, NP_CSUM_FULL, NP_CSUM_PARTIAL };

/*
 * How the kernel keeps a transport checksum, from what one update by
 * `diff` with BPF_F_PSEUDO_HDR turned `old` into (`now`): NP_CSUM_FULL
 * when only the whole-checksum update gives `now`, NP_CSUM_PARTIAL when
 * only the CHECKSUM_PARTIAL one does, NP_CSUM_UNKNOWN when both or neither
 * do (a UDP datagram without a checksum among them: the kernel leaves 0).
 */
static __always_inline int np_csum_kept(__u16 old, __u16 now, __u32 diff, bool udp)
{
	__u16 full = np_csum_mangle0(np_csum_by_diff(old, diff), udp);
	__u16 partial = np_csum_mangle0(np_csum_by_diff_partial(old, diff), udp);

	if (udp && !old)
		return NP_CSUM_UNKNOWN;
	if (now == full && now != partial)
		return NP_CSUM_FULL;
	if (now == partial && now != full)
		return NP_CSUM_PARTIAL;
	return NP_CSUM_UNKNOWN;
}

/*
 * A transport checksum after the ports' change too (`p`, their sum), from
 * `now`, what the kernel's update by the addresses' sum `a` (with
 * BPF_F_PSEUDO_HDR) turned `old` into: a CHECKSUM_PARTIAL field takes no
 * port change, a whole checksum the same update as the addresses'. -1 when
 * np_csum_kept() cannot tell which the field is: the caller asks the kernel.
 */
static __always_inline int np_csum_ports_after(__u16 old, __u16 now, __u32 a, __u32 p, bool udp)
{
	int kept = np_csum_kept(old, now, a, udp);

	if (kept == NP_CSUM_FULL)
		return np_csum_mangle0(np_csum_by_diff(now, p), udp);
	if (kept == NP_CSUM_PARTIAL)
		return now;
	return -1;
}

/* TCP and SCTP: connections with a state to track (an opening, a close). */
static __always_inline bool np_stateful(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_SCTP;
}

/* The transport checksum's offset; 0 for SCTP, whose CRC32c has no pseudo header (only a port change moves it). */
static __always_inline __u32 np_l4_csum_off(__u8 proto, __u32 l4_off)
{
	if (proto == IPPROTO_SCTP)
		return 0;
	return l4_off + (proto == IPPROTO_TCP ? offsetof(struct tcphdr, check) : offsetof(struct udphdr, check));
}

#ifndef NP_XDP
/* The socket buffer's rewrites (tc); at XDP np4_xlate()/np6_xlate() write in place and np_l4_csum_update() follows. */

/* SCTP's first chunk as np_l4.tcp_flags. */
static __always_inline __u8 np_sctp_flags(struct __sk_buff *skb, __u32 l4_off, __u32 len)
{
	int type = lb_sctp_first_chunk(skb, l4_off, len);

	if (type == LB_SCTP_CID_INIT)
		return 0x02; /* SYN */
	if (type == LB_SCTP_CID_ABORT || type == LB_SCTP_CID_SHUTDOWN_COMPLETE)
		return 0x04; /* RST */
	return 0x10; /* ACK */
}

#endif /* !NP_XDP */

/* BPF_F_MARK_MANGLED_0 keeps a zero UDP checksum zero and never writes a computed zero as 0. */
static __always_inline __u64 np_csum_flags(const struct np_l4 *l4)
{
	return l4->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
}

#ifndef NP_XDP
/* Rewrites one IPv4 address at `off` (saddr or daddr) with the IP header checksum only. */
static __always_inline int np4_rewrite_l3(struct __sk_buff *skb, __u32 off, __be32 old, __be32 new)
{
	if (old == new)
		return 0;
	if (bpf_l3_csum_replace(skb, NP_L3_OFF + offsetof(struct iphdr, check), old, new, sizeof(new)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, off, &new, sizeof(new), 0);
}

/* Rewrites a port (`which`: 0 source, 2 destination) with the L4 checksum (SCTP: its CRC32c). */
static __always_inline int np_rewrite_port(struct __sk_buff *skb, const struct np_l4 *l4, __u32 which, __be16 old, __be16 new)
{
	if (old == new || !l4->has_ports)
		return 0;
	if (l4->proto == IPPROTO_SCTP)
		return lb_sctp_rewrite_port(skb, l4->l4_off, l4->l4_len, which, old, new);
	if (l4->csum_off && bpf_l4_csum_replace(skb, l4->csum_off, old, new, np_csum_flags(l4) | sizeof(new)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, l4->l4_off + which, &new, sizeof(new), 0);
}

/*
 * Rewrites one IPv6 address at `off`: only the L4 checksum covers it
 * (pseudo header). Where none does (SCTP, a later fragment), no checksum
 * change balances the new bytes: a CHECKSUM_COMPLETE skb's sum is
 * recomputed with them.
 */
static __always_inline int np6_rewrite_addr(struct __sk_buff *skb, const struct np_l4 *l4, __u32 off, const __be32 *old, const __be32 *new)
{
	__s64 diff;

	if (old[0] == new[0] && old[1] == new[1] && old[2] == new[2] && old[3] == new[3])
		return 0;
	if (!l4->has_ports || !l4->csum_off)
		return bpf_skb_store_bytes(skb, off, new, 16, BPF_F_RECOMPUTE_CSUM);
	diff = bpf_csum_diff((__be32 *)old, 16, (__be32 *)new, 16, 0);
	if (diff < 0 || bpf_l4_csum_replace(skb, l4->csum_off, 0, diff, BPF_F_PSEUDO_HDR | np_csum_flags(l4)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, off, new, 16, 0);
}

/*
 * Checksums inside an ICMP error (the quoted packet's, and the ICMP
 * header's own) are plain 16-bit fields to the skb: they are updated with
 * bpf_l3_csum_replace, which never consults or changes skb->ip_summed or
 * skb->csum. Every rewrite of an error keeps each checksummed region's sum,
 * so a CHECKSUM_COMPLETE skb's csum stays right without being touched.
 */

/* The checksum at `off` follows a change of `size` (2 or 4) bytes it covers, old -> new. */
static __always_inline int np_csum_follow(struct __sk_buff *skb, __u32 off, __u32 old, __u32 new, __u32 size)
{
	return bpf_l3_csum_replace(skb, off, old, new, size);
}

/* The checksum at `off` follows a change whose bpf_csum_diff() is `diff`. */
static __always_inline int np_csum_follow_diff(struct __sk_buff *skb, __u32 off, __s64 diff)
{
	if (diff < 0)
		return -1;
	return bpf_l3_csum_replace(skb, off, 0, diff, 0);
}

/* A UDP checksum a rewrite made 0 ("none") is sent as 0xffff, its equal in ones' complement. */
static __always_inline int np_udp_csum_nonzero(struct __sk_buff *skb, __u32 off)
{
	__u16 c;

	if (bpf_skb_load_bytes(skb, off, &c, sizeof(c)) < 0)
		return -1;
	if (c)
		return 0;
	c = 0xffff;
	return bpf_skb_store_bytes(skb, off, &c, sizeof(c), 0);
}

#endif /* !NP_XDP */

/* The Internet checksum (RFC 1071) of a bpf_csum_diff() sum, as it is stored. */
static __always_inline __u16 np_csum_fold(__s64 sum)
{
	__u32 s = (__u32)sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

#ifndef NP_XDP
/*
 * Decrements the TTL of a packet this program forwards itself (the stack
 * would have). The caller checked it was above 1 before translating: a
 * packet left to the stack after SNAT carries the node's own source, which
 * the stack drops as a martian instead of answering "time exceeded".
 */
static __always_inline bool np4_dec_ttl(struct __sk_buff *skb, __u8 ttl)
{
	__u32 off = NP_L3_OFF + offsetof(struct iphdr, ttl);
	__be16 old, new;
	__u8 nttl;

	if (ttl <= 1)
		return false;
	nttl = ttl - 1;
	/* the checksum covers ttl as the high byte of the ttl/protocol word */
	old = bpf_htons((__u16)ttl << 8);
	new = bpf_htons((__u16)nttl << 8);
	if (bpf_l3_csum_replace(skb, NP_L3_OFF + offsetof(struct iphdr, check), old, new, 2) < 0)
		return false;
	return bpf_skb_store_bytes(skb, off, &nttl, 1, 0) == 0;
}

static __always_inline bool np6_dec_hoplimit(struct __sk_buff *skb, __u8 hl)
{
	__u8 nhl;

	if (hl <= 1)
		return false;
	nhl = hl - 1;
	return bpf_skb_store_bytes(skb, NP_L3_OFF + offsetof(struct ipv6hdr, hop_limit), &nhl, 1, 0) == 0;
}

/*
 * The link-layer header of an error sent back out of the device its packet
 * came in on, to that packet's sender: the Ethernet addresses swapped
 * (nothing to do on a layer-3 device). <0: a multicast sender, which gets no
 * error, or a header that cannot be read.
 */
static __always_inline int np_l2_reverse(struct __sk_buff *skb)
{
#ifdef NP_L3_DEVICE
	return 0;
#else
	__u8 eth[2 * ETH_ALEN], swapped[2 * ETH_ALEN];

	if (bpf_skb_load_bytes(skb, 0, eth, sizeof(eth)) < 0 || (eth[0] & 1))
		return -1;
	__builtin_memcpy(swapped, eth + ETH_ALEN, ETH_ALEN);
	__builtin_memcpy(swapped + ETH_ALEN, eth, ETH_ALEN);
	return bpf_skb_store_bytes(skb, 0, swapped, sizeof(swapped), 0);
#endif
}

/*
 * Sends a translated packet out of the device the FIB names, as the stack
 * would have forwarded it: with the neighbour's address when the FIB knows
 * it, else through the neighbour subsystem (bpf_redirect_neigh resolves it).
 * Out of a layer-3 device (`l3_out`) there is no link-layer header: the
 * kernel drops the Ethernet one the packet came with. A packet that came in
 * on a layer-3 device (NP_L3_DEVICE) has none, and gets one before it
 * leaves by an Ethernet device (bpf_redirect_neigh, too, wants one).
 * Ingress only: the MACs are written in place (see np4_xlate()).
 */
static __always_inline int np_fib_redirect(struct __sk_buff *skb, struct bpf_fib_lookup *fib, int rc, bool l3_out)
{
	if (l3_out)
		return bpf_redirect(fib->ifindex, 0);
#ifdef NP_L3_DEVICE
	{
		__be16 proto = skb->protocol;

		if (bpf_skb_change_head(skb, ETH_HLEN, 0) < 0 ||
		    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto), 0) < 0)
			return TC_ACT_SHOT;
	}
#endif
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		struct ethhdr *eth = np_header(skb, 0, sizeof(*eth));

		if (!eth)
			return TC_ACT_SHOT;
		__builtin_memcpy(eth->h_dest, fib->dmac, ETH_ALEN);
		__builtin_memcpy(eth->h_source, fib->smac, ETH_ALEN);
		return bpf_redirect(fib->ifindex, 0);
	}
	return bpf_redirect_neigh(fib->ifindex, NULL, 0, 0);
}
#else /* NP_XDP */

/*
 * XDP's verdict for a frame it finished (forwarded out of a device), kept
 * apart from tc's verdicts the shared code returns: NP_XDP_VERDICT + an
 * XDP action.
 */
#define NP_XDP_VERDICT	0x200

/*
 * At XDP: out of the FIB's device with the neighbour's address the FIB
 * knows (the caller made sure it does, and that the device is one XDP may
 * send through); back out of the device it came in on, XDP_TX.
 */
static __always_inline int np_fib_redirect(struct np_ctx *ctx, struct bpf_fib_lookup *fib, int rc, bool l3_out)
{
	struct ethhdr *eth = np_header(ctx, 0, sizeof(*eth));

	if (!eth || l3_out || rc != BPF_FIB_LKUP_RET_SUCCESS)
		return TC_ACT_SHOT;
	__builtin_memcpy(eth->h_dest, fib->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib->smac, ETH_ALEN);
	if (fib->ifindex == ctx->ingress_ifindex)
		return NP_XDP_VERDICT + XDP_TX;
	return NP_XDP_VERDICT + bpf_redirect(fib->ifindex, 0);
}
#endif /* NP_XDP */

/*
 * The length a packet must fit the egress MTU with, as the stack measures
 * it when forwarding (ip_exceeds_mtu, ip6_pkt_too_big): its own (`len`,
 * from its IP header) or, for a GSO packet (GRO merged it, or a local
 * namespace sent it by TSO over a veth), that of each segment it becomes:
 * its IP and transport headers and gso_size (skb_gso_network_seglen).
 */
static __always_inline __u32 np_seglen(struct np_ctx *skb, const struct np_l4 *l4, __u32 len)
{
#ifdef NP_XDP
	__u32 gso = 0;	/* a frame on the wire: never merged yet */
#else
	__u32 gso = skb->gso_size;
#endif
	__u8 doff;

	if (!gso || !l4->has_ports)
		return len;
	/* SCTP is segmented by its chunks (GSO_BY_FRAGS): each already fits the path its stack measured */
	if (l4->proto == IPPROTO_SCTP)
		return 0;
	if (l4->proto != IPPROTO_TCP)
		return l4->l4_off - NP_L3_OFF + sizeof(struct udphdr) + gso;
	if (bpf_skb_load_bytes(skb, l4->l4_off + 12, &doff, sizeof(doff)) < 0)
		return len;
	return l4->l4_off - NP_L3_OFF + (doff >> 4) * 4 + gso;
}

/* A FIB answer that names a way out (possibly without a neighbour entry yet). */
static __always_inline bool np_fib_routed(int rc)
{
	return rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH;
}

/*
 * The datapath's clock, in seconds of CLOCK_MONOTONIC (the agent reads CT
 * expiries against its own). The coarse clock (5.11+) reads the
 * timekeeper's last tick instead of the TSC: 3 ns in every run of
 * bench/nodeport-tc.ts, where bpf_ktime_get_ns cost 3 to 27 on the same
 * machine (the TSC's read in a VM) and 30 on another; a tick behind at
 * most, nothing at a resolution of seconds. Which one is decided at load time, from the
 * kernel's BTF (CO-RE): the other call is dead code the verifier never
 * walks, so 5.10 loads the same object.
 */
static __always_inline __u64 np_now(void)
{
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_ktime_get_coarse_ns))
		return bpf_ktime_get_coarse_ns() / 1000000000ULL;
	return bpf_ktime_get_ns() / 1000000000ULL;
}

static __always_inline __u32 np_rol32(__u32 w, __u32 s)
{
	return (w << s) | (w >> (32 - s));
}

/*
 * The kernel's jhash_3words (include/linux/jhash.h): the Maglev flow hash,
 * the same in src/lb/maglev.ts (flowSlot4), so tests can predict a flow's
 * backend from user space.
 */
static __always_inline __u32 np_jhash_3words(__u32 a, __u32 b, __u32 c, __u32 initval)
{
	__u32 iv = initval + 0xdeadbeef + (3 << 2);

	a += iv;
	b += iv;
	c += iv;
	c ^= b; c -= np_rol32(b, 14);
	a ^= c; a -= np_rol32(c, 11);
	b ^= a; b -= np_rol32(a, 25);
	c ^= b; c -= np_rol32(b, 16);
	a ^= c; a -= np_rol32(c, 4);
	b ^= a; b -= np_rol32(a, 14);
	c ^= b; c -= np_rol32(b, 24);
	return c;
}

/* A small, good-enough mix of a flow's words (SNAT port choice; not shared with user space). */
static __always_inline __u32 np_mix(__u32 a, __u32 b, __u32 c)
{
	a ^= b * 0x9e3779b1U;
	a = (a << 13) | (a >> 19);
	a ^= c * 0x85ebca77U;
	a ^= a >> 16;
	a *= 0xc2b2ae3dU;
	a ^= a >> 13;
	return a;
}

#endif /* __NP_LIB_H */
