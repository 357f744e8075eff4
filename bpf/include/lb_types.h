/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * lbctl's ABI: every key and value stored in a BPF map, and the enums they
 * carry. This header is the single source of truth; the TypeScript codecs
 * (src/datapath/abi.gen.ts) are generated from the BTF of the compiled
 * objects, so a change here is a change of the generated file too.
 *
 * Rules: plain fixed-width types, explicit padding, no bitfields, byte order
 * in the type (__be* fields are network order, everything else host order),
 * and a static size assertion per struct.
 */
#ifndef __LB_TYPES_H
#define __LB_TYPES_H

#include <linux/types.h>

/*
 * Service types (struct lb_service.type, slot 0). The wildcard entries come
 * from the reconciler, the others from the model. Backend slots carry 0.
 * The numbers are what pinned maps hold, so a removed value is not reused:
 * 5 stays the wildcard across upgrades.
 */
enum lb_svc_type {
	LB_SVC_NONE = 0,	/* a backend slot (slot > 0) */
	LB_SVC_CLUSTER_IP = 1,
	LB_SVC_NODEPORT = 2,	/* address 0.0.0.0 / ::: the surrogate every node address matches */
	LB_SVC_LOADBALANCER = 3,	/* status.loadBalancer.ingress[].ip */
	LB_SVC_EXTERNAL_IP = 4,	/* spec.externalIPs[] */
	LB_SVC_WILDCARD = 5,	/* address-only entry: port 0, proto 0 */
};

/*
 * Lookup scopes (lb*_key.scope). A frontend whose external and internal
 * traffic policies pick different backends has two master entries: the
 * external one (what tc serves to clients from outside) and the internal one
 * (what the socket programs serve to the node and its pods), flagged
 * LB_SVC_F_TWO_SCOPES. Every other frontend has only the external entry.
 */
enum lb_scope {
	LB_SCOPE_EXT = 0,
	LB_SCOPE_INT = 1,
};

/* Service flags (struct lb_service.flags, slot 0). */
enum lb_svc_flags {
	LB_SVC_F_AFFINITY = (1 << 0),		/* sessionAffinity ClientIP: read by lb*_select_backend */
	/*
	 * internalTrafficPolicy Local, written by the reconciler in the master
	 * entry it compares (a policy change rewrites the entry). No program
	 * reads it: the model already gave such a frontend only node-local
	 * backends.
	 */
	LB_SVC_F_LOCAL_INTERNAL = (1 << 1),
	/* externalTrafficPolicy Local: only this node's endpoints, client address kept (no SNAT) */
	LB_SVC_F_LOCAL_EXTERNAL = (1 << 2),
	/* the frontend also has an LB_SCOPE_INT entry (see enum lb_scope) */
	LB_SVC_F_TWO_SCOPES = (1 << 3),
	/* loadBalancerSourceRanges: clients outside lb*_src_range are dropped */
	LB_SVC_F_SRC_RANGE = (1 << 4),
	/* a Maglev table is in lb_maglev under the rev-NAT id; random selection without one */
	LB_SVC_F_MAGLEV = (1 << 5),
};

/*
 * Backend states (struct lb*_backend.state), for listings: no program reads
 * the state. What decides selection is the backend's slot: slots 1..count of
 * the master entry are selectable, slots count+1..count+qcount (terminating
 * backends, and backends a readiness probe quarantined) are never picked
 * for a new socket and are kept so the backend stays in the maps for the
 * sockets already sent to it.
 */
enum lb_backend_state {
	LB_BACKEND_ACTIVE = 0,
	LB_BACKEND_TERMINATING = 1,
	LB_BACKEND_QUARANTINED = 2,
};

