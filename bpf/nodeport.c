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
#include "lib/lb.h"
#include "lib/np.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* CT lifetimes, seconds (Cilium's defaults). */
#define CT_LIFETIME_TCP_SYN	60
#define CT_LIFETIME_TCP		21600
#define CT_LIFETIME_CLOSE	10
#define CT_LIFETIME_NONTCP	60

/* Upper bound of --snat-port-range retries the verifier sees. */
#define NP_SNAT_TRIES_MAX	32

#define TCP_F_FIN	0x01
#define TCP_F_SYN	0x02
#define TCP_F_RST	0x04
#define TCP_F_ACK	0x10

static __always_inline const struct lb_np_config *np_config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&lb_np_config, &zero);
}

static __always_inline bool np_in_range(__be16 port, __u16 lo, __u16 hi)
{
	__u16 p = bpf_ntohs(port);

	return lo && p >= lo && p <= hi;
}

static __always_inline bool np_tcp_closing(const struct np_l4 *l4)
{
	return l4->proto == IPPROTO_TCP && (l4->tcp_flags & (TCP_F_FIN | TCP_F_RST));
}

/* A SYN without ACK: a client opening a connection (maybe reusing a tuple). */
static __always_inline bool np_tcp_syn(const struct np_l4 *l4)
{
	return l4->proto == IPPROTO_TCP && (l4->tcp_flags & (TCP_F_SYN | TCP_F_ACK)) == TCP_F_SYN;
}

static __always_inline __u64 np_lifetime(const struct np_l4 *l4, __u16 flags)
{
	if (l4->proto != IPPROTO_TCP)
		return CT_LIFETIME_NONTCP;
	if ((flags & LB_CT_F_CLOSING) || np_tcp_closing(l4))
		return CT_LIFETIME_CLOSE;
	return (flags & LB_CT_F_SEEN_REPLY) ? CT_LIFETIME_TCP : CT_LIFETIME_TCP_SYN;
}

/* Moves an entry's expiry on (at most one write a second) and notes a close. */
static __always_inline void np_ct_touch(__u64 *expires, __u16 *flags, const struct np_l4 *l4, __u64 now, __u16 set)
{
	__u16 f = *flags | set | (np_tcp_closing(l4) ? LB_CT_F_CLOSING : 0);
	__u64 e = now + np_lifetime(l4, f);

	if (f != *flags)
		*flags = f;
	if (e != *expires)
		*expires = e;
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
	struct np_l4 l4;
};

/* 0: a TCP or UDP packet (fragment) whose addresses and ports are in `f`; <0: not ours to look at. */
static __always_inline int np4_parse(struct __sk_buff *skb, struct np4_flow *f)
{
	struct iphdr ip;
	__u16 frag;
	__u32 ports;

	if (bpf_skb_load_bytes(skb, NP_L3_OFF, &ip, sizeof(ip)) < 0 || ip.ihl < 5 || ip.version != 4)
		return -1;
	if (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP)
		return -1;
	f->saddr = ip.saddr;
	f->daddr = ip.daddr;
	f->tot_len = bpf_ntohs(ip.tot_len);
	f->id = ip.id;
	f->ttl = ip.ttl;
	f->l4.proto = ip.protocol;
	f->l4.l4_off = NP_L3_OFF + ip.ihl * 4;
	f->l4.csum_off = np_l4_csum_off(ip.protocol, f->l4.l4_off);
	f->l4.tcp_flags = 0;
	f->l4.udp_zero_csum = false;
	frag = bpf_ntohs(ip.frag_off);
	f->frag_first = (frag & IP_MF) && !(frag & IP_OFFSET);
	if (frag & IP_OFFSET) {
		/* a later fragment: its ports are those its first fragment recorded */
		struct lb4_frag_key fk = { .saddr = ip.saddr, .daddr = ip.daddr, .id = ip.id, .proto = ip.protocol };
		struct lb4_frag_ports *fp = bpf_map_lookup_elem(&lb4_frag, &fk);

		if (!fp)
			return -1;
		f->sport = fp->sport;
		f->dport = fp->dport;
		f->l4.has_ports = false;
		f->l4.csum_off = 0;
		return 0;
	}
	if (bpf_skb_load_bytes(skb, f->l4.l4_off, &ports, sizeof(ports)) < 0)
		return -1;
	f->sport = (__be16)ports;
	f->dport = (__be16)(ports >> 16);
	f->l4.has_ports = true;
	if (ip.protocol == IPPROTO_TCP) {
		if (bpf_skb_load_bytes(skb, f->l4.l4_off + 13, &f->l4.tcp_flags, 1) < 0)
			return -1;
	} else {
		__u16 csum;

		if (bpf_skb_load_bytes(skb, f->l4.csum_off, &csum, sizeof(csum)) < 0)
			return -1;
		f->l4.udp_zero_csum = csum == 0;
	}
	return 0;
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
static __always_inline struct lb_service *np4_lookup(const struct np4_flow *f, struct lb4_key *key,
						     const struct lb_np_config *cfg, bool *node_addr)
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
	*node_addr = np4_is_node_addr(f->daddr);
	if (!*node_addr || !np_in_range(f->dport, cfg->nodeport_min, cfg->nodeport_max))
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

static __always_inline int np4_fib(struct __sk_buff *skb, struct bpf_fib_lookup *fib, const struct np4_flow *f,
				   __be32 src, __be32 dst, __be16 sport, __be16 dport)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET;
	fib->l4_protocol = f->l4.proto;
	fib->sport = sport;
	fib->dport = dport;
	fib->ipv4_src = src;
	fib->ipv4_dst = dst;
	fib->ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
	return bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
}

