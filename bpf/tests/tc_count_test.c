// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* A tc program that counts the packets it sees and lets them pass: proves a
 * tc or tcx attachment runs (test/native/tc.ts). */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} tc_packets SEC(".maps");

static __always_inline int count(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&tc_packets, &zero);

	if (n)
		__sync_fetch_and_add(n, 1);
	return TC_ACT_UNSPEC;
}

SEC("tc")
int count_packets(struct __sk_buff *skb)
{
	return count();
}

/* Someone else's program whose name shares lbctl's first 15 characters
 * (lb_nodeport_ing), all the kernel keeps of a program's name: only its BTF
 * tells it from lbctl's lb_nodeport_ingress (test/native/tc.ts, and the
 * clsact tests of test/e2e/nodeport-restart.ts). */
SEC("tc")
int lb_nodeport_ingest(struct __sk_buff *skb)
{
	return count();
}