/* Per-CPU datapath counters (lb_metrics index). */
enum lb_metric {
	LB_MTR_XLATE_FWD = 0,		/* a socket was sent to a backend */
	LB_MTR_NO_BACKEND = 1,		/* service has no selectable backend: refused */
	LB_MTR_NO_SERVICE_PORT = 2,	/* service address, unknown port: refused */
	LB_MTR_BACKEND_MISSING = 3,	/* a slot points at a missing backend */
	LB_MTR_XLATE_REV = 4,		/* a reply or peer name was rewritten back */
	LB_MTR_REVNAT_STALE = 5,	/* stale socket rev-NAT entry removed */
	LB_MTR_REVNAT_UPDATE_FAIL = 6,	/* socket rev-NAT entry could not be written */
	LB_MTR_SOCK_RELEASE = 7,	/* socket rev-NAT entry (TCP: slot) removed at close */
	LB_MTR_AFFINITY_HIT = 8,	/* session affinity kept a client's backend */
	/* tc (bpf/nodeport.c): NodePort, LoadBalancer and external IPs */
	LB_MTR_NP_NEW = 9,		/* a new flow got a backend (CT entries written) */
	LB_MTR_NP_FWD = 10,		/* a packet of a flow was DNATed (and SNATed) */
	LB_MTR_NP_REV = 11,		/* a reply was translated back */
	LB_MTR_NP_NO_BACKEND = 12,	/* no selectable backend: dropped or refused by ICMP */
	LB_MTR_NP_LOCAL_NONE = 13,	/* eTP Local with no local backend: dropped */
	LB_MTR_NP_SRC_RANGE = 14,	/* client outside loadBalancerSourceRanges: dropped */
	LB_MTR_NP_SNAT_EXHAUSTED = 15,	/* no free SNAT port after the retries: dropped */
	LB_MTR_NP_FIB_FAIL = 16,	/* no route to the backend or the client: dropped */
	LB_MTR_NP_CT_FULL = 17,		/* a CT entry could not be written: dropped */
	LB_MTR_NP_FRAG = 18,		/* a fragment that cannot be translated: dropped */
	LB_MTR_NP_ICMP_XLATE = 19,	/* an ICMP error about a flow was translated */
	LB_MTR_NP_REJECT = 20,		/* an ICMP port unreachable was sent */
	LB_MTR_NP_NO_SNAT_ADDR = 21,	/* the egress device has no address to SNAT to: dropped */
	LB_MTR_NP_BAD_PACKET = 22,	/* a malformed header of a service flow: dropped */
	LB_MTR_NP_TTL = 23,		/* TTL/hop limit would expire on a packet forwarded here: dropped */
	LB_MTR_BIND_REFUSED = 24,	/* a socket's bind to a service's nodePort refused (EADDRINUSE) */
	LB_MTR_NP_FRAG_NEEDED = 25,	/* bigger than the redirect's egress MTU: dropped, answered by frag-needed/packet too big */
	LB_MTR_NP_REBALANCE = 26,	/* an established flow's backend left every service: it got a new one */
	LB_MTR_NP_SNAT_REUSE = 27,	/* a new flow took the SNAT port of a closed one (no free port among the tries) */
	LB_MTR_NP_NAT_REPAIR = 28,	/* a flow's SNAT entry was gone (evicted) and was written again from its CT entry */
	LB_MTR_NP_NAT_STOLEN = 29,	/* a flow's SNAT port went to another flow: the old flow ends (its packets dropped) */
	LB_MTR_NP_NAT_FULL = 30,	/* a SNAT entry could not be written: dropped */
	LB_MTR_NP_HOST_CLASH = 31,	/* the node's own flow met a tuple a SNATed flow holds: its packet dropped */
	LB_MTR_NP_L3_OUTER = 32,	/* a layer-3 tunnel's packet came to tc with its outer headers on (IP-in-IP before 5.14): not translated */
	LB_MTR_NP_DSR_FWD = 33,		/* --nodeport-mode dsr|hybrid: a packet sent to a remote backend with the frontend in its DSR option */
	LB_MTR_NP_DSR_FLOW = 34,	/* the backend's node: a DSR flow to a local backend recorded from its option */
	LB_MTR_NP_DSR_REV = 35,		/* the backend's node: a local backend's reply to a DSR flow left from the frontend */
	LB_MTR_NP_XDP_FWD = 36,		/* --nodeport-acceleration: a packet XDP translated (sent on itself, or passed up to a local backend) */
	LB_MTR_NP_XDP_TO_TC = 37,	/* ... a service's packet XDP could not finish, passed on to tc unchanged */
	LB_MTR_NP_MIGRATING_DROP = 38,	/* LB_NP_F_MIGRATING: a flow's packet with no entry yet dropped (its sender retransmits into the copy) */
	LB_MTR_MAX = 39,		/* append only: a value is never renumbered */
};