/*
 * Reserves a SNAT port for a new flow to a remote backend: the port the
 * flow's tuple hashes to, then random ones, each taken by inserting the
 * reply entry with BPF_NOEXIST (an expired entry's port is taken over).
 */
static __always_inline int np4_snat_reserve(const struct lb_np_config *cfg, const struct np4_flow *f,
					    const struct lb4_backend *be, __be32 snat_addr,
					    struct lb4_ct_entry *reply, __u64 now, __be16 *port_out)
{
	struct lb4_ct_key rk = { .saddr = be->address, .daddr = snat_addr, .sport = be->port,
				 .proto = f->l4.proto, .dir = LB_CT_REPLY };
	__u32 span = (__u32)cfg->snat_max - cfg->snat_min + 1;
	__u32 pick = np_mix(f->saddr, f->daddr, ((__u32)f->sport << 16) | f->dport);
	__u32 i;

	if (!cfg->snat_min || cfg->snat_max < cfg->snat_min)
		return -1;
	for (i = 0; i < NP_SNAT_TRIES_MAX; i++) {
		struct lb4_ct_entry *old;

		if (i > cfg->snat_retries)
			break;
		if (i > 0)
			pick = bpf_get_prandom_u32();
		rk.dport = bpf_htons(cfg->snat_min + pick % span);
		old = bpf_map_lookup_elem(&lb4_ct, &rk);
		if (old) {
			if (old->expires > now)
				continue;
			bpf_map_delete_elem(&lb4_ct, &rk);
		}
		if (bpf_map_update_elem(&lb4_ct, &rk, reply, BPF_NOEXIST) == 0) {
			*port_out = rk.dport;
			return 0;
		}
	}
	return -1;
}

/* Rewrites the packet's destination to the backend and, with SNAT, its source to ours. */
static __always_inline int np4_xlate_fwd(struct __sk_buff *skb, const struct np4_flow *f, const struct lb4_ct_entry *ct)
{
	if (np4_rewrite_addr(skb, &f->l4, NP_L3_OFF + offsetof(struct iphdr, daddr), f->daddr, ct->addr1) < 0 ||
	    np_rewrite_port(skb, &f->l4, offsetof(struct tcphdr, dest), f->dport, ct->port1) < 0)
		return -1;
	if (!(ct->flags & LB_CT_F_SNAT))
		return 0;
	if (np4_rewrite_addr(skb, &f->l4, NP_L3_OFF + offsetof(struct iphdr, saddr), f->saddr, ct->addr2) < 0 ||
	    np_rewrite_port(skb, &f->l4, offsetof(struct tcphdr, source), f->sport, ct->port2) < 0)
		return -1;
	return 0;
}

/*
 * A backend for a new flow: from the frontend's Maglev table when it has one
 * (the slot the flow's hash names: every node picks the same backend for a
 * flow, and a backend change moves few flows), else at random. Session
 * affinity keeps the socket layer's per-client choice instead.
 */
static __always_inline struct lb4_backend *np4_select(struct lb4_key *key, const struct lb_service *svc, const struct np4_flow *f,
						      const struct lb_np_config *cfg, __u32 *backend_id)
{
	if ((svc->flags & LB_SVC_F_MAGLEV) && !lb_svc_has_affinity(svc) && cfg->maglev_m) {
		__u32 outer = svc->rev_nat_index;
		void *table = bpf_map_lookup_elem(&lb_maglev, &outer);

		if (table) {
			__u32 slot = np_jhash_3words(bpf_ntohl(f->saddr), ((__u32)bpf_ntohs(f->dport) << 16) | bpf_ntohs(f->sport),
						     f->l4.proto, cfg->maglev_seed4) % cfg->maglev_m;
			__u32 *id = bpf_map_lookup_elem(table, &slot);
			struct lb4_backend *be = id && *id ? bpf_map_lookup_elem(&lb4_backends, id) : NULL;

			if (be) {
				*backend_id = *id;
				return be;
			}
		}
	}
	/* The client is its address here; affinity entries are per network namespace at the socket layer. */
	return lb4_select_backend(key, svc, ((__u64)f->saddr << 8) | 0xff, backend_id);
}

