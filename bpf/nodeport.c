// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * NodePort, LoadBalancer and external IPs at tc, on the node's devices.
 *
 * Ingress, a client's packet to a frontend (dst:port, protocol; a node
 * address also matches the NodePort surrogate 0.0.0.0:port / [::]:port):
 * the flow's CT entry names its backend, or a new flow picks one. A backend
 * the FIB routes out of one of lbctl's devices is remote: the packet is
 * DNATed and SNATed to that device's address and a port of its own, and
 * redirected there. Any other backend is local (a pod behind a veth, or the
 * node itself): the packet is DNATed only, keeps the client's address, and
 * goes up the stack.
 * Ingress, a remote backend's reply (to a SNAT port): rev-SNAT and
 * rev-DNAT, then redirected towards the client.
 * Egress, a local backend's reply: rev-DNAT (source back to the frontend).
 *
 * A new flow to a frontend without endpoints is answered with an ICMP port
 * unreachable, as kube-proxy's REJECT rule does (externalTrafficPolicy
 * Local with endpoints only elsewhere is dropped instead, as kube-proxy
 * does). ICMP errors about translated flows, both ways, get the flow's
 * translation inside and out, so path MTU discovery works through it (see
 * the ICMP section); a packet this program redirects itself that is bigger
 * than the egress device's MTU is answered as a router would, with
 * fragmentation needed or packet too big (see np_mtu_check()).
 *
 * Anything else returns TC_ACT_UNSPEC (tcx's TCX_NEXT): the next program
 * and the stack see the packet untouched. ClusterIPs are not served from
 * outside unless the agent says so (--external-clusterip).
 */
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

#include "include/lb_types.h"
#include "include/np_maps.h"
#include "lib/addr.h"
#include "lib/dsr.h"
#include "lib/lb.h"
#include "lib/np.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* CT lifetimes, seconds. */
#define CT_LIFETIME_TCP_SYN	60	/* a TCP flow until the client's ACK of the backend's answer */
#define CT_LIFETIME_CLOSE	10	/* TCP closed: a FIN each way, or a reset */
/* Defaults of those the agent may set (lb_np_config; 0 there: these). */
#define CT_LIFETIME_TCP		21600	/* established (--conntrack-tcp-timeout-established) */
#define CT_LIFETIME_CLOSE_WAIT	3600	/* half closed: one side's FIN (--conntrack-tcp-timeout-close-wait) */
#define CT_LIFETIME_NONTCP	60	/* UDP (--conntrack-udp-timeout) */

/* Upper bound of --snat-port-range retries the verifier sees. */
#define NP_SNAT_TRIES_MAX	32

/*
 * Not tc verdicts: what a family's handler asks its section entry to do
 * next, in a subprogram of its own whose stack frame sits beside the
 * handler's rather than under it (together they would pass 512 bytes).
 */
#define NP_DO_ICMP	0x100	/* an ICMP packet: maybe an error about a translated flow */
#define NP_DO_REJECT	0x101	/* a new flow to a frontend without endpoints: port unreachable */
#define NP_NOT_HOST	0x102	/* np4/np6_host_flow(): not the node's own flow from a SNAT address */
#define NP_DO_TOOBIG	0x10000	/* | the MTU (low 16 bits): fragmentation needed / packet too big; above every verdict */
#define NP_MTU_MASK	0xffff

/* np4_parse()/np6_parse(): the first fragment of a datagram (its ports are in the flow). */
#define NP_PARSE_FRAG	1
/* np4_parse()/np6_parse(): an ICMP or ICMPv6 packet, left to the ICMP handlers. */
#define NP_PARSE_ICMP	2

#define TCP_F_FIN	0x01
#define TCP_F_SYN	0x02
#define TCP_F_RST	0x04
#define TCP_F_ACK	0x10

/*
 * A SNAT port whose TCP flow the backend closed first is best left alone
 * this long past its entry's expiry: the backend keeps the old tuple in
 * TIME_WAIT for 60 s, and a new client's SYN on it is accepted only when
 * its timestamp (or sequence number) is newer than the old connection's;
 * otherwise the backend answers with an ACK of the old connection, the
 * client resets it and retries a second later. When the client closed
 * first, or either side reset, the backend holds nothing.
 */
#define NP_SNAT_TIME_WAIT	60

/*
 * What a SNAT port's lb*_nat entry leaves a new flow, best last: a live flow
 * holds it (NP_NAT_BUSY); its TCP flow is closed but the backend may still
 * hold the tuple in TIME_WAIT (NP_NAT_TW); its TCP flow is closed and the
 * backend holds nothing (NP_NAT_CLOSED); expired, and past the TIME_WAIT
 * hold (NP_NAT_FREE). See np4_snat_reserve() for the order they are taken in.
 */
enum { NP_NAT_BUSY, NP_NAT_TW, NP_NAT_CLOSED, NP_NAT_FREE };

/*
 * Only the entry's own flags decide, not the flow's protocol: CLOSING and
 * TIME_WAIT are set for TCP (and SCTP) flows alone. A branch on the
 * protocol here, inside the reservation's loop, split the verifier's work
 * by protocol at every try.
 */
static __always_inline int np_nat_rank(__u64 expires, __u16 flags, __u64 now)
{
	__u64 hold = (flags & LB_CT_F_TIME_WAIT) ? NP_SNAT_TIME_WAIT : 0;

	if (expires + hold <= now)
		return NP_NAT_FREE;
	if (!(flags & LB_CT_F_CLOSING))
		return NP_NAT_BUSY;
	return hold ? NP_NAT_TW : NP_NAT_CLOSED;
}

/* The device a packet came in on (tc at egress: the one it leaves by). */
static __always_inline __u32 np_in_ifindex(struct np_ctx *skb)
{
#ifdef NP_XDP
	return skb->ingress_ifindex;
#else
	return skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
#endif
}

static __always_inline const struct lb_np_config *np_config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&lb_np_config, &zero);
}

/*
 * The agent is carrying flows into new maps (LB_NP_F_MIGRATING), and its
 * deadline has not passed: an agent killed inside the window leaves the flag
 * set, and the deadline ends what it holds back.
 */
static __always_inline bool np_migrating(const struct lb_np_config *cfg, __u64 now)
{
	return (cfg->flags & LB_NP_F_MIGRATING) && now < cfg->migrating_until;
}

/* A packet held back while flows are carried (np_migrating()): its sender retransmits into the copy. */
static __always_inline int np_migrating_drop(void)
{
	lb_count(LB_MTR_NP_MIGRATING_DROP);
	return TC_ACT_SHOT;
}

static __always_inline bool np_in_range(__be16 port, __u16 lo, __u16 hi)
{
	__u16 p = bpf_ntohs(port);

	return lo && p >= lo && p <= hi;
}

/* Whether some frontend may have this port (LB_NP_F_PORTS: lb_np_ports says; else any may). */
static __always_inline bool np_frontend_port(const struct lb_np_config *cfg, __be16 port)
{
	__u16 p = bpf_ntohs(port);
	__u32 word = p / 64;
	__u64 *bits;

	if (!(cfg->flags & LB_NP_F_PORTS))
		return true;
	bits = bpf_map_lookup_elem(&lb_np_ports, &word);
	return bits && (*bits >> (p % 64)) & 1;
}

/* A SYN without ACK (SCTP: an INIT): a client opening a connection (maybe reusing a tuple). */
static __always_inline bool np_tcp_syn(const struct np_l4 *l4)
{
	return np_stateful(l4->proto) && (l4->tcp_flags & (TCP_F_SYN | TCP_F_ACK)) == TCP_F_SYN;
}

/* A client's SYN on a tuple whose flow was closed or half closed: a new flow, not that one. */
static __always_inline bool np_ct_reopened(const struct np_l4 *l4, __u16 flags)
{
	return (flags & (LB_CT_F_CLOSING | LB_CT_F_FIN_ORIG | LB_CT_F_FIN_REPLY)) && np_tcp_syn(l4);
}

/*
 * A flow's flags after a packet of it (`reply`: from the backend): a reset
 * closes it, a FIN half closes it, FINs both ways close it; the backend's
 * FIN before the client's makes the backend the active closer, which
 * holds the tuple in TIME_WAIT. Both entries of a flow carry the same.
 */
static __always_inline __u16 np_ct_flags(const struct np_l4 *l4, __u16 flags, bool reply)
{
	__u8 t = l4->tcp_flags;

	if (!np_stateful(l4->proto))
		return flags;
	if (t & TCP_F_RST)
		return flags | LB_CT_F_CLOSING;
	if (!(t & TCP_F_FIN))
		return flags;
	if (reply) {
		if (!(flags & (LB_CT_F_FIN_ORIG | LB_CT_F_CLOSING)))
			flags |= LB_CT_F_TIME_WAIT;
		flags |= LB_CT_F_FIN_REPLY;
	} else {
		flags |= LB_CT_F_FIN_ORIG;
	}
	if ((flags & (LB_CT_F_FIN_ORIG | LB_CT_F_FIN_REPLY)) == (LB_CT_F_FIN_ORIG | LB_CT_F_FIN_REPLY))
		flags |= LB_CT_F_CLOSING;
	return flags;
}

/* The flags an entry takes from its flow's other entry. */
#define NP_CT_F_SHARED	(LB_CT_F_CLOSING | LB_CT_F_SEEN_REPLY | LB_CT_F_TIME_WAIT | LB_CT_F_FIN_ORIG | LB_CT_F_FIN_REPLY)

/* SCTP has TCP's: an association is as long-lived, and its heartbeats (30 s) keep it alive. */
static __always_inline __u64 np_lifetime(const struct lb_np_config *cfg, __u8 proto, __u16 flags)
{
	if (!np_stateful(proto))
		return cfg->ct_udp ? cfg->ct_udp : CT_LIFETIME_NONTCP;
	if (flags & LB_CT_F_CLOSING)
		return CT_LIFETIME_CLOSE;
	if (flags & (LB_CT_F_FIN_ORIG | LB_CT_F_FIN_REPLY))
		return cfg->ct_tcp_close_wait ? cfg->ct_tcp_close_wait : CT_LIFETIME_CLOSE_WAIT;
	if (flags & LB_CT_F_SEEN_REPLY)
		return cfg->ct_tcp_established ? cfg->ct_tcp_established : CT_LIFETIME_TCP;
	return CT_LIFETIME_TCP_SYN;
}

/*
 * Sets an entry's flags and moves its expiry on (the clock is in seconds:
 * at most one write a second). True when either changed, so the flow's
 * other entry is brought along as rarely.
 */
static __always_inline bool np_ct_set(const struct lb_np_config *cfg, __u64 *expires, __u16 *flags, __u8 proto, __u16 f, __u64 now)
{
	__u64 e = now + np_lifetime(cfg, proto, f);
	bool changed = false;

	if (f != *flags) {
		*flags = f;
		changed = true;
	}
	if (e != *expires) {
		*expires = e;
		changed = true;
	}
	return changed;
}

/* A flow's other entry after this one changed: the state they share, the same lifetime. */
static __always_inline void np_ct_pair(const struct lb_np_config *cfg, __u64 *expires, __u16 *flags, __u8 proto, __u16 from, __u64 now)
{
	np_ct_set(cfg, expires, flags, proto, *flags | (from & NP_CT_F_SHARED), now);
}

/*
 * Path MTU, for a packet this program redirects itself (DNAT+SNAT to a
 * remote backend, and that backend's replies to the client): after
 * bpf_redirect() nothing fragments it or answers for it, so one bigger than
 * the egress device's MTU was lost without a word (the kernel drops it, or
 * bpf_fib_lookup's own check makes the lookup fail) and the sender never
 * learned the path's MTU. `seglen` is np_seglen()'s (GSO-aware); the MTU is
 * lb_devices' copy of the egress device's (5.10's bpf_fib_lookup reports
 * none, bpf_check_mtu is 5.12+), or the one bpf_fib_lookup reports (5.12+)
 * when its own check failed; `dev` is lb_devices' entry of the FIB's
 * device (np_fib_dev()). Called before any rewrite: the error built
 * over the packet then quotes it as its sender sent it. 0: it fits (or no
 * MTU is known); else NP_DO_TOOBIG | the MTU.
 */
static __always_inline int np_mtu_check(const struct lb_device *dev, const struct bpf_fib_lookup *fib, int rc, __u32 seglen)
{
	__u32 mtu = dev ? dev->mtu : 0;

	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED && fib->mtu_result)
		mtu = fib->mtu_result;
	if (!mtu || mtu > NP_MTU_MASK || seglen <= mtu)
		return 0;
#ifndef NP_XDP	/* XDP hands it to tc (np_xdp_verdict()), which counts it */
	lb_count(LB_MTR_NP_FRAG_NEEDED);
#endif
	return NP_DO_TOOBIG | mtu;
}

/* lb_devices' entry of the device the FIB named, if it is one of ours. */
static __always_inline const struct lb_device *np_fib_dev(const struct bpf_fib_lookup *fib)
{
	__u32 ifindex = fib->ifindex;

	return bpf_map_lookup_elem(&lb_devices, &ifindex);
}

#ifndef NP_XDP
/*
 * skb->tc_index: a packet this program translated and redirected to a
 * device of ours (np_forward_dev()), whose egress program has nothing left
 * to do for it: it returns at once (np_egress_done()), where it would look
 * the packet up for a local flow's reply and find none (a remote flow's
 * packets both ways, DSR's, ICMP errors translated). The kernel keeps
 * tc_index from the redirect to the device's egress; the bit is cleared
 * where it is read, and at ingress. One set for a device whose egress does
 * not run ours (not attached yet, or an older release's mid-switch) may
 * ride a tunnel's outer packet (ipip, vxlan, geneve keep the skb) to the
 * underlay's egress, which then only skips the node's-own-flow check
 * (np4_host_flow()) for that packet. A bit of its own: Cilium's
 * TC_INDEX_F_* flags take the low ones.
 */
#define NP_TC_INDEX_REDIRECTED	0x8000
#endif

/* np_fib_redirect() out of the FIB's device (`dev`, np_fib_dev()'s), a layer-3 one or not as lb_devices says. */
static __always_inline int np_forward_dev(struct np_ctx *skb, struct bpf_fib_lookup *fib, int rc, const struct lb_device *dev)
{
#ifndef NP_XDP
	if (dev)
		skb->tc_index |= NP_TC_INDEX_REDIRECTED;
#endif
	return np_fib_redirect(skb, fib, rc, dev && (dev->flags & LB_DEV_F_L3));
}

#ifndef NP_XDP
static __always_inline int np_forward(struct np_ctx *skb, struct bpf_fib_lookup *fib, int rc)
{
	return np_forward_dev(skb, fib, rc, np_fib_dev(fib));
}
#endif

#ifdef NP_XDP
/*
 * XDP: a service's packet it cannot finish (a local backend's, which goes
 * up the stack anyway; DSR, whose option needs room it cannot make; one
 * too big, at its last hop, or to a neighbour the FIB does not know yet;
 * one to send out of a device without native XDP) goes on to tc as it came
 * in: every such decision is taken before any rewrite. The flow's entries,
 * if this packet made them, are tc's to use.
 */
static __always_inline int np_xdp_to_tc(void)
{
	lb_count(LB_MTR_NP_XDP_TO_TC);
	return TC_ACT_UNSPEC;
}

/* Whether XDP sends a frame the FIB routed by `rc` out of `dev` itself. */
static __always_inline bool np_xdp_sends(const struct lb_device *dev, int rc)
{
	return rc == BPF_FIB_LKUP_RET_SUCCESS && dev && (dev->flags & LB_DEV_F_XDP);
}
#endif

/* What np4_dsr_recv()/np6_dsr_recv() return for a packet without a DSR option: not theirs. */
#define NP_NOT_DSR	0x103
/* What np4_fwd() returns for an IPv4 NodePort's packet with neither a live CT entry nor a frontend: no service's. */
#define NP_NOT_SVC	0x104

/*
 * Whether a new flow to a remote backend goes by direct server return
 * (--nodeport-mode): TCP in dsr and hybrid, UDP in dsr only, SCTP never
 * (its multi-homing would need the option on every path's packets). A
 * packet whose IP header already has options (IPv4), or that has extension
 * headers (IPv6: a hop-by-hop header must stay first), is SNATed as before.
 */
static __always_inline bool np_dsr_wanted(const struct lb_np_config *cfg, const struct np_l4 *l4, __u32 l3_len)
{
	if (l4->l4_off != NP_L3_OFF + l3_len)
		return false;
	if (l4->proto == IPPROTO_TCP)
		return cfg->flags & LB_NP_F_DSR;
	return l4->proto == IPPROTO_UDP && (cfg->flags & LB_NP_F_DSR_UDP);
}

/* ------------------------------------------------------------------ IPv4 */

struct np4_flow {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u16 tot_len;
	__be16 id;
	__u8 ttl;
	bool frag_first;	/* MF set, offset 0: later fragments follow it */
	bool df;		/* don't fragment */
	struct np_l4 l4;
};

/* The most of a transport header the parse reads: TCP's up to its flags. */
#define NP_L4_PARSED	offsetof(struct tcphdr, window)

/* What np_parse_l4() reads of a transport header: TCP's up to its flags, UDP's 8 bytes, SCTP's ports. */
static __always_inline __u32 np_l4_parsed(__u8 proto)
{
	return proto == IPPROTO_TCP ? NP_L4_PARSED : proto == IPPROTO_UDP ? sizeof(struct udphdr) : 2 * sizeof(__be16);
}

/*
 * The transport header at `off`: the packet made linear up to what the
 * parse reads of it (np_pull(), `len` bytes), and `off` returned. A global
 * function, verified once apart from its callers, and called on every
 * path: its result is a number the verifier knows nothing about, the same
 * on every path, where `off` itself differs with IPv6's walk over its
 * extension headers (and, used for packet pointers, is tracked precisely
 * back to it: every walk then went through the rest of the program on its
 * own, 231,000 instructions verified instead of 120,000). The caller holds
 * no packet pointer across it (before 6.13 the verifier does not know that
 * a global function may move the packet).
 */
__attribute__((noinline)) int np_l4_pull(struct np_ctx *skb, __u32 off, __u32 len)
{
	if (!skb || off > NP_HDR_OFF_MAX || len > NP_L4_PARSED)
		return -1;
	np_pull(skb, off + len);
	return off;
}

/*
 * A transport header's ports (and TCP's flags, UDP's checksum) into `l4`
 * and the flow's ports: read in place, as much of the header as the
 * protocol's parse reads (TCP: up to its flags; UDP: its 8 bytes; SCTP:
 * its ports, then its first chunk). <0: the packet is shorter.
 */
static __always_inline int np_parse_l4(struct np_ctx *skb, struct np_l4 *l4, __be16 *sport, __be16 *dport)
{
	__u32 ports;

	if (l4->proto == IPPROTO_TCP) {
		__u8 *th = np_header(skb, l4->l4_off, NP_L4_PARSED);

		if (!th)
			return -1;
		ports = *(__u32 *)th;
		l4->tcp_flags = th[13];
	} else if (l4->proto == IPPROTO_UDP) {
		struct udphdr *uh = np_header(skb, l4->l4_off, sizeof(*uh));

		if (!uh)
			return -1;
		ports = *(__u32 *)uh;
		l4->udp_zero_csum = uh->check == 0;
	} else {
#ifdef NP_XDP
		return -1;	/* SCTP: its CRC32c rewrite is tc's */
#else
		__u32 *p = np_header(skb, l4->l4_off, sizeof(ports));

		if (!p)
			return -1;
		ports = *p;
		l4->tcp_flags = np_sctp_flags(skb, l4->l4_off, l4->l4_len);
#endif
	}
	*sport = (__be16)ports;
	*dport = (__be16)(ports >> 16);
	l4->has_ports = true;
	return 0;
}

/*
 * 0: a TCP or UDP packet (fragment) whose addresses and ports are in `f`;
 * NP_PARSE_ICMP: an ICMP packet (nothing in `f`); <0: not ours to look at.
 * Read in place, each header made linear first where it is not (np_pull()).
 */
