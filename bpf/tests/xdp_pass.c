// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * For test/e2e/nodeport-xdp.ts: an XDP program that passes every frame,
 * attached to the veth peers that receive what lbctl's XDP program sends
 * (XDP_REDIRECT out of a veth reaches its peer only when the peer's NAPI
 * is on, which an XDP program there turns on; 5.13+ also turn it on with
 * GRO). A physical NIC needs nothing of the kind.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}