/* A new flow: source ranges, a backend, local or remote, the CT entries. */
static __always_inline int np4_new_flow(struct __sk_buff *skb, const struct np4_flow *f, struct lb4_key *key,
					const struct lb_service *svc, const struct lb_np_config *cfg,
					struct lb4_ct_key *ok, struct lb4_ct_entry *orig, __u64 now)
{
	struct lb4_ct_entry reply = {};
	struct bpf_fib_lookup fib;
	struct lb4_backend *be;
	struct lb_device *dev;
	__u32 backend_id = 0;
	int rc;

	if (!np4_src_allowed(svc, f->saddr)) {
		lb_count(LB_MTR_NP_SRC_RANGE);
		return TC_ACT_SHOT;
	}
	if (!lb_svc_has_backends(svc)) {
		lb_count(svc->flags & LB_SVC_F_LOCAL_EXTERNAL ? LB_MTR_NP_LOCAL_NONE : LB_MTR_NP_NO_BACKEND);
		return TC_ACT_SHOT;
	}
	be = np4_select(key, svc, f, cfg, &backend_id);
	if (!be) {
		lb_count(LB_MTR_BACKEND_MISSING);
		return TC_ACT_SHOT;
	}
	rc = np4_fib(skb, &fib, f, f->saddr, be->address, f->sport, be->port);
	dev = np_fib_routed(rc) ? bpf_map_lookup_elem(&lb_devices, &fib.ifindex) : NULL;
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
	if (dev && !(svc->flags & LB_SVC_F_LOCAL_EXTERNAL)) {
		/* remote: SNAT to the device's address and a port of this flow's own */
		if (!dev->addr4) {
			lb_count(LB_MTR_NP_NO_SNAT_ADDR);
			return TC_ACT_SHOT;
		}
		reply.flags = LB_CT_F_SNAT;
		reply.expires = now + np_lifetime(&f->l4, 0);
		if (np4_snat_reserve(cfg, f, be, dev->addr4, &reply, now, &orig->port2) < 0) {
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
		reply.expires = now + np_lifetime(&f->l4, 0);
		if (bpf_map_update_elem(&lb4_ct, &rk, &reply, BPF_ANY) < 0) {
			lb_count(LB_MTR_NP_CT_FULL);
			return TC_ACT_SHOT;
		}
		orig->flags = LB_CT_F_LOCAL;
	}
	orig->expires = now + np_lifetime(&f->l4, orig->flags);
	if (bpf_map_update_elem(&lb4_ct, ok, orig, BPF_ANY) < 0) {
		lb_count(LB_MTR_NP_CT_FULL);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_NEW);
	return 0;
}

/* The reply entry of an ORIG entry, to keep it alive as long as the flow. */
static __always_inline void np4_touch_reply(const struct np4_flow *f, const struct lb4_ct_entry *orig, __u64 now)
{
	struct lb4_ct_key rk = { .saddr = orig->addr1, .sport = orig->port1, .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb4_ct_entry *r;

	if (orig->flags & LB_CT_F_SNAT) {
		rk.daddr = orig->addr2;
		rk.dport = orig->port2;
	} else {
		rk.daddr = f->saddr;
		rk.dport = f->sport;
	}
	r = bpf_map_lookup_elem(&lb4_ct, &rk);
	if (r)
		np_ct_touch(&r->expires, &r->flags, &f->l4, now, 0);
}

/* A client's packet to a frontend: DNAT (and SNAT), then up the stack or out to the backend's node. */
static __always_inline int np4_fwd(struct __sk_buff *skb, struct np4_flow *f, struct lb4_key *key,
				   const struct lb_service *svc, const struct lb_np_config *cfg)
{
	struct lb4_ct_key ok = { .saddr = f->saddr, .daddr = f->daddr, .sport = f->sport, .dport = f->dport,
				 .proto = f->l4.proto, .dir = LB_CT_ORIG };
	struct lb4_ct_entry fresh = {};
	struct lb4_ct_entry *ct;
	struct bpf_fib_lookup fib;
	__u64 now = np_now();
	int rc;

	ct = bpf_map_lookup_elem(&lb4_ct, &ok);
	if (ct && (ct->expires <= now || ((ct->flags & LB_CT_F_CLOSING) && np_tcp_syn(&f->l4))))
		ct = NULL; /* dead, or a closed tuple opened again: a new flow */
	if (!ct) {
		if (!f->l4.has_ports) {
			lb_count(LB_MTR_NP_FRAG);
			return TC_ACT_SHOT;
		}
		rc = np4_new_flow(skb, f, key, svc, cfg, &ok, &fresh, now);
		if (rc)
			return rc;
		ct = &fresh;
	} else {
		__u64 before = ct->expires;

		np_ct_touch(&ct->expires, &ct->flags, &f->l4, now, np_tcp_syn(&f->l4) ? 0 : LB_CT_F_SEEN_REPLY);
		if (ct->expires != before)
			np4_touch_reply(f, ct, now);
	}
	np4_frag_record(f);
	if ((ct->flags & LB_CT_F_SNAT) && f->ttl <= 1) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	if (np4_xlate_fwd(skb, f, ct) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_FWD);
	if (!(ct->flags & LB_CT_F_SNAT))
		return TC_ACT_OK;
	/* remote: forward it ourselves, as the stack would */
	rc = np4_fib(skb, &fib, f, ct->addr2, ct->addr1, ct->port2, ct->port1);
	if (!np_fib_routed(rc)) {
		lb_count(LB_MTR_NP_FIB_FAIL);
		return TC_ACT_SHOT;
	}
	if (!np4_dec_ttl(skb, f->ttl)) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_OK;
	}
	return np_fib_redirect(skb, &fib, rc);
}

/*
 * A reply entry's translation: the source becomes the frontend and, after
 * SNAT, the destination the client again.
 */
static __always_inline int np4_xlate_rev(struct __sk_buff *skb, const struct np4_flow *f, const struct lb4_ct_entry *ct)
{
	if (np4_rewrite_addr(skb, &f->l4, NP_L3_OFF + offsetof(struct iphdr, saddr), f->saddr, ct->addr1) < 0 ||
	    np_rewrite_port(skb, &f->l4, offsetof(struct tcphdr, source), f->sport, ct->port1) < 0)
		return -1;
	if (np4_rewrite_addr(skb, &f->l4, NP_L3_OFF + offsetof(struct iphdr, daddr), f->daddr, ct->addr2) < 0 ||
	    np_rewrite_port(skb, &f->l4, offsetof(struct tcphdr, dest), f->dport, ct->port2) < 0)
		return -1;
	return 0;
}

static __always_inline struct lb4_ct_entry *np4_reply_entry(const struct np4_flow *f, __u16 want)
{
	struct lb4_ct_key rk = { .saddr = f->saddr, .daddr = f->daddr, .sport = f->sport, .dport = f->dport,
				 .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb4_ct_entry *ct = bpf_map_lookup_elem(&lb4_ct, &rk);

	if (!ct || !(ct->flags & want) || ct->expires <= np_now())
		return NULL;
	return ct;
}

/* A remote backend's reply to a SNAT port: back to the client, from the frontend. */
static __always_inline int np4_rev_snat(struct __sk_buff *skb, struct np4_flow *f)
{
	struct lb4_ct_entry *ct = np4_reply_entry(f, LB_CT_F_SNAT);
	struct bpf_fib_lookup fib;
	int rc;

	if (!ct)
		return TC_ACT_UNSPEC;
	np_ct_touch(&ct->expires, &ct->flags, &f->l4, np_now(), LB_CT_F_SEEN_REPLY);
	np4_frag_record(f);
	if (f->ttl <= 1) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	if (np4_xlate_rev(skb, f, ct) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_REV);
	rc = np4_fib(skb, &fib, f, ct->addr1, ct->addr2, ct->port1, ct->port2);
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED)
		return TC_ACT_OK;
	if (!np_fib_routed(rc)) {
		lb_count(LB_MTR_NP_FIB_FAIL);
		return TC_ACT_SHOT;
	}
	if (!np4_dec_ttl(skb, f->ttl)) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_OK;
	}
	return np_fib_redirect(skb, &fib, rc);
}

