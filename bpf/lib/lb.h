/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Service, slot and backend lookups shared by the socket and tc datapaths. */
#ifndef __LB_LIB_H
#define __LB_LIB_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "../include/lb_maps.h"

static __always_inline void lb_count(__u32 metric)
{
	__u64 *cnt = bpf_map_lookup_elem(&lb_metrics, &metric);

	if (cnt)
		*cnt += 1; /* per-CPU slot: no atomics needed */
}

static __always_inline bool lb_svc_has_backends(const struct lb_service *svc)
{
	return svc->count > 0;
}

static __always_inline bool lb_svc_has_affinity(const struct lb_service *svc)
{
	return svc->flags & LB_SVC_F_AFFINITY;
}

static __always_inline bool lb_svc_has_two_scopes(const struct lb_service *svc)
{
	return svc->flags & LB_SVC_F_TWO_SCOPES;
}

static __always_inline bool lb_svc_is_nodeport(const struct lb_service *svc)
{
	return svc->type == LB_SVC_NODEPORT;
}

/* Selectable slot in 1..count; count must be > 0. */
static __always_inline __u16 lb_select_slot(const struct lb_service *svc)
{
	return (bpf_get_prandom_u32() % svc->count) + 1;
}

static __always_inline __u64 lb_now_sec(void)
{
	return bpf_ktime_get_ns() / 1000000000ULL;
}

/*
 * The slot a client stuck to, if its entry in `map` (lb_affinity at the
 * socket layer, lb_np_affinity at tc) is fresh and the slot is still
 * selectable; the caller still checks the slot names the same backend.
 */
static __always_inline struct lb_affinity_val *
lb_affinity_get(void *map, const void *akey, const struct lb_service *svc, __u64 now)
{
	struct lb_affinity_val *aval = bpf_map_lookup_elem(map, akey);

	if (!aval || now - aval->last_used > svc->affinity_timeout)
		return NULL;
	if (aval->slot < 1 || aval->slot > svc->count)
		return NULL;
	return aval;
}

static __always_inline void lb_affinity_put(void *map, const void *akey, __u32 backend_id, __u16 slot, __u64 now)
{
	struct lb_affinity_val aval = { .last_used = now, .backend_id = backend_id, .slot = slot };

	bpf_map_update_elem(map, akey, &aval, BPF_ANY);
}

static __always_inline struct lb_service *lb4_lookup_service(struct lb4_key *key)
{
	key->backend_slot = 0;
	return bpf_map_lookup_elem(&lb4_services, key);
}

/*
 * What a client on the node (a socket of the node or of its pods) gets for
 * the master entry `svc` found at `key`: a frontend with two scopes is
 * served from its internal-scope twin, whose slots follow
 * internalTrafficPolicy, while the external entry keeps the node-local
 * backends externalTrafficPolicy Local gives clients from outside. key->scope
 * is left on the entry returned, so slot lookups follow it. A twin missing
 * while its master is being written or removed leaves the external entry in
 * use: the node-local backends, never a packet to the frontend's address.
 * Without the flag this is one flag test and no lookup.
 */
static __always_inline struct lb_service *lb4_client_view(struct lb4_key *key, struct lb_service *svc)
{
	struct lb_service *twin;

	if (!lb_svc_has_two_scopes(svc))
		return svc;
	key->scope = LB_SCOPE_INT;
	twin = lb4_lookup_service(key);
	if (twin)
		return twin;
	key->scope = LB_SCOPE_EXT;
	return svc;
}

/* Whether `svc` (found at `key`) or, with two scopes, its twin carries rev-NAT id `id`. */
static __always_inline bool lb4_frontend_has_revnat(struct lb4_key *key, const struct lb_service *svc, __u32 id)
{
	if (svc->rev_nat_index == id)
		return true;
	if (!lb_svc_has_two_scopes(svc))
		return false;
	key->scope = LB_SCOPE_INT;
	svc = lb4_lookup_service(key);
	key->scope = LB_SCOPE_EXT;
	return svc && svc->rev_nat_index == id;
}

