/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * SCTP at tc: the common header, and the checksum update a port rewrite
 * needs. Self-contained: nothing here knows services, flows or the tc
 * datapath's other headers (bpf/lib/np.h).
 *
 * SCTP's checksum (RFC 9260 6.8, appendix A) is a CRC32c over the whole
 * SCTP packet, common header included with its checksum field as zero, and
 * no pseudo header: rewriting IP addresses (DNAT, SNAT, a family change,
 * an encapsulation) needs no L4 update at all; rewriting a port does.
 *
 * A port change is applied to the CRC incrementally, as the Internet
 * checksum's is (RFC 1624), instead of recomputing it over the packet:
 * the CRC without its initial value and final inversion is linear over
 * GF(2), so for two packets of the same length n that differ by D
 *
 *	crc(new) = crc(old) ^ lin(D)
 *
 * and when D is zero but for the bytes at offset o (a port: o = 0 or 2),
 * lin(D) = d * x^(8 * (n - o)) mod P, d those bytes' XOR as the CRC register
 * holds them (little-endian). x^(8 * m) mod P comes from a table of 512
 * constants: two multiplications for any SCTP packet (n < 2^16), whatever
 * its length, linear or not, and without reading its payload (zlib's
 * crc32_combine does the same).
 * Two properties a full recomputation lacks: a packet that arrived with a
 * bad CRC keeps a bad CRC (the receiver still drops it; netfilter verifies
 * before it rewrites for the same reason), and the cost does not grow with
 * the packet (a loop over 64 KiB costs the verifier every iteration on 5.10,
 * which has no bpf_loop: 5.17).
 *
 * The checksum field holds 0, and must be left so, when the CRC is not
 * computed yet: a packet of this host's own stack with CHECKSUM_PARTIAL
 * (the device, or skb_crc32c_csum_help() before it leaves, computes it
 * over the packet as it then is, the field included; veth offloads it,
 * so every SCTP packet between namespaces of one host is such a packet),
 * a GSO SCTP packet (segmented with GSO_BY_FRAGS, each segment's CRC
 * computed then), and an association that negotiated zero checksums
 * (RFC 9653). A tc program cannot read skb->ip_summed before 6.3
 * (bpf_cast_to_kern_ctx), so the field's value decides: a CRC that is
 * really 0 (one packet in 2^32) is then left stale and the packet dropped
 * by the receiver, as a corrupted one would be. CHECKSUM_UNNECESSARY (a
 * NIC verified the CRC) stays true after a correct update; a
 * CHECKSUM_COMPLETE skb's csum follows every byte stored here
 * (BPF_F_RECOMPUTE_CSUM).
 */
#ifndef __LB_SCTP_H
#define __LB_SCTP_H

#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef IPPROTO_SCTP
#define IPPROTO_SCTP	132
#endif

/* The common header (RFC 9260 3.1): ports where TCP and UDP keep theirs. */
struct lb_sctphdr {
	__be16 source;
	__be16 dest;
	__be32 vtag;		/* the verification tag: 0 only in an INIT */
	__le32 checksum;	/* CRC32c, stored little-endian (RFC 9260 appendix A) */
};

/* A chunk's header; the first chunk follows the common header. */
struct lb_sctp_chunkhdr {
	__u8 type;
	__u8 flags;
	__be16 length;
};

#define LB_SCTP_CSUM_OFF	8	/* offsetof(struct lb_sctphdr, checksum) */
#define LB_SCTP_HLEN		12

/* Chunk types a translation looks at (RFC 9260 3.2). */
#define LB_SCTP_CID_INIT		1
#define LB_SCTP_CID_INIT_ACK		2
#define LB_SCTP_CID_ABORT		6
#define LB_SCTP_CID_SHUTDOWN_COMPLETE	14

/* The longest SCTP packet whose CRC is updated: an IP payload's bound. */
#define LB_SCTP_LEN_MAX		0xffff

/* CRC32c's polynomial (Castagnoli), bit-reflected: x^0 is bit 31. */
#define LB_CRC32C_POLY		0x82f63b78U

/* The CRC register's value of `v` (4 bytes as stored in the packet). */
static __always_inline __u32 lb_crc32c_le32(__u32 v)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return v;
#else
	return __builtin_bswap32(v);