static __always_inline int np4_ingress(struct __sk_buff *skb)
{
	const struct lb_np_config *cfg = np_config();
	struct lb4_key key = {};
	struct lb_service *svc;
	struct np4_flow f;
	bool node_addr = false;

	if (!cfg || np4_parse(skb, &f) < 0)
		return TC_ACT_UNSPEC;
	svc = np4_lookup(&f, &key, cfg, &node_addr);
	if (svc)
		return np4_fwd(skb, &f, &key, svc, cfg);
	if (node_addr && np_in_range(f.dport, cfg->snat_min, cfg->snat_max))
		return np4_rev_snat(skb, &f);
	return TC_ACT_UNSPEC;
}

/* A local backend's reply on its way out: from the frontend again. */
static __always_inline int np4_egress(struct __sk_buff *skb)
{
	struct lb4_ct_entry *ct;
	struct np4_flow f;

	if (np4_parse(skb, &f) < 0)
		return TC_ACT_UNSPEC;
	ct = np4_reply_entry(&f, LB_CT_F_LOCAL);
	if (!ct)
		return TC_ACT_UNSPEC;
	np_ct_touch(&ct->expires, &ct->flags, &f.l4, np_now(), LB_CT_F_SEEN_REPLY);
	np4_frag_record(&f);
	if (np4_rewrite_addr(skb, &f.l4, NP_L3_OFF + offsetof(struct iphdr, saddr), f.saddr, ct->addr1) < 0 ||
	    np_rewrite_port(skb, &f.l4, offsetof(struct tcphdr, source), f.sport, ct->port1) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_REV);
	return TC_ACT_UNSPEC;
}