static __always_inline int np4_parse(struct np_ctx *skb, struct np4_flow *f)
{
	struct iphdr *ip;
	int l4_off;
	__u32 hlen;
	__u16 frag;
	__u8 proto;

	np_pull(skb, NP_L3_OFF + sizeof(*ip));
	ip = np_header(skb, NP_L3_OFF, sizeof(*ip));
	if (!ip || ip->ihl < 5 || ip->version != 4)
		return -1;
	proto = ip->protocol;
	if (proto == IPPROTO_ICMP)
		return NP_PARSE_ICMP;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_SCTP)
		return -1;
	frag = bpf_ntohs(ip->frag_off);
#ifdef NP_XDP
	if (frag & (IP_MF | IP_OFFSET))
		return -1;	/* fragments: tc's (it records and finds their ports) */
#endif
	/* a fragment's CRC32c covers the reassembled packet: no update can follow a port change in it */
	if (proto == IPPROTO_SCTP && (frag & (IP_MF | IP_OFFSET)))
		return -1;
	hlen = ip->ihl * 4;
	f->saddr = ip->saddr;
	f->daddr = ip->daddr;
	f->tot_len = bpf_ntohs(ip->tot_len);
	f->id = ip->id;
	f->ttl = ip->ttl;
	f->l4.proto = proto;
	f->l4.l4_off = NP_L3_OFF + hlen;
	f->l4.csum_off = np_l4_csum_off(proto, f->l4.l4_off);
	f->l4.l4_len = f->tot_len - hlen;
	f->l4.tcp_flags = 0;
	f->l4.udp_zero_csum = false;
	f->frag_first = (frag & IP_MF) && !(frag & IP_OFFSET);
	f->df = frag & IP_DF;
	if (frag & IP_OFFSET) {
		/* a later fragment: its ports are those its first fragment recorded */
		struct lb4_frag_key fk = { .saddr = f->saddr, .daddr = f->daddr, .id = f->id, .proto = proto };
		struct lb4_frag_ports *fp = bpf_map_lookup_elem(&lb4_frag, &fk);

		if (!fp)
			return -1;
		f->sport = fp->sport;
		f->dport = fp->dport;
		f->l4.has_ports = false;
		f->l4.csum_off = 0;
		return 0;
	}
	/* the options, if any, and the transport header */
	l4_off = np_l4_pull(skb, f->l4.l4_off, np_l4_parsed(proto));
	if (l4_off < 0)
		return -1;
	f->l4.l4_off = l4_off;
	return np_parse_l4(skb, &f->l4, &f->sport, &f->dport);
}

static __always_inline void np4_frag_record(const struct np4_flow *f)
{
	struct lb4_frag_key fk = { .saddr = f->saddr, .daddr = f->daddr, .id = f->id, .proto = f->l4.proto };
	struct lb4_frag_ports fp = { .sport = f->sport, .dport = f->dport };

	if (f->frag_first)
		bpf_map_update_elem(&lb4_frag, &fk, &fp, BPF_ANY);
}

static __always_inline bool np4_is_node_addr(__be32 addr)
{
	struct lb_node_addr_key k = { .address = { addr }, .family = 4 };

	return bpf_map_lookup_elem(&lb_node_addrs, &k) != NULL;
}

/* The frontend a client's packet asks for: its own entry, else the NodePort surrogate on a node address. */
static __always_inline struct lb_service *np4_lookup(const struct np4_flow *f, struct lb4_key *key, const struct lb_np_config *cfg)
{
	struct lb_service *svc;

	key->address = f->daddr;
	key->dport = f->dport;
	key->proto = f->l4.proto;
	key->scope = LB_SCOPE_EXT;
	svc = lb4_lookup_service(key);
	if (svc) {
		if (svc->type == LB_SVC_WILDCARD)
			return NULL;
		if (svc->type == LB_SVC_CLUSTER_IP && !(cfg->flags & LB_NP_F_EXTERNAL_CLUSTERIP))
			return NULL;
		return svc;
	}
	if (!np_in_range(f->dport, cfg->nodeport_min, cfg->nodeport_max) || !np4_is_node_addr(f->daddr))
		return NULL;
	key->address = 0;
	return lb4_lookup_service(key);
}

static __always_inline bool np4_src_allowed(const struct lb_service *svc, __be32 saddr)
{
	struct lb4_src_range_key k = { .prefixlen = 64, .rev_nat_index = svc->rev_nat_index, .address = saddr };

	if (!(svc->flags & LB_SVC_F_SRC_RANGE))
		return true;
	return bpf_map_lookup_elem(&lb4_src_range, &k) != NULL;
}

/*
 * The way a packet goes (bpf_fib_lookup()'s answer in *fib), for `use`:
 * NP_FIB_CACHED, an established flow's packet, takes the answer this CPU
 * kept for the same question (device in, addresses, protocol, ports) in
 * this second of np_now() (`now`: struct lb_fib_cache); NP_FIB_FRESH, a
 * new flow's, asks the FIB and keeps its answer; NP_FIB_ONLY asks and
 * keeps nothing. Only a complete answer is kept (BPF_FIB_LKUP_RET_SUCCESS:
 * device and both MACs, and the device's MTU, 5.12+); a route or
 * neighbour change reaches established flows within a second.
 */
enum { NP_FIB_ONLY, NP_FIB_FRESH, NP_FIB_CACHED };

/* The question's protocol and ports, for its slot's hash. */
static __always_inline __u32 np_fib_ports(const struct bpf_fib_lookup *fib)
{
	return ((__u32)fib->sport << 16 | fib->dport) ^ fib->l4_protocol;
}

static __always_inline __u32 np_fib_slot(__u32 in, __u32 h)
{
	return ((in ^ h) * 0x9e3779b1U) >> (32 - LB_FIB_CACHE_BITS);
}

/*
 * A kept answer, as the FIB gave it: at tc its own check of the packet's
 * length against the device's MTU is made again (is_skb_forwardable(): a
 * GSO packet passes; np_mtu_check() makes the segment-aware one), with an
 * Ethernet header's length where the kernel takes the device's (a layer-3
 * device's packets may be 14 bytes longer here; np_mtu_check() has its
 * exact MTU when it is one of ours).
 */
static __always_inline int np_fib_kept(struct np_ctx *skb, struct bpf_fib_lookup *fib, const struct lb_fib_cache *c)
{
	fib->ifindex = c->ifindex;
	fib->mtu_result = c->mtu;
	__builtin_memcpy(fib->smac, c->smac, ETH_ALEN);
	__builtin_memcpy(fib->dmac, c->dmac, ETH_ALEN);
#ifndef NP_XDP
	if (c->mtu && !skb->gso_size && skb->len > (__u32)c->mtu + ETH_HLEN + 4 /* VLAN_HLEN */)
		return BPF_FIB_LKUP_RET_FRAG_NEEDED;
#endif
	return BPF_FIB_LKUP_RET_SUCCESS;
}

/* Whether slot `c` holds the question *fib asks (its inputs: both families' addresses are four words). */
static __always_inline bool np_fib_same(const struct lb_fib_cache *c, const struct bpf_fib_lookup *fib)
{
	return c->in_ifindex == fib->ifindex && c->family == fib->family && c->proto == fib->l4_protocol &&
	       c->sport == fib->sport && c->dport == fib->dport && ip6_equal(c->src, fib->ipv6_src) &&
	       ip6_equal(c->dst, fib->ipv6_dst);
}

/*
 * The lookup of a *fib np4_fib()/np6_fib() filled in, through the cache. A
 * function of its own: inlined, the cache's key and pointer cost
 * np_ingress6's frame the 32 bytes that put its call chain over 5.10's and
 * 6.1's 512.
 */
static __noinline int np_fib(struct np_ctx *skb, struct bpf_fib_lookup *fib, __u64 now, int use)
{
	struct lb_fib_cache *c = NULL;
	__u32 slot;
	int rc;

	/*
	 * The slot takes the question before the lookup (which writes its
	 * answer over the destination: the next hop's address), and the answer
	 * and its second after a complete one: few values live across the
	 * call, each a stack slot of this frame otherwise. An IPv4 address is
	 * word 0, the others 0 (np4_fib() zeroes the question); an IPv6 one's
	 * words 2 and 3 (the interface id) vary most, word 0 between sites.
	 */
	if (use != NP_FIB_ONLY) {
		slot = np_fib_slot(fib->ifindex, fib->ipv6_src[0] ^ fib->ipv6_src[2] ^ fib->ipv6_src[3] ^
						 np_rol32(fib->ipv6_dst[0] ^ fib->ipv6_dst[2] ^ fib->ipv6_dst[3], 16) ^ np_fib_ports(fib));
		c = bpf_map_lookup_elem(&lb_fib_cache, &slot);
	}
	if (c && use == NP_FIB_CACHED && c->stamp == now && np_fib_same(c, fib))
		return np_fib_kept(skb, fib, c);
	if (c) {
		c->stamp = 0;
		c->in_ifindex = fib->ifindex;
		c->family = fib->family;
		c->proto = fib->l4_protocol;
		c->sport = fib->sport;
		c->dport = fib->dport;
		ip6_copy(c->src, fib->ipv6_src);
		ip6_copy(c->dst, fib->ipv6_dst);
	}
	rc = bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
	/* a kept answer's MTU check needs the device's MTU, which 5.10 and 5.11 do not report: nothing kept there */
	if (c && rc == BPF_FIB_LKUP_RET_SUCCESS && fib->mtu_result) {
		c->ifindex = fib->ifindex;
		c->mtu = fib->mtu_result;
		__builtin_memcpy(c->smac, fib->smac, ETH_ALEN);
		__builtin_memcpy(c->dmac, fib->dmac, ETH_ALEN);
		c->stamp = now;
	}
	return rc;
}

static __always_inline int np4_fib(struct np_ctx *skb, struct bpf_fib_lookup *fib, __u8 proto,
				   __be32 src, __be32 dst, __be16 sport, __be16 dport, __u64 now, int use)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET;
	fib->l4_protocol = proto;
	fib->sport = sport;
	fib->dport = dport;
	fib->ipv4_src = src;
	fib->ipv4_dst = dst;
	fib->ifindex = np_in_ifindex(skb);
	return np_fib(skb, fib, now, use);
}

/*
 * The first SNAT port a new flow tries: the one this client tuple had last
 * (`prev`, a closed or expired flow opened again: the backend took that
 * tuple's last segments from this very client, whose next SYN it accepts,
 * and a retried SYN after a reset keeps its port), else the client's own
 * source port when it is inside --snat-port-range, else the port the
 * flow's tuple hashes to. An offset into the range.
 */
static __always_inline __u32 np_snat_first(const struct lb_np_config *cfg, __be16 prev, __be16 client_port, __u32 hash)
{
	__u16 p = bpf_ntohs(prev), c = bpf_ntohs(client_port);

	if (p && p >= cfg->snat_min && p <= cfg->snat_max)
		return p - cfg->snat_min;
	if (c >= cfg->snat_min && c <= cfg->snat_max)
		return c - cfg->snat_min;
	return hash;
}

/*
 * A SNAT port search's request and state (np4/np6_snat_search()), in a
 * per-CPU scratch value: the search is a global function, which the
 * verifier checks once, apart from the paths that call it (whose protocol,
 * flow state and branches otherwise multiplied its work at every try of
 * its loop), and a global function takes scalars only (5.10); the best
 * closed port met so far lives here rather than in registers for the same
 * reason. The program's scratch space, not the agent's: declared here,
 * unpinned.
 */
struct np4_snat_req {
	__u8 rk[sizeof(struct lb4_ct_key)];	/* the reservation's key (its dport the search's), as bytes: no nested struct in the ABI */
	__u8 nat[sizeof(struct lb4_ct_entry)];	/* what it holds: addr1/port1 the frontend, addr2/port2 the client */
	__u64 now;
	__u32 first;			/* np_snat_first()'s offset */
	__u32 best_rank;		/* NP_NAT_*: NP_NAT_BUSY while none was met */
	__be16 best_port;
	__u8 pad[6];
};

struct np6_snat_req {
	__u8 rk[sizeof(struct lb6_ct_key)];
	__u8 nat[sizeof(struct lb6_ct_entry)];
	__u64 now;
	__u32 first;
	__u32 best_rank;
	__be16 best_port;
	__u8 pad[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct np4_snat_req);
	__uint(max_entries, 1);
} lb_snat_req4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct np6_snat_req);
	__uint(max_entries, 1);
} lb_snat_req6 SEC(".maps");

/* True when a port of `rank` is free to take now; else remembers it if it is the best closed one yet. */
static __always_inline bool np_snat_consider(__u32 *best_rank, __be16 *best_port, int rank, __be16 port)
{
	if (rank == NP_NAT_FREE)
		return true;
	if ((__u32)rank > *best_rank) {
		*best_rank = rank;
		*best_port = port;
	}
	return false;
}

/*
 * The search for a new flow's SNAT port, by inserting its lb4_nat entry
 * (the request's) with BPF_NOEXIST: the port np_snat_first() names, then
 * random ones. Every (backend, SNAT address, port, protocol) tuple is a
 * reservation of its own, so a port serves any number of backends. A free
 * port (never used, or expired: np_nat_rank()) is taken at once, and so is
 * one whose last flow was this same client tuple's; when no try finds one,
 * the best closed flow's met on the way is taken over: closed flows never
 * starve new ones. The port, or -1 when every try met a live flow.
 */
__attribute__((noinline)) int np4_snat_search(__u32 unused)
{
	const struct lb_np_config *cfg = np_config();
	__u32 zero = 0, span, pick, i;
	struct np4_snat_req *q = bpf_map_lookup_elem(&lb_snat_req4, &zero);
	struct lb4_ct_key *rk;
	struct lb4_ct_entry *nat;

	if (!q || !cfg || !cfg->snat_min || cfg->snat_max < cfg->snat_min)
		return -1;
	rk = (void *)q->rk;
	nat = (void *)q->nat;
	span = (__u32)cfg->snat_max - cfg->snat_min + 1;
	pick = q->first;
	q->best_rank = NP_NAT_BUSY;
	for (i = 0; i < NP_SNAT_TRIES_MAX; i++) {
		struct lb4_ct_entry *old;

		if (i > cfg->snat_retries)
			break;
		if (i > 0)
			pick = bpf_get_prandom_u32();
		rk->dport = bpf_htons(cfg->snat_min + pick % span);
		old = bpf_map_lookup_elem(&lb4_nat, rk);
		if (old) {
			bool own = old->addr2 == nat->addr2 && old->port2 == nat->port2 && old->addr1 == nat->addr1 && old->port1 == nat->port1;

			if (!own && !np_snat_consider(&q->best_rank, &q->best_port, np_nat_rank(old->expires, old->flags, q->now), rk->dport))
				continue;
			bpf_map_delete_elem(&lb4_nat, rk);
		}
		if (bpf_map_update_elem(&lb4_nat, rk, nat, BPF_NOEXIST) == 0)
			return rk->dport;
	}
	if (q->best_rank == NP_NAT_BUSY)
		return -1;
	rk->dport = q->best_port;
	bpf_map_delete_elem(&lb4_nat, rk);
	if (bpf_map_update_elem(&lb4_nat, rk, nat, BPF_NOEXIST) < 0)
		return -1;
	lb_count(LB_MTR_NP_SNAT_REUSE);
	return rk->dport;
}

/* Reserves a SNAT port for a new flow to a remote backend (np4_snat_search()). */
static __always_inline int np4_snat_reserve(const struct lb_np_config *cfg, const struct np4_flow *f,
					    const struct lb4_backend *be, __be32 snat_addr,
					    const struct lb4_ct_entry *nat, __u64 now, __be16 prev, __be16 *port_out)
{
	struct lb4_ct_key rk = { .saddr = be->address, .daddr = snat_addr, .sport = be->port,
				 .proto = f->l4.proto, .dir = LB_CT_REPLY };
	__u32 zero = 0;
	struct np4_snat_req *q = bpf_map_lookup_elem(&lb_snat_req4, &zero);
	int port;

	if (!q)
		return -1;
	__builtin_memcpy(q->rk, &rk, sizeof(rk));
	__builtin_memcpy(q->nat, nat, sizeof(*nat));
	q->now = now;
	q->first = np_snat_first(cfg, prev, f->sport, np_mix(f->saddr, f->daddr, ((__u32)f->sport << 16) | f->dport));
	port = np4_snat_search(0);
	if (port < 0)
		return -1;
	*port_out = (__be16)port;
	return 0;
}

/*
 * The transport checksum after a rewrite at ingress: `addrs`, the sum of
 * the address changes, through the pseudo header (the kernel keeps a
 * CHECKSUM_PARTIAL field and a CHECKSUM_COMPLETE skb's csum right), and
 * `ports`, the port changes' (none to a CHECKSUM_PARTIAL field, which
 * holds the pseudo header's sum only): two updates at most, however many
 * words changed. SCTP's CRC32c follows its ports instead (no pseudo
 * header); a later fragment has no transport header: where no transport
 * checksum covers the addresses (`recsum`, IPv6), a CHECKSUM_COMPLETE
 * skb's csum follows them instead (bpf_csum_update(); a no-op for any
 * other skb; IPv4's header checksum keeps its sum). Called after every
 * write in place: these helpers may move the packet. What they need is
 * taken first, so that little stays live across them (each value that
 * does is a stack slot, and a frame more than 32 bytes put IPv6's call
 * chain over 5.10's 512).
 */
#ifndef NP_XDP
/*
 * The transport checksum field at `off` (np_l4_csum_update()'s reads
 * around a helper call), bounded on the very register added to the
 * packet's start: clang's np_header() there bounded one copy of `off` and
 * added another, whose range the verifier does not know, and kept
 * &skb->data across the call, a ctx pointer it refuses to dereference.
 */
static __always_inline __u16 *np_csum_field(struct np_ctx *skb, __u32 off)
{
	__u64 o = off;
	void *data, *end;

	asm volatile("%[o] &= 0x3fff" : [o] "+r"(o));
	asm volatile("" : "+r"(skb));
	if (o != off)
		return NULL;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (data + o + sizeof(__u16) > end)
		return NULL;
	return data + o;
}
#endif

static __always_inline int np_l4_csum_update(struct np_ctx *skb, const struct np_l4 *l4, __u64 addrs, __u64 ports, bool recsum)
{
#ifdef NP_XDP
	/*
	 * A frame off the wire carries its whole checksum (no CHECKSUM_PARTIAL
	 * before an skb exists): updated in place, a UDP datagram sent without
	 * one left without, and a computed 0 sent as 0xffff.
	 */
	__u16 *check;

	if (!l4->has_ports || !l4->csum_off || (!addrs && !ports))
		return 0;
	if (l4->proto == IPPROTO_UDP && l4->udp_zero_csum)
		return 0;
	check = np_header(skb, l4->csum_off, sizeof(*check));
	if (!check)
		return -1;
	*check = np_csum_apply(*check, addrs + ports);
	if (l4->proto == IPPROTO_UDP && !*check)
		*check = 0xffff;
	return 0;
#else
	__u32 off = l4->has_ports ? l4->csum_off : 0;
	__u64 flags = np_csum_flags(l4);
	__u32 a = np_csum_fold32(addrs), p = np_csum_fold32(ports);

	if (!off) {
		if (recsum && a)
			bpf_csum_update(skb, a);
		return 0;
	}
	if (a) {
		__u16 *check = p ? np_csum_field(skb, off) : NULL;
		__u16 old = check ? *check : 0;

		if (bpf_l4_csum_replace(skb, off, 0, a, BPF_F_PSEUDO_HDR | flags) < 0)
			return -1;
		/*
		 * The ports' change without a second call: what the first one
		 * wrote says how the kernel keeps this skb's checksum, when only
		 * one of the two ways gives it (np_csum_ports_after()); else
		 * the kernel's call.
		 */
		if (check && (check = np_csum_field(skb, off))) {
			int v = np_csum_ports_after(old, *check, a, p, l4->proto == IPPROTO_UDP);

			if (v >= 0) {
				*check = v;
				return 0;
			}
		}
	}
	if (p && bpf_l4_csum_replace(skb, off, 0, p, flags) < 0)
		return -1;
	return 0;
#endif
}

/*
 * The backend id a flow of hash `hash` takes from the Maglev table of
 * lb_maglev_index key `key` (enum lb_maglev_layout), 0 when the frontend
 * has no table. A function of its own: inlined, its keys and pointers cost
 * the callers' frames 40 bytes, which put IPv6's call chain over 5.10's 512.
 */