#endif
}

static __always_inline __u32 lb_crc32c_le16(__u16 v)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return v;
#else
	return __builtin_bswap16(v);
#endif
}

/*
 * a * b mod P, in the reflected representation (zlib's multmodp), without
 * branches: 64-bit words spare the verifier's and JIT's 32-bit zero
 * extensions, and the loop is unrolled eight bits at a time (half the
 * cost of a plain loop), inlined in lb_crc32c_shift() (a global function:
 * no frame of its own on the call chain, which 5.10 and 6.1 count against
 * 512 bytes of stack with the callers'). A bit selects with a multiplication, not with
 * `x & -bit`: the 6.18 verifier splits its state at an AND with a value in
 * [-1, 0], and 16 such ANDs between two jumps were 65,536 paths (refused:
 * a million instructions).
 */
static __always_inline __u32 lb_crc32c_mul(__u32 a32, __u32 b32)
{
	__u64 a = a32, b = b32, p = 0;
	int i;

#pragma unroll 8
	for (i = 31; i >= 0; i--) {
		p ^= b * ((a >> i) & 1);
		b = (b >> 1) ^ (LB_CRC32C_POLY * (b & 1));
	}
	return p;
}

/*
 * x^(8k) and x^(2048k) mod P, k = 0..255 (node scripts/sctp-crc-table.mjs
 * prints them; test/bpf/sctp-csum.ts checks each against real CRCs): with
 * them a shift by any length below 64 KiB is two multiplications.
 */