/* ------------------------------------------------------------------ IPv6 */

struct np6_flow {
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u16 tot_len;
	__u8 hop_limit;
	struct np_l4 l4;
};

/*
 * 0: a TCP or UDP packet whose addresses and ports are in `f`, after at most
 * NP_IPV6_EXT_MAX extension headers; 1: a fragment (no ports to translate
 * by); <0: not ours to look at.
 */
static __always_inline int np6_parse(struct __sk_buff *skb, struct np6_flow *f)
{
	struct ipv6hdr ip;
	__u32 off = NP_L3_OFF + sizeof(struct ipv6hdr);
	__u32 ports;
	__u8 nh;
	int i;

	if (bpf_skb_load_bytes(skb, NP_L3_OFF, &ip, sizeof(ip)) < 0 || ip.version != 6)
		return -1;
	nh = ip.nexthdr;
#pragma unroll
	for (i = 0; i < NP_IPV6_EXT_MAX; i++) {
		__u8 ext[2];

		if (nh == NEXTHDR_FRAGMENT)
			return 1;
		if (nh != NEXTHDR_HOP && nh != NEXTHDR_ROUTING && nh != NEXTHDR_DEST && nh != NEXTHDR_AUTH)
			break;
		if (bpf_skb_load_bytes(skb, off, ext, sizeof(ext)) < 0)
			return -1;
		off += nh == NEXTHDR_AUTH ? (ext[1] + 2) * 4 : (ext[1] + 1) * 8;
		nh = ext[0];
	}
	if (nh != IPPROTO_TCP && nh != IPPROTO_UDP)
		return -1;
	ip6_copy(f->saddr, ip.saddr.in6_u.u6_addr32);
	ip6_copy(f->daddr, ip.daddr.in6_u.u6_addr32);
	f->tot_len = bpf_ntohs(ip.payload_len) + sizeof(struct ipv6hdr);
	f->hop_limit = ip.hop_limit;
	f->l4.proto = nh;
	f->l4.l4_off = off;
	f->l4.csum_off = np_l4_csum_off(nh, off);
	f->l4.has_ports = true;
	f->l4.tcp_flags = 0;
	f->l4.udp_zero_csum = false;
	if (bpf_skb_load_bytes(skb, off, &ports, sizeof(ports)) < 0)
		return -1;
	f->sport = (__be16)ports;
	f->dport = (__be16)(ports >> 16);
	if (nh == IPPROTO_TCP && bpf_skb_load_bytes(skb, off + 13, &f->l4.tcp_flags, 1) < 0)
		return -1;
	return 0;
}

static __always_inline bool np6_is_node_addr(const __be32 *addr)
{
	struct lb_node_addr_key k = { .family = 6 };

	ip6_copy(k.address, addr);
	return bpf_map_lookup_elem(&lb_node_addrs, &k) != NULL;
}

static __always_inline struct lb_service *np6_lookup(const struct np6_flow *f, struct lb6_key *key,
						     const struct lb_np_config *cfg, bool *node_addr)
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
	*node_addr = np6_is_node_addr(f->daddr);
	if (!*node_addr || !np_in_range(f->dport, cfg->nodeport_min, cfg->nodeport_max))
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

static __always_inline int np6_fib(struct __sk_buff *skb, struct bpf_fib_lookup *fib, const struct np6_flow *f,
				   const __be32 *src, const __be32 *dst, __be16 sport, __be16 dport)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET6;
	fib->l4_protocol = f->l4.proto;
	fib->sport = sport;
	fib->dport = dport;
	ip6_copy(fib->ipv6_src, src);
	ip6_copy(fib->ipv6_dst, dst);
	fib->ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
	return bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
}

static __always_inline bool ip6_is_zero(const __be32 *a)
{
	return !(a[0] | a[1] | a[2] | a[3]);
}

