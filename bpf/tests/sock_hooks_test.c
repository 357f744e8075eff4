// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Which cgroup socket hooks the kernel runs, per protocol: every sock_addr
 * and sock hook lbctl could use counts its calls by (hook, IP protocol) and
 * lets the syscall proceed untouched. test/e2e/sctp.ts attaches them all to
 * a child cgroup, runs SCTP (and a TCP control) clients there, and compares
 * the counts with what docs/kernels.md states per kernel. Never loaded by
 * the agent.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Index of each hook in the key; test/e2e/sctp.ts names them in this order. */
enum hook {
	H_CONNECT4, H_CONNECT6, H_SENDMSG4, H_SENDMSG6, H_RECVMSG4, H_RECVMSG6,
	H_GETPEERNAME4, H_GETPEERNAME6, H_GETSOCKNAME4, H_GETSOCKNAME6,
	H_BIND4, H_BIND6, H_POST_BIND4, H_POST_BIND6, H_SOCK_CREATE, H_SOCK_RELEASE,
};

struct hook_key {
	__u32 hook;
	__u32 proto;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct hook_key);
	__type(value, __u64);
} hook_calls SEC(".maps");

static __always_inline void count(__u32 hook, __u32 proto)
{
	struct hook_key k = { .hook = hook, .proto = proto };
	__u64 one = 1, *n;

	n = bpf_map_lookup_elem(&hook_calls, &k);
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&hook_calls, &k, &one, BPF_NOEXIST);
}

#define ADDR_HOOK(sec, name, hook)					\
	SEC(sec) int name(struct bpf_sock_addr *ctx)			\
	{								\
		count(hook, ctx->protocol);				\
		return 1;						\
	}
#define SOCK_HOOK(sec, name, hook)					\
	SEC(sec) int name(struct bpf_sock *sk)				\
	{								\
		count(hook, sk->protocol);				\
		return 1;						\
	}

ADDR_HOOK("cgroup/connect4", hooks_connect4, H_CONNECT4)
ADDR_HOOK("cgroup/connect6", hooks_connect6, H_CONNECT6)
ADDR_HOOK("cgroup/sendmsg4", hooks_sendmsg4, H_SENDMSG4)
ADDR_HOOK("cgroup/sendmsg6", hooks_sendmsg6, H_SENDMSG6)
ADDR_HOOK("cgroup/recvmsg4", hooks_recvmsg4, H_RECVMSG4)
ADDR_HOOK("cgroup/recvmsg6", hooks_recvmsg6, H_RECVMSG6)
ADDR_HOOK("cgroup/getpeername4", hooks_getpeername4, H_GETPEERNAME4)
ADDR_HOOK("cgroup/getpeername6", hooks_getpeername6, H_GETPEERNAME6)
ADDR_HOOK("cgroup/getsockname4", hooks_getsockname4, H_GETSOCKNAME4)
ADDR_HOOK("cgroup/getsockname6", hooks_getsockname6, H_GETSOCKNAME6)
ADDR_HOOK("cgroup/bind4", hooks_bind4, H_BIND4)
ADDR_HOOK("cgroup/bind6", hooks_bind6, H_BIND6)
SOCK_HOOK("cgroup/post_bind4", hooks_post_bind4, H_POST_BIND4)
SOCK_HOOK("cgroup/post_bind6", hooks_post_bind6, H_POST_BIND6)
SOCK_HOOK("cgroup/sock_create", hooks_sock_create, H_SOCK_CREATE)
SOCK_HOOK("cgroup/sock_release", hooks_sock_release, H_SOCK_RELEASE)