/* lb_metrics' size: room for counters to come, so appending one moves no pin. */
#ifndef LB_LAYOUT_TEST
#define LB_METRIC_SLOTS 64
#else
/* The upgrade test's "old" datapath: sized by the enum, as lbctl did before. */
#define LB_METRIC_SLOTS LB_MTR_MAX
#endif
_Static_assert(LB_MTR_MAX <= LB_METRIC_SLOTS, "lb_metrics has a slot for every enum lb_metric value");

#define LB_PROTO_ANY 0

/* Service lookup key, IPv4. Slot 0 is the master entry; 1..n backends. */
struct lb4_key {
	__be32 address;		/* service IPv4 address */
	__be16 dport;		/* service port; 0 for the wildcard entry */
	__u16 backend_slot;	/* 0: master entry; 1..n: backend slots */
	__u8 proto;		/* IPPROTO_TCP/UDP; LB_PROTO_ANY for wildcard */
	__u8 scope;		/* enum lb_scope (was padding: old entries read as LB_SCOPE_EXT) */
	__u8 pad[2];
};

/* Service lookup key, IPv6. */
struct lb6_key {
	__be32 address[4];	/* service IPv6 address */
	__be16 dport;		/* service port; 0 for the wildcard entry */
	__u16 backend_slot;	/* 0: master entry; 1..n: backend slots */
	__u8 proto;		/* IPPROTO_TCP/UDP; LB_PROTO_ANY for wildcard */
	__u8 scope;		/* enum lb_scope (was padding: old entries read as LB_SCOPE_EXT) */
	__u8 pad[2];
};

#ifndef LB_LAYOUT_TEST
/*
 * Service value, shared by both families. In the master entry (slot 0)
 * backend_id is 0 and the rest describes the service; in a backend slot only
 * backend_id is meaningful. The __u32 fields come first and the narrow ones
 * after them, so every field is naturally aligned and only the tail pads.
 */
struct lb_service {
	__u32 backend_id;	/* slot > 0: backend id */
	__u32 rev_nat_index;	/* slot 0: rev-NAT id of this frontend */
	__u32 affinity_timeout;	/* slot 0: session affinity timeout, seconds */
	__u16 count;		/* slot 0: selectable slots, 1..count */
	__u16 qcount;		/* slot 0: non-selectable (terminating) slots after count */
	__u8 type;		/* slot 0: enum lb_svc_type */
	__u8 flags;		/* slot 0: enum lb_svc_flags */
	__u8 pad[2];
};

/* Backend, IPv4. Keyed by a __u32 backend id (shared id space with IPv6). */
struct lb4_backend {
	__be32 address;		/* backend IPv4 address */
	__be16 port;		/* backend port */
	__u8 proto;		/* IPPROTO_TCP/UDP */
	__u8 state;		/* enum lb_backend_state */
};
#else
/*
 * LB_LAYOUT_TEST: a deliberately different layout of the same two values,
 * built only as bpf/.output/sock_layout_test.bpf.o for the upgrade test
 * (test/e2e/upgrade-layout.ts), which pins it as the "old" datapath and
 * upgrades to the standard layout above under load. lb_service reorders its
 * ids, has a wider count and a field the standard layout drops (24 bytes);
 * lb4_backend is reordered at the same size, which libbpf alone would reuse.
 */
struct lb_service {
	__u32 rev_nat_index;
	__u32 backend_id;
	__u32 affinity_timeout;
	__u32 count;
	__u16 qcount;
	__u8 type;
	__u8 flags;
	__u32 weight;		/* dropped by the standard layout */
};

struct lb4_backend {
	__u8 state;
	__u8 proto;
	__be16 port;
	__be32 address;
};
#endif

/* Backend, IPv6. */
struct lb6_backend {
	__be32 address[4];	/* backend IPv6 address */
	__be16 port;		/* backend port */
	__u8 proto;		/* IPPROTO_TCP/UDP */
	__u8 state;		/* enum lb_backend_state */
};

