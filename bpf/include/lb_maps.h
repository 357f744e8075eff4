/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every map lbctl's datapath uses, beside the types of lb_types.h. Maps are
 * pinned by name under the agent's --bpf-root, so a restarted agent and
 * `lbctl bpf lb list` find them; max_entries here are the defaults, and the
 * loader may override them before load (bpf_map__set_max_entries).
 */
#ifndef __LB_MAPS_H
#define __LB_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "lb_types.h"

/*
 * Defaults: 64k frontends with 256k backends in all. The services map holds
 * a master entry per frontend, a wildcard entry per service address (at most
 * one per frontend) and a slot per backend: 2 * frontends + backends.
 */
#define LB_SERVICES_MAX		(2 * 65536 + 262144)
#define LB_BACKENDS_MAX		262144
#define LB_REVNAT_MAX		65536
#define LB_SOCK_REVNAT_MAX	262144
#define LB_SOCK_PEER_SLOTS	262144	/* a power of two */
#define LB_AFFINITY_MAX		65536
#define LB_NODE_ADDRS_MAX	1024

/* BPF unit tests (bpf/tests) include the programs with their maps unpinned. */
#ifndef LB_MAP_PINNING
#define LB_MAP_PINNING		LIBBPF_PIN_BY_NAME
#endif

/* frontend (+slot) -> master entry or backend id */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_key);
	__type(value, struct lb_service);
	__uint(max_entries, LB_SERVICES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LB_MAP_PINNING);
} lb4_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb6_key);
	__type(value, struct lb_service);
	__uint(max_entries, LB_SERVICES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LB_MAP_PINNING);
} lb6_services SEC(".maps");

/* backend id -> backend address */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_backend);
	__uint(max_entries, LB_BACKENDS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LB_MAP_PINNING);
} lb4_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb6_backend);
	__uint(max_entries, LB_BACKENDS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LB_MAP_PINNING);
} lb6_backends SEC(".maps");

/*
 * rev-NAT id -> frontend address. No program reads it today: the socket
 * programs translate back from their per-socket entries below. The agent
 * writes it, reads it back when it restarts (its realized state, and the
 * entries its liveness write probe rewrites) and prunes unused ids.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_reverse_nat);
	__uint(max_entries, LB_REVNAT_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LB_MAP_PINNING);
} lb4_reverse_nat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb6_reverse_nat);
	__uint(max_entries, LB_REVNAT_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LB_MAP_PINNING);
} lb6_reverse_nat SEC(".maps");

/*
 * (socket, backend) -> the service that socket asked for: UDP sockets (an
 * unconnected one may send to several backends), and TCP sockets connected
 * before lb*_sock_peer existed.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_sock_key);
	__type(value, struct lb4_sock_revnat);
	__uint(max_entries, LB_SOCK_REVNAT_MAX);
	__uint(pinning, LB_MAP_PINNING);
} lb4_sock_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb6_sock_key);
	__type(value, struct lb6_sock_revnat);
	__uint(max_entries, LB_SOCK_REVNAT_MAX);
	__uint(pinning, LB_MAP_PINNING);
} lb6_sock_revnat SEC(".maps");

/*
 * TCP socket (cookie) -> the backend it was sent to and the service it
 * asked for: slot cookie % LB_SOCK_PEER_SLOTS, or a hash of the cookie
 * (bpf/sock.c, sock_peer_slot). Written and cleared in place, no lock; a
 * fixed size (a power of two), not resized by the agent.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lb4_sock_peer);
	__uint(max_entries, LB_SOCK_PEER_SLOTS);
	__uint(pinning, LB_MAP_PINNING);
} lb4_sock_peer SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lb6_sock_peer);
	__uint(max_entries, LB_SOCK_PEER_SLOTS);
	__uint(pinning, LB_MAP_PINNING);
} lb6_sock_peer SEC(".maps");

/* (client netns, frontend) -> the backend it sticks to */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_affinity_key);
	__type(value, struct lb_affinity_val);
	__uint(max_entries, LB_AFFINITY_MAX);
	__uint(pinning, LB_MAP_PINNING);
} lb_affinity SEC(".maps");

/*
 * The node's addresses (the agent writes those of the tc devices, as
 * --nodeport-addresses allows): the NodePort surrogate (0.0.0.0 / ::)
 * answers on them, at tc and for sockets of the node and its pods.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_node_addr_key);
	__type(value, struct lb_node_addr);
	__uint(max_entries, LB_NODE_ADDRS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LB_MAP_PINNING);
} lb_node_addrs SEC(".maps");

/*
 * enum lb_metric -> per-CPU packet/socket counter. Sized with room to grow
 * (LB_METRIC_SLOTS), so a counter appended to the enum needs no migration;
 * a pinned map of another size is migrated by the loader all the same.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, LB_METRIC_SLOTS);
	__uint(pinning, LB_MAP_PINNING);
} lb_metrics SEC(".maps");

#endif /* __LB_MAPS_H */
