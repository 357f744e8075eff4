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

static __always_inline bool lb_svc_is_wildcard(const struct lb_service *svc)
{
	return svc->type == LB_SVC_WILDCARD;
}

static __always_inline bool lb_svc_has_backends(const struct lb_service *svc)
{
	return svc->count > 0;
}

/* Selectable slot in 1..count; count must be > 0. */
static __always_inline __u16 lb_select_slot(const struct lb_service *svc)
{
	return (bpf_get_prandom_u32() % svc->count) + 1;
}

static __always_inline struct lb_service *lb4_lookup_service(struct lb4_key *key)
{
	key->backend_slot = 0;
	return bpf_map_lookup_elem(&lb4_services, key);
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

static __always_inline struct lb4_backend *
lb4_select_backend(struct lb4_key *key, const struct lb_service *svc, __u32 *backend_id)
{
	struct lb_service *slot;

	key->backend_slot = lb_select_slot(svc);
	slot = bpf_map_lookup_elem(&lb4_services, key);
	key->backend_slot = 0;
	if (!slot)
		return NULL;
	*backend_id = slot->backend_id;
	return bpf_map_lookup_elem(&lb4_backends, backend_id);
}

static __always_inline struct lb_service *lb6_lookup_service(struct lb6_key *key)
{
	key->backend_slot = 0;
	return bpf_map_lookup_elem(&lb6_services, key);
}

static __always_inline struct lb_service *lb6_lookup_wildcard(const struct lb6_key *key)
{
	struct lb6_key wild = {};

	__builtin_memcpy(wild.address, key->address, sizeof(wild.address));
	return bpf_map_lookup_elem(&lb6_services, &wild);
}

static __always_inline struct lb6_backend *
lb6_select_backend(struct lb6_key *key, const struct lb_service *svc, __u32 *backend_id)
{
	struct lb_service *slot;

	key->backend_slot = lb_select_slot(svc);
	slot = bpf_map_lookup_elem(&lb6_services, key);
	key->backend_slot = 0;
	if (!slot)
		return NULL;
	*backend_id = slot->backend_id;
	return bpf_map_lookup_elem(&lb6_backends, backend_id);
}

#endif /* __LB_LIB_H */
