// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The tc datapath (bpf/nodeport.c) with its maps unpinned, for
 * BPF_PROG_TEST_RUN: test/bpf/nodeport-unit.ts fills the maps through the
 * generated codecs, runs lb_nodeport_ingress / lb_nodeport_egress on packets
 * it builds, and checks what comes out. Nothing here changes the programs.
 */
#define LB_MAP_PINNING LIBBPF_PIN_NONE
#include "../nodeport.c"

/*
 * The datapath's clock (np_now(): bpf_ktime_get_ns() in seconds) as the
 * return value, so the test can check a CT entry's expiry against it.
 */
SEC("tc")
int np_test_now(struct __sk_buff *skb)
{
	return (int)np_now();
}

/*
 * test/bpf/nodeport-nonlinear.ts: how much of each packet arriving on a
 * device sits in the skb's linear part (data_end - data) when tc sees it,
 * last packet first, so the test can show the datapath got its headers out
 * of the skb's pages. Attached before lb_nodeport_ingress; passes every
 * packet on.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} np_test_headlen SEC(".maps");

SEC("tc")
int np_test_record_headlen(struct __sk_buff *skb)
{
	__u32 zero = 0, len = skb->data_end - skb->data;

	bpf_map_update_elem(&np_test_headlen, &zero, &len, BPF_ANY);
	return TC_ACT_UNSPEC;
}

/*
 * test/bpf/nodeport-unit.ts: the mark a redirect leaves for the egress
 * program (NP_TC_INDEX_REDIRECTED), which a test run neither takes in its
 * context nor hands back: NP_TEST_MARKED + the verdict when the packet
 * leaves the program with the bit set. np_test_ingress_mark runs the
 * ingress program as it is; np_test_egress_marked the egress program on a
 * packet marked as a redirect would have left it.
 */
#define NP_TEST_MARKED 1000

SEC("tc")
int np_test_ingress_mark(struct __sk_buff *skb)
{
	int rc = np_ingress(skb);

	return (skb->tc_index & NP_TC_INDEX_REDIRECTED) ? NP_TEST_MARKED + rc : rc;
}

SEC("tc")
int np_test_egress_marked(struct __sk_buff *skb)
{
	int rc;

	skb->tc_index |= NP_TC_INDEX_REDIRECTED;
	rc = np_egress(skb);
	return (skb->tc_index & NP_TC_INDEX_REDIRECTED) ? NP_TEST_MARKED + rc : rc;
}