/* An address of this node (lb_node_addrs, written by the agent). */
static __always_inline bool lb4_is_node_addr(__be32 addr)
{
	struct lb_node_addr_key k = { .address = { addr }, .family = 4 };

	return bpf_map_lookup_elem(&lb_node_addrs, &k) != NULL;
}

/*
 * The NodePort surrogate (address 0.0.0.0) for key's port and protocol, in
 * the external scope; NULL unless it is a NodePort entry. key->address is
 * left at 0 on a hit and restored on a miss. The caller decides whether the
 * destination is one the surrogate answers on.
 */
static __always_inline struct lb_service *lb4_lookup_surrogate(struct lb4_key *key)
{
	__be32 dst = key->address;
	struct lb_service *svc;

	key->address = 0;
	key->scope = LB_SCOPE_EXT;
	svc = lb4_lookup_service(key);
	if (svc && lb_svc_is_nodeport(svc))
		return svc;
	key->address = dst;
	return NULL;
}

/*
 * The address-only entry every service address has: a hit means "known
 * service address, port in use by no service" and the caller refuses.
 */
static __always_inline struct lb_service *lb4_lookup_wildcard(const struct lb4_key *key)
{
	struct lb4_key wild = { .address = key->address };

	return bpf_map_lookup_elem(&lb4_services, &wild);
}

/* The backend in `slot` of the frontend `key`; *backend_id is set from the slot. */
static __always_inline struct lb4_backend *lb4_slot_backend(struct lb4_key *key, __u16 slot, __u32 *backend_id)
{
	struct lb_service *entry;

	key->backend_slot = slot;
	entry = bpf_map_lookup_elem(&lb4_services, key);
	key->backend_slot = 0;
	if (!entry)
		return NULL;
	*backend_id = entry->backend_id;
	return bpf_map_lookup_elem(&lb4_backends, backend_id);
}

/*
 * A backend for a new socket: the one this client (network namespace)
 * stuck to when the service has session affinity and the entry is valid,
 * else a random selectable one (remembered, under affinity).
 */
static __always_inline struct lb4_backend *
lb4_select_backend_in(struct lb4_key *key, const struct lb_service *svc, void *amap, const void *akey, __u32 *backend_id)
{
	struct lb_affinity_val *aval;
	struct lb4_backend *backend;
	__u64 now = 0;
	__u16 slot;

	if (lb_svc_has_affinity(svc)) {
		now = lb_now_sec();
		aval = lb_affinity_get(amap, akey, svc, now);
		if (aval) {
			backend = lb4_slot_backend(key, aval->slot, backend_id);
			if (backend && *backend_id == aval->backend_id) {
				aval->last_used = now;
				lb_count(LB_MTR_AFFINITY_HIT);
				return backend;
			}
		}
	}
	slot = lb_select_slot(svc);
	backend = lb4_slot_backend(key, slot, backend_id);
	if (backend && lb_svc_has_affinity(svc))
		lb_affinity_put(amap, akey, *backend_id, slot, now);
	return backend;
}

/* A socket's backend: under session affinity, the client is its network namespace. */
static __always_inline struct lb4_backend *
lb4_select_backend(struct lb4_key *key, const struct lb_service *svc, __u64 netns, __u32 *backend_id)
{
	struct lb_affinity_key akey = { .netns_cookie = netns, .rev_nat_index = svc->rev_nat_index, .family = 4 };

	return lb4_select_backend_in(key, svc, &lb_affinity, &akey, backend_id);
}

static __always_inline struct lb_service *lb6_lookup_service(struct lb6_key *key)
{
	key->backend_slot = 0;
	return bpf_map_lookup_elem(&lb6_services, key);
}

