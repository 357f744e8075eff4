/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The maps only the tc datapath (bpf/nodeport.c) uses, beside the shared ones
 * of lb_maps.h: connection tracking and SNAT, fragments, session affinity
 * by client address, the devices it runs on, its settings,
 * loadBalancerSourceRanges and Maglev tables. A separate
 * header so the socket object does not create them (libbpf creates every
 * map an object declares, used or not).
 */
#ifndef __NP_MAPS_H
#define __NP_MAPS_H

#include "lb_maps.h"

#define LB_CT_MAX		262144	/* --ct-max */
#define LB_NAT_MAX		131072	/* --nat-max */
#define LB_FRAG_MAX		8192
#define LB_NP_AFFINITY_MAX	65536
#define LB_DEVICES_MAX		256
#define LB_SRC_RANGE_MAX	16384
#define LB_MAGLEV_MAX		65536	/* Maglev tables */
#define LB_MAGLEV_CHUNKS	4096
#define LB_FIB_CACHE_BITS	10
#define LB_FIB_CACHE_SLOTS	(1 << LB_FIB_CACHE_BITS)

/* the translated flows (see struct lb4_ct_key) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_ct_key);
	__type(value, struct lb4_ct_entry);
	__uint(max_entries, LB_CT_MAX);
	__uint(pinning, LB_MAP_PINNING);
} lb4_ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb6_ct_key);
	__type(value, struct lb6_ct_entry);
	__uint(max_entries, LB_CT_MAX);
	__uint(pinning, LB_MAP_PINNING);
} lb6_ct SEC(".maps");

#ifndef LB_NAT_IN_CT
/* the SNAT translations, each a port's reservation (see struct lb4_ct_key) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_ct_key);
	__type(value, struct lb4_ct_entry);
	__uint(max_entries, LB_NAT_MAX);
	__uint(pinning, LB_MAP_PINNING);
} lb4_nat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb6_ct_key);
	__type(value, struct lb6_ct_entry);
	__uint(max_entries, LB_NAT_MAX);
	__uint(pinning, LB_MAP_PINNING);
} lb6_nat SEC(".maps");
#else
/*
 * LB_NAT_IN_CT: the layout of lbctl before lb*_nat (0.1.0 as released, with
 * issue 14): each SNAT translation in the CT map beside the flows, keyed the
 * same. Built only into bpf/.output/tests/nodeport_nat_in_ct.bpf.o for
 * test/e2e/nodeport-upgrade.ts, which runs it and upgrades to the standard
 * object under load: the agent moves the translations out.
 */
#define lb4_nat lb4_ct
#define lb6_nat lb6_ct
#endif

/* fragments: see struct lb4_frag_key */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_frag_key);
	__type(value, struct lb4_frag_ports);
	__uint(max_entries, LB_FRAG_MAX);
	__uint(pinning, LB_MAP_PINNING);
} lb4_frag SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb6_frag_key);
	__type(value, struct lb4_frag_ports);
	__uint(max_entries, LB_FRAG_MAX);
	__uint(pinning, LB_MAP_PINNING);
} lb6_frag SEC(".maps");

/* sessionAffinity ClientIP at tc: (client address, frontend) -> its backend */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_np_affinity_key);
	__type(value, struct lb_affinity_val);
	__uint(max_entries, LB_NP_AFFINITY_MAX);
	__uint(pinning, LB_MAP_PINNING);
} lb_np_affinity SEC(".maps");


/* ifindex -> the device's SNAT addresses; a backend routed out of one is remote */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb_device);
	__uint(max_entries, LB_DEVICES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LB_MAP_PINNING);
} lb_devices SEC(".maps");

/* the ports frontends have (LB_NP_F_PORTS): word index -> 64 ports' bits */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, LB_NP_PORT_WORDS);
	__uint(pinning, LB_MAP_PINNING);
} lb_np_ports SEC(".maps");

/*
 * The FIB's answers for established flows, per CPU (struct lb_fib_cache):
 * never pinned, each program its own, empty after a restart.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct lb_fib_cache);
	__uint(max_entries, LB_FIB_CACHE_SLOTS);
} lb_fib_cache SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lb_np_config);
	__uint(max_entries, 1);
	__uint(pinning, LB_MAP_PINNING);
} lb_np_config SEC(".maps");

/* (rev-NAT id, client prefix) -> allowed; value unused */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb4_src_range_key);
	__type(value, __u8);
	__uint(max_entries, LB_SRC_RANGE_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LB_MAP_PINNING);
} lb4_src_range SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb6_src_range_key);
	__type(value, __u8);
	__uint(max_entries, LB_SRC_RANGE_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LB_MAP_PINNING);
} lb6_src_range SEC(".maps");

/*
 * Maglev lookup tables, one per frontend served at tc (LB_SVC_F_MAGLEV in
 * its master entry; see enum lb_maglev_layout): lb_maglev_index maps the
 * frontend's rev-NAT id (| LB_MAGLEV_V6) to where its table is, lb_maglev a
 * chunk's number to an array of blocks. The agent builds each table (every
 * node the same, from the backends' addresses) and writes it in place; a new
 * table is written before its index entry, and its slots are reused only
 * long after its frontend left. A packet may see a table half rewritten for
 * a moment: every id it names is a live backend's.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb_maglev_row);
	__uint(max_entries, LB_MAGLEV_MAX);
	__uint(pinning, LB_MAP_PINNING);
} lb_maglev_index SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, LB_MAGLEV_CHUNKS);
	__uint(pinning, LB_MAP_PINNING);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_ARRAY);
		__uint(key_size, sizeof(__u32));
		__uint(value_size, sizeof(struct lb_maglev_block));
		__uint(max_entries, 1024); /* the template's; BPF_F_INNER_MAP lets chunks have any */
		__uint(map_flags, BPF_F_INNER_MAP);
	});
} lb_maglev SEC(".maps");

#endif /* __NP_MAPS_H */
