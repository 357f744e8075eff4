// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Kernel feature probes: one program per feature lbctl needs or can use,
 * each with exactly the program type, attach type and helper its feature
 * names and nothing else. The agent loads them one at a time
 * (src/datapath/features.ts), so the kernel's verifier, not a version
 * number, says what this kernel can do; a refused program names the
 * missing feature. Nothing here is ever attached where traffic runs.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* For the map batch probe (BPF_MAP_UPDATE_BATCH, 5.6): the agent writes services in batches. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u32);
} probe_hash SEC(".maps");

/* The socket hooks of the ClusterIP datapath (bpf/sock.c). */
SEC("cgroup/connect4")
int probe_connect4(struct bpf_sock_addr *ctx) { return 1; }
SEC("cgroup/connect6")
int probe_connect6(struct bpf_sock_addr *ctx) { return 1; }
SEC("cgroup/sendmsg4")
int probe_sendmsg4(struct bpf_sock_addr *ctx) { return 1; }
SEC("cgroup/sendmsg6")
int probe_sendmsg6(struct bpf_sock_addr *ctx) { return 1; }
SEC("cgroup/recvmsg4")
int probe_recvmsg4(struct bpf_sock_addr *ctx) { return 1; }
SEC("cgroup/recvmsg6")
int probe_recvmsg6(struct bpf_sock_addr *ctx) { return 1; }
SEC("cgroup/getpeername4")
int probe_getpeername4(struct bpf_sock_addr *ctx) { return 1; }
SEC("cgroup/getpeername6")
int probe_getpeername6(struct bpf_sock_addr *ctx) { return 1; }
SEC("cgroup/sock_release")
int probe_sock_release(struct bpf_sock *sk) { return 1; }

/* Helpers those hooks call. */
SEC("cgroup/connect4")
int probe_socket_cookie(struct bpf_sock_addr *ctx)
{
	return bpf_get_socket_cookie(ctx) ? 1 : 1;
}

SEC("cgroup/sock_release")
int probe_release_cookie(struct bpf_sock *sk)
{
	return bpf_get_socket_cookie(sk) ? 1 : 1;
}

SEC("cgroup/connect4")
int probe_netns_cookie(struct bpf_sock_addr *ctx)
{
	return bpf_get_netns_cookie(ctx) ? 1 : 1;
}

/* Optional: refusals as ECONNREFUSED (5.18); without it they are EPERM. */
SEC("cgroup/connect4")
int probe_set_retval(struct bpf_sock_addr *ctx)
{
	bpf_set_retval(0);
	return 1;
}

/* A tc program, for the tc attach mode probe (tcx from 6.6, clsact before). */
SEC("tc")
int probe_tc(struct __sk_buff *skb) { return TC_ACT_OK; }