/* As lb4_client_view. */
static __always_inline struct lb_service *lb6_client_view(struct lb6_key *key, struct lb_service *svc)
{
	struct lb_service *twin;

	if (!lb_svc_has_two_scopes(svc))
		return svc;
	key->scope = LB_SCOPE_INT;
	twin = lb6_lookup_service(key);
	if (twin)
		return twin;
	key->scope = LB_SCOPE_EXT;
	return svc;
}

/* As lb4_frontend_has_revnat. */
static __always_inline bool lb6_frontend_has_revnat(struct lb6_key *key, const struct lb_service *svc, __u32 id)
{
	if (svc->rev_nat_index == id)
		return true;
	if (!lb_svc_has_two_scopes(svc))
		return false;
	key->scope = LB_SCOPE_INT;
	svc = lb6_lookup_service(key);
	key->scope = LB_SCOPE_EXT;
	return svc && svc->rev_nat_index == id;
}

static __always_inline bool lb6_is_node_addr(const __be32 *addr)
{
	/* every field spelled out: a partial initializer becomes a .rodata constant */
	struct lb_node_addr_key k = { .address = { addr[0], addr[1], addr[2], addr[3] }, .family = 6 };

	return bpf_map_lookup_elem(&lb_node_addrs, &k) != NULL;
}

/* As lb4_lookup_surrogate, at ::. */
static __always_inline struct lb_service *lb6_lookup_surrogate(struct lb6_key *key)
{
	__be32 dst[4];
	struct lb_service *svc;

	__builtin_memcpy(dst, key->address, sizeof(dst));
	__builtin_memset(key->address, 0, sizeof(key->address));
	key->scope = LB_SCOPE_EXT;
	svc = lb6_lookup_service(key);
	if (svc && lb_svc_is_nodeport(svc))
		return svc;
	__builtin_memcpy(key->address, dst, sizeof(dst));
	return NULL;
}

static __always_inline struct lb_service *lb6_lookup_wildcard(const struct lb6_key *key)
{
	struct lb6_key wild = {};

	__builtin_memcpy(wild.address, key->address, sizeof(wild.address));
	return bpf_map_lookup_elem(&lb6_services, &wild);
}

static __always_inline struct lb6_backend *lb6_slot_backend(struct lb6_key *key, __u16 slot, __u32 *backend_id)
{
	struct lb_service *entry;

	key->backend_slot = slot;
	entry = bpf_map_lookup_elem(&lb6_services, key);
	key->backend_slot = 0;
	if (!entry)
		return NULL;
	*backend_id = entry->backend_id;
	return bpf_map_lookup_elem(&lb6_backends, backend_id);
}

static __always_inline struct lb6_backend *
lb6_select_backend_in(struct lb6_key *key, const struct lb_service *svc, void *amap, const void *akey, __u32 *backend_id)
{
	struct lb_affinity_val *aval;
	struct lb6_backend *backend;
	__u64 now = 0;
	__u16 slot;

	if (lb_svc_has_affinity(svc)) {
		now = lb_now_sec();
		aval = lb_affinity_get(amap, akey, svc, now);
		if (aval) {
			backend = lb6_slot_backend(key, aval->slot, backend_id);
			if (backend && *backend_id == aval->backend_id) {
				aval->last_used = now;
				lb_count(LB_MTR_AFFINITY_HIT);
				return backend;
			}
		}
	}
	slot = lb_select_slot(svc);
	backend = lb6_slot_backend(key, slot, backend_id);
	if (backend && lb_svc_has_affinity(svc))
		lb_affinity_put(amap, akey, *backend_id, slot, now);
	return backend;
}

/* A socket's backend: under session affinity, the client is its network namespace. */
static __always_inline struct lb6_backend *
lb6_select_backend(struct lb6_key *key, const struct lb_service *svc, __u64 netns, __u32 *backend_id)
{
	struct lb_affinity_key akey = { .netns_cookie = netns, .rev_nat_index = svc->rev_nat_index, .family = 6 };

	return lb6_select_backend_in(key, svc, &lb_affinity, &akey, backend_id);
}

#endif /* __LB_LIB_H */
