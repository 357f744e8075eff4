/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Direct server return (--nodeport-mode dsr|hybrid): how the node a client
 * reached tells a remote backend's node which frontend the flow was for.
 *
 * The frontend (address and port, as the client sent them) rides in the
 * packet itself, as Cilium's default DSR dispatch carries it: an IPv4
 * option (8 bytes) or an IPv6 Destination Options header (24 bytes) right
 * after the fixed IP header. Chosen over IPIP/IP6IP6 (Katran's, Cilium's
 * dispatch=ipip): no tunnel device or decapsulation on the backend's node,
 * the backend's node and the pod see the client's own address as the
 * source, the packet grows by 8/24 bytes instead of 20/40, and the
 * transport checksum does not change (neither header is in its pseudo
 * header). The option is on every packet of the flow, not only the first:
 * the backend's node needs no state from before its own restart, nor does
 * an LRU eviction there lose a flow.
 *
 * Unknown to every stack on the way, both are passed over: Linux ignores an
 * IPv4 option it does not know on a packet it receives or forwards, and an
 * IPv6 destination option whose type has the two high bits 00 is skipped
 * (RFC 8200 4.2). Only wire formats here; the code is bpf/nodeport.c's.
 */
#ifndef __LB_DSR_H
#define __LB_DSR_H

#include <linux/types.h>

/*
 * IPv4: copied (set in every fragment), class 0, number 26: 0x9a, the type
 * Cilium's DSR uses; the length counts the type and length bytes.
 */
#define LB_DSR_OPT4_TYPE	0x9a

struct lb_dsr_opt4 {
	__u8 type;		/* LB_DSR_OPT4_TYPE */
	__u8 len;		/* sizeof(struct lb_dsr_opt4) */
	__be16 port;		/* the frontend's port */
	__be32 addr;		/* the frontend's address */
};

/* IPv6: a destination option of type 0x1b (skipped where unknown), Cilium's too. */
#define LB_DSR_OPT6_TYPE	0x1b

struct lb_dsr_opt6 {
	__u8 nexthdr;		/* the header after it (the transport's) */
	__u8 hdrlen;		/* 8-octet units after the first: 2 */
	__u8 type;		/* LB_DSR_OPT6_TYPE */
	__u8 len;		/* the option's data: 20 (address, port, 2 bytes of padding) */
	__be32 addr[4];		/* the frontend's address */
	__be16 port;		/* the frontend's port */
	__u8 pad[2];
};

#define LB_DSR_OPT4_LEN		sizeof(struct lb_dsr_opt4)
#define LB_DSR_OPT6_LEN		sizeof(struct lb_dsr_opt6)
#define LB_DSR_OPT6_HDRLEN	(LB_DSR_OPT6_LEN / 8 - 1)
#define LB_DSR_OPT6_DATALEN	(LB_DSR_OPT6_LEN - 4)

_Static_assert(sizeof(struct lb_dsr_opt4) == 8, "lb_dsr_opt4 size");
_Static_assert(sizeof(struct lb_dsr_opt6) == 24, "lb_dsr_opt6 size");

#endif /* __LB_DSR_H */