static const __u32 lb_crc32c_x8k[2][256] = {
	{ /* x^(8k) */
		0x80000000, 0x00800000, 0x00008000, 0x00000080, 0x82f63b78, 0xfbc3faf9, 0x8b277743, 0x52a0c93f,
		0x6ea2d55c, 0x1c08b7d6, 0xf56e0ef4, 0x34019664, 0xa66805eb, 0x7a1f6b24, 0xe75d06aa, 0xc94ec098,
		0x18b8ea18, 0x9a9f274a, 0x2a03aaa3, 0xb13145f8, 0x790606ff, 0xad045557, 0x8542ba6d, 0xde6b9d0b,
		0x9957c0a6, 0x8473058e, 0x2e0af75a, 0x3ae9f81c, 0x5d27e147, 0x95ec5eb6, 0x9421797f, 0x2f1f4950,
		0x510ac59a, 0xf91bdeea, 0x882b9bfc, 0xbea58b3e, 0x9c25531d, 0xafeaaeef, 0xbd8c7e90, 0x92157069,
		0x19e65dde, 0x7fb2b8d1, 0x21c7d010, 0x107f00bf, 0xec1631ed, 0x5cf4f2f8, 0x79ebc348, 0xcbdbaeb0,
		0xb2dea967, 0xb5be2920, 0x200830f7, 0x278403ae, 0x0e148e82, 0x63c35f01, 0xf208405c, 0x1c941d43,
		0x52377a55, 0x6486f9b5, 0x8780e02c, 0x6d79c1ee, 0x4f256efc, 0xbe6285cb, 0x5abaef7a, 0x1a20c6da,
		0xb82be955, 0x646ce526, 0x067805d3, 0xc0856a5a, 0x3a077781, 0x70a7bf0c, 0x4d33686f, 0x3f989c2e,
		0x8cfaa965, 0x54bb7dd7, 0x074d3e3d, 0x8fcc485c, 0x1ce9d94b, 0xd8ee5f5e, 0xfd858bab, 0x3b3f9b16,
		0x36c41f1c, 0x5d2bcca0, 0xa2169e6a, 0x0a86adc4, 0x041d3776, 0x573daed2, 0x32bfacf2, 0x1267a02e,
		0x8cd75659, 0x291bd649, 0x39e0dda6, 0x84d3b293, 0x817cdc51, 0xa3cf250c, 0x4de000f5, 0xc6d29b69,
		0x19b29a35, 0x050bef37, 0xe42c26b5, 0x87004af3, 0xe0b99ccb, 0x5ae43463, 0x72cc84a2, 0x430209d5,
		0xe661f7be, 0x1e8bac19, 0x68f2970f, 0x5e7bceb3, 0xa11bfaf3, 0xe09f877b, 0xe8f160b1, 0x409600aa,
		0xc9e90b9e, 0x3e19aa3b, 0xa954fb20, 0x2014da25, 0x156c8e18, 0x9a92f32e, 0x8c5fa30a, 0x6b6e779b,
		0x0b4a395b, 0xc8a73bd1, 0x2170c593, 0x81d97f26, 0x069db049, 0x39cf5bc0, 0xc3b4e99f, 0xcc7874da,
		0xb8fdb1e7, 0x37423140, 0x414c5f8d, 0x3d9f3bf4, 0x34c96751, 0xa37a90b7, 0x667c6cb2, 0x53487e52,
		0xb04de25a, 0x3a77bf09, 0x7888ac73, 0x62b02f55, 0x64b67ee0, 0xe3541e64, 0xa6bf5063, 0x7230dfc6,
		0xe55ef1f3, 0xe0dbc270, 0x71788fcf, 0x9def626f, 0x3f484024, 0xe7185181, 0x707aa02a, 0x4b2fdc46,
		0x6791d588, 0x0848f262, 0x80f5ab67, 0xb58c0222, 0xc133722b, 0xb9f51697, 0x46db6dea, 0x88945b4f,
		0x1fe0b5c3, 0xd0c23585, 0xb7d7ed51, 0xa3f98e3d, 0x8f68fcec, 0xaefc0f36, 0x16ec5256, 0x7792d169,
		0x1903da7f, 0x2f926bf3, 0xe0110eea, 0x8832912c, 0x6d76739f, 0xccd6b640, 0x41b7cb0a, 0x6ba39ff3,
		0xe0553f1e, 0xbcc62d77, 0xa5eef6cb, 0x5aa16309, 0x78e87aaf, 0xfc2061f8, 0x794b17db, 0x4a230187,
		0x56767c92, 0x73c5fa9c, 0xdf98f63d, 0x8f149d94, 0x55bd7f95, 0xa70c5574, 0xb6a5cf47, 0x9507dc98,
		0x18e4a304, 0xc78273bc, 0xff913f6a, 0x0adb2a65, 0x543d5c54, 0x96eb7090, 0x923e1767, 0xb59ec99e,
		0x3e65ddf9, 0x8be2d164, 0xa6d7e6ac, 0xefaead90, 0x924752ba, 0xd9651da3, 0xb1c2234f, 0x1fd9e3bb,
		0x2b830011, 0xe21ec76c, 0x2c674275, 0x44452753, 0x42316c00, 0x0042316c, 0x2c851e83, 0x918a4d92,
		0x730206ad, 0x1d10fb73, 0x62d5b702, 0xe159a540, 0x419a4419, 0x68ad86e7, 0x37926177, 0xa565a287,
		0x56993a31, 0xc2de5388, 0x08edbde4, 0x24a2d2b8, 0x38e888d4, 0x14719e3c, 0x7db4f7ff, 0xad00e7a6,
		0x844752a9, 0xda7d2938, 0xbae06c57, 0x85555e54, 0x963a1892, 0x7305b6f8, 0x79c4320c, 0x4d3a0be2,
		0x0246e2e6, 0xc5930910, 0x109b5466, 0x4777efde, 0x7fec2963, 0x72e98cbf, 0xec74a761, 0x934164c6,
		0xe5bf8048, 0xcb47faf3, 0xe0f5db7b, 0xe8f10aed, 0x5cf015c3, 0xd0812525, 0x159c1be7, 0x37ef50ea,
	},
	{ /* x^(2048k) */
		0x80000000, 0x88e56f72, 0x74c360a4, 0x631bb273, 0xe4172b16, 0x71892b1b, 0x835305c9, 0x196b1eae,
		0x0d65762a, 0xafc81338, 0xb5a50ab7, 0xf373c3ac, 0x5f60970f, 0xd46d3063, 0x3a5275ea, 0x02331c01,
		0x35d73a62, 0x2600ffa6, 0xf65e86d6, 0x68e46ea2, 0x8eeafe04, 0xaca289d5, 0x84e3f8c8, 0xda17456b,
		0x481bee08, 0xa8b4118b, 0x59f4852c, 0x717a8910, 0xefcf4f49, 0xecbbe106, 0xda1c4087, 0xdc2ced79,
		0x28461564, 0xeccb4578, 0x6d8f49d8, 0x9b7ad6c5, 0xce2c905d, 0xa32be27a, 0xde8a8e12, 0x8c117538,
		0x8778fbde, 0xd8c96934, 0x9b9e9037, 0xafc0eb67, 0x8a898a05, 0x6e971abe, 0x186d1391, 0xc2d95be8,
		0x43eefc9f, 0xb8868422, 0xde5a3422, 0x2082707c, 0x456ea1c5, 0x3ed57030, 0x3b1d89ea, 0xb158055f,
		0xba8dd573, 0xbd9b04e0, 0x86162060, 0xc9f6cbf5, 0x9714afd1, 0xe45901d7, 0x5282b1be, 0xd847ebfd,
		0xbf455269, 0xb031d46e, 0x1409a35b, 0x9dfd8341, 0xa335d306, 0x68e38fb7, 0x2144743e, 0xbcf65005,
		0x57ac1403, 0x0cfe7f1c, 0x0f121b5e, 0xecb4c29e, 0x80295058, 0x20f3da38, 0xb6afd2ff, 0x778fcc50,
		0x5edcdeb9, 0x187953cc, 0x7479c4c7, 0xed137dd7, 0x087ff103, 0xa3b2a824, 0xa6b9d5fb, 0xfb260ce6,
		0x0cebb5b1, 0x35045674, 0x209c6e45, 0x2e7b0cec, 0x22c5adcc, 0x88c913f0, 0x208e2ea9, 0x4bd8d801,
		0x65059450, 0xb76e2d72, 0xb9e80571, 0x0788eab5, 0x78d4b491, 0xd578ef9e, 0x50a06c86, 0x8d34099a,
		0x0d69c0ac, 0x16e43bc4, 0x36c9680c, 0xb06470d4, 0xa22ceb86, 0x1137a0bd, 0xb041c5a6, 0x8d92f930,
		0x4e6f41a4, 0x8ee01bfc, 0xa71bd31a, 0x088ca01f, 0xd3e49f36, 0xcc9e356a, 0x3644c1b4, 0xa03f4f11,
		0x2e7776e1, 0xa2fdc76c, 0x346f98da, 0xf40277fe, 0x6381067f, 0x80ed08da, 0xec3fda46, 0x1a8124d4,
		0xe2ea32dc, 0x8f5302d6, 0x1c2f57d2, 0xbb78612e, 0x05f6b022, 0x88317045, 0xe426ba19, 0xadd38f2b,
		0x504a4b48, 0x3a0b2256, 0xf67036b8, 0xb2a1474b, 0x3829b75e, 0x4746bb56, 0x2364630b, 0xd0394222,
		0xf5b95b32, 0x29e89c99, 0xbf0c695a, 0xbd1488dc, 0x7de96c1b, 0x6964405e, 0x20766722, 0x02b36975,
		0xbd0d968d, 0x22a0cd12, 0x0839f3ed, 0xd73e4ac8, 0x85b7f30f, 0x9f3722be, 0xa20285ee, 0xfe7530cd,
		0x695a4c87, 0x448e7bda, 0x96b1761e, 0x9447b8ff, 0x0385a49d, 0xc71e1e96, 0xfbfa074f, 0xa2ccde30,
		0xa74fc7bd, 0x0212ecfe, 0x94923908, 0x01d9badb, 0x9548f5f8, 0x6bf1bbe5, 0x5d91d42c, 0x7c7016b8,
		0xf204502c, 0x31911140, 0x68645de4, 0x0a2cf292, 0x323e42ec, 0x67c226c5, 0x5b575c57, 0x1ceb6eb0,
		0x4cccbb63, 0x86be4c0b, 0xc6b7c3bc, 0x9c6e7cf1, 0xc534a11c, 0xad653be3, 0x275ebea9, 0xab3620bc,
		0x9a4f01b6, 0xf8cd9b71, 0xc3c0ad48, 0x737faaf8, 0xfb51cf31, 0x7db26281, 0xda347829, 0xcf21e0b7,
		0xc73054ad, 0xab23597f, 0x0320b658, 0x774b30fe, 0xa66a47c4, 0x6f2a1385, 0x3c884fa0, 0x9441fdfb,
		0x941a0916, 0xf8e7d20a, 0x951e116b, 0x9c5c8fdb, 0xde0a51de, 0x46760adc, 0x33764417, 0xd44c2980,
		0x4b4eec48, 0xa4d0f239, 0xccd68c23, 0xf244c119, 0xe29278a3, 0xb7a8320b, 0xe2b3b949, 0xea7f1c7b,
		0x4303cb97, 0x168d4703, 0xb8d9ec73, 0xa29ef54f, 0x9a80cc59, 0x2604c3ea, 0x8b662cc9, 0xd5453e55,
		0xa98112a7, 0x5f369ea5, 0xee7d1674, 0xa4f34d2d, 0xa41aaa68, 0x089d6d00, 0x66ac1f55, 0x6d98601a,
		0x4c3d3d65, 0xd860d327, 0xb3091735, 0x4610220e, 0x13c6ed5f, 0xee604a48, 0x4a39e877, 0xc2850474,
		0x9049aab7, 0xa7a82bae, 0xfa2b26d8, 0x9ad84164, 0x4d227ac3, 0x9d5073df, 0x05f3f11e, 0x73411e5c,
	},
};