/* Rev-NAT value, keyed by a __u32 rev-NAT id: the frontend to report. */
struct lb4_reverse_nat {
	__be32 address;		/* service IPv4 address */
	__be16 port;		/* service port */
	__u8 pad[2];
};

struct lb6_reverse_nat {
	__be32 address[4];	/* service IPv6 address */
	__be16 port;		/* service port */
	__u8 pad[2];
};

/* Socket rev-NAT key: which backend a given socket was sent to. */
struct lb4_sock_key {
	__u64 cookie;		/* bpf_get_socket_cookie() */
	__be32 address;		/* backend IPv4 address */
	__be16 port;		/* backend port */
	__u8 pad[2];
};

struct lb6_sock_key {
	__u64 cookie;		/* bpf_get_socket_cookie() */
	__be32 address[4];	/* backend IPv6 address */
	__be16 port;		/* backend port */
	__u8 pad[6];
};

/* Socket rev-NAT value: the service that socket asked for. */
struct lb4_sock_revnat {
	__be32 address;		/* service IPv4 address */
	__be16 port;		/* service port */
	__u8 pad[2];
	__u32 rev_nat_index;	/* rev-NAT id of the service when recorded */
};

struct lb6_sock_revnat {
	__be32 address[4];	/* service IPv6 address */
	__be16 port;		/* service port */
	__u8 pad[2];
	__u32 rev_nat_index;	/* rev-NAT id of the service when recorded */
};

/*
 * A TCP socket's rev-NAT, in a slot of lb4_sock_peer (an array indexed by
 * the socket's cookie, two ways): the socket, the backend connect() sent
 * it to, and the service it asked for. cookie 0 is a free slot.
 */
struct lb4_sock_peer {
	__u64 cookie;		/* bpf_get_socket_cookie(); 0: free */
	__be32 backend;		/* backend IPv4 address */
	__be16 backend_port;	/* backend port */
	__be16 port;		/* service port */
	__be32 address;		/* service IPv4 address */
	__u32 rev_nat_index;	/* rev-NAT id of the service when recorded */
};

struct lb6_sock_peer {
	__u64 cookie;		/* bpf_get_socket_cookie(); 0: free */
	__be32 backend[4];	/* backend IPv6 address */
	__be32 address[4];	/* service IPv6 address */
	__be16 backend_port;	/* backend port */
	__be16 port;		/* service port */
	__u32 rev_nat_index;	/* rev-NAT id of the service when recorded */
};

/*
 * Session affinity (sessionAffinity ClientIP). At the socket layer the
 * client is its network namespace: every socket of a pod shares one, and
 * so does every host process (the node's own address).
 */
struct lb_affinity_key {
	__u64 netns_cookie;	/* bpf_get_netns_cookie() of the client */
	__u32 rev_nat_index;	/* the frontend */
	__u8 family;		/* 4 or 6: rev-NAT ids are per family */
	__u8 pad[3];
};

struct lb_affinity_val {
	__u64 last_used;	/* bpf_ktime_get_ns() / 1e9 at the last use */
	__u32 backend_id;	/* the backend the client sticks to */
	__u16 slot;		/* its slot then; a moved backend means re-pick */
	__u8 pad[2];
};

/*
 * Connection tracking of the tc datapath (bpf/nodeport.c). Two maps per
 * family, both LRU, sized apart (--ct-max, --nat-max):
 *   lb*_ct   the flows:
 *     LB_CT_ORIG  keyed as the client's packet arrives (client -> frontend);
 *                 addr1/port1 = the backend it goes to, addr2/port2 = the
 *                 source it is SNATed to (zero: no SNAT, a local backend).
 *     LB_CT_REPLY keyed as a local backend's reply leaves (backend -> client,
 *                 at egress); addr1/port1 = the frontend to answer from,
 *                 addr2/port2 = the client.
 *   lb*_nat  the SNAT translations, one per SNATed flow, keyed as the
 *            remote backend's reply arrives (backend -> SNAT address and
 *            port, dir LB_CT_REPLY): addr1/port1 = the frontend, addr2/port2
 *            = the client. An entry is also the port's reservation: it is
 *            inserted with BPF_NOEXIST, so two live flows never share a
 *            (backend, SNAT address, port) tuple.
 * Apart, an eviction in one map cannot hand a live flow's port to another:
 * every packet of a SNATed flow checks that its lb*_nat entry is still its
 * own (rebuilt from the lb*_ct entry when the LRU dropped it; the flow ends
 * if another flow holds the port now).
 * The node's own flows from a SNAT address with a source port in
 * --snat-port-range are in lb*_nat too (LB_CT_F_HOST, keyed the same, seen
 * at egress): SNAT keeps a client's port when it can, and the range holds
 * the node's ephemeral ports, so those tuples are the node's and never
 * taken.
 */
