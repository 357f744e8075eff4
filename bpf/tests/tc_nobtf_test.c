// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Built without -g (Makefile): a tc program loaded without BTF, named as
 * lbctl's ingress program. The kernel keeps 15 characters of its name and no
 * function name, so nothing whole says whose it is (test/native/tc.ts,
 * test/native/nodeport-load.ts). No maps: BTF-defined maps need BTF. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tc")
int lb_nodeport_ingress(struct __sk_buff *skb)
{
	return TC_ACT_UNSPEC;
}