/*
 * v * x^(8 * nbytes) mod P: what `v` in the CRC register becomes after
 * nbytes zero bytes; nbytes < 2^16. A global function: the verifier checks
 * it once, whatever calls it, on every kernel from 5.6.
 */
__noinline __u32 lb_crc32c_shift(__u32 v, __u32 nbytes)
{
	__u32 lo = nbytes & 0xff, hi = (nbytes >> 8) & 0xff;

	if (lo)
		v = lb_crc32c_mul(lb_crc32c_x8k[0][lo], v);
	if (hi)
		v = lb_crc32c_mul(lb_crc32c_x8k[1][hi], v);
	return v;
}

/*
 * The type of the first chunk of the SCTP packet at `l4_off`, `len` bytes
 * long, or -1 when it has none. A new association starts with an INIT
 * (alone in its packet, verification tag 0); ABORT and SHUTDOWN COMPLETE
 * end one: what a SYN, an RST and the last ACK are to TCP's connection
 * tracking.
 */
static __always_inline int lb_sctp_first_chunk(struct __sk_buff *skb, __u32 l4_off, __u32 len)
{
	struct lb_sctp_chunkhdr c;

	if (len < LB_SCTP_HLEN + sizeof(c) || bpf_skb_load_bytes(skb, l4_off + LB_SCTP_HLEN, &c, sizeof(c)) < 0)
		return -1;
	return c.type;
}

