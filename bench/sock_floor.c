// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The socket path's floor: the least a socket load balancer does for a
 * connect() to a ClusterIP. It looks the frontend up in lbctl's own
 * lb4_services (the master entry, slot 0), picks a random selectable slot,
 * looks the slot and its backend up, and rewrites the destination; nothing
 * else. No rev-NAT entry (so getpeername() and UDP replies would show the
 * backend), no counters, no refusals, no affinity, no NodePorts, no
 * sock_release program.
 *
 * bench/sock-floor.ts loads it over the maps the agent pinned (the same
 * N services, the same layout) and attaches it to a cgroup of its own, so
 * lbctl, this program and a direct connect are measured interleaved in one
 * world. Built by the bench (clang, into build/bench/), never loaded by the
 * agent.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "include/lb_types.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* lbctl's maps, reused by fd (bpf_map__reuse_fd): sizes come from the pins. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_key);
	__type(value, struct lb_service);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} lb4_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_backend);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} lb4_backends SEC(".maps");

SEC("cgroup/connect4")
int floor_connect4(struct bpf_sock_addr *ctx)
{
	volatile __u32 port = ctx->user_port;
	struct lb4_key key = {
		.address = ctx->user_ip4,
		.dport = (__be16)port,
		.proto = ctx->protocol,
	};
	struct lb4_backend *backend;
	struct lb_service *svc;

	svc = bpf_map_lookup_elem(&lb4_services, &key);
	if (!svc || !svc->count)
		return 1;
	key.backend_slot = (bpf_get_prandom_u32() % svc->count) + 1;
	svc = bpf_map_lookup_elem(&lb4_services, &key);
	if (!svc)
		return 1;
	backend = bpf_map_lookup_elem(&lb4_backends, &svc->backend_id);
	if (!backend)
		return 1;
	ctx->user_ip4 = backend->address;
	ctx->user_port = backend->port;
	return 1;
}