static __always_inline int np6_snat_reserve(const struct lb_np_config *cfg, const struct np6_flow *f,
					    const struct lb6_backend *be, const __be32 *snat_addr,
					    struct lb6_ct_entry *reply, __u64 now, __be16 *port_out)
{
	struct lb6_ct_key rk = { .sport = be->port, .proto = f->l4.proto, .dir = LB_CT_REPLY };
	__u32 span = (__u32)cfg->snat_max - cfg->snat_min + 1;
	__u32 pick = np_mix(f->saddr[3] ^ f->saddr[2], f->daddr[3], ((__u32)f->sport << 16) | f->dport);
	__u32 i;

	if (!cfg->snat_min || cfg->snat_max < cfg->snat_min)
		return -1;
	ip6_copy(rk.saddr, be->address);
	ip6_copy(rk.daddr, snat_addr);
	for (i = 0; i < NP_SNAT_TRIES_MAX; i++) {
		struct lb6_ct_entry *old;

		if (i > cfg->snat_retries)
			break;
		if (i > 0)
			pick = bpf_get_prandom_u32();
		rk.dport = bpf_htons(cfg->snat_min + pick % span);
		old = bpf_map_lookup_elem(&lb6_ct, &rk);
		if (old) {
			if (old->expires > now)
				continue;
			bpf_map_delete_elem(&lb6_ct, &rk);
		}
		if (bpf_map_update_elem(&lb6_ct, &rk, reply, BPF_NOEXIST) == 0) {
			*port_out = rk.dport;
			return 0;
		}
	}
	return -1;
}

static __always_inline int np6_xlate_fwd(struct __sk_buff *skb, const struct np6_flow *f, const struct lb6_ct_entry *ct)
{
	if (np6_rewrite_addr(skb, &f->l4, NP_L3_OFF + offsetof(struct ipv6hdr, daddr), f->daddr, ct->addr1) < 0 ||
	    np_rewrite_port(skb, &f->l4, offsetof(struct tcphdr, dest), f->dport, ct->port1) < 0)
		return -1;
	if (!(ct->flags & LB_CT_F_SNAT))
		return 0;
	if (np6_rewrite_addr(skb, &f->l4, NP_L3_OFF + offsetof(struct ipv6hdr, saddr), f->saddr, ct->addr2) < 0 ||
	    np_rewrite_port(skb, &f->l4, offsetof(struct tcphdr, source), f->sport, ct->port2) < 0)
		return -1;
	return 0;
}

static __always_inline __u32 np6_addr_hash(const __be32 *a)
{
	return bpf_ntohl(a[0]) ^ bpf_ntohl(a[1]) ^ bpf_ntohl(a[2]) ^ bpf_ntohl(a[3]);
}

static __always_inline struct lb6_backend *np6_select(struct lb6_key *key, const struct lb_service *svc, const struct np6_flow *f,
						      const struct lb_np_config *cfg, __u32 *backend_id)
{
	if ((svc->flags & LB_SVC_F_MAGLEV) && !lb_svc_has_affinity(svc) && cfg->maglev_m) {
		__u32 outer = svc->rev_nat_index | LB_MAGLEV_V6;
		void *table = bpf_map_lookup_elem(&lb_maglev, &outer);

		if (table) {
			__u32 slot = np_jhash_3words(np6_addr_hash(f->saddr), ((__u32)bpf_ntohs(f->dport) << 16) | bpf_ntohs(f->sport),
						     f->l4.proto, cfg->maglev_seed6) % cfg->maglev_m;
			__u32 *id = bpf_map_lookup_elem(table, &slot);
			struct lb6_backend *be = id && *id ? bpf_map_lookup_elem(&lb6_backends, id) : NULL;

			if (be) {
				*backend_id = *id;
				return be;
			}
		}
	}
	return lb6_select_backend(key, svc, ((__u64)f->saddr[3] << 8) | 0xfe, backend_id);
}

static __always_inline int np6_new_flow(struct __sk_buff *skb, const struct np6_flow *f, struct lb6_key *key,
					const struct lb_service *svc, const struct lb_np_config *cfg,
					struct lb6_ct_key *ok, struct lb6_ct_entry *orig, __u64 now)
{
	struct lb6_ct_entry reply = {};
	struct bpf_fib_lookup fib;
	struct lb6_backend *be;
	struct lb_device *dev;
	__u32 backend_id = 0;
	int rc;