enum lb_ct_dir {
	LB_CT_ORIG = 0,
	LB_CT_REPLY = 1,
};

enum lb_ct_flags {
	LB_CT_F_SNAT = (1 << 0),	/* the flow is SNATed (a remote backend) */
	LB_CT_F_CLOSING = (1 << 1),	/* TCP closed: a FIN each way, or a reset (short lifetime; its SNAT port may be taken over) */
	LB_CT_F_SEEN_REPLY = (1 << 2),	/* a reply went back: established */
	LB_CT_F_LOCAL = (1 << 3),	/* the backend is on this node: replies pass its egress */
	LB_CT_F_TIME_WAIT = (1 << 4),	/* TCP: the backend closed first, so it holds the tuple in TIME_WAIT */
	LB_CT_F_FIN_ORIG = (1 << 5),	/* TCP: the client sent a FIN (half closed until the backend's) */
	LB_CT_F_FIN_REPLY = (1 << 6),	/* TCP: the backend sent a FIN */
	LB_CT_F_HOST = (1 << 7),	/* lb*_nat: the node's own flow from a SNAT address, a port kept from SNAT (never translated) */
	/*
	 * Direct server return (--nodeport-mode dsr|hybrid). ORIG on the node
	 * the client reached: the flow goes to a remote backend DNATed only,
	 * the frontend carried in a DSR option (bpf/lib/dsr.h), and its
	 * replies never come back here. REPLY (with LB_CT_F_LOCAL) on the
	 * backend's node: recorded from that option, its replies leave from
	 * the frontend.
	 */
	LB_CT_F_DSR = (1 << 8),
};

struct lb4_ct_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir;		/* enum lb_ct_dir */
	__u8 pad[2];
};

struct lb6_ct_key {
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir;		/* enum lb_ct_dir */
	__u8 pad[2];
};

#ifndef LB_CT_LAYOUT_TEST
/* The value of lb4_ct and lb4_nat entries (see above for addr1/addr2). */
struct lb4_ct_entry {
	__u64 expires;		/* bpf_ktime_get_ns() / 1e9 past which the entry is dead */
	__be32 addr1;		/* ORIG: backend; REPLY and NAT: frontend */
	__be32 addr2;		/* ORIG: SNAT source (0: none); REPLY and NAT: client */
	__be16 port1;
	__be16 port2;
	__u32 rev_nat_index;	/* the frontend's rev-NAT id */
	__u32 backend_id;	/* the backend's id: a flow whose backend is gone gets a new one */
	__u16 flags;		/* enum lb_ct_flags */
	__u8 pad[2];
};

struct lb6_ct_entry {
	__u64 expires;
	__be32 addr1[4];
	__be32 addr2[4];
	__be16 port1;
	__be16 port2;
	__u32 rev_nat_index;
	__u32 backend_id;
	__u16 flags;
	__u8 pad[2];
};
#else
/*
 * LB_CT_LAYOUT_TEST: another layout of the same values, built only into
 * bpf/.output/tests/nodeport_ct_layout.bpf.o for test/e2e/nodeport-upgrade.ts,
 * which runs it and upgrades to the standard layout under load (and back):
 * the fields reordered, and one the standard layout lacks (a larger value).
 */
struct lb4_ct_entry {
	__u32 rev_nat_index;
	__u16 flags;
	__be16 port1;
	__be16 port2;
	__u8 pad[2];
	__be32 addr1;
	__be32 addr2;
	__u64 expires;
	__u32 backend_id;
	__u32 created;		/* dropped by the standard layout */
};

