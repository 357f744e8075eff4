// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * bpf/lib/sctp.h through BPF_PROG_TEST_RUN (test/bpf/sctp-csum.ts):
 *   test_sctp_ports   an Ethernet frame with IPv4 or IPv6 (no extension
 *                     headers) and SCTP: both ports rewritten to those in
 *                     sctp_test_ports, the CRC32c updated; TC_ACT_OK, or
 *                     TC_ACT_SHOT when the helper refused the packet
 *   test_sctp_first_chunk  the first chunk's type, or -1 (-2: not SCTP)
 *   test_crc32c_shift the bare arithmetic: 8 bytes after the Ethernet
 *                     header, v and nbytes (host order); returns
 *                     lb_crc32c_shift(v, nbytes)
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lib/sctp.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct sctp_test_ports {
	__be16 sport;
	__be16 dport;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sctp_test_ports);
} sctp_test_ports SEC(".maps");

/* The SCTP header's offset and the SCTP packet's length (from the IP header), or -1. */
static __always_inline int sctp_locate(struct __sk_buff *skb, __u32 *l4_off, __u32 *len)
{
	__u16 proto = bpf_ntohs(skb->protocol);

	if (proto == ETH_P_IP) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0 || ip.protocol != IPPROTO_SCTP || ip.ihl < 5)
			return -1;
		*l4_off = ETH_HLEN + ip.ihl * 4;
		*len = bpf_ntohs(ip.tot_len) - ip.ihl * 4;
		return 0;
	}
	if (proto == ETH_P_IPV6) {
		struct ipv6hdr ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0 || ip.nexthdr != IPPROTO_SCTP)
			return -1;
		*l4_off = ETH_HLEN + sizeof(ip);
		*len = bpf_ntohs(ip.payload_len);
		return 0;
	}
	return -1;
}

SEC("tc")
int test_sctp_ports(struct __sk_buff *skb)
{
	struct sctp_test_ports *want;
	struct lb_sctphdr h;
	__u32 zero = 0, l4_off, len;

	want = bpf_map_lookup_elem(&sctp_test_ports, &zero);
	if (!want || sctp_locate(skb, &l4_off, &len) < 0 ||
	    bpf_skb_load_bytes(skb, l4_off, &h, sizeof(h)) < 0)
		return TC_ACT_SHOT;
	if (lb_sctp_rewrite_port(skb, l4_off, len, 2, h.dest, want->dport) < 0 ||
	    lb_sctp_rewrite_port(skb, l4_off, len, 0, h.source, want->sport) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

SEC("tc")
int test_sctp_first_chunk(struct __sk_buff *skb)
{
	__u32 l4_off, len;

	if (sctp_locate(skb, &l4_off, &len) < 0)
		return -2;
	return lb_sctp_first_chunk(skb, l4_off, len);
}

SEC("tc")
int test_crc32c_shift(struct __sk_buff *skb)
{
	__u32 arg[2];

	if (bpf_skb_load_bytes(skb, ETH_HLEN, arg, sizeof(arg)) < 0)
		return 0;
	return lb_crc32c_shift(arg[0], arg[1] & 0xffff);
}