	if (!np6_src_allowed(svc, f->saddr)) {
		lb_count(LB_MTR_NP_SRC_RANGE);
		return TC_ACT_SHOT;
	}
	if (!lb_svc_has_backends(svc)) {
		lb_count(svc->flags & LB_SVC_F_LOCAL_EXTERNAL ? LB_MTR_NP_LOCAL_NONE : LB_MTR_NP_NO_BACKEND);
		return TC_ACT_SHOT;
	}
	be = np6_select(key, svc, f, cfg, &backend_id);
	if (!be) {
		lb_count(LB_MTR_BACKEND_MISSING);
		return TC_ACT_SHOT;
	}
	rc = np6_fib(skb, &fib, f, f->saddr, be->address, f->sport, be->port);
	dev = np_fib_routed(rc) ? bpf_map_lookup_elem(&lb_devices, &fib.ifindex) : NULL;
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
	if (dev && !(svc->flags & LB_SVC_F_LOCAL_EXTERNAL)) {
		if (ip6_is_zero(dev->addr6)) {
			lb_count(LB_MTR_NP_NO_SNAT_ADDR);
			return TC_ACT_SHOT;
		}
		reply.flags = LB_CT_F_SNAT;
		reply.expires = now + np_lifetime(&f->l4, 0);
		if (np6_snat_reserve(cfg, f, be, dev->addr6, &reply, now, &orig->port2) < 0) {
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
		reply.expires = now + np_lifetime(&f->l4, 0);
		if (bpf_map_update_elem(&lb6_ct, &rk, &reply, BPF_ANY) < 0) {
			lb_count(LB_MTR_NP_CT_FULL);
			return TC_ACT_SHOT;
		}
		orig->flags = LB_CT_F_LOCAL;
	}
	orig->expires = now + np_lifetime(&f->l4, orig->flags);
	if (bpf_map_update_elem(&lb6_ct, ok, orig, BPF_ANY) < 0) {
		lb_count(LB_MTR_NP_CT_FULL);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_NEW);
	return 0;
}

static __always_inline void np6_touch_reply(const struct np6_flow *f, const struct lb6_ct_entry *orig, __u64 now)
{
	struct lb6_ct_key rk = { .sport = orig->port1, .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb6_ct_entry *r;

	ip6_copy(rk.saddr, orig->addr1);
	if (orig->flags & LB_CT_F_SNAT) {
		ip6_copy(rk.daddr, orig->addr2);
		rk.dport = orig->port2;
	} else {
		ip6_copy(rk.daddr, f->saddr);
		rk.dport = f->sport;
	}
	r = bpf_map_lookup_elem(&lb6_ct, &rk);
	if (r)
		np_ct_touch(&r->expires, &r->flags, &f->l4, now, 0);
}

static __always_inline int np6_fwd(struct __sk_buff *skb, struct np6_flow *f, struct lb6_key *key,
				   const struct lb_service *svc, const struct lb_np_config *cfg)
{
	struct lb6_ct_key ok = { .sport = f->sport, .dport = f->dport, .proto = f->l4.proto, .dir = LB_CT_ORIG };
	struct lb6_ct_entry fresh = {};
	struct lb6_ct_entry *ct;
	struct bpf_fib_lookup fib;
	__u64 now = np_now();
	int rc;

	ip6_copy(ok.saddr, f->saddr);
	ip6_copy(ok.daddr, f->daddr);
	ct = bpf_map_lookup_elem(&lb6_ct, &ok);
	if (ct && (ct->expires <= now || ((ct->flags & LB_CT_F_CLOSING) && np_tcp_syn(&f->l4))))
		ct = NULL;
	if (!ct) {
		rc = np6_new_flow(skb, f, key, svc, cfg, &ok, &fresh, now);
		if (rc)
			return rc;
		ct = &fresh;
	} else {
		__u64 before = ct->expires;

		np_ct_touch(&ct->expires, &ct->flags, &f->l4, now, np_tcp_syn(&f->l4) ? 0 : LB_CT_F_SEEN_REPLY);
		if (ct->expires != before)
			np6_touch_reply(f, ct, now);
	}
	if ((ct->flags & LB_CT_F_SNAT) && f->hop_limit <= 1) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	if (np6_xlate_fwd(skb, f, ct) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_FWD);
	if (!(ct->flags & LB_CT_F_SNAT))
		return TC_ACT_OK;
	rc = np6_fib(skb, &fib, f, ct->addr2, ct->addr1, ct->port2, ct->port1);
	if (!np_fib_routed(rc)) {
		lb_count(LB_MTR_NP_FIB_FAIL);
		return TC_ACT_SHOT;
	}
	if (!np6_dec_hoplimit(skb, f->hop_limit)) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_OK;
	}
	return np_fib_redirect(skb, &fib, rc);
}

static __always_inline struct lb6_ct_entry *np6_reply_entry(const struct np6_flow *f, __u16 want)
{
	struct lb6_ct_key rk = { .sport = f->sport, .dport = f->dport, .proto = f->l4.proto, .dir = LB_CT_REPLY };
	struct lb6_ct_entry *ct;

	ip6_copy(rk.saddr, f->saddr);
	ip6_copy(rk.daddr, f->daddr);
	ct = bpf_map_lookup_elem(&lb6_ct, &rk);
	if (!ct || !(ct->flags & want) || ct->expires <= np_now())
		return NULL;
	return ct;
}

static __always_inline int np6_rev_snat(struct __sk_buff *skb, struct np6_flow *f)
{
	struct lb6_ct_entry *ct = np6_reply_entry(f, LB_CT_F_SNAT);
	struct bpf_fib_lookup fib;
	int rc;

	if (!ct)
		return TC_ACT_UNSPEC;
	np_ct_touch(&ct->expires, &ct->flags, &f->l4, np_now(), LB_CT_F_SEEN_REPLY);
	if (f->hop_limit <= 1) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_SHOT;
	}
	if (np6_rewrite_addr(skb, &f->l4, NP_L3_OFF + offsetof(struct ipv6hdr, saddr), f->saddr, ct->addr1) < 0 ||
	    np_rewrite_port(skb, &f->l4, offsetof(struct tcphdr, source), f->sport, ct->port1) < 0 ||
	    np6_rewrite_addr(skb, &f->l4, NP_L3_OFF + offsetof(struct ipv6hdr, daddr), f->daddr, ct->addr2) < 0 ||
	    np_rewrite_port(skb, &f->l4, offsetof(struct tcphdr, dest), f->dport, ct->port2) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_REV);
	rc = np6_fib(skb, &fib, f, ct->addr1, ct->addr2, ct->port1, ct->port2);
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED)
		return TC_ACT_OK;
	if (!np_fib_routed(rc)) {
		lb_count(LB_MTR_NP_FIB_FAIL);
		return TC_ACT_SHOT;
	}
	if (!np6_dec_hoplimit(skb, f->hop_limit)) {
		lb_count(LB_MTR_NP_TTL);
		return TC_ACT_OK;
	}
	return np_fib_redirect(skb, &fib, rc);
}