static __noinline __u32 np_maglev_pick(__u32 key, __u32 hash)
{
	const struct lb_maglev_row *row = bpf_map_lookup_elem(&lb_maglev_index, &key);
	struct lb_maglev_block *b;
	__u32 slot, block;
	void *chunk;

	if (!row || !row->m)
		return 0;
	chunk = bpf_map_lookup_elem(&lb_maglev, &row->chunk);
	if (!chunk)
		return 0;
	slot = row->first + hash % row->m;
	block = slot / LB_MAGLEV_BLOCK_SLOTS;
	b = bpf_map_lookup_elem(chunk, &block);
	return b ? b->backend_id[slot % LB_MAGLEV_BLOCK_SLOTS] : 0;
}

/*
 * The ports of a flow's packet at ingress, in place: the sum of the change
 * for np_l4_csum_update() in *sum. SCTP's go through
 * np_rewrite_sctp_ports() instead.
 */
static __always_inline int np_rewrite_ports(struct np_ctx *skb, const struct np_l4 *l4, __be16 old_sport, __be16 old_dport,
					    __be16 sport, __be16 dport, __u64 *sum)
{
	__be16 *p;
	__u32 old;

	if (!l4->has_ports || l4->proto == IPPROTO_SCTP || (sport == old_sport && dport == old_dport))
		return 0;
	p = np_header(skb, l4->l4_off, 2 * sizeof(__be16));
	if (!p)
		return -1;
	old = *(__u32 *)p;
	p[0] = sport;
	p[1] = dport;
	*sum = np_csum_add32(0, old, *(__u32 *)p);
	return 0;
}

static __always_inline int np_rewrite_sctp_ports(struct np_ctx *skb, const struct np_l4 *l4, __be16 old_sport, __be16 old_dport,
						 __be16 sport, __be16 dport)
{
	if (!l4->has_ports || l4->proto != IPPROTO_SCTP)
		return 0;
#ifdef NP_XDP
	return -1;	/* never parsed at XDP */
#else
	if (lb_sctp_rewrite_port(skb, l4->l4_off, l4->l4_len, offsetof(struct lb_sctphdr, source), old_sport, sport) < 0 ||
	    lb_sctp_rewrite_port(skb, l4->l4_off, l4->l4_len, offsetof(struct lb_sctphdr, dest), old_dport, dport) < 0)
		return -1;
	return 0;
#endif
}

/* How np4_xlate()/np6_xlate() rewrite a flow's packet by its CT entry. */
enum {
	NP_XLATE_FWD,		/* a client's: to the backend, and from our SNAT address and port (then forwarded by us) */
	NP_XLATE_REV,		/* a reply: from the frontend, to the client (a client on this node: up the stack) */
	NP_XLATE_REV_FWD,	/* a reply forwarded by us */
};

/*
 * Rewrites a flow's packet at ingress (`how`: NP_XLATE_*), each address and
 * port only where it changes, and decrements the TTL of one this program
 * forwards itself (checked above 1 before): in place, the IP header's
 * checksum computed here over every changed word, the transport checksum
 * by np_l4_csum_update(); SCTP's ports are the caller's to rewrite after
 * it (np_rewrite_sctp_ports(): its CRC32c's global function would be a
 * fourth frame on the call chain, over 512 bytes on 5.10, which counts
 * at least 32 for each). A function of its own (each inlined copy cost
 * the callers' frames 100 bytes of spills). Ingress only: a program that
 * writes packets in place has every cloned skb it sees uncloned first (the
 * kernel's prologue for direct writes), and at egress every TCP segment of
 * the node's own is a clone.
 */
static __noinline int np4_xlate(struct np_ctx *skb, const struct np4_flow *f, const struct lb4_ct_entry *ct, int how)
{
	bool snat = how != NP_XLATE_FWD || (ct->flags & LB_CT_F_SNAT);
	bool fwd = how == NP_XLATE_REV_FWD || (how == NP_XLATE_FWD && (ct->flags & (LB_CT_F_SNAT | LB_CT_F_DSR)));
	__be32 saddr = f->saddr, daddr = f->daddr;
	__be16 sport = f->sport, dport = f->dport;
	__u64 addrs = 0, l3, ports = 0;
	struct iphdr *ip;

	if (how == NP_XLATE_FWD) {
		daddr = ct->addr1;
		dport = ct->port1;
		if (snat) {
			saddr = ct->addr2;
			sport = ct->port2;
		}
	} else {
		saddr = ct->addr1;
		sport = ct->port1;
		daddr = ct->addr2;
		dport = ct->port2;
	}
	ip = np_header(skb, NP_L3_OFF, sizeof(*ip));
	if (!ip)
		return -1;
	if (saddr != f->saddr) {
		addrs = np_csum_add32(addrs, f->saddr, saddr);
		ip->saddr = saddr;
	}
	if (daddr != f->daddr) {
		addrs = np_csum_add32(addrs, f->daddr, daddr);
		ip->daddr = daddr;
	}
	l3 = addrs;
	if (fwd) {
		/* the checksum covers the TTL as the high byte of the ttl/protocol word */
		__u16 old = *(__u16 *)&ip->ttl;

		ip->ttl = f->ttl - 1;
		l3 = np_csum_add16(l3, old, *(__u16 *)&ip->ttl);
	}
	if (l3)
		ip->check = np_csum_apply(ip->check, l3);
	if (np_rewrite_ports(skb, &f->l4, f->sport, f->dport, sport, dport, &ports) < 0)
		return -1;
	return np_l4_csum_update(skb, &f->l4, addrs, ports, false);
}

/*
 * A backend for a new flow: under session affinity the one this client
 * (its address) stuck to; else from the frontend's Maglev table when it
 * has one (the slot the flow's hash names: every node picks the same
 * backend for a flow, and a backend change moves few flows); else at
 * random.
 */
static __always_inline struct lb4_backend *np4_select(struct lb4_key *key, const struct lb_service *svc, const struct np4_flow *f,
						      const struct lb_np_config *cfg, __u32 *backend_id)
{
	struct lb_np_affinity_key akey = { .address = { f->saddr }, .rev_nat_index = svc->rev_nat_index, .family = 4 };

	if ((svc->flags & LB_SVC_F_MAGLEV) && !lb_svc_has_affinity(svc) && cfg->maglev_m) {
		__u32 id = np_maglev_pick(svc->rev_nat_index,
					  np_jhash_3words(bpf_ntohl(f->saddr), ((__u32)bpf_ntohs(f->dport) << 16) | bpf_ntohs(f->sport),
							  f->l4.proto, cfg->maglev_seed4));
		struct lb4_backend *be = id ? bpf_map_lookup_elem(&lb4_backends, &id) : NULL;

		if (be) {
			*backend_id = id;
			return be;
		}
	}
	return lb4_select_backend_in(key, svc, &lb_np_affinity, &akey, backend_id);
}

/*
 * A frontend without a selectable backend whose service has endpoints on
 * other nodes: externalTrafficPolicy Local with none here, which kube-proxy
 * drops silently. Its internal-scope twin follows internalTrafficPolicy: if
 * that is Cluster and the twin has no endpoint either (ready or
 * terminating), the service has none anywhere and the client is refused,
 * as kube-proxy's REJECT rule does for every service without endpoints.
 */
static __always_inline bool np4_endpoints_elsewhere(struct lb4_key *key, const struct lb_service *svc)
{
	const struct lb_service *twin;

	if (!(svc->flags & LB_SVC_F_LOCAL_EXTERNAL))
		return false;
	if (!(svc->flags & LB_SVC_F_TWO_SCOPES))
		return true;
	key->scope = LB_SCOPE_INT;
	twin = lb4_lookup_service(key);
	key->scope = LB_SCOPE_EXT;
	return !twin || (twin->flags & LB_SVC_F_LOCAL_INTERNAL) || twin->count || twin->qcount;
}

/* A new flow: source ranges, a backend, local or remote, the CT (and SNAT) entries. */
static __always_inline int np4_new_flow(struct np_ctx *skb, const struct np4_flow *f, struct lb4_key *key,
					const struct lb_service *svc, const struct lb_np_config *cfg,
					struct lb4_ct_key *ok, struct lb4_ct_entry *orig, __u64 now, __be16 prev,
					struct bpf_fib_lookup *fib)
{
	struct lb4_ct_entry reply = {};
	struct lb4_backend *be;
	struct lb_device *dev;
	__u32 backend_id = 0;
	int rc;

	if (!np4_src_allowed(svc, f->saddr)) {
		lb_count(LB_MTR_NP_SRC_RANGE);
		return TC_ACT_SHOT;
	}
	if (!lb_svc_has_backends(svc)) {
		if (np4_endpoints_elsewhere(key, svc)) {
			lb_count(LB_MTR_NP_LOCAL_NONE);
			return TC_ACT_SHOT;
		}
		lb_count(LB_MTR_NP_NO_BACKEND);
		return NP_DO_REJECT;
	}
	be = np4_select(key, svc, f, cfg, &backend_id);
	if (!be) {
		lb_count(LB_MTR_BACKEND_MISSING);
		return TC_ACT_SHOT;
	}
	rc = np4_fib(skb, fib, f->l4.proto, f->saddr, be->address, f->sport, be->port, now, NP_FIB_FRESH);
	dev = np_fib_routed(rc) ? bpf_map_lookup_elem(&lb_devices, &fib->ifindex) : NULL;
	if (!dev && rc != BPF_FIB_LKUP_RET_NOT_FWDED && !np_fib_routed(rc)) {
		lb_count(LB_MTR_NP_FIB_FAIL);
		return TC_ACT_SHOT;
	}
	orig->addr1 = be->address;
	orig->port1 = be->port;
	orig->rev_nat_index = svc->rev_nat_index;
	orig->backend_id = backend_id;
	reply.addr1 = f->daddr;
	reply.port1 = f->dport;
	reply.addr2 = f->saddr;
	reply.port2 = f->sport;
	reply.rev_nat_index = svc->rev_nat_index;
	reply.backend_id = backend_id;
	if (dev && !(svc->flags & LB_SVC_F_LOCAL_EXTERNAL) && np_dsr_wanted(cfg, &f->l4, sizeof(struct iphdr))) {
		/* remote, by direct server return: DNAT only, its replies go from the backend's node to the client */
		orig->flags = LB_CT_F_DSR;
	} else if (dev && !(svc->flags & LB_SVC_F_LOCAL_EXTERNAL)) {
		/* remote: SNAT to the device's address and a port of this flow's own */
		if (!dev->addr4) {
			lb_count(LB_MTR_NP_NO_SNAT_ADDR);
			return TC_ACT_SHOT;
		}
		reply.flags = LB_CT_F_SNAT;
		reply.expires = now + np_lifetime(cfg, f->l4.proto, 0);
		if (np4_snat_reserve(cfg, f, be, dev->addr4, &reply, now, prev, &orig->port2) < 0) {
			lb_count(LB_MTR_NP_SNAT_EXHAUSTED);
			return TC_ACT_SHOT;
		}
		orig->addr2 = dev->addr4;
		orig->flags = LB_CT_F_SNAT;
	} else {
		/* local: the reply leaves through a device's egress, keyed as it goes */
		struct lb4_ct_key rk = { .saddr = be->address, .daddr = f->saddr, .sport = be->port,
					 .dport = f->sport, .proto = f->l4.proto, .dir = LB_CT_REPLY };

		reply.flags = LB_CT_F_LOCAL;
		reply.expires = now + np_lifetime(cfg, f->l4.proto, 0);
		if (bpf_map_update_elem(&lb4_ct, &rk, &reply, BPF_ANY) < 0) {
			lb_count(LB_MTR_NP_CT_FULL);
			return TC_ACT_SHOT;
		}
		orig->flags = LB_CT_F_LOCAL;
	}
	orig->flags = np_ct_flags(&f->l4, orig->flags, false);
	orig->expires = now + np_lifetime(cfg, f->l4.proto, orig->flags);
	if (bpf_map_update_elem(&lb4_ct, ok, orig, BPF_ANY) < 0) {
		lb_count(LB_MTR_NP_CT_FULL);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_NEW);
	return 0;
}