struct lb6_ct_entry {
	__u32 rev_nat_index;
	__u16 flags;
	__be16 port1;
	__be16 port2;
	__u8 pad[2];
	__be32 addr1[4];
	__be32 addr2[4];
	__u64 expires;
	__u32 backend_id;
	__u32 created;
};
#endif

/*
 * Fragments: the ports of a datagram's first fragment, by (saddr, daddr,
 * id, proto), so the later ones (which carry no ports) follow it to the
 * same flow. IPv6's id is the fragment header's 32 bits.
 */
struct lb4_frag_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct lb6_frag_key {
	__be32 saddr[4];
	__be32 daddr[4];
	__be32 id;
	__u8 proto;
	__u8 pad[3];
};

/* Both families' value. */
struct lb4_frag_ports {
	__be16 sport;
	__be16 dport;
};

/*
 * Session affinity at tc (sessionAffinity ClientIP for clients from
 * outside): the client is its whole address. The socket layer's
 * lb_affinity keys on network namespaces instead.
 */
struct lb_np_affinity_key {
	__be32 address[4];	/* IPv4 in address[0], the rest zero */
	__u32 rev_nat_index;	/* the frontend */
	__u8 family;		/* 4 or 6: rev-NAT ids are per family */
	__u8 pad[3];
};

/* A node address (the NodePort surrogate matches it), keyed by address. */
struct lb_node_addr_key {
	__be32 address[4];	/* IPv4 in address[0], the rest zero */
	__u8 family;		/* 4 or 6 */
	__u8 pad[3];
};

struct lb_node_addr {
	__u32 ifindex;		/* the device that has it */
	__u32 flags;		/* reserved */
};

/*
 * The FIB's answer (bpf_fib_lookup, BPF_FIB_LKUP_RET_SUCCESS) to a question
 * (family, in by `in_ifindex`, from `src` to `dst`, protocol and ports: all
 * the lookup reads, so rules and multipath hashes on ports see the same),
 * kept per CPU in a slot of lb_fib_cache the question hashes to, for the
 * second of the datapath's clock it was looked up in (`stamp`, np_now(); 0:
 * none). An established flow's packets take the next hop from it instead
 * of asking the FIB again: on the machines of docs/benchmarks.md the lookup
 * was the largest cost of a forwarded packet. A new flow always asks the
 * FIB (and refreshes the slot). One layout for both families, as struct
 * bpf_fib_lookup has: an IPv4 address is src[0]/dst[0] (its ipv4_src and
 * ipv6_src[0] are one field), the other words 0. The layout is the
 * datapath's alone: nothing outside it reads the map.
 */
struct lb_fib_cache {
	__u64 stamp;
	__u32 ifindex;		/* the answer: the device out */
	__u8 smac[6];
	__u8 dmac[6];
	__u16 mtu;		/* the FIB's mtu_result (5.12+; 0 before) */
	__u8 family;		/* the question: bpf_fib_lookup's inputs */
	__u8 proto;
	__u32 in_ifindex;
	__be32 src[4];
	__be32 dst[4];
	__be16 sport;
	__be16 dport;
};

/* A device the tc programs run on, keyed by ifindex: its SNAT addresses and MTU. */
enum lb_device_flags {
	/*
	 * A layer-3 device (ipip, sit, ip6tnl, gre, wireguard): its packets
	 * start with the IP header. Programs of nodeport_l3.bpf.o run on it; a
	 * packet redirected out of it carries no link-layer header.
	 */
	LB_DEV_F_L3 = (1 << 0),
	/*
	 * nodeport_xdp.bpf.o runs on it in the driver (--nodeport-acceleration):
	 * a device the XDP program may send a frame out of (XDP_REDIRECT needs
	 * the driver's ndo_xdp_xmit, which native XDP drivers have).
	 */
	LB_DEV_F_XDP = (1 << 1),
};