static __always_inline int np6_ingress(struct __sk_buff *skb)
{
	const struct lb_np_config *cfg = np_config();
	struct lb6_key key = {};
	struct lb_service *svc;
	struct np6_flow f;
	bool node_addr = false;
	int rc;

	if (!cfg)
		return TC_ACT_UNSPEC;
	rc = np6_parse(skb, &f);
	if (rc)
		return TC_ACT_UNSPEC; /* fragments: see docs/nodeport.md (IPv6 fragments are not translated) */
	svc = np6_lookup(&f, &key, cfg, &node_addr);
	if (svc)
		return np6_fwd(skb, &f, &key, svc, cfg);
	if (node_addr && np_in_range(f.dport, cfg->snat_min, cfg->snat_max))
		return np6_rev_snat(skb, &f);
	return TC_ACT_UNSPEC;
}

static __always_inline int np6_egress(struct __sk_buff *skb)
{
	struct lb6_ct_entry *ct;
	struct np6_flow f;

	if (np6_parse(skb, &f))
		return TC_ACT_UNSPEC;
	ct = np6_reply_entry(&f, LB_CT_F_LOCAL);
	if (!ct)
		return TC_ACT_UNSPEC;
	np_ct_touch(&ct->expires, &ct->flags, &f.l4, np_now(), LB_CT_F_SEEN_REPLY);
	if (np6_rewrite_addr(skb, &f.l4, NP_L3_OFF + offsetof(struct ipv6hdr, saddr), f.saddr, ct->addr1) < 0 ||
	    np_rewrite_port(skb, &f.l4, offsetof(struct tcphdr, source), f.sport, ct->port1) < 0) {
		lb_count(LB_MTR_NP_BAD_PACKET);
		return TC_ACT_SHOT;
	}
	lb_count(LB_MTR_NP_REV);
	return TC_ACT_UNSPEC;
}

/* ------------------------------------------------------------ entries */

/* Separate functions per family keep each one's verifier state small. */
static __noinline int np_ingress4(struct __sk_buff *skb)
{
	return np4_ingress(skb);
}

static __noinline int np_ingress6(struct __sk_buff *skb)
{
	return np6_ingress(skb);
}

static __noinline int np_egress4(struct __sk_buff *skb)
{
	return np4_egress(skb);
}

static __noinline int np_egress6(struct __sk_buff *skb)
{
	return np6_egress(skb);
}

SEC("tc")
int lb_nodeport_ingress(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return np_ingress4(skb);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return np_ingress6(skb);
	return TC_ACT_UNSPEC;
}

SEC("tc")
int lb_nodeport_egress(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return np_egress4(skb);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return np_egress6(skb);
	return TC_ACT_UNSPEC;
}