/* A local flow's reply entry (egress: backend -> client), brought along with its ORIG entry. */
static __always_inline void np4_pair_local(const struct lb_np_config *cfg, const struct np4_flow *f,
					   const struct lb4_ct_entry *orig, __u64 now)
{
	struct lb4_ct_key rk = { .saddr = orig->addr1, .daddr = f->saddr, .sport = orig->port1, .dport = f->sport,
				 .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb4_ct_entry *r = bpf_map_lookup_elem(&lb4_ct, &rk);

	if (r)
		np_ct_pair(cfg, &r->expires, &r->flags, f->l4.proto, orig->flags, now);
}

/* Outcomes of np4_nat_own() beside 0 (the entry is the flow's). */
#define NP_NAT_LOST	1	/* neither there nor writable: dropped (np_nat_full) */
#define NP_NAT_TAKEN	2	/* another flow holds the port now: this flow ends */

/*
 * A SNATed flow's lb4_nat entry, checked at every packet the client sends:
 * still its own (the client and frontend it translates back to are this
 * flow's), its state and expiry brought along. One the LRU dropped is
 * written again from the ORIG entry (np_nat_repair; also, uncounted, one
 * an upgrade has not carried into new maps yet). One that names
 * another client means the port was taken (its entry was lost, or the flow
 * had closed and its port went to a new one): this flow's packets must no
 * longer leave with that tuple, or the backend would take them for the
 * other flow's and its replies would reach the wrong client.
 */
static __always_inline int np4_nat_own(const struct lb_np_config *cfg, const struct np4_flow *f,
				       const struct lb4_ct_entry *orig, bool changed, __u64 now)
{
	struct lb4_ct_key rk = { .saddr = orig->addr1, .daddr = orig->addr2, .sport = orig->port1, .dport = orig->port2,
				 .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb4_ct_entry *r = bpf_map_lookup_elem(&lb4_nat, &rk);

	if (!r) {
		struct lb4_ct_entry nat = {
			.expires = orig->expires, .addr1 = f->daddr, .addr2 = f->saddr, .port1 = f->dport, .port2 = f->sport,
			.rev_nat_index = orig->rev_nat_index, .backend_id = orig->backend_id, .flags = orig->flags,
		};

		if (bpf_map_update_elem(&lb4_nat, &rk, &nat, BPF_NOEXIST) == 0) {
			/* while flows are carried, an entry not copied yet is no loss: the commit keeps this one */
			if (!np_migrating(cfg, now))
				lb_count(LB_MTR_NP_NAT_REPAIR);
			return 0;
		}
		r = bpf_map_lookup_elem(&lb4_nat, &rk);
		if (!r)
			return NP_NAT_LOST;
	}
	if (r->addr2 != f->saddr || r->port2 != f->sport || r->addr1 != f->daddr || r->port1 != f->dport)
		return NP_NAT_TAKEN;
	if (changed)
		np_ct_pair(cfg, &r->expires, &r->flags, f->l4.proto, orig->flags, now);
	return 0;
}

/* An established flow's backend is gone when its id no longer names its address (removed, or the id reused). */
static __always_inline bool np4_backend_gone(const struct lb4_ct_entry *ct)
{
	__u32 id = ct->backend_id;
	struct lb4_backend *be = bpf_map_lookup_elem(&lb4_backends, &id);

	return !be || be->address != ct->addr1 || be->port != ct->port1;
}

/*
 * A packet too big for the way out (np_mtu_check() said so, with `mtu`):
 * with DF it is answered with fragmentation needed (NP_DO_TOOBIG), as a
 * router answers; without DF it is dropped, as nothing here can fragment
 * it: bpf_redirect() does not, and the stack cannot have it either (after
 * the rewrite its source is our own SNAT address, a martian to the stack;
 * before it, its destination is a frontend, which the stack would deliver
 * to this node). Senders doing path MTU discovery, every TCP stack among
 * them, set DF; a datagram fragmented by its sender has fragments without
 * it, and they are dropped (Cilium's DSR path answers regardless of DF;
 * RFC 1191 names the error "fragmentation needed and DF set").
 */
static __always_inline int np4_too_big(const struct np4_flow *f, int mtu)
{
#ifdef NP_XDP
	return mtu;	/* to tc, which answers or drops it, and counts it */
#endif
	return f->df ? mtu : TC_ACT_SHOT;
}

#ifndef NP_XDP
/* ------------------------------------------------------- DSR, IPv4 */

/*
 * Inserts the DSR option (bpf/lib/dsr.h) carrying the frontend `addr`:`port`
 * right after the fixed IPv4 header of a packet already DNATed: the header
 * length, total length and checksum follow. bpf_skb_adjust_room() keeps a
 * GSO packet's segments the size they were (gso_size shrinks by the
 * option), and its checksum state (BPF_F_ADJ_ROOM_NO_CSUM_RESET, 5.8+: the
 * transport checksum does not change). A function of its own, called after
 * the rewrite: it moves the packet, and no packet pointer of the caller's
 * lives across it.
 */
static __noinline int np4_dsr_push(struct np_ctx *skb, __be32 addr, __be16 port)
{
	struct lb_dsr_opt4 *opt;
	__u16 old0, oldlen;
	struct iphdr *ip;
	__u64 sum;

	if (!skb || bpf_skb_adjust_room(skb, LB_DSR_OPT4_LEN, BPF_ADJ_ROOM_NET, BPF_F_ADJ_ROOM_NO_CSUM_RESET) < 0)
		return -1;
	np_pull(skb, NP_L3_OFF + sizeof(*ip) + LB_DSR_OPT4_LEN);
	ip = np_header(skb, NP_L3_OFF, sizeof(*ip) + LB_DSR_OPT4_LEN);
	if (!ip || ip->ihl > 15 - LB_DSR_OPT4_LEN / 4)
		return -1;
	old0 = *(__u16 *)ip;
	oldlen = ip->tot_len;
	ip->ihl += LB_DSR_OPT4_LEN / 4;
	ip->tot_len = bpf_htons(bpf_ntohs(oldlen) + LB_DSR_OPT4_LEN);
	opt = (void *)(ip + 1);
	opt->type = LB_DSR_OPT4_TYPE;
	opt->len = LB_DSR_OPT4_LEN;
	opt->port = port;
	opt->addr = addr;
	sum = np_csum_add16(0, old0, *(__u16 *)ip);
	sum = np_csum_add16(sum, oldlen, ip->tot_len);
	sum = np_csum_add32(sum, 0, ((__u32 *)opt)[0]);
	sum = np_csum_add32(sum, 0, ((__u32 *)opt)[1]);
	ip->check = np_csum_apply(ip->check, sum);
	return 0;
}

/*
 * The backend's node: a packet with a DSR option (an IP header longer than
 * 20 bytes, the option first, as np4_dsr_push() puts it) is a flow another
 * node sent to a backend here by direct server return. Its REPLY entry
 * (backend -> client, LB_CT_F_LOCAL | LB_CT_F_DSR) holds the frontend, so
 * the backend's replies leave from it (np4_egress(), as a local flow's);
 * written at the flow's first packet (or when it names another frontend,
 * or was closed and is opened again), brought along by the later ones. The
 * packet goes on up the stack to the backend, the option left in it (the
 * backend's stack ignores it). NP_NOT_DSR: no option.
 */
static __noinline int np4_dsr_recv(struct np_ctx *skb, const struct np4_flow *f, const struct lb_np_config *cfg)
{
	struct lb4_ct_key rk = { .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb4_ct_entry fresh = {};
	struct lb_dsr_opt4 *opt;
	struct lb4_ct_entry *ct;
	__be32 addr;
	__be16 port;
	__u64 now;

	opt = np_header(skb, NP_L3_OFF + sizeof(struct iphdr), sizeof(*opt));
	if (!opt || opt->type != LB_DSR_OPT4_TYPE || opt->len != LB_DSR_OPT4_LEN)
		return NP_NOT_DSR;
	addr = opt->addr;
	port = opt->port;
	now = np_now();
	np4_frag_record(f);
	rk.saddr = f->daddr;
	rk.daddr = f->saddr;
	rk.sport = f->dport;
	rk.dport = f->sport;
	ct = bpf_map_lookup_elem(&lb4_ct, &rk);
	if (ct && ct->expires > now && !np_ct_reopened(&f->l4, ct->flags) && (ct->flags & LB_CT_F_DSR) &&
	    ct->addr1 == addr && ct->port1 == port) {
		np_ct_set(cfg, &ct->expires, &ct->flags, f->l4.proto, np_ct_flags(&f->l4, ct->flags, false), now);
		return TC_ACT_UNSPEC;
	}
	if (!f->l4.has_ports)
		return TC_ACT_UNSPEC;
	fresh.addr1 = addr;
	fresh.port1 = port;
	fresh.addr2 = f->saddr;
	fresh.port2 = f->sport;
	fresh.flags = np_ct_flags(&f->l4, LB_CT_F_LOCAL | LB_CT_F_DSR, false);
	fresh.expires = now + np_lifetime(cfg, f->l4.proto, fresh.flags);
	if (bpf_map_update_elem(&lb4_ct, &rk, &fresh, BPF_ANY) < 0) {
		lb_count(LB_MTR_NP_CT_FULL);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_DSR_FLOW);
	return TC_ACT_UNSPEC;
}

/*
 * A client's packet to a frontend: the flow's ORIG entry, or a new flow (no
 * entry, a dead one, a closed tuple opened again, a backend that left every
 * service: kube-proxy flushes such UDP flows, Cilium picks again); DNAT (and
 * SNAT), then up the stack or out to the backend's node.
 */
#endif /* !NP_XDP */

static __always_inline int np4_fwd(struct np_ctx *skb, struct np4_flow *f, struct lb4_key *key,
				   struct lb_service *svc, const struct lb_np_config *cfg)
{
	struct lb4_ct_key ok = { .saddr = f->saddr, .daddr = f->daddr, .sport = f->sport, .dport = f->dport,
				 .proto = f->l4.proto, .dir = LB_CT_ORIG };
	const struct lb_device *dev = NULL;
	struct lb4_ct_entry fresh = {};
	struct lb4_ct_entry *ct;
	struct bpf_fib_lookup fib;
	__u64 now = np_now();
	__be16 prev = 0;
	int rc = 0, mtu;
	bool changed, gone = false;

	ct = bpf_map_lookup_elem(&lb4_ct, &ok);
	if (ct && (ct->expires <= now || np_ct_reopened(&f->l4, ct->flags))) {
		if (ct->flags & LB_CT_F_SNAT)
			prev = ct->port2;
		ct = NULL;
	}
	if (ct && np4_backend_gone(ct)) {
		gone = true;
		ct = NULL;
	}
	if (ct) {
		__u16 fl = np_ct_flags(&f->l4, ct->flags, false) | (np_tcp_syn(&f->l4) ? 0 : LB_CT_F_SEEN_REPLY);

		changed = np_ct_set(cfg, &ct->expires, &ct->flags, f->l4.proto, fl, now);
		if (ct->flags & LB_CT_F_SNAT) {
			rc = np4_nat_own(cfg, f, ct, changed, now);
			if (rc == NP_NAT_LOST) {
				lb_count(LB_MTR_NP_NAT_FULL);
				return TC_ACT_SHOT;
			}
			if (rc == NP_NAT_TAKEN) {
				lb_count(LB_MTR_NP_NAT_STOLEN);
				bpf_map_delete_elem(&lb4_ct, &ok);
				ct = NULL;
			}
		} else if (changed) {
			np4_pair_local(cfg, f, ct, now);
		}
	}
	if (!ct) {
		if (!svc) {
			svc = np4_lookup(f, key, cfg);
			if (!svc)
				return NP_NOT_SVC;
		}
		/* balanced again: counted once its frontend is known to be there still */
		if (gone)
			lb_count(LB_MTR_NP_REBALANCE);
		if (!f->l4.has_ports) {
			lb_count(LB_MTR_NP_FRAG);
			return TC_ACT_SHOT;
		}
		/* an established TCP flow whose entry is being carried into new maps: its retransmit finds it */
		if (np_migrating(cfg, now) && np_stateful(f->l4.proto) && !(f->l4.tcp_flags & TCP_F_SYN))
			return np_migrating_drop();
		rc = np4_new_flow(skb, f, key, svc, cfg, &ok, &fresh, now, prev, &fib);
		if (rc)
			return rc;
		ct = &fresh;
	}
#ifdef NP_XDP
	/* DSR's option needs room XDP does not make; at the last hop tc sends the ICMP error */
	if ((ct->flags & LB_CT_F_DSR) || ((ct->flags & LB_CT_F_SNAT) && f->ttl <= 1))
		return np_xdp_to_tc();
#endif
	np4_frag_record(f);
	if (ct->flags & (LB_CT_F_SNAT | LB_CT_F_DSR)) {
		/* DSR: the packet grows by the option, and a client told it is too big sends less by as much */
		__u32 grow = (ct->flags & LB_CT_F_DSR) ? LB_DSR_OPT4_LEN : 0;
		/* a new flow's first packet asks the FIB itself */
		int use = ct == &fresh ? NP_FIB_FRESH : NP_FIB_CACHED;

		/* remote: forwarded by us, as the stack would; its checks first, before any rewrite */
		if (f->ttl <= 1) {
			lb_count(LB_MTR_NP_TTL);
			return TC_ACT_SHOT;
		}
		if (grow)
			rc = np4_fib(skb, &fib, f->l4.proto, f->saddr, ct->addr1, f->sport, ct->port1, now, use);
		else
			rc = np4_fib(skb, &fib, f->l4.proto, ct->addr2, ct->addr1, ct->port2, ct->port1, now, use);
		dev = np_fib_dev(&fib);
#ifdef NP_XDP
		if (!np_xdp_sends(dev, rc))
			return np_xdp_to_tc();
#endif
		mtu = np_mtu_check(dev, &fib, rc, np_seglen(skb, &f->l4, f->tot_len) + grow);
		if (mtu)
			return np4_too_big(f, mtu - grow);
		if (!np_fib_routed(rc)) {
			lb_count(LB_MTR_NP_FIB_FAIL);
			return TC_ACT_SHOT;
		}
	}
	if (np4_xlate(skb, f, ct, NP_XLATE_FWD) < 0 ||
	    np_rewrite_sctp_ports(skb, &f->l4, f->sport, f->dport, (ct->flags & LB_CT_F_SNAT) ? ct->port2 : f->sport, ct->port1) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_FWD);
#ifndef NP_XDP
	if (ct->flags & LB_CT_F_DSR) {
		if (np4_dsr_push(skb, f->daddr, f->dport) < 0) {
			lb_count(LB_MTR_NP_BAD_PACKET);
			return TC_ACT_SHOT;
		}
		lb_count(LB_MTR_NP_DSR_FWD);
	} else if (!(ct->flags & LB_CT_F_SNAT)) {
		return TC_ACT_OK;
	}
#else
	/* a local backend's: translated here, up the stack (tc's ingress finds no service in it) */
	if (!(ct->flags & LB_CT_F_SNAT))
		return NP_XDP_VERDICT + XDP_PASS;
#endif
	return np_forward_dev(skb, &fib, rc, dev);
}

/* A reply as it arrives, in `map` (lb4_nat after SNAT, lb4_ct for a local backend's), if alive. */
static __always_inline struct lb4_ct_entry *np4_reply_entry(void *map, const struct np4_flow *f, __u64 now)
{
	struct lb4_ct_key rk = { .saddr = f->saddr, .daddr = f->daddr, .sport = f->sport, .dport = f->dport,
				 .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb4_ct_entry *ct = bpf_map_lookup_elem(map, &rk);

	if (!ct || ct->expires <= now)
		return NULL;
	return ct;
}

/*
 * A reply entry after a reply: its state, and the flow's ORIG entry
 * (client -> frontend) brought along when that changed (a FIN, a reset,
 * the expiry's once-a-second move).
 */
static __always_inline void np4_reply_seen(const struct lb_np_config *cfg, const struct np4_flow *f,
					   struct lb4_ct_entry *ct, __u64 now)
{
	__u16 fl = np_ct_flags(&f->l4, ct->flags, true) | LB_CT_F_SEEN_REPLY;
	struct lb4_ct_key ok = { .saddr = ct->addr2, .daddr = ct->addr1, .sport = ct->port2, .dport = ct->port1,
				 .proto = f->l4.proto, .dir = LB_CT_ORIG };
	struct lb4_ct_entry *o;

	if (!np_ct_set(cfg, &ct->expires, &ct->flags, f->l4.proto, fl, now))
		return;
	o = bpf_map_lookup_elem(&lb4_ct, &ok);
	if (o)
		np_ct_pair(cfg, &o->expires, &o->flags, f->l4.proto, ct->flags, now);
}

/* A remote backend's reply to a SNAT port: back to the client, from the frontend. */
static __always_inline int np4_rev_snat(struct np_ctx *skb, struct np4_flow *f, const struct lb_np_config *cfg)
{
	__u64 now = np_now();
	struct lb4_ct_entry *ct = np4_reply_entry(&lb4_nat, f, now);
	const struct lb_device *dev = NULL;
	struct bpf_fib_lookup fib;
	int rc, mtu;

	if (!ct)
		return np_migrating(cfg, now) ? np_migrating_drop() : TC_ACT_UNSPEC;
	if (ct->flags & LB_CT_F_HOST) {
		/* a reply to the node's own flow: the stack's */
		np_ct_set(cfg, &ct->expires, &ct->flags, f->l4.proto, np_ct_flags(&f->l4, ct->flags, true) | LB_CT_F_SEEN_REPLY, now);
		return TC_ACT_UNSPEC;
	}
	np4_reply_seen(cfg, f, ct, now);
	np4_frag_record(f);
	if (f->ttl <= 1) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	/* the way to the client, and whether the reply fits it (an error goes to the backend, from our SNAT address) */
	rc = np4_fib(skb, &fib, f->l4.proto, ct->addr1, ct->addr2, ct->port1, ct->port2, now, NP_FIB_CACHED);
#ifdef NP_XDP
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED)
		return np_xdp_to_tc();
#endif
	if (rc != BPF_FIB_LKUP_RET_NOT_FWDED) {
		dev = np_fib_dev(&fib);
#ifdef NP_XDP
		if (!np_xdp_sends(dev, rc))
			return np_xdp_to_tc();
#endif
		mtu = np_mtu_check(dev, &fib, rc, np_seglen(skb, &f->l4, f->tot_len));
		if (mtu)
			return np4_too_big(f, mtu);
		if (!np_fib_routed(rc)) {
			lb_count(LB_MTR_NP_FIB_FAIL);
			return TC_ACT_SHOT;
		}
	}
	/* the source becomes the frontend, the destination the client again; forwarded by us unless the client is this node */
	if (np4_xlate(skb, f, ct, rc == BPF_FIB_LKUP_RET_NOT_FWDED ? NP_XLATE_REV : NP_XLATE_REV_FWD) < 0 ||
	    np_rewrite_sctp_ports(skb, &f->l4, f->sport, f->dport, ct->port1, ct->port2) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_REV);
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED)
		return TC_ACT_OK;
	return np_forward_dev(skb, &fib, rc, dev);
}

/*
 * Ingress. A packet to a port of --snat-port-range can only be a reply to
 * a SNATed flow (the range and the NodePort range never overlap, and a
 * frontend's own entry is looked up first): its lb4_nat entry decides,
 * whatever address it was sent to, so replies to any address we SNAT to
 * come back, --nodeport-addresses or not.
 */
static __always_inline int np4_ingress(struct np_ctx *skb)
{
	const struct lb_np_config *cfg = np_config();
	struct lb4_key key = {};
	struct lb_service *svc;
	struct np4_flow f;
	int rc;

	if (!cfg)
		return TC_ACT_UNSPEC;
	rc = np4_parse(skb, &f);
	if (rc == NP_PARSE_ICMP)
		return NP_DO_ICMP;
	if (rc < 0)
		return TC_ACT_UNSPEC;
	/*
	 * A NodePort's flow: its CT entry first, and an established one needs
	 * no frontend (np4_fwd() looks it up for a new flow); any other port
	 * is a frontend's by its own entry, or no service's (no lookup for a
	 * port no frontend has).
	 */
	svc = NULL;
	if (!np_in_range(f.dport, cfg->nodeport_min, cfg->nodeport_max) && np_frontend_port(cfg, f.dport))
		svc = np4_lookup(&f, &key, cfg);
	if (svc || np_in_range(f.dport, cfg->nodeport_min, cfg->nodeport_max)) {
		rc = np4_fwd(skb, &f, &key, svc, cfg);
		if (rc != NP_NOT_SVC)
			return rc;
	}
	if ((cfg->flags & LB_NP_F_DSR) && f.l4.l4_off > NP_L3_OFF + sizeof(struct iphdr)) {
#ifdef NP_XDP
		return TC_ACT_UNSPEC;	/* maybe a DSR option: tc's */
#else
		rc = np4_dsr_recv(skb, &f, cfg);
		if (rc != NP_NOT_DSR)
			return rc;
#endif
	}
	if (np_in_range(f.dport, cfg->snat_min, cfg->snat_max))
		return np4_rev_snat(skb, &f, cfg);
	return TC_ACT_UNSPEC;
}

#ifndef NP_XDP	/* egress: tc's alone */
/*
 * The node's own flow, leaving from the SNAT address of its device with a
 * source port in --snat-port-range (a packet the node itself sent: no
 * ingress device; the SNATed packets this program redirects have one). The
 * range holds the node's ephemeral ports, since SNAT keeps a client's own
 * port when it can, so the tuple is reserved for the node in lb4_nat
 * (LB_CT_F_HOST): written at the flow's first packet, kept alive by the
 * later ones both ways (np4_rev_snat() leaves its replies to the stack),
 * never taken by a SNATed flow while alive. A tuple a live SNATed flow
 * holds is a clash: the node's packet is dropped and counted, and its stack
 * retries (a SYN) until that flow is done, so no packet of the node's
 * reaches the backend on the other flow's tuple, and no reply of the
 * node's the other flow's client.
 */
static __always_inline int np4_host_flow(struct np_ctx *skb, const struct lb_np_config *cfg, const struct np4_flow *f, __u64 now)
{
	struct lb4_ct_key rk = { .saddr = f->daddr, .daddr = f->saddr, .sport = f->dport, .dport = f->sport,
				 .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb4_ct_entry host = { .flags = LB_CT_F_HOST };
	__u32 ifindex = skb->ifindex;
	struct lb_device *dev;
	struct lb4_ct_entry *r;

	if (skb->ingress_ifindex || !f->l4.has_ports || !np_in_range(f->sport, cfg->snat_min, cfg->snat_max))
		return NP_NOT_HOST;
	dev = bpf_map_lookup_elem(&lb_devices, &ifindex);
	if (!dev || dev->addr4 != f->saddr)
		return NP_NOT_HOST;
	r = bpf_map_lookup_elem(&lb4_nat, &rk);
	if (r && (r->flags & LB_CT_F_HOST)) {
		np_ct_set(cfg, &r->expires, &r->flags, f->l4.proto, np_ct_flags(&f->l4, r->flags, false), now);
		return TC_ACT_UNSPEC;
	}
	if (r && np_nat_rank(r->expires, r->flags, now) == NP_NAT_BUSY) {
		lb_count(LB_MTR_NP_HOST_CLASH);
		return TC_ACT_SHOT;
	}
	host.flags = np_ct_flags(&f->l4, host.flags, false);
	host.expires = now + np_lifetime(cfg, f->l4.proto, host.flags);
	bpf_map_update_elem(&lb4_nat, &rk, &host, BPF_ANY);
	return TC_ACT_UNSPEC;
}

/*
 * A packet's source address and port at egress, where the program writes
 * through helpers (see np4_xlate()), in as few calls as they allow. After a
 * 20-byte header the IP checksum, the addresses, the ports and the
 * transport checksum are one span: the IP checksum is computed here, the
 * addresses' change goes into the transport checksum by
 * bpf_l4_csum_replace() (it keeps a CHECKSUM_COMPLETE skb's csum), the
 * ports' is added here as np_l4_csum_update() adds it (np_csum_ports_after()),
 * and the span is stored at once. Otherwise (IPv4 options, SCTP, a
 * transport header not all linear, a checksum that does not say how the
 * kernel keeps it) the kernel's calls, the IP checksum still stored with
 * the address (and the port, when it follows).
 */
static __always_inline int np4_rewrite_src(struct __sk_buff *skb, const struct np_l4 *l4, __be32 old, __be32 new,
					   __be16 old_port, __be16 new_port)
{
	struct {
		__sum16 check;
		__be32 saddr;
		__be32 daddr;
		__be16 sport;
		__be16 dport;
		__u8 rest[14];	/* UDP: length, checksum; TCP: sequence, acknowledgment, offset and flags, window, checksum */
	} __attribute__((packed)) w;
	bool udp = l4->proto == IPPROTO_UDP;
	bool after = l4->has_ports && l4->proto != IPPROTO_SCTP && l4->l4_off == NP_L3_OFF + sizeof(struct iphdr);
	bool span = after && old_port != new_port && l4->csum_off && (udp || l4->proto == IPPROTO_TCP);
	__u32 len = udp ? offsetof(typeof(w), rest) + 4 : sizeof(w);
	__u32 at = udp ? offsetof(typeof(w), rest) + 2 : offsetof(typeof(w), rest) + 12;
	__u32 a = np_csum_fold32(np_csum_add32(0, old, new));
	struct iphdr *ip;
	__u16 *check;
	void *h;
	int v;

	if (old == new)
		return np_rewrite_port(skb, l4, offsetof(struct tcphdr, source), old_port, new_port);
	ip = np_header(skb, NP_L3_OFF, sizeof(*ip));
	if (!ip)
		return -1;
	if (span) {
		h = udp ? np_header(skb, NP_L3_OFF + offsetof(struct iphdr, check), offsetof(typeof(w), rest) + 4) :
			  np_header(skb, NP_L3_OFF + offsetof(struct iphdr, check), sizeof(w));
		if (!h)
			span = false;
		else if (udp)
			__builtin_memcpy(&w, h, offsetof(typeof(w), rest) + 4);
		else
			__builtin_memcpy(&w, h, sizeof(w));
	}
	/* read before the helpers below, which may move the packet */
	w.check = np_csum_apply(ip->check, np_csum_add32(0, old, new));
	w.saddr = new;
	w.daddr = ip->daddr;
	w.sport = new_port;
	if (span) {
		__u16 before = *(__u16 *)((void *)&w + at);

		if (bpf_l4_csum_replace(skb, l4->csum_off, 0, a, BPF_F_PSEUDO_HDR | np_csum_flags(l4)) < 0)
			return -1;
		check = np_csum_field(skb, l4->csum_off);
		v = check ? np_csum_ports_after(before, *check, a, np_csum_fold32(np_csum_add16(0, old_port, new_port)), udp) : -1;
		if (v >= 0) {
			*(__u16 *)((void *)&w + at) = v;
			return bpf_skb_store_bytes(skb, NP_L3_OFF + offsetof(struct iphdr, check), &w, len, 0);
		}
	} else if (l4->has_ports && l4->csum_off &&
		   bpf_l4_csum_replace(skb, l4->csum_off, 0, a, BPF_F_PSEUDO_HDR | np_csum_flags(l4)) < 0) {
		return -1;
	}
	after = after && old_port != new_port;
	if (after && l4->csum_off &&
	    bpf_l4_csum_replace(skb, l4->csum_off, old_port, new_port, np_csum_flags(l4) | sizeof(new_port)) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, NP_L3_OFF + offsetof(struct iphdr, check), &w,
				after ? offsetof(typeof(w), dport) : offsetof(typeof(w), daddr), 0) < 0)
		return -1;
	return after ? 0 : np_rewrite_port(skb, l4, offsetof(struct tcphdr, source), old_port, new_port);
}

/*
 * An egress packet no local flow's reply entry claims leaves as it is,
 * except while flows are carried into new maps (LB_NP_F_MIGRATING, the
 * tens of milliseconds between the switch and the commit): then a TCP or
 * SCTP packet past its flow's first, forwarded from a device not ours (a
 * pod's), is dropped, and its sender retransmits into the copy. A local
 * backend's reply to a flow not copied yet, leaked with the backend's own
 * address, would have the client's stack reset the backend's connection
 * while the client's waits for an answer that never comes. The node's own
 * packets (no device in: a hostNetwork backend's replies among them) and
 * what came in by a device of ours (the flows this datapath redirects,
 * SNATed or DSR, and transit) are never a pod's reply: they pass. The
 * ingress side drops the same way (np4_fwd(), np4_rev_snat()).
 */
static __always_inline int np_egress_unclaimed(struct np_ctx *skb, const struct lb_np_config *cfg, const struct np_l4 *l4,
					       __u64 now)
{
	__u32 in = skb->ingress_ifindex;

	if (!np_migrating(cfg, now) || !np_stateful(l4->proto) || (l4->tcp_flags & TCP_F_SYN))
		return TC_ACT_UNSPEC;
	if (!in || bpf_map_lookup_elem(&lb_devices, &in))
		return TC_ACT_UNSPEC;
	return np_migrating_drop();
}

/* A local backend's reply on its way out: from the frontend again. */
static __always_inline int np4_egress(struct np_ctx *skb)
{
	const struct lb_np_config *cfg = np_config();
	struct lb4_ct_entry *ct;
	struct np4_flow f;
	__u64 now;
	int rc;

	if (!cfg)
		return TC_ACT_UNSPEC;
	rc = np4_parse(skb, &f);
	if (rc == NP_PARSE_ICMP)
		return NP_DO_ICMP;
	if (rc < 0)
		return TC_ACT_UNSPEC;
	now = np_now();
	rc = np4_host_flow(skb, cfg, &f, now);
	if (rc != NP_NOT_HOST)
		return rc;
	ct = np4_reply_entry(&lb4_ct, &f, now);
	if (!ct || !(ct->flags & LB_CT_F_LOCAL))
		return np_egress_unclaimed(skb, cfg, &f.l4, now);
	np4_reply_seen(cfg, &f, ct, now);
	np4_frag_record(&f);
	if (np4_rewrite_src(skb, &f.l4, f.saddr, ct->addr1, f.sport, ct->port1) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count((ct->flags & LB_CT_F_DSR) ? LB_MTR_NP_DSR_REV : LB_MTR_NP_REV);
	return TC_ACT_UNSPEC;
}

#endif /* !NP_XDP */

/* ------------------------------------------------------------------ IPv6 */

struct np6_flow {
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u16 tot_len;
	__u8 hop_limit;
	bool frag_first;	/* a fragment header, offset 0, M set: later fragments follow it */
	__be32 id;		/* the fragment header's identification */
	struct np_l4 l4;
};

/*
 * 0: a TCP or UDP packet (a first or later fragment among them) whose
 * addresses and ports are in `f`, after at most NP_IPV6_EXT_MAX extension
 * headers (a later fragment's ports are those its first recorded);
 * NP_PARSE_ICMP: an ICMPv6 packet right after the IPv6 header (nothing in
 * `f`); <0: not ours to look at.
 */
static __always_inline int np6_parse(struct np_ctx *skb, struct np6_flow *f)
{
	__u32 off = NP_L3_OFF + sizeof(struct ipv6hdr);
	struct ipv6hdr *ip;
	bool later = false;
	__u16 payload_len;
	int l4_off;
	__u8 nh;
#ifndef NP_XDP
	int i;
#endif

	np_pull(skb, NP_L3_OFF + sizeof(*ip));
	ip = np_header(skb, NP_L3_OFF, sizeof(*ip));
	if (!ip || ip->version != 6)
		return -1;
	/* everything of the header now: a pull after the walk below may move the packet */
	ip6_copy(f->saddr, ip->saddr.in6_u.u6_addr32);
	ip6_copy(f->daddr, ip->daddr.in6_u.u6_addr32);
	payload_len = bpf_ntohs(ip->payload_len);
	f->hop_limit = ip->hop_limit;
	nh = ip->nexthdr;
	f->frag_first = false;
	f->id = 0;
#ifdef NP_XDP
	/* extension headers (fragments, a DSR option among them): tc's */
	if (nh == NEXTHDR_HOP || nh == NEXTHDR_ROUTING || nh == NEXTHDR_DEST || nh == NEXTHDR_AUTH || nh == NEXTHDR_FRAGMENT)
		return -1;
#else
#pragma unroll
	for (i = 0; i < NP_IPV6_EXT_MAX; i++) {
		/* next header, length (or reserved), and a fragment header's offset, flags and id */
		__u8 ext[8];

		if (nh != NEXTHDR_HOP && nh != NEXTHDR_ROUTING && nh != NEXTHDR_DEST && nh != NEXTHDR_AUTH &&
		    nh != NEXTHDR_FRAGMENT)
			break;
		if (bpf_skb_load_bytes(skb, off, ext, sizeof(ext)) < 0)
			return -1;
		if (nh == NEXTHDR_FRAGMENT) {
			__u16 fo = ((__u16)ext[2] << 8) | ext[3];

			__builtin_memcpy(&f->id, ext + 4, sizeof(f->id));
			if (fo & IP6_OFFSET)
				later = true;
			else if (fo & 1)
				f->frag_first = true; /* M set; without it an atomic fragment (RFC 6946): a whole packet */
			off += 8;
		} else {
			off += nh == NEXTHDR_AUTH ? (ext[1] + 2) * 4 : (ext[1] + 1) * 8;
		}
		nh = ext[0];
		if (later)
			break;
	}
#endif
	if (nh == IPPROTO_ICMPV6 && off == NP_L3_OFF + sizeof(struct ipv6hdr))
		return NP_PARSE_ICMP;
	if (nh != IPPROTO_TCP && nh != IPPROTO_UDP && nh != IPPROTO_SCTP)
		return -1;
	if (nh == IPPROTO_SCTP && (later || f->frag_first))
		return -1; /* as np4_parse(): a fragment's CRC32c cannot follow a port change */
	l4_off = np_l4_pull(skb, off, np_l4_parsed(nh));
	if (l4_off < 0)
		return -1;
	off = l4_off;
	f->tot_len = payload_len + sizeof(struct ipv6hdr);
	f->l4.proto = nh;
	f->l4.l4_off = off;
	f->l4.csum_off = np_l4_csum_off(nh, off);
	f->l4.l4_len = f->tot_len - (off - NP_L3_OFF);
	f->l4.tcp_flags = 0;
	f->l4.udp_zero_csum = false;
	if (later) {
		struct lb6_frag_key fk = { .id = f->id, .proto = nh };
		struct lb4_frag_ports *fp;

		ip6_copy(fk.saddr, f->saddr);
		ip6_copy(fk.daddr, f->daddr);
		fp = bpf_map_lookup_elem(&lb6_frag, &fk);
		if (!fp)
			return -1;
		f->sport = fp->sport;
		f->dport = fp->dport;
		f->l4.has_ports = false;
		f->l4.csum_off = 0;
		return 0;
	}
	return np_parse_l4(skb, &f->l4, &f->sport, &f->dport);
}

static __always_inline void np6_frag_record(const struct np6_flow *f)
{
	struct lb6_frag_key fk = { .id = f->id, .proto = f->l4.proto };
	struct lb4_frag_ports fp = { .sport = f->sport, .dport = f->dport };

	if (!f->frag_first)
		return;
	ip6_copy(fk.saddr, f->saddr);
	ip6_copy(fk.daddr, f->daddr);
	bpf_map_update_elem(&lb6_frag, &fk, &fp, BPF_ANY);
}

static __always_inline bool np6_is_node_addr(const __be32 *addr)
{
	struct lb_node_addr_key k = { .family = 6 };

	ip6_copy(k.address, addr);
	return bpf_map_lookup_elem(&lb_node_addrs, &k) != NULL;
}

static __always_inline struct lb_service *np6_lookup(const struct np6_flow *f, struct lb6_key *key, const struct lb_np_config *cfg)
{
	struct lb_service *svc;

	ip6_copy(key->address, f->daddr);
	key->dport = f->dport;
	key->proto = f->l4.proto;
	key->scope = LB_SCOPE_EXT;
	svc = lb6_lookup_service(key);
	if (svc) {
		if (svc->type == LB_SVC_WILDCARD)
			return NULL;
		if (svc->type == LB_SVC_CLUSTER_IP && !(cfg->flags & LB_NP_F_EXTERNAL_CLUSTERIP))
			return NULL;
		return svc;
	}
	if (!np_in_range(f->dport, cfg->nodeport_min, cfg->nodeport_max) || !np6_is_node_addr(f->daddr))
		return NULL;
	__builtin_memset(key->address, 0, sizeof(key->address));
	return lb6_lookup_service(key);
}

static __always_inline bool np6_src_allowed(const struct lb_service *svc, const __be32 *saddr)
{
	struct lb6_src_range_key k = { .prefixlen = 32 + 128, .rev_nat_index = svc->rev_nat_index };

	if (!(svc->flags & LB_SVC_F_SRC_RANGE))
		return true;
	ip6_copy(k.address, saddr);
	return bpf_map_lookup_elem(&lb6_src_range, &k) != NULL;
}

/* As np4_fib(). */
static __always_inline int np6_fib(struct np_ctx *skb, struct bpf_fib_lookup *fib, __u8 proto,
				   const __be32 *src, const __be32 *dst, __be16 sport, __be16 dport, __u64 now, int use)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET6;
	fib->l4_protocol = proto;
	fib->sport = sport;
	fib->dport = dport;
	ip6_copy(fib->ipv6_src, src);
	ip6_copy(fib->ipv6_dst, dst);
	fib->ifindex = np_in_ifindex(skb);
	return np_fib(skb, fib, now, use);
}

static __always_inline bool ip6_is_zero(const __be32 *a)
{
	return !(a[0] | a[1] | a[2] | a[3]);
}

/* As np4_snat_search(). */
__attribute__((noinline)) int np6_snat_search(__u32 unused)
{
	const struct lb_np_config *cfg = np_config();
	__u32 zero = 0, span, pick, i;
	struct np6_snat_req *q = bpf_map_lookup_elem(&lb_snat_req6, &zero);
	struct lb6_ct_key *rk;
	struct lb6_ct_entry *nat;

	if (!q || !cfg || !cfg->snat_min || cfg->snat_max < cfg->snat_min)
		return -1;
	rk = (void *)q->rk;
	nat = (void *)q->nat;
	span = (__u32)cfg->snat_max - cfg->snat_min + 1;
	pick = q->first;
	q->best_rank = NP_NAT_BUSY;
	for (i = 0; i < NP_SNAT_TRIES_MAX; i++) {
		struct lb6_ct_entry *old;

		if (i > cfg->snat_retries)
			break;
		if (i > 0)
			pick = bpf_get_prandom_u32();
		rk->dport = bpf_htons(cfg->snat_min + pick % span);
		old = bpf_map_lookup_elem(&lb6_nat, rk);
		if (old) {
			bool own = np6_addr_eq(old->addr2, nat->addr2) && old->port2 == nat->port2 && np6_addr_eq(old->addr1, nat->addr1) &&
				   old->port1 == nat->port1;

			if (!own && !np_snat_consider(&q->best_rank, &q->best_port, np_nat_rank(old->expires, old->flags, q->now), rk->dport))
				continue;
			bpf_map_delete_elem(&lb6_nat, rk);
		}
		if (bpf_map_update_elem(&lb6_nat, rk, nat, BPF_NOEXIST) == 0)
			return rk->dport;
	}
	if (q->best_rank == NP_NAT_BUSY)
		return -1;
	rk->dport = q->best_port;
	bpf_map_delete_elem(&lb6_nat, rk);
	if (bpf_map_update_elem(&lb6_nat, rk, nat, BPF_NOEXIST) < 0)
		return -1;
	lb_count(LB_MTR_NP_SNAT_REUSE);
	return rk->dport;
}

/* As np4_snat_reserve(). */
static __always_inline int np6_snat_reserve(const struct lb_np_config *cfg, const struct np6_flow *f,
					    const struct lb6_backend *be, const __be32 *snat_addr,
					    const struct lb6_ct_entry *nat, __u64 now, __be16 prev, __be16 *port_out)
{
	__u32 zero = 0;
	struct np6_snat_req *q = bpf_map_lookup_elem(&lb_snat_req6, &zero);
	struct lb6_ct_key *rk;
	int port;

	if (!q)
		return -1;
	/* the key is built in the request itself: IPv6's stack frame is the largest on the call chain */
	rk = (void *)q->rk;
	ip6_copy(rk->saddr, be->address);
	ip6_copy(rk->daddr, snat_addr);
	rk->sport = be->port;
	rk->dport = 0;
	rk->proto = f->l4.proto;
	rk->dir = LB_CT_REPLY;
	rk->pad[0] = 0;
	rk->pad[1] = 0;
	__builtin_memcpy(q->nat, nat, sizeof(*nat));
	q->now = now;
	q->first = np_snat_first(cfg, prev, f->sport, np_mix(f->saddr[3] ^ f->saddr[2], f->daddr[3], ((__u32)f->sport << 16) | f->dport));
	port = np6_snat_search(0);
	if (port < 0)
		return -1;
	*port_out = (__be16)port;
	return 0;
}

/*
 * An IPv6 address in place, when it changes; the sum of its change added
 * to *sum. Without a branch per word: each one doubled the verifier's
 * paths through np6_xlate().
 */
static __always_inline void np6_set_addr(__be32 *at, const __be32 *old, const __be32 *new, __u64 *sum)
{
	__u64 s = 0;
	int i;

	if (!((old[0] ^ new[0]) | (old[1] ^ new[1]) | (old[2] ^ new[2]) | (old[3] ^ new[3])))
		return;
#pragma unroll
	for (i = 0; i < 4; i++) {
		s = np_csum_add32(s, old[i], new[i]);
		at[i] = new[i];
	}
	*sum += s;
}

/*
 * As np4_xlate(), the hop limit for the TTL. IPv6 has no header checksum:
 * only the transport checksum covers the addresses (its pseudo header),
 * or where none does (SCTP, a later fragment) a CHECKSUM_COMPLETE skb's
 * csum (np_l4_csum_update()).
 */
static __noinline int np6_xlate(struct np_ctx *skb, const struct np6_flow *f, const struct lb6_ct_entry *ct, int how)
{
	bool snat = how == NP_XLATE_FWD && (ct->flags & LB_CT_F_SNAT);
	bool fwd = how == NP_XLATE_REV_FWD || snat || (how == NP_XLATE_FWD && (ct->flags & LB_CT_F_DSR));
	__u64 addrs = 0, ports = 0;
	struct ipv6hdr *ip;

	/* the ports first, then the addresses: fewer values live at once (see np_l4_csum_update()) */
	if (how == NP_XLATE_FWD) {
		if (np_rewrite_ports(skb, &f->l4, f->sport, f->dport, snat ? ct->port2 : f->sport, ct->port1, &ports) < 0)
			return -1;
	} else if (np_rewrite_ports(skb, &f->l4, f->sport, f->dport, ct->port1, ct->port2, &ports) < 0) {
		return -1;
	}
	ip = np_header(skb, NP_L3_OFF, sizeof(*ip));
	if (!ip)
		return -1;
	if (how == NP_XLATE_FWD) {
		if (snat)
			np6_set_addr(ip->saddr.in6_u.u6_addr32, f->saddr, ct->addr2, &addrs);
		np6_set_addr(ip->daddr.in6_u.u6_addr32, f->daddr, ct->addr1, &addrs);
	} else {
		np6_set_addr(ip->saddr.in6_u.u6_addr32, f->saddr, ct->addr1, &addrs);
		np6_set_addr(ip->daddr.in6_u.u6_addr32, f->daddr, ct->addr2, &addrs);
	}
	if (fwd)
		ip->hop_limit = f->hop_limit - 1;
	return np_l4_csum_update(skb, &f->l4, addrs, ports, true);
}

static __always_inline __u32 np6_addr_hash(const __be32 *a)
{
	return bpf_ntohl(a[0]) ^ bpf_ntohl(a[1]) ^ bpf_ntohl(a[2]) ^ bpf_ntohl(a[3]);
}

/* As np4_select(): affinity keys on the client's whole address. */
static __always_inline struct lb6_backend *np6_select(struct lb6_key *key, const struct lb_service *svc, const struct np6_flow *f,
						      const struct lb_np_config *cfg, __u32 *backend_id)
{
	struct lb_np_affinity_key akey = { .rev_nat_index = svc->rev_nat_index, .family = 6 };

	if ((svc->flags & LB_SVC_F_MAGLEV) && !lb_svc_has_affinity(svc) && cfg->maglev_m) {
		__u32 id = np_maglev_pick(svc->rev_nat_index | LB_MAGLEV_V6,
					  np_jhash_3words(np6_addr_hash(f->saddr), ((__u32)bpf_ntohs(f->dport) << 16) | bpf_ntohs(f->sport),
							  f->l4.proto, cfg->maglev_seed6));
		struct lb6_backend *be = id ? bpf_map_lookup_elem(&lb6_backends, &id) : NULL;

		if (be) {
			*backend_id = id;
			return be;
		}
	}
	ip6_copy(akey.address, f->saddr);
	return lb6_select_backend_in(key, svc, &lb_np_affinity, &akey, backend_id);
}

static __always_inline bool np6_endpoints_elsewhere(struct lb6_key *key, const struct lb_service *svc)
{
	const struct lb_service *twin;

	if (!(svc->flags & LB_SVC_F_LOCAL_EXTERNAL))
		return false;
	if (!(svc->flags & LB_SVC_F_TWO_SCOPES))
		return true;
	key->scope = LB_SCOPE_INT;
	twin = lb6_lookup_service(key);
	key->scope = LB_SCOPE_EXT;
	return !twin || (twin->flags & LB_SVC_F_LOCAL_INTERNAL) || twin->count || twin->qcount;
}

static __always_inline int np6_new_flow(struct np_ctx *skb, const struct np6_flow *f, struct lb6_key *key,
					const struct lb_service *svc, const struct lb_np_config *cfg,
					struct lb6_ct_key *ok, struct lb6_ct_entry *orig, __u64 now, __be16 prev,
					struct bpf_fib_lookup *fib)
{
	struct lb6_ct_entry reply = {};
	struct lb6_backend *be;
	struct lb_device *dev;
	__u32 backend_id = 0;
	int rc;

	if (!np6_src_allowed(svc, f->saddr)) {
		lb_count(LB_MTR_NP_SRC_RANGE);
		return TC_ACT_SHOT;
	}
	if (!lb_svc_has_backends(svc)) {
		if (np6_endpoints_elsewhere(key, svc)) {
			lb_count(LB_MTR_NP_LOCAL_NONE);
			return TC_ACT_SHOT;
		}
		lb_count(LB_MTR_NP_NO_BACKEND);
		return NP_DO_REJECT;
	}
	be = np6_select(key, svc, f, cfg, &backend_id);
	if (!be) {
		lb_count(LB_MTR_BACKEND_MISSING);
		return TC_ACT_SHOT;
	}
	rc = np6_fib(skb, fib, f->l4.proto, f->saddr, be->address, f->sport, be->port, now, NP_FIB_FRESH);
	dev = np_fib_routed(rc) ? bpf_map_lookup_elem(&lb_devices, &fib->ifindex) : NULL;
	if (!dev && rc != BPF_FIB_LKUP_RET_NOT_FWDED && !np_fib_routed(rc)) {
		lb_count(LB_MTR_NP_FIB_FAIL);
		return TC_ACT_SHOT;
	}
	ip6_copy(orig->addr1, be->address);
	orig->port1 = be->port;
	orig->rev_nat_index = svc->rev_nat_index;
	orig->backend_id = backend_id;
	ip6_copy(reply.addr1, f->daddr);
	reply.port1 = f->dport;
	ip6_copy(reply.addr2, f->saddr);
	reply.port2 = f->sport;
	reply.rev_nat_index = svc->rev_nat_index;
	reply.backend_id = backend_id;
	if (dev && !(svc->flags & LB_SVC_F_LOCAL_EXTERNAL) && np_dsr_wanted(cfg, &f->l4, sizeof(struct ipv6hdr))) {
		/* remote, by direct server return (as np4_new_flow()) */
		orig->flags = LB_CT_F_DSR;
	} else if (dev && !(svc->flags & LB_SVC_F_LOCAL_EXTERNAL)) {
		if (ip6_is_zero(dev->addr6)) {
			lb_count(LB_MTR_NP_NO_SNAT_ADDR);
			return TC_ACT_SHOT;
		}
		reply.flags = LB_CT_F_SNAT;
		reply.expires = now + np_lifetime(cfg, f->l4.proto, 0);
		if (np6_snat_reserve(cfg, f, be, dev->addr6, &reply, now, prev, &orig->port2) < 0) {
			lb_count(LB_MTR_NP_SNAT_EXHAUSTED);
			return TC_ACT_SHOT;
		}
		ip6_copy(orig->addr2, dev->addr6);
		orig->flags = LB_CT_F_SNAT;
	} else {
		struct lb6_ct_key rk = { .sport = be->port, .dport = f->sport, .proto = f->l4.proto, .dir = LB_CT_REPLY };

		ip6_copy(rk.saddr, be->address);
		ip6_copy(rk.daddr, f->saddr);
		reply.flags = LB_CT_F_LOCAL;
		reply.expires = now + np_lifetime(cfg, f->l4.proto, 0);
		if (bpf_map_update_elem(&lb6_ct, &rk, &reply, BPF_ANY) < 0) {
			lb_count(LB_MTR_NP_CT_FULL);
			return TC_ACT_SHOT;
		}
		orig->flags = LB_CT_F_LOCAL;
	}
	orig->flags = np_ct_flags(&f->l4, orig->flags, false);
	orig->expires = now + np_lifetime(cfg, f->l4.proto, orig->flags);
	if (bpf_map_update_elem(&lb6_ct, ok, orig, BPF_ANY) < 0) {
		lb_count(LB_MTR_NP_CT_FULL);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_NEW);
	return 0;
}

static __always_inline void np6_pair_local(const struct lb_np_config *cfg, const struct np6_flow *f,
					   const struct lb6_ct_entry *orig, __u64 now)
{
	struct lb6_ct_key rk = { .sport = orig->port1, .dport = f->sport, .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb6_ct_entry *r;

	ip6_copy(rk.saddr, orig->addr1);
	ip6_copy(rk.daddr, f->saddr);
	r = bpf_map_lookup_elem(&lb6_ct, &rk);
	if (r)
		np_ct_pair(cfg, &r->expires, &r->flags, f->l4.proto, orig->flags, now);
}

/* As np4_nat_own(). */
static __always_inline int np6_nat_own(const struct lb_np_config *cfg, const struct np6_flow *f,
				       const struct lb6_ct_entry *orig, bool changed, __u64 now)
{
	struct lb6_ct_key rk = { .sport = orig->port1, .dport = orig->port2, .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb6_ct_entry *r;

	ip6_copy(rk.saddr, orig->addr1);
	ip6_copy(rk.daddr, orig->addr2);
	r = bpf_map_lookup_elem(&lb6_nat, &rk);
	if (!r) {
		struct lb6_ct_entry nat = {
			.expires = orig->expires, .port1 = f->dport, .port2 = f->sport,
			.rev_nat_index = orig->rev_nat_index, .backend_id = orig->backend_id, .flags = orig->flags,
		};

		ip6_copy(nat.addr1, f->daddr);
		ip6_copy(nat.addr2, f->saddr);
		if (bpf_map_update_elem(&lb6_nat, &rk, &nat, BPF_NOEXIST) == 0) {
			/* while flows are carried, an entry not copied yet is no loss: the commit keeps this one */
			if (!np_migrating(cfg, now))
				lb_count(LB_MTR_NP_NAT_REPAIR);
			return 0;
		}
		r = bpf_map_lookup_elem(&lb6_nat, &rk);
		if (!r)
			return NP_NAT_LOST;
	}
	if (!np6_addr_eq(r->addr2, f->saddr) || r->port2 != f->sport || !np6_addr_eq(r->addr1, f->daddr) || r->port1 != f->dport)
		return NP_NAT_TAKEN;
	if (changed)
		np_ct_pair(cfg, &r->expires, &r->flags, f->l4.proto, orig->flags, now);
	return 0;
}

static __always_inline bool np6_backend_gone(const struct lb6_ct_entry *ct)
{
	__u32 id = ct->backend_id;
	struct lb6_backend *be = bpf_map_lookup_elem(&lb6_backends, &id);

	return !be || !np6_addr_eq(be->address, ct->addr1) || be->port != ct->port1;
}

#ifndef NP_XDP
/* ------------------------------------------------------- DSR, IPv6 */

/*
 * As np4_dsr_push(): a Destination Options header (bpf/lib/dsr.h) right
 * after the fixed IPv6 header, carrying the frontend; the next header
 * and payload length follow. No header checksum, and the transport's
 * pseudo header counts the transport's own length: nothing else changes.
 */
static __noinline int np6_dsr_push(struct np_ctx *skb, const __be32 *addr, __be16 port)
{
	struct lb_dsr_opt6 *opt;
	struct ipv6hdr *ip;

	if (!skb || !addr || bpf_skb_adjust_room(skb, LB_DSR_OPT6_LEN, BPF_ADJ_ROOM_NET, BPF_F_ADJ_ROOM_NO_CSUM_RESET) < 0)
		return -1;
	np_pull(skb, NP_L3_OFF + sizeof(*ip) + LB_DSR_OPT6_LEN);
	ip = np_header(skb, NP_L3_OFF, sizeof(*ip) + LB_DSR_OPT6_LEN);
	if (!ip)
		return -1;
	opt = (void *)(ip + 1);
	opt->nexthdr = ip->nexthdr;
	opt->hdrlen = LB_DSR_OPT6_HDRLEN;
	opt->type = LB_DSR_OPT6_TYPE;
	opt->len = LB_DSR_OPT6_DATALEN;
	ip6_copy(opt->addr, addr);
	opt->port = port;
	opt->pad[0] = 0;
	opt->pad[1] = 0;
	ip->nexthdr = NEXTHDR_DEST;
	ip->payload_len = bpf_htons(bpf_ntohs(ip->payload_len) + LB_DSR_OPT6_LEN);
	return 0;
}

/* As np4_dsr_recv(): the option is the Destination Options header right after the fixed header. */
static __always_inline int np6_dsr_recv(struct np_ctx *skb, const struct np6_flow *f, const struct lb_np_config *cfg)
{
	struct lb6_ct_key rk = { .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb6_ct_entry fresh = {};
	struct lb_dsr_opt6 opt;
	struct lb6_ct_entry *ct;
	__u8 nh;
	__u64 now;

	if (bpf_skb_load_bytes(skb, NP_L3_OFF + offsetof(struct ipv6hdr, nexthdr), &nh, sizeof(nh)) < 0 || nh != NEXTHDR_DEST ||
	    bpf_skb_load_bytes(skb, NP_L3_OFF + sizeof(struct ipv6hdr), &opt, sizeof(opt)) < 0 ||
	    opt.hdrlen != LB_DSR_OPT6_HDRLEN || opt.type != LB_DSR_OPT6_TYPE || opt.len != LB_DSR_OPT6_DATALEN)
		return NP_NOT_DSR;
	now = np_now();
	np6_frag_record(f);
	ip6_copy(rk.saddr, f->daddr);
	ip6_copy(rk.daddr, f->saddr);
	rk.sport = f->dport;
	rk.dport = f->sport;
	ct = bpf_map_lookup_elem(&lb6_ct, &rk);
	if (ct && ct->expires > now && !np_ct_reopened(&f->l4, ct->flags) && (ct->flags & LB_CT_F_DSR) &&
	    np6_addr_eq(ct->addr1, opt.addr) && ct->port1 == opt.port) {
		np_ct_set(cfg, &ct->expires, &ct->flags, f->l4.proto, np_ct_flags(&f->l4, ct->flags, false), now);
		return TC_ACT_UNSPEC;
	}
	if (!f->l4.has_ports)
		return TC_ACT_UNSPEC;
	ip6_copy(fresh.addr1, opt.addr);
	fresh.port1 = opt.port;
	ip6_copy(fresh.addr2, f->saddr);
	fresh.port2 = f->sport;
	fresh.flags = np_ct_flags(&f->l4, LB_CT_F_LOCAL | LB_CT_F_DSR, false);
	fresh.expires = now + np_lifetime(cfg, f->l4.proto, fresh.flags);
	if (bpf_map_update_elem(&lb6_ct, &rk, &fresh, BPF_ANY) < 0) {
		lb_count(LB_MTR_NP_CT_FULL);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_DSR_FLOW);
	return TC_ACT_UNSPEC;
}

/* As np4_fwd(); IPv6 routers never fragment: too big is a packet too big to the sender. */
#endif /* !NP_XDP */

static __always_inline int np6_fwd(struct np_ctx *skb, struct np6_flow *f, struct lb6_key *key,
				   const struct lb_service *svc, const struct lb_np_config *cfg)
{
	struct lb6_ct_key ok = { .sport = f->sport, .dport = f->dport, .proto = f->l4.proto, .dir = LB_CT_ORIG };
	const struct lb_device *dev = NULL;
	struct lb6_ct_entry fresh = {};
	struct lb6_ct_entry *ct;
	struct bpf_fib_lookup fib;
	__u64 now = np_now();
	__be16 prev = 0;
	int rc = 0, mtu;
	bool changed;

	ip6_copy(ok.saddr, f->saddr);
	ip6_copy(ok.daddr, f->daddr);
	ct = bpf_map_lookup_elem(&lb6_ct, &ok);
	if (ct && (ct->expires <= now || np_ct_reopened(&f->l4, ct->flags))) {
		if (ct->flags & LB_CT_F_SNAT)
			prev = ct->port2;
		ct = NULL;
	}
	if (ct && np6_backend_gone(ct)) {
		lb_count(LB_MTR_NP_REBALANCE);
		ct = NULL;
	}
	if (ct) {
		__u16 fl = np_ct_flags(&f->l4, ct->flags, false) | (np_tcp_syn(&f->l4) ? 0 : LB_CT_F_SEEN_REPLY);

		changed = np_ct_set(cfg, &ct->expires, &ct->flags, f->l4.proto, fl, now);
		if (ct->flags & LB_CT_F_SNAT) {
			rc = np6_nat_own(cfg, f, ct, changed, now);
			if (rc == NP_NAT_LOST) {
				lb_count(LB_MTR_NP_NAT_FULL);
				return TC_ACT_SHOT;
			}
			if (rc == NP_NAT_TAKEN) {
				lb_count(LB_MTR_NP_NAT_STOLEN);
				bpf_map_delete_elem(&lb6_ct, &ok);
				ct = NULL;
			}
		} else if (changed) {
			np6_pair_local(cfg, f, ct, now);
		}
	}
	if (!ct) {
		if (!f->l4.has_ports) {
			lb_count(LB_MTR_NP_FRAG);
			return TC_ACT_SHOT;
		}
		/* an established TCP flow whose entry is being carried into new maps: its retransmit finds it */
		if (np_migrating(cfg, now) && np_stateful(f->l4.proto) && !(f->l4.tcp_flags & TCP_F_SYN))
			return np_migrating_drop();
		rc = np6_new_flow(skb, f, key, svc, cfg, &ok, &fresh, now, prev, &fib);
		if (rc)
			return rc;
		ct = &fresh;
	}
#ifdef NP_XDP
	if ((ct->flags & LB_CT_F_DSR) || ((ct->flags & LB_CT_F_SNAT) && f->hop_limit <= 1))
		return np_xdp_to_tc();
#endif
	np6_frag_record(f);
	if (ct->flags & (LB_CT_F_SNAT | LB_CT_F_DSR)) {
		/* a new flow's first packet asks the FIB itself */
		int use = ct == &fresh ? NP_FIB_FRESH : NP_FIB_CACHED;

		/*
		 * The option's bytes (DSR) are read from ct->flags where needed,
		 * not kept in a variable: one more slot live across the FIB
		 * lookup took np_ingress6's frame past what 5.10's and 6.1's
		 * 512-byte call chain allows with the test CT layout.
		 */
		if (f->hop_limit <= 1) {
			lb_count(LB_MTR_NP_TTL);
			return TC_ACT_SHOT;
		}
		if (ct->flags & LB_CT_F_DSR)
			rc = np6_fib(skb, &fib, f->l4.proto, f->saddr, ct->addr1, f->sport, ct->port1, now, use);
		else
			rc = np6_fib(skb, &fib, f->l4.proto, ct->addr2, ct->addr1, ct->port2, ct->port1, now, use);
		dev = np_fib_dev(&fib);
#ifdef NP_XDP
		if (!np_xdp_sends(dev, rc))
			return np_xdp_to_tc();
#endif
		mtu = np_mtu_check(dev, &fib, rc, np_seglen(skb, &f->l4, f->tot_len) + ((ct->flags & LB_CT_F_DSR) ? LB_DSR_OPT6_LEN : 0));
		if (mtu)
			return mtu - ((ct->flags & LB_CT_F_DSR) ? LB_DSR_OPT6_LEN : 0);
		if (!np_fib_routed(rc)) {
			lb_count(LB_MTR_NP_FIB_FAIL);
			return TC_ACT_SHOT;
		}
	}
	if (np6_xlate(skb, f, ct, NP_XLATE_FWD) < 0 ||
	    np_rewrite_sctp_ports(skb, &f->l4, f->sport, f->dport, (ct->flags & LB_CT_F_SNAT) ? ct->port2 : f->sport, ct->port1) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_FWD);
#ifndef NP_XDP
	if (ct->flags & LB_CT_F_DSR) {
		if (np6_dsr_push(skb, f->daddr, f->dport) < 0) {
			lb_count(LB_MTR_NP_BAD_PACKET);
			return TC_ACT_SHOT;
		}
		lb_count(LB_MTR_NP_DSR_FWD);
	} else if (!(ct->flags & LB_CT_F_SNAT)) {
		return TC_ACT_OK;
	}
#else
	/* a local backend's: translated here, up the stack (tc's ingress finds no service in it) */
	if (!(ct->flags & LB_CT_F_SNAT))
		return NP_XDP_VERDICT + XDP_PASS;
#endif
	return np_forward_dev(skb, &fib, rc, dev);
}

static __always_inline struct lb6_ct_entry *np6_reply_entry(void *map, const struct np6_flow *f, __u64 now)
{
	struct lb6_ct_key rk = { .sport = f->sport, .dport = f->dport, .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb6_ct_entry *ct;

	ip6_copy(rk.saddr, f->saddr);
	ip6_copy(rk.daddr, f->daddr);
	ct = bpf_map_lookup_elem(map, &rk);
	if (!ct || ct->expires <= now)
		return NULL;
	return ct;
}

static __always_inline void np6_reply_seen(const struct lb_np_config *cfg, const struct np6_flow *f,
					   struct lb6_ct_entry *ct, __u64 now)
{
	__u16 fl = np_ct_flags(&f->l4, ct->flags, true) | LB_CT_F_SEEN_REPLY;
	struct lb6_ct_key ok = { .sport = ct->port2, .dport = ct->port1, .proto = f->l4.proto, .dir = LB_CT_ORIG };
	struct lb6_ct_entry *o;

	if (!np_ct_set(cfg, &ct->expires, &ct->flags, f->l4.proto, fl, now))
		return;
	ip6_copy(ok.saddr, ct->addr2);
	ip6_copy(ok.daddr, ct->addr1);
	o = bpf_map_lookup_elem(&lb6_ct, &ok);
	if (o)
		np_ct_pair(cfg, &o->expires, &o->flags, f->l4.proto, ct->flags, now);
}

static __always_inline int np6_rev_snat(struct np_ctx *skb, struct np6_flow *f, const struct lb_np_config *cfg)
{
	__u64 now = np_now();
	struct lb6_ct_entry *ct = np6_reply_entry(&lb6_nat, f, now);
	const struct lb_device *dev = NULL;
	struct bpf_fib_lookup fib;
	int rc, mtu;

	if (!ct)
		return np_migrating(cfg, now) ? np_migrating_drop() : TC_ACT_UNSPEC;
	if (ct->flags & LB_CT_F_HOST) {
		np_ct_set(cfg, &ct->expires, &ct->flags, f->l4.proto, np_ct_flags(&f->l4, ct->flags, true) | LB_CT_F_SEEN_REPLY, now);
		return TC_ACT_UNSPEC;
	}
	np6_reply_seen(cfg, f, ct, now);
	np6_frag_record(f);
	if (f->hop_limit <= 1) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	rc = np6_fib(skb, &fib, f->l4.proto, ct->addr1, ct->addr2, ct->port1, ct->port2, now, NP_FIB_CACHED);
#ifdef NP_XDP
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED)
		return np_xdp_to_tc();
#endif
	if (rc != BPF_FIB_LKUP_RET_NOT_FWDED) {
		dev = np_fib_dev(&fib);
#ifdef NP_XDP
		if (!np_xdp_sends(dev, rc))
			return np_xdp_to_tc();
#endif
		mtu = np_mtu_check(dev, &fib, rc, np_seglen(skb, &f->l4, f->tot_len));
		if (mtu)
			return mtu;
		if (!np_fib_routed(rc)) {
			lb_count(LB_MTR_NP_FIB_FAIL);
			return TC_ACT_SHOT;
		}
	}
	if (np6_xlate(skb, f, ct, rc == BPF_FIB_LKUP_RET_NOT_FWDED ? NP_XLATE_REV : NP_XLATE_REV_FWD) < 0 ||
	    np_rewrite_sctp_ports(skb, &f->l4, f->sport, f->dport, ct->port1, ct->port2) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_REV);
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED)
		return TC_ACT_OK;
	return np_forward_dev(skb, &fib, rc, dev);
}

/* As np4_ingress(). */
static __always_inline int np6_ingress(struct np_ctx *skb)
{
	const struct lb_np_config *cfg = np_config();
	struct lb6_key key = {};
	struct lb_service *svc;
	struct np6_flow f;
	int rc;

	if (!cfg)
		return TC_ACT_UNSPEC;
	rc = np6_parse(skb, &f);
	if (rc == NP_PARSE_ICMP)
		return NP_DO_ICMP;
	if (rc < 0)
		return TC_ACT_UNSPEC;
	/*
	 * The frontend first, then the CT entry (np4_ingress() has it the
	 * other way round for NodePorts): np6_fwd() looking the frontend up
	 * after the CT entry took np_ingress6's frame 24 bytes past what
	 * 5.10's and 6.1's 512-byte call chain allows.
	 */
	svc = NULL;
	if (np_in_range(f.dport, cfg->nodeport_min, cfg->nodeport_max) || np_frontend_port(cfg, f.dport))
		svc = np6_lookup(&f, &key, cfg);
	if (svc)
		return np6_fwd(skb, &f, &key, svc, cfg);
	if ((cfg->flags & LB_NP_F_DSR) && f.l4.l4_off > NP_L3_OFF + sizeof(struct ipv6hdr)) {
#ifdef NP_XDP
		return TC_ACT_UNSPEC;	/* maybe a DSR option: tc's */
#else
		rc = np6_dsr_recv(skb, &f, cfg);
		if (rc != NP_NOT_DSR)
			return rc;
#endif
	}
	if (np_in_range(f.dport, cfg->snat_min, cfg->snat_max))
		return np6_rev_snat(skb, &f, cfg);
	return TC_ACT_UNSPEC;
}

#ifndef NP_XDP
/* As np4_host_flow(). */
static __always_inline int np6_host_flow(struct np_ctx *skb, const struct lb_np_config *cfg, const struct np6_flow *f, __u64 now)
{
	struct lb6_ct_key rk = { .sport = f->dport, .dport = f->sport, .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb6_ct_entry host = { .flags = LB_CT_F_HOST };
	__u32 ifindex = skb->ifindex;
	struct lb_device *dev;
	struct lb6_ct_entry *r;

	if (skb->ingress_ifindex || !f->l4.has_ports || !np_in_range(f->sport, cfg->snat_min, cfg->snat_max))
		return NP_NOT_HOST;
	dev = bpf_map_lookup_elem(&lb_devices, &ifindex);
	if (!dev || !np6_addr_eq(dev->addr6, f->saddr))
		return NP_NOT_HOST;
	ip6_copy(rk.saddr, f->daddr);
	ip6_copy(rk.daddr, f->saddr);
	r = bpf_map_lookup_elem(&lb6_nat, &rk);
	if (r && (r->flags & LB_CT_F_HOST)) {
		np_ct_set(cfg, &r->expires, &r->flags, f->l4.proto, np_ct_flags(&f->l4, r->flags, false), now);
		return TC_ACT_UNSPEC;
	}
	if (r && np_nat_rank(r->expires, r->flags, now) == NP_NAT_BUSY) {
		lb_count(LB_MTR_NP_HOST_CLASH);
		return TC_ACT_SHOT;
	}
	host.flags = np_ct_flags(&f->l4, host.flags, false);
	host.expires = now + np_lifetime(cfg, f->l4.proto, host.flags);
	bpf_map_update_elem(&lb6_nat, &rk, &host, BPF_ANY);
	return TC_ACT_UNSPEC;
}

static __always_inline int np6_egress(struct np_ctx *skb)
{
	const struct lb_np_config *cfg = np_config();
	struct lb6_ct_entry *ct;
	struct np6_flow f;
	__u64 now;
	int rc;

	if (!cfg)
		return TC_ACT_UNSPEC;
	rc = np6_parse(skb, &f);
	if (rc == NP_PARSE_ICMP)
		return NP_DO_ICMP;
	if (rc < 0)
		return TC_ACT_UNSPEC;
	now = np_now();
	rc = np6_host_flow(skb, cfg, &f, now);
	if (rc != NP_NOT_HOST)
		return rc;
	ct = np6_reply_entry(&lb6_ct, &f, now);
	if (!ct || !(ct->flags & LB_CT_F_LOCAL))
		return np_egress_unclaimed(skb, cfg, &f.l4, now);
	np6_reply_seen(cfg, &f, ct, now);
	np6_frag_record(&f);
	if (np6_rewrite_addr(skb, &f.l4, NP_L3_OFF + offsetof(struct ipv6hdr, saddr), f.saddr, ct->addr1) < 0 ||
	    np_rewrite_port(skb, &f.l4, offsetof(struct tcphdr, source), f.sport, ct->port1) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count((ct->flags & LB_CT_F_DSR) ? LB_MTR_NP_DSR_REV : LB_MTR_NP_REV);
	return TC_ACT_UNSPEC;
}

#endif /* !NP_XDP */

#ifndef NP_XDP	/* ICMP: tc's alone (XDP passes it on) */
/* ------------------------------------------------------------------ ICMP */

/*
 * The ICMP errors this datapath sends itself (port unreachable, for a
 * frontend without endpoints) are rate-limited per CPU by a token bucket:
 * NP_ICMP_BURST at once, then NP_ICMP_RATE a second, as Linux limits its
 * own (icmp_msgs_burst, icmp_msgs_per_sec), so spoofed packets do not make
 * the node a reflector. The bucket is the program's scratch state, not the
 * agent's: it is declared here rather than in bpf/include, unpinned (each
 * load starts with a full bucket), and written by this program only.
 */
#define NP_ICMP_RATE		100
#define NP_ICMP_BURST		100
#define NP_ICMP_TOKEN_NS	(1000000000ULL / NP_ICMP_RATE)

struct lb_icmp_bucket {
	__u64 stamp;		/* bpf_ktime_get_ns() up to which tokens were added */
	__u64 tokens;		/* errors that may be sent now */
};

_Static_assert(sizeof(struct lb_icmp_bucket) == 16, "lb_icmp_bucket size");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct lb_icmp_bucket);
	__uint(max_entries, 1);
} lb_icmp_bucket SEC(".maps");

static __always_inline bool np_icmp_take_token(void)
{
	__u32 zero = 0;
	struct lb_icmp_bucket *b = bpf_map_lookup_elem(&lb_icmp_bucket, &zero);
	__u64 now = bpf_ktime_get_ns();
	__u64 add;

	if (!b)
		return false;
	if (now > b->stamp) {
		add = (now - b->stamp) / NP_ICMP_TOKEN_NS;
		if (add >= NP_ICMP_BURST || b->tokens + add >= NP_ICMP_BURST) {
			b->tokens = NP_ICMP_BURST;
			b->stamp = now;
		} else if (add) {
			b->tokens += add;
			b->stamp += add * NP_ICMP_TOKEN_NS;
		}
	}
	if (!b->tokens)
		return false;
	b->tokens--;
	return true;
}

/* RFC 1122 3.2.2: no ICMP error to a source that is not one host (0/8, loopback, multicast, reserved, broadcast). */
static __always_inline bool np4_unicast(__be32 addr)
{
	__u32 first = bpf_ntohl(addr) >> 24;

	return first != 0 && first != 127 && first < 224;
}

static __always_inline bool np6_unicast(const __be32 *a)
{
	if ((bpf_ntohl(a[0]) >> 24) == 0xff)
		return false;
	return a[0] || a[1] || a[2] || (a[3] && a[3] != bpf_htonl(1));
}

/*
 * A packet becomes the ICMP error that answers it, from the address it was
 * sent to, and goes back out of the device it came in on: MACs and
 * addresses swapped, cut to the answer's length, quoting the packet's IP
 * header and the first 8 bytes of its TCP or UDP header (RFC 792: the
 * ports and, for TCP, the sequence number the sender's stack matches the
 * error by). `mtu` 0: a client's packet to a frontend without endpoints,
 * answered with a port unreachable from the frontend (kube-proxy's REJECT);
 * else a packet too big for the way out (np_mtu_check(), before any
 * rewrite), answered with fragmentation needed and that next-hop MTU
 * (RFC 1191): a client's from the frontend, a remote backend's reply from
 * our SNAT address. It is dropped instead when the bucket is empty or the
 * packet must not be answered (not from one host, or sent to a multicast
 * MAC).
 *
 * The skb keeps its checksum state: one that came in CHECKSUM_PARTIAL was
 * sent by a process on this machine, and goes back to it with the
 * checksums taken as good; CHECKSUM_COMPLETE means nothing on the way out.
 * A GSO skb stops being one when it is cut (bpf_skb_change_tail).
 */
static __noinline int np_icmp_reply4(struct np_ctx *skb, __u32 mtu)
{
	struct np_icmphdr icmp = { .type = ICMP_DEST_UNREACH, .code = ICMP_PORT_UNREACH };
	__u8 quote[60 + 8] = {};	/* the longest IPv4 header and 8 bytes */
	struct iphdr ip;
	__be32 client;
	__u32 qlen;
	__s64 sum;

	if (np_l2_reverse(skb) < 0 || bpf_skb_load_bytes(skb, NP_L3_OFF, &ip, sizeof(ip)) < 0)
		return TC_ACT_SHOT;
	if (ip.ihl < 5 || !np4_unicast(ip.saddr) || !np_icmp_take_token())
		return TC_ACT_SHOT;
	qlen = ip.ihl * 4 + 8;
	if (bpf_skb_load_bytes(skb, NP_L3_OFF, quote, qlen) < 0)
		return TC_ACT_SHOT;
	if (mtu) {
		icmp.code = ICMP_FRAG_NEEDED;
		icmp.rest = bpf_htonl(mtu & NP_MTU_MASK);
	}

	client = ip.saddr;
	ip.ihl = 5;
	ip.tos = IPTOS_PREC_INTERNETCONTROL;
	ip.tot_len = bpf_htons(sizeof(ip) + sizeof(icmp) + qlen);
	ip.id = (__be16)bpf_get_prandom_u32();
	ip.frag_off = 0;
	ip.ttl = 64;
	ip.protocol = IPPROTO_ICMP;
	ip.check = 0;
	ip.saddr = ip.daddr;
	ip.daddr = client;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&ip, sizeof(ip), 0);
	if (sum < 0)
		return TC_ACT_SHOT;
	ip.check = np_csum_fold(sum);
	/* no pseudo header for ICMP; the quote's zeroed tail adds nothing */
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&icmp, sizeof(icmp), 0);
	if (sum >= 0)
		sum = bpf_csum_diff(NULL, 0, (__be32 *)quote, sizeof(quote), sum);
	if (sum < 0)
		return TC_ACT_SHOT;
	icmp.check = np_csum_fold(sum);

	if (bpf_skb_change_tail(skb, NP_L3_OFF + sizeof(ip) + sizeof(icmp) + qlen, 0) < 0 ||
	    bpf_skb_store_bytes(skb, NP_L3_OFF, &ip, sizeof(ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, NP_L3_OFF + sizeof(ip), &icmp, sizeof(icmp), 0) < 0 ||
	    bpf_skb_store_bytes(skb, NP_L3_OFF + sizeof(ip) + sizeof(icmp), quote, qlen, 0) < 0)
		return TC_ACT_SHOT;
	if (!mtu)
		lb_count(LB_MTR_NP_REJECT);
	return bpf_redirect(skb->ifindex, 0);
}

/* The ICMPv6 checksum's pseudo header (RFC 8200 8.1). */
struct np6_pseudo {
	__be32 saddr[4];
	__be32 daddr[4];
	__be32 len;
	__u8 zero[3];
	__u8 nexthdr;
};

/* What an ICMPv6 error of ours quotes of the packet at most: the IPv6 header, extension headers, the ports. */
#define NP_ICMP6_QUOTE		128

/*
 * IPv6: an ICMPv6 destination unreachable, port unreachable (type 1 code
 * 4), or with `mtu` a packet too big (type 2, the MTU in its 32-bit field),
 * quoting the packet from its IPv6 header on, up to NP_ICMP6_QUOTE bytes
 * (RFC 4443 asks for as much as fits 1280; the sender's stack needs the
 * headers up to its ports and sequence number). Its checksum covers the
 * pseudo header.
 */
static __noinline int np_icmp_reply6(struct np_ctx *skb, __u32 mtu)
{
	struct np_icmphdr icmp = { .type = ICMPV6_DEST_UNREACH, .code = ICMPV6_PORT_UNREACH };
	__u8 quote[NP_ICMP6_QUOTE] = {};
	struct np6_pseudo ph = {};
	struct ipv6hdr ip;
	__u32 qlen;
	__s64 sum;

	if (np_l2_reverse(skb) < 0 || bpf_skb_load_bytes(skb, NP_L3_OFF, &ip, sizeof(ip)) < 0)
		return TC_ACT_SHOT;
	if (!np6_unicast(ip.saddr.in6_u.u6_addr32) || !np_icmp_take_token())
		return TC_ACT_SHOT;
	qlen = sizeof(ip) + bpf_ntohs(ip.payload_len);
	if (qlen > NP_ICMP6_QUOTE)
		qlen = NP_ICMP6_QUOTE;
	if (bpf_skb_load_bytes(skb, NP_L3_OFF, quote, qlen) < 0)
		return TC_ACT_SHOT;
	if (mtu) {
		icmp.type = ICMPV6_PKT_TOOBIG;
		icmp.code = 0;
		icmp.rest = bpf_htonl(mtu & NP_MTU_MASK);
	}

	ip6_copy(ph.saddr, ip.daddr.in6_u.u6_addr32);
	ip6_copy(ph.daddr, ip.saddr.in6_u.u6_addr32);
	ph.len = bpf_htonl(sizeof(icmp) + qlen);
	ph.nexthdr = IPPROTO_ICMPV6;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
	if (sum >= 0)
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&icmp, sizeof(icmp), sum);
	if (sum >= 0)
		sum = bpf_csum_diff(NULL, 0, (__be32 *)quote, sizeof(quote), sum);
	if (sum < 0)
		return TC_ACT_SHOT;
	icmp.check = np_csum_fold(sum);

	ip.priority = 0;
	ip.flow_lbl[0] = 0;
	ip.flow_lbl[1] = 0;
	ip.flow_lbl[2] = 0;
	ip.payload_len = bpf_htons(sizeof(icmp) + qlen);
	ip.nexthdr = IPPROTO_ICMPV6;
	ip.hop_limit = 64;
	ip6_copy(ip.saddr.in6_u.u6_addr32, ph.saddr);
	ip6_copy(ip.daddr.in6_u.u6_addr32, ph.daddr);

	if (bpf_skb_change_tail(skb, NP_L3_OFF + sizeof(ip) + sizeof(icmp) + qlen, 0) < 0 ||
	    bpf_skb_store_bytes(skb, NP_L3_OFF, &ip, sizeof(ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, NP_L3_OFF + sizeof(ip), &icmp, sizeof(icmp), 0) < 0 ||
	    bpf_skb_store_bytes(skb, NP_L3_OFF + sizeof(ip) + sizeof(icmp), quote, qlen, 0) < 0)
		return TC_ACT_SHOT;
	if (!mtu)
		lb_count(LB_MTR_NP_REJECT);
	return bpf_redirect(skb->ifindex, 0);
}

/*
 * ICMP errors about translated flows, so path MTU discovery (fragmentation
 * needed, packet too big) and the other errors reach the end that caused
 * them. The flow is the one the quoted packet belongs to, looked up in CT
 * as its other direction is keyed; the error then gets the translation the
 * flow's packets get in its direction, inside (the quote) and outside:
 *
 * - at ingress, about a reply we sent a client from a frontend (a router
 *   on the client's side): the ORIG entry of the client's flow. The quote
 *   becomes the reply as the backend sent it (from the backend; to our SNAT
 *   address and port after SNAT), the error goes to the backend: up the
 *   stack to a local one (its source, the router, kept), forwarded from our
 *   SNAT address to a remote one (whose node has no route to the router);
 * - at ingress, about a request we forwarded to a remote backend (its
 *   network, or the backend itself): the REPLY entry of its SNAT port. The
 *   quote becomes the request as the client sent it (client to frontend),
 *   the error goes to the client. Its source stays a router's, but the
 *   backend's own address becomes the frontend's: the client never learns
 *   a backend address (issue 14's research, 8.4 item 5: git show f561a95:notes/issue14-research.md);
 * - at egress, about a request we delivered to a local backend (the
 *   backend itself, or this node's stack on the way to it): the REPLY entry
 *   of the local flow. The quote's destination becomes the frontend, and a
 *   source that is the backend's the frontend's too.
 *
 * Of the quote only the IP header, the ports and the TCP or UDP checksum
 * (when quoted) are read and rewritten. IPv6: the error right after the
 * IPv6 header, the quoted transport header right after the quoted IPv6
 * header (no extension headers). An error about anything else (no flow, an
 * ICMP echo, a later fragment, a fragmented error) is left untouched.
 */

/* Destination unreachable (fragmentation needed among them), time exceeded, parameter problem. */
static __always_inline bool np4_icmp_is_error(__u8 type, __u8 code)
{
	return (type == ICMP_DEST_UNREACH && code <= 15) || (type == ICMP_TIME_EXCEEDED && code <= 1) ||
	       (type == ICMP_PARAMETERPROB && code <= 2);
}

/* An ICMP error about a TCP or UDP packet: where its parts are, and what the quote names. */
struct np4_icmp {
	__u32 icmp_off;		/* the ICMP header */
	__u32 in_off;		/* the quoted IP header */
	__u32 in_l4_off;	/* the quoted TCP or UDP header */
	__u32 in_csum_off;	/* its checksum; 0: not quoted, or a UDP datagram sent without one */
	__be32 saddr;		/* the error's own source and destination */
	__be32 daddr;
	__be32 in_saddr;	/* the quoted packet's */
	__be32 in_daddr;
	__be16 in_sport;
	__be16 in_dport;
	__u8 in_proto;
	__u8 ttl;
};

/* 0: an error of a type above, sent to the source of the TCP or UDP packet it quotes; <0: anything else. */
static __always_inline int np4_icmp_parse(struct np_ctx *skb, struct np4_icmp *ic)
{
	struct iphdr ip;
	__u8 tc[2];
	__u32 ports, end;
	__u16 csum;

	if (bpf_skb_load_bytes(skb, NP_L3_OFF, &ip, sizeof(ip)) < 0 || ip.version != 4 || ip.ihl < 5 ||
	    ip.protocol != IPPROTO_ICMP || (bpf_ntohs(ip.frag_off) & (IP_MF | IP_OFFSET)))
		return -1;
	ic->saddr = ip.saddr;
	ic->daddr = ip.daddr;
	ic->ttl = ip.ttl;
	end = NP_L3_OFF + bpf_ntohs(ip.tot_len);
	ic->icmp_off = NP_L3_OFF + ip.ihl * 4;
	if (bpf_skb_load_bytes(skb, ic->icmp_off, tc, sizeof(tc)) < 0 || !np4_icmp_is_error(tc[0], tc[1]))
		return -1;
	ic->in_off = ic->icmp_off + NP_ICMP_HLEN;
	if (bpf_skb_load_bytes(skb, ic->in_off, &ip, sizeof(ip)) < 0 || ip.version != 4 || ip.ihl < 5 ||
	    (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP) || (bpf_ntohs(ip.frag_off) & IP_OFFSET))
		return -1;
	if (ip.saddr != ic->daddr)
		return -1;
	ic->in_saddr = ip.saddr;
	ic->in_daddr = ip.daddr;
	ic->in_proto = ip.protocol;
	ic->in_l4_off = ic->in_off + ip.ihl * 4;
	if (ic->in_l4_off + sizeof(ports) > end || bpf_skb_load_bytes(skb, ic->in_l4_off, &ports, sizeof(ports)) < 0)
		return -1;
	ic->in_sport = (__be16)ports;
	ic->in_dport = (__be16)(ports >> 16);
	/* RFC 792 quotes 8 bytes: a TCP checksum is often cut off, and then left as it is */
	ic->in_csum_off = np_l4_csum_off(ip.protocol, ic->in_l4_off);
	if (ic->in_csum_off + sizeof(csum) > end || bpf_skb_load_bytes(skb, ic->in_csum_off, &csum, sizeof(csum)) < 0 ||
	    (ip.protocol == IPPROTO_UDP && !csum))
		ic->in_csum_off = 0;
	return 0;
}

/*
 * Rewrites the quote's source (`src`) or destination address and port.
 * The quoted IP header's checksum balances the address; a quoted TCP or
 * UDP checksum follows the port and the address (its pseudo header, as
 * Cilium rewrites it), so the quote's sum moves by the address change,
 * which the ICMP checksum takes; without one it takes the port's.
 */
static __noinline int np4_icmp_quote(struct np_ctx *skb, const struct np4_icmp *ic, bool src, __be32 addr, __be16 port)
{
	__be32 old_a = src ? ic->in_saddr : ic->in_daddr;
	__be16 old_p = src ? ic->in_sport : ic->in_dport;
	__u32 icmp_csum = ic->icmp_off + NP_ICMP_CSUM;

	if (np_csum_follow(skb, ic->in_off + offsetof(struct iphdr, check), old_a, addr, sizeof(addr)) < 0 ||
	    bpf_skb_store_bytes(skb, ic->in_off + (src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr)),
				&addr, sizeof(addr), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ic->in_l4_off + (src ? offsetof(struct tcphdr, source) : offsetof(struct tcphdr, dest)),
				&port, sizeof(port), 0) < 0)
		return -1;
	if (!ic->in_csum_off)
		return np_csum_follow(skb, icmp_csum, old_p, port, sizeof(port));
	if (np_csum_follow(skb, ic->in_csum_off, old_a, addr, sizeof(addr)) < 0 ||
	    np_csum_follow(skb, ic->in_csum_off, old_p, port, sizeof(port)) < 0 ||
	    (ic->in_proto == IPPROTO_UDP && np_udp_csum_nonzero(skb, ic->in_csum_off) < 0))
		return -1;
	return np_csum_follow(skb, icmp_csum, addr, old_a, sizeof(addr));
}

/* An error about a reply we sent from a frontend: to the backend, about its reply as it sent it. */
static __always_inline int np4_icmp_to_backend(struct np_ctx *skb, const struct np4_icmp *ic, const struct lb4_ct_entry *ct)
{
	bool snat = ct->flags & LB_CT_F_SNAT;
	struct bpf_fib_lookup fib;
	int rc;

	if (snat && ic->ttl <= 1) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	if (np4_icmp_quote(skb, ic, true, ct->addr1, ct->port1) < 0 ||
	    (snat && np4_icmp_quote(skb, ic, false, ct->addr2, ct->port2) < 0) ||
	    np4_rewrite_l3(skb, NP_L3_OFF + offsetof(struct iphdr, daddr), ic->daddr, ct->addr1) < 0 ||
	    (snat && np4_rewrite_l3(skb, NP_L3_OFF + offsetof(struct iphdr, saddr), ic->saddr, ct->addr2) < 0)) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_ICMP_XLATE);
	if (!snat)
		return TC_ACT_OK;
	rc = np4_fib(skb, &fib, IPPROTO_ICMP, ct->addr2, ct->addr1, 0, 0, 0, NP_FIB_ONLY);
	if (!np_fib_routed(rc)) {
		lb_count(LB_MTR_NP_FIB_FAIL);
		return TC_ACT_SHOT;
	}
	if (!np4_dec_ttl(skb, ic->ttl)) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	return np_forward(skb, &fib, rc);
}

/* An error about a request we forwarded to a remote backend: to the client, about its request as it sent it. */
static __always_inline int np4_icmp_to_client(struct np_ctx *skb, const struct np4_icmp *ic, const struct lb4_ct_entry *ct)
{
	__be32 src = ic->saddr == ic->in_daddr ? ct->addr1 : ic->saddr;
	struct bpf_fib_lookup fib;
	int rc;

	if (ic->ttl <= 1) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	if (np4_icmp_quote(skb, ic, true, ct->addr2, ct->port2) < 0 ||
	    np4_icmp_quote(skb, ic, false, ct->addr1, ct->port1) < 0 ||
	    np4_rewrite_l3(skb, NP_L3_OFF + offsetof(struct iphdr, daddr), ic->daddr, ct->addr2) < 0 ||
	    np4_rewrite_l3(skb, NP_L3_OFF + offsetof(struct iphdr, saddr), ic->saddr, src) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_ICMP_XLATE);
	rc = np4_fib(skb, &fib, IPPROTO_ICMP, src, ct->addr2, 0, 0, 0, NP_FIB_ONLY);
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED)
		return TC_ACT_OK;
	if (!np_fib_routed(rc)) {
		lb_count(LB_MTR_NP_FIB_FAIL);
		return TC_ACT_SHOT;
	}
	if (!np4_dec_ttl(skb, ic->ttl)) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	return np_forward(skb, &fib, rc);
}

