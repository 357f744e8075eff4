/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Address families and IPv6 address helpers, shared by every object
 * (bpf/sock.c, bpf/sock_destroy.c and their tests). No vmlinux.h and no libc
 * headers in BPF objects, so the two family numbers are defined here, once.
 */
#ifndef __LB_ADDR_H
#define __LB_ADDR_H

#include <stdbool.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define AF_INET		2
#define AF_INET6	10

/* ::ffff:a.b.c.d, as a dual-stack (AF_INET6) socket shows an IPv4 peer */
static __always_inline bool ip6_is_v4mapped(const __be32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0x0000ffff);
}

static __always_inline void ip6_copy(__be32 *dst, const __be32 *src)
{
	dst[0] = src[0];
	dst[1] = src[1];
	dst[2] = src[2];
	dst[3] = src[3];
}

static __always_inline bool ip6_equal(const __be32 *a, const __be32 *b)
{
	return ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3])) == 0;
}

#endif /* __LB_ADDR_H */