/*
 * Rewrites a port of the SCTP packet at `l4_off` (`which`: 0 source, 2
 * destination), `len` bytes long from its common header to the end of the
 * IP payload (from the IP header's length: never skb->len, which can carry
 * a frame's padding), and updates its CRC32c to match. 0, or -1 when the
 * packet cannot be read or written or `len` is out of range. The packet
 * may be non-linear: only its common header is read and written.
 */
static __always_inline int lb_sctp_rewrite_port(struct __sk_buff *skb, __u32 l4_off, __u32 len, __u32 which,
						 __be16 old, __be16 new)
{
	__u32 csum;

	if (old == new)
		return 0;
	if (len < LB_SCTP_HLEN || len > LB_SCTP_LEN_MAX || which > 2)
		return -1;
	if (bpf_skb_load_bytes(skb, l4_off + LB_SCTP_CSUM_OFF, &csum, sizeof(csum)) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, l4_off + which, &new, sizeof(new), BPF_F_RECOMPUTE_CSUM) < 0)
		return -1;
	/* 0: not computed yet (CHECKSUM_PARTIAL, GSO) or not used (RFC 9653): left for whoever computes it */
	if (!csum)
		return 0;
	csum ^= lb_crc32c_le32(lb_crc32c_shift(lb_crc32c_le16((__u16)(old ^ new)), len - which));
	return bpf_skb_store_bytes(skb, l4_off + LB_SCTP_CSUM_OFF, &csum, sizeof(csum), BPF_F_RECOMPUTE_CSUM);
}

#endif /* __LB_SCTP_H */