static __noinline int np_icmp_ingress4(struct np_ctx *skb)
{
	struct lb4_ct_key k = { .dir = LB_CT_ORIG };
	struct lb4_ct_entry *ct;
	struct np4_icmp ic;
	__u64 now;

	if (np4_icmp_parse(skb, &ic) < 0)
		return TC_ACT_UNSPEC;
	now = np_now();
	k.saddr = ic.in_daddr;
	k.daddr = ic.in_saddr;
	k.sport = ic.in_dport;
	k.dport = ic.in_sport;
	k.proto = ic.in_proto;
	ct = bpf_map_lookup_elem(&lb4_ct, &k);
	if (ct && ct->expires > now)
		return np4_icmp_to_backend(skb, &ic, ct);
	k.dir = LB_CT_REPLY;
	ct = bpf_map_lookup_elem(&lb4_nat, &k);
	if (ct && !(ct->flags & LB_CT_F_HOST) && ct->expires > now)
		return np4_icmp_to_client(skb, &ic, ct);
	return TC_ACT_UNSPEC;
}

static __noinline int np_icmp_egress4(struct np_ctx *skb)
{
	struct lb4_ct_key k = { .dir = LB_CT_REPLY };
	struct lb4_ct_entry *ct;
	struct np4_icmp ic;

	if (np4_icmp_parse(skb, &ic) < 0)
		return TC_ACT_UNSPEC;
	k.saddr = ic.in_daddr;
	k.daddr = ic.in_saddr;
	k.sport = ic.in_dport;
	k.dport = ic.in_sport;
	k.proto = ic.in_proto;
	ct = bpf_map_lookup_elem(&lb4_ct, &k);
	if (!ct || !(ct->flags & LB_CT_F_LOCAL) || ct->expires <= np_now())
		return TC_ACT_UNSPEC;
	if (np4_icmp_quote(skb, &ic, false, ct->addr1, ct->port1) < 0 ||
	    (ic.saddr == ic.in_daddr && np4_rewrite_l3(skb, NP_L3_OFF + offsetof(struct iphdr, saddr), ic.saddr, ct->addr1) < 0)) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_ICMP_XLATE);
	return TC_ACT_UNSPEC;
}