struct lb_device {
	__be32 addr4;		/* SNAT source for IPv4 (0: none) */
	__be32 addr6[4];	/* SNAT source for IPv6 (::: none) */
	/*
	 * The device's MTU (rtnetlink's IFLA_MTU, rewritten when it changes):
	 * what a packet redirected out of it must fit (5.10's bpf_fib_lookup
	 * reports no MTU). 0 (an agent before this field, which wrote a
	 * reserved 0 here): no check.
	 */
	__u32 mtu;
	__u32 flags;		/* enum lb_device_flags */
};

/* Settings of the tc datapath (lb_np_config[0]), written by the agent before attach. */
enum lb_np_config_flags {
	LB_NP_F_EXTERNAL_CLUSTERIP = (1 << 0),	/* --external-clusterip: serve ClusterIPs from outside */
	/*
	 * The agent is carrying the flows into new maps (between the programs'
	 * switch and the last copy, milliseconds): a reply or a TCP segment of
	 * an established flow without its entry yet is dropped, its sender
	 * retransmits, rather than reset by the stack or taken for a new flow.
	 * Only until migrating_until: an agent that died in the window leaves
	 * the flag set, and it must not hold flows back for good.
	 */
	LB_NP_F_MIGRATING = (1 << 1),
	/*
	 * --nodeport-mode dsr or hybrid: new TCP flows to a remote backend go
	 * by direct server return (DNAT only, the frontend in a DSR option),
	 * and DSR options on packets to local backends are honoured (their
	 * replies leave from the frontend). Every node must run the same mode.
	 */
	LB_NP_F_DSR = (1 << 2),
	LB_NP_F_DSR_UDP = (1 << 3),	/* --nodeport-mode dsr: UDP flows too (hybrid SNATs them) */
	/*
	 * lb_np_ports holds every port a frontend has (the agent wrote it from
	 * the services maps before setting this flag, and marks a port before
	 * it writes a frontend on it): a packet to a port it lacks, outside
	 * --nodeport-range, is no frontend's without a lookup. Unset (an agent
	 * before it, or none yet), every packet's frontend is looked up.
	 */
	LB_NP_F_PORTS = (1 << 4),
};

/*
 * lb_np_ports: a bit per port, set where some frontend (any address,
 * protocol and family) has that port: bit (port % 64) of word port / 64.
 * A bit may stay set after its last frontend went (the agent clears them
 * when it starts): a set bit only costs the lookup it would have made.
 */
#define LB_NP_PORT_WORDS	(65536 / 64)

struct lb_np_config {
	__u16 nodeport_min;	/* --nodeport-range */
	__u16 nodeport_max;
	__u16 snat_min;		/* --snat-port-range */
	__u16 snat_max;
	__u32 flags;		/* enum lb_np_config_flags */
	__u32 snat_retries;	/* random tries after the tuple hash's port */
	__u32 maglev_m;		/* --maglev-table-size: entries of every lb_maglev table */
	__u32 maglev_seed4;	/* flow hash seeds (--maglev-hash-seed), the same on every node */
	__u32 maglev_seed6;
	/* CT lifetimes, seconds (0: the datapath's default) */
	__u32 ct_tcp_established;	/* --conntrack-tcp-timeout-established */
	__u32 ct_tcp_close_wait;	/* --conntrack-tcp-timeout-close-wait: one side sent its FIN */
	__u32 ct_udp;			/* --conntrack-udp-timeout */
	__u32 migrating_until;		/* LB_NP_F_MIGRATING holds until this second of np_now() (0: not at all) */
};

/*
 * lb_maglev_index's key: the frontend's rev-NAT id, with LB_MAGLEV_V6 set
 * for an IPv6 frontend (rev-NAT ids are per family).
 */
#define LB_MAGLEV_V6	(1U << 31)

/*
 * Maglev tables at tc, Katran's flat layout in chunks: a chunk (one inner
 * array of lb_maglev) holds tables back to back, M backend ids each
 * (--maglev-table-size), in blocks of LB_MAGLEV_BLOCK_SLOTS; lb_maglev_index
 * names a frontend's table as a struct lb_maglev_row. Tables are written in
 * place: no map is made or swapped per table, a chunk holds as many tables
 * as the agent needs at once (one map-of-maps update, one RCU grace period,
 * for all of them), and packing them without gaps takes 4 bytes a slot where
 * an array of single ids would take 8 (array values round up to 8 bytes).
 */
