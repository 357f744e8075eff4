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
 * Service types (struct lb_service.type, slot 0). The model produces
 * ClusterIP frontends only; the wildcard entries come from the reconciler.
 * Backend slots carry 0. The numbers are what pinned maps hold, so a
 * removed value is not reused: 5 stays the wildcard across upgrades.
 */
enum lb_svc_type {
	LB_SVC_NONE = 0,	/* a backend slot (slot > 0) */
	LB_SVC_CLUSTER_IP = 1,
	LB_SVC_WILDCARD = 5,	/* address-only entry: port 0, proto 0 */
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
};

/*
 * Backend states (struct lb*_backend.state), for listings: no program reads
 * the state. What decides selection is the backend's slot: slots 1..count of
 * the master entry are selectable, slots count+1..count+qcount (terminating
 * backends) are never picked for a new socket and are kept so the backend
 * stays in the maps for the sockets already sent to it.
 */
enum lb_backend_state {
	LB_BACKEND_ACTIVE = 0,
	LB_BACKEND_TERMINATING = 1,
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
	LB_MTR_SOCK_RELEASE = 7,	/* socket rev-NAT entry removed at close */
	LB_MTR_AFFINITY_HIT = 8,	/* session affinity kept a client's backend */
	LB_MTR_MAX = 9,		/* append only: a value is never renumbered */
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
	__u8 pad[3];
};

/* Service lookup key, IPv6. */
struct lb6_key {
	__be32 address[4];	/* service IPv6 address */
	__be16 dport;		/* service port; 0 for the wildcard entry */
	__u16 backend_slot;	/* 0: master entry; 1..n: backend slots */
	__u8 proto;		/* IPPROTO_TCP/UDP; LB_PROTO_ANY for wildcard */
	__u8 pad[3];
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

#endif /* __LB_TYPES_H */