/* IPv6: ICMPv6 right after the IPv6 header, quoting an IPv6 header right before TCP or UDP. */
#define NP6_ICMP_OFF		(NP_L3_OFF + sizeof(struct ipv6hdr))
#define NP6_ICMP_CSUM_OFF	(NP6_ICMP_OFF + NP_ICMP_CSUM)
#define NP6_ICMP_IN_OFF		(NP6_ICMP_OFF + NP_ICMP_HLEN)
#define NP6_ICMP_IN_L4_OFF	(NP6_ICMP_IN_OFF + sizeof(struct ipv6hdr))

struct np6_icmp {
	__be32 saddr[4];	/* the error's own source and destination */
	__be32 daddr[4];
	__be32 in_saddr[4];	/* the quoted packet's */
	__be32 in_daddr[4];
	__u32 in_csum_off;	/* the quoted TCP or UDP checksum; 0: not quoted */
	__be16 in_sport;
	__be16 in_dport;
	__u8 in_proto;
	__u8 hop_limit;
};

static __always_inline int np6_icmp_parse(struct np_ctx *skb, struct np6_icmp *ic)
{
	struct ipv6hdr ip;
	__u32 ports, end;
	__u16 csum;
	__u8 type;

	if (bpf_skb_load_bytes(skb, NP_L3_OFF, &ip, sizeof(ip)) < 0 || ip.version != 6 || ip.nexthdr != IPPROTO_ICMPV6)
		return -1;
	ip6_copy(ic->saddr, ip.saddr.in6_u.u6_addr32);
	ip6_copy(ic->daddr, ip.daddr.in6_u.u6_addr32);
	ic->hop_limit = ip.hop_limit;
	end = NP6_ICMP_OFF + bpf_ntohs(ip.payload_len);
	/* destination unreachable, packet too big, time exceeded, parameter problem */
	if (bpf_skb_load_bytes(skb, NP6_ICMP_OFF, &type, sizeof(type)) < 0 || type < ICMPV6_DEST_UNREACH ||
	    type > ICMPV6_PARAMPROB)
		return -1;
	if (bpf_skb_load_bytes(skb, NP6_ICMP_IN_OFF, &ip, sizeof(ip)) < 0 || ip.version != 6 ||
	    (ip.nexthdr != IPPROTO_TCP && ip.nexthdr != IPPROTO_UDP))
		return -1;
	if (!np6_addr_eq(ip.saddr.in6_u.u6_addr32, ic->daddr))
		return -1;
	ip6_copy(ic->in_saddr, ip.saddr.in6_u.u6_addr32);
	ip6_copy(ic->in_daddr, ip.daddr.in6_u.u6_addr32);
	ic->in_proto = ip.nexthdr;
	if (NP6_ICMP_IN_L4_OFF + sizeof(ports) > end || bpf_skb_load_bytes(skb, NP6_ICMP_IN_L4_OFF, &ports, sizeof(ports)) < 0)
		return -1;
	ic->in_sport = (__be16)ports;
	ic->in_dport = (__be16)(ports >> 16);
	ic->in_csum_off = np_l4_csum_off(ip.nexthdr, NP6_ICMP_IN_L4_OFF);
	if (ic->in_csum_off + sizeof(csum) > end || bpf_skb_load_bytes(skb, ic->in_csum_off, &csum, sizeof(csum)) < 0 ||
	    (ip.nexthdr == IPPROTO_UDP && !csum))
		ic->in_csum_off = 0;
	return 0;
}