enum lb_maglev_layout {
	LB_MAGLEV_BLOCK_SLOTS = 1024,
};

struct lb_maglev_block {
	__u32 backend_id[LB_MAGLEV_BLOCK_SLOTS];
};

/* A frontend's Maglev table: lb_maglev_index's value. */
struct lb_maglev_row {
	__u32 chunk;	/* lb_maglev's key of the chunk that holds it */
	__u32 first;	/* its slot 0 in the chunk: slot s is (first + s) / LB_MAGLEV_BLOCK_SLOTS, id (first + s) % ... */
	__u32 m;	/* its size (the table was built for it; flows hash modulo it) */
};

/*
 * loadBalancerSourceRanges (LPM trie): prefixlen counts the rev-NAT id's 32
 * bits plus the CIDR's, so one trie serves every frontend.
 */
struct lb4_src_range_key {
	__u32 prefixlen;
	__u32 rev_nat_index;
	__be32 address;
};

struct lb6_src_range_key {
	__u32 prefixlen;
	__u32 rev_nat_index;
	__be32 address[4];
};

_Static_assert(sizeof(struct lb4_key) == 12, "lb4_key size");
_Static_assert(sizeof(struct lb_affinity_key) == 16, "lb_affinity_key size");
_Static_assert(sizeof(struct lb_affinity_val) == 16, "lb_affinity_val size");
_Static_assert(sizeof(struct lb6_key) == 24, "lb6_key size");
#ifndef LB_LAYOUT_TEST
_Static_assert(sizeof(struct lb_service) == 20, "lb_service size");
#else
_Static_assert(sizeof(struct lb_service) == 24, "lb_service size (LB_LAYOUT_TEST)");
#endif
_Static_assert(sizeof(struct lb4_backend) == 8, "lb4_backend size");
_Static_assert(sizeof(struct lb6_backend) == 20, "lb6_backend size");
_Static_assert(sizeof(struct lb4_reverse_nat) == 8, "lb4_reverse_nat size");
_Static_assert(sizeof(struct lb6_reverse_nat) == 20, "lb6_reverse_nat size");
_Static_assert(sizeof(struct lb4_sock_key) == 16, "lb4_sock_key size");
_Static_assert(sizeof(struct lb6_sock_key) == 32, "lb6_sock_key size");
_Static_assert(sizeof(struct lb4_sock_revnat) == 12, "lb4_sock_revnat size");
_Static_assert(sizeof(struct lb6_sock_revnat) == 24, "lb6_sock_revnat size");
_Static_assert(sizeof(struct lb4_sock_peer) == 24, "lb4_sock_peer size");
_Static_assert(sizeof(struct lb6_sock_peer) == 48, "lb6_sock_peer size");

_Static_assert(sizeof(struct lb4_ct_key) == 16, "lb4_ct_key size");
_Static_assert(sizeof(struct lb6_ct_key) == 40, "lb6_ct_key size");
#ifndef LB_CT_LAYOUT_TEST
_Static_assert(sizeof(struct lb4_ct_entry) == 32, "lb4_ct_entry size");
_Static_assert(sizeof(struct lb6_ct_entry) == 56, "lb6_ct_entry size");
#endif
_Static_assert(sizeof(struct lb4_frag_key) == 12, "lb4_frag_key size");
_Static_assert(sizeof(struct lb6_frag_key) == 40, "lb6_frag_key size");
_Static_assert(sizeof(struct lb_np_affinity_key) == 24, "lb_np_affinity_key size");
_Static_assert(sizeof(struct lb_node_addr_key) == 20, "lb_node_addr_key size");
_Static_assert(sizeof(struct lb_device) == 28, "lb_device size");
_Static_assert(sizeof(struct lb_np_config) == 44, "lb_np_config size");
_Static_assert(sizeof(struct lb4_src_range_key) == 12, "lb4_src_range_key size");
_Static_assert(sizeof(struct lb6_src_range_key) == 24, "lb6_src_range_key size");

#endif /* __LB_TYPES_H */
