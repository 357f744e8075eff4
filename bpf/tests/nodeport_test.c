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