/*
 * IPv6 has no header checksum: a quoted TCP or UDP checksum balances the
 * quote's address (its pseudo header) and port; without one the ICMPv6
 * checksum takes both.
 */
static __noinline int np6_icmp_quote(struct np_ctx *skb, const struct np6_icmp *ic, bool src, const __be32 *addr, __be16 port)
{
	const __be32 *old_a = src ? ic->in_saddr : ic->in_daddr;
	__be16 old_p = src ? ic->in_sport : ic->in_dport;
	__u32 csum_off = ic->in_csum_off ? ic->in_csum_off : NP6_ICMP_CSUM_OFF;

	if (bpf_skb_store_bytes(skb, NP6_ICMP_IN_OFF + (src ? offsetof(struct ipv6hdr, saddr) : offsetof(struct ipv6hdr, daddr)),
				addr, 16, 0) < 0 ||
	    bpf_skb_store_bytes(skb, NP6_ICMP_IN_L4_OFF + (src ? offsetof(struct tcphdr, source) : offsetof(struct tcphdr, dest)),
				&port, sizeof(port), 0) < 0 ||
	    np_csum_follow_diff(skb, csum_off, bpf_csum_diff((__be32 *)old_a, 16, (__be32 *)addr, 16, 0)) < 0 ||
	    np_csum_follow(skb, csum_off, old_p, port, sizeof(port)) < 0)
		return -1;
	if (ic->in_csum_off && ic->in_proto == IPPROTO_UDP)
		return np_udp_csum_nonzero(skb, ic->in_csum_off);
	return 0;
}

/* The error's own address at `off`: the ICMPv6 checksum follows it (pseudo header). */
static __always_inline int np6_icmp_rewrite_outer(struct np_ctx *skb, __u32 off, const __be32 *old, const __be32 *new)
{
	if (np6_addr_eq(old, new))
		return 0;
	if (np_csum_follow_diff(skb, NP6_ICMP_CSUM_OFF, bpf_csum_diff((__be32 *)old, 16, (__be32 *)new, 16, 0)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, off, new, 16, 0);
}

static __always_inline int np6_icmp_to_backend(struct np_ctx *skb, const struct np6_icmp *ic, const struct lb6_ct_entry *ct)
{
	bool snat = ct->flags & LB_CT_F_SNAT;
	struct bpf_fib_lookup fib;
	int rc;

	if (snat && ic->hop_limit <= 1) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	if (np6_icmp_quote(skb, ic, true, ct->addr1, ct->port1) < 0 ||
	    (snat && np6_icmp_quote(skb, ic, false, ct->addr2, ct->port2) < 0) ||
	    np6_icmp_rewrite_outer(skb, NP_L3_OFF + offsetof(struct ipv6hdr, daddr), ic->daddr, ct->addr1) < 0 ||
	    (snat && np6_icmp_rewrite_outer(skb, NP_L3_OFF + offsetof(struct ipv6hdr, saddr), ic->saddr, ct->addr2) < 0)) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_ICMP_XLATE);
	if (!snat)
		return TC_ACT_OK;
	rc = np6_fib(skb, &fib, IPPROTO_ICMPV6, ct->addr2, ct->addr1, 0, 0, 0, NP_FIB_ONLY);
	if (!np_fib_routed(rc)) {
		lb_count(LB_MTR_NP_FIB_FAIL);
		return TC_ACT_SHOT;
	}
	if (!np6_dec_hoplimit(skb, ic->hop_limit)) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	return np_forward(skb, &fib, rc);
}

static __always_inline int np6_icmp_to_client(struct np_ctx *skb, const struct np6_icmp *ic, const struct lb6_ct_entry *ct)
{
	const __be32 *src = np6_addr_eq(ic->saddr, ic->in_daddr) ? ct->addr1 : ic->saddr;
	struct bpf_fib_lookup fib;
	int rc;

	if (ic->hop_limit <= 1) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	if (np6_icmp_quote(skb, ic, true, ct->addr2, ct->port2) < 0 ||
	    np6_icmp_quote(skb, ic, false, ct->addr1, ct->port1) < 0 ||
	    np6_icmp_rewrite_outer(skb, NP_L3_OFF + offsetof(struct ipv6hdr, daddr), ic->daddr, ct->addr2) < 0 ||
	    np6_icmp_rewrite_outer(skb, NP_L3_OFF + offsetof(struct ipv6hdr, saddr), ic->saddr, src) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_ICMP_XLATE);
	rc = np6_fib(skb, &fib, IPPROTO_ICMPV6, src, ct->addr2, 0, 0, 0, NP_FIB_ONLY);
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED)
		return TC_ACT_OK;
	if (!np_fib_routed(rc)) {
		lb_count(LB_MTR_NP_FIB_FAIL);
		return TC_ACT_SHOT;
	}
	if (!np6_dec_hoplimit(skb, ic->hop_limit)) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	return np_forward(skb, &fib, rc);
}

static __noinline int np_icmp_ingress6(struct np_ctx *skb)
{
	struct lb6_ct_key k = { .dir = LB_CT_ORIG };
	struct lb6_ct_entry *ct;
	struct np6_icmp ic;
	__u64 now;

	if (np6_icmp_parse(skb, &ic) < 0)
		return TC_ACT_UNSPEC;
	now = np_now();
	ip6_copy(k.saddr, ic.in_daddr);
	ip6_copy(k.daddr, ic.in_saddr);
	k.sport = ic.in_dport;
	k.dport = ic.in_sport;
	k.proto = ic.in_proto;
	ct = bpf_map_lookup_elem(&lb6_ct, &k);
	if (ct && ct->expires > now)
		return np6_icmp_to_backend(skb, &ic, ct);
	k.dir = LB_CT_REPLY;
	ct = bpf_map_lookup_elem(&lb6_nat, &k);
	if (ct && !(ct->flags & LB_CT_F_HOST) && ct->expires > now)
		return np6_icmp_to_client(skb, &ic, ct);
	return TC_ACT_UNSPEC;
}

static __noinline int np_icmp_egress6(struct np_ctx *skb)
{
	struct lb6_ct_key k = { .dir = LB_CT_REPLY };
	struct lb6_ct_entry *ct;
	struct np6_icmp ic;

	if (np6_icmp_parse(skb, &ic) < 0)
		return TC_ACT_UNSPEC;
	ip6_copy(k.saddr, ic.in_daddr);
	ip6_copy(k.daddr, ic.in_saddr);
	k.sport = ic.in_dport;
	k.dport = ic.in_sport;
	k.proto = ic.in_proto;
	ct = bpf_map_lookup_elem(&lb6_ct, &k);
	if (!ct || !(ct->flags & LB_CT_F_LOCAL) || ct->expires <= np_now())
		return TC_ACT_UNSPEC;
	if (np6_icmp_quote(skb, &ic, false, ct->addr1, ct->port1) < 0 ||
	    (np6_addr_eq(ic.saddr, ic.in_daddr) &&
	     np6_icmp_rewrite_outer(skb, NP_L3_OFF + offsetof(struct ipv6hdr, saddr), ic.saddr, ct->addr1) < 0)) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_ICMP_XLATE);
	return TC_ACT_UNSPEC;
}

#endif /* !NP_XDP */

/* ------------------------------------------------------------ entries */

/* Separate functions per family keep each one's verifier state small. */
static __noinline int np_ingress4(struct np_ctx *skb)
{
	return np4_ingress(skb);
}

static __noinline int np_ingress6(struct np_ctx *skb)
{
	return np6_ingress(skb);
}

#ifdef NP_XDP
/*
 * --nodeport-acceleration: the ingress path at XDP, in the driver, before
 * an skb exists, on the maps tc uses. What it finishes (a flow's packet
 * to a remote backend, SNATed, and the backend's reply to the client, each
 * sent out of a device that runs this program too) never reaches tc; a
 * local backend's packet it translates and passes up the stack, as tc
 * would (tc's ingress then finds no service in it, and the pod's replies
 * are tc's at egress, as before); all else goes on to tc as it came
 * (np_xdp_to_tc()): ICMP, fragments, SCTP, IPv6 extension headers (and
 * IPv4 options under DSR: one may be a DSR option), DSR flows, a frame too
 * big or at its last hop, a neighbour the FIB does not know yet. tc, which
 * stays attached, does with it what it always did.
 */
/* The XDP action for what the shared ingress path answered. */
static __always_inline int np_xdp_verdict(int rc)
{
	if (rc >= NP_XDP_VERDICT && rc <= NP_XDP_VERDICT + XDP_REDIRECT) {
		lb_count(LB_MTR_NP_XDP_FWD);
		return rc - NP_XDP_VERDICT;
	}
	if (rc == TC_ACT_SHOT)
		return XDP_DROP;
	/* TC_ACT_UNSPEC, ICMP (NP_DO_ICMP), and a service's packet tc answers with an error */
	if (rc == NP_DO_REJECT || rc >= NP_DO_TOOBIG)
		lb_count(LB_MTR_NP_XDP_TO_TC);
	return XDP_PASS;
}

SEC("xdp")
int lb_nodeport_xdp(struct xdp_md *ctx)
{
	struct ethhdr *eth = np_header(ctx, 0, sizeof(*eth));

	if (!eth)
		return XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		return np_xdp_verdict(np_ingress4(ctx));
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return np_xdp_verdict(np_ingress6(ctx));
	return XDP_PASS;
}

#else

static __noinline int np_egress4(struct np_ctx *skb)
{
	return np4_egress(skb);
}

static __noinline int np_egress6(struct np_ctx *skb)
{
	return np6_egress(skb);
}

#ifdef NP_L3_DEVICE
/*
 * A layer-3 device's packet starts with its IP header, whose length is the
 * packet's. Kernels before 5.14 hand tc an IP-in-IP tunnel's packets (ipip,
 * sit, ip6tnl) with the outer Ethernet and IP headers still in front
 * (upstream 7ad136fd288c made them start at the inner one): counted, so
 * the agent can say why flows through such a tunnel are not translated,
 * and passed on as they are.
 */
static __always_inline bool np_l3_at_start(struct np_ctx *skb)
{
	__u8 h[6];

	if (bpf_skb_load_bytes(skb, 0, h, sizeof(h)) < 0)
		return false;
	if (skb->protocol == bpf_htons(ETH_P_IP) && (h[0] >> 4) == 4 && ((__u32)h[2] << 8 | h[3]) == skb->len)
		return true;
	/* IPv6: 40 bytes and the payload's; 0 is a jumbogram's (BIG TCP) */
	if (skb->protocol == bpf_htons(ETH_P_IPV6) && (h[0] >> 4) == 6 &&
	    (((__u32)h[4] << 8 | h[5]) + sizeof(struct ipv6hdr) == skb->len || !(h[4] | h[5])))
		return true;
	lb_count(LB_MTR_NP_L3_OUTER);
	return false;
}
#endif

/*
 * Whether egress has nothing to do for this packet (NP_TC_INDEX_REDIRECTED:
 * redirected here, translated, by the ingress program); the bit is cleared.
 */
static __always_inline bool np_egress_done(struct np_ctx *skb)
{
	if (!(skb->tc_index & NP_TC_INDEX_REDIRECTED))
		return false;
	skb->tc_index &= ~NP_TC_INDEX_REDIRECTED;
	return true;
}

/* The ingress half of a tc program run: np_ingress4/6 and what they hand on (ICMP). */
static __always_inline int np_ingress(struct np_ctx *skb)
{
	int rc;

	if (skb->tc_index & NP_TC_INDEX_REDIRECTED)
		skb->tc_index &= ~NP_TC_INDEX_REDIRECTED; /* set on another hop, not read there */
#ifdef NP_L3_DEVICE
	if (!np_l3_at_start(skb))
		return TC_ACT_UNSPEC;
#endif

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		rc = np_ingress4(skb);
		if (rc == NP_DO_ICMP)
			return np_icmp_ingress4(skb);
		if (rc == NP_DO_REJECT)
			return np_icmp_reply4(skb, 0);
		if (rc >= NP_DO_TOOBIG)
			return np_icmp_reply4(skb, rc & NP_MTU_MASK);
		return rc;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		rc = np_ingress6(skb);
		if (rc == NP_DO_ICMP)
			return np_icmp_ingress6(skb);
		if (rc == NP_DO_REJECT)
			return np_icmp_reply6(skb, 0);
		if (rc >= NP_DO_TOOBIG)
			return np_icmp_reply6(skb, rc & NP_MTU_MASK);
		return rc;
	}
	return TC_ACT_UNSPEC;
}

/* The egress half. */
static __always_inline int np_egress(struct np_ctx *skb)
{
	int rc;

	if (np_egress_done(skb))
		return TC_ACT_UNSPEC;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		rc = np_egress4(skb);
		return rc == NP_DO_ICMP ? np_icmp_egress4(skb) : rc;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		rc = np_egress6(skb);
		return rc == NP_DO_ICMP ? np_icmp_egress6(skb) : rc;
	}
	return TC_ACT_UNSPEC;
}

SEC("tc")
int lb_nodeport_ingress(struct np_ctx *skb)
{
	return np_ingress(skb);
}

SEC("tc")
int lb_nodeport_egress(struct np_ctx *skb)
{
	return np_egress(skb);
}
#endif /* NP_XDP */
