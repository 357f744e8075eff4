// Ethernet frames for BPF_PROG_TEST_RUN: IPv4 and IPv6 (with extension
// headers), TCP and UDP with correct checksums, IPv4 and IPv6 fragments, ARP, an
// ICMPv6 neighbour solicitation, ICMP echo requests and ICMP/ICMPv6 errors
// quoting a packet; and a parser that reads a frame back (an ICMP error's
// quoted packet too) and says whether its IPv4 header, transport and ICMP
// checksums are valid. Addresses are strings ('10.0.0.5', 'fd00::1') and
// MACs 'aa:bb:cc:dd:ee:ff'.
import ipaddr from 'ipaddr.js';

export const ETH_P_IP = 0x0800;
export const ETH_P_ARP = 0x0806;
export const ETH_P_IPV6 = 0x86dd;
export const IPPROTO_ICMP = 1;
export const IPPROTO_TCP = 6;
export const IPPROTO_UDP = 17;
export const IPPROTO_ICMPV6 = 58;
export const NEXTHDR_HOP = 0;
export const NEXTHDR_ROUTING = 43;
export const NEXTHDR_FRAGMENT = 44;
export const NEXTHDR_AUTH = 51;
export const NEXTHDR_DEST = 60;

// ICMP (RFC 792) and ICMPv6 (RFC 4443) types and codes the tests use.
export const ICMP_DEST_UNREACH = 3;
export const ICMP_PORT_UNREACH = 3;
export const ICMP_FRAG_NEEDED = 4;
export const ICMP_TIME_EXCEEDED = 11;
export const ICMP_ECHO = 8;
export const ICMPV6_DEST_UNREACH = 1;
export const ICMPV6_PORT_UNREACH = 4;
export const ICMPV6_PKT_TOOBIG = 2;
export const ICMPV6_ECHO_REQUEST = 128;

export const TCP_FIN = 0x01;
export const TCP_SYN = 0x02;
export const TCP_RST = 0x04;
export const TCP_PSH = 0x08;
export const TCP_ACK = 0x10;

const ETH_HLEN = 14;

export function mac(s: string): Buffer {
  const b = Buffer.from(s.split(':').map((x) => parseInt(x, 16)));
  if (b.length !== 6) throw new RangeError(`not a MAC address: ${s}`);
  return b;
}

export function macString(b: Buffer): string {
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');
}

/** An IPv4 address as the number the codecs take for a __be32 field. */
export function ip4(s: string): number {
  return Buffer.from(ipaddr.IPv4.parse(s).toByteArray()).readUInt32BE(0);
}

export function ip4String(n: number): string {
  return ipaddr.fromByteArray([...u32be(n)]).toString();
}

/** An IPv6 address as its 16 bytes (what the codecs take for __be32[4]). */
export function ip6(s: string): Buffer {
  return Buffer.from(ipaddr.IPv6.parse(s).toByteArray());
}

export function ip6String(b: Buffer): string {
  return (ipaddr.fromByteArray([...b]) as ipaddr.IPv6).toRFC5952String();
}

function u32be(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0);
  return b;
}

function addrBytes(s: string): Buffer {
  return s.includes(':') ? ip6(s) : u32be(ip4(s));
}

// ---- the Internet checksum (RFC 1071)

/** The ones' complement sum of `b` as 16-bit big-endian words (odd length: zero padded), unfolded. */
export function onesSum(b: Buffer, initial = 0): number {
  let sum = initial;
  for (let i = 0; i + 1 < b.length; i += 2) sum += b.readUInt16BE(i);
  if (b.length % 2) sum += b[b.length - 1]! << 8;
  return sum;
}

function fold(sum: number): number {
  while (sum > 0xffff) sum = (sum & 0xffff) + Math.floor(sum / 0x10000);
  return sum;
}

/** The checksum of `b` (its own checksum field zero), starting from a partial sum. */
export function checksum(b: Buffer, initial = 0): number {
  return ~fold(onesSum(b, initial)) & 0xffff;
}

/** The pseudo header's sum for a transport segment of `len` bytes. */
function pseudoSum(src: Buffer, dst: Buffer, proto: number, len: number): number {
  if (src.length === 4) return onesSum(Buffer.concat([src, dst, Buffer.from([0, proto]), u16be(len)]));
  const lenb = Buffer.alloc(4);
  lenb.writeUInt32BE(len);
  return onesSum(Buffer.concat([src, dst, lenb, Buffer.from([0, 0, 0, proto])]));
}

function u16be(n: number): Buffer {
  const b = Buffer.alloc(2);
  b.writeUInt16BE(n);
  return b;
}

// ---- builders

export interface L4Spec {
  proto: 'tcp' | 'udp';
  sport: number;
  dport: number;
  /** TCP flags (default SYN) */
  flags?: number;
  seq?: number;
  payload?: Buffer;
  /** UDP: send without a checksum (0), as IPv4 allows */
  zeroChecksum?: boolean;
}

export interface FrameSpec extends L4Spec {
  src: string;
  dst: string;
  srcMac?: string;
  dstMac?: string;
  /** IPv4 TTL or IPv6 hop limit (default 64) */
  ttl?: number;
  /** IPv4 identification */
  id?: number;
  /** IPv4: set DF (don't fragment), as senders doing path MTU discovery do */
  df?: boolean;
  /** IPv6: extension headers before the transport header, outermost first */
  ext?: Array<{ type: number; body?: Buffer }>;
  /** IPv4: header options (padded with end-of-options to a multiple of 4 bytes; at most 40) */
  options?: Buffer;
}

const DEFAULT_SRC_MAC = '02:00:00:00:00:fe';
const DEFAULT_DST_MAC = '02:00:00:00:01:01';

/** A transport segment with its checksum over the given pseudo-header addresses. */
export function l4Segment(spec: L4Spec, src: string, dst: string): Buffer {
  const payload = spec.payload ?? Buffer.from('lbctl');
  const proto = spec.proto === 'tcp' ? IPPROTO_TCP : IPPROTO_UDP;
  let seg: Buffer;
  let csumOff: number;
  if (spec.proto === 'tcp') {
    seg = Buffer.alloc(20 + payload.length);
    seg.writeUInt16BE(spec.sport, 0);
    seg.writeUInt16BE(spec.dport, 2);
    seg.writeUInt32BE(spec.seq ?? 1000, 4);
    seg.writeUInt32BE((spec.flags ?? TCP_SYN) & TCP_ACK ? 2000 : 0, 8);
    seg[12] = 5 << 4;
    seg[13] = spec.flags ?? TCP_SYN;
    seg.writeUInt16BE(65535, 14);
    payload.copy(seg, 20);
    csumOff = 16;
  } else {
    seg = Buffer.alloc(8 + payload.length);
    seg.writeUInt16BE(spec.sport, 0);
    seg.writeUInt16BE(spec.dport, 2);
    seg.writeUInt16BE(seg.length, 4);
    payload.copy(seg, 8);
    csumOff = 6;
  }
  if (!spec.zeroChecksum) {
    let c = checksum(seg, pseudoSum(addrBytes(src), addrBytes(dst), proto, seg.length));
    if (c === 0 && spec.proto === 'udp') c = 0xffff;
    seg.writeUInt16BE(c, csumOff);
  }
  return seg;
}

function eth(type: number, srcMac = DEFAULT_SRC_MAC, dstMac = DEFAULT_DST_MAC): Buffer {
  return Buffer.concat([mac(dstMac), mac(srcMac), u16be(type)]);
}

export interface Ip4HeaderSpec {
  src: string;
  dst: string;
  proto: number;
  payloadLen: number;
  ttl?: number;
  id?: number;
  /** DF (don't fragment) */
  df?: boolean;
  moreFragments?: boolean;
  /** fragment offset in 8-byte units */
  fragOffset?: number;
  /** header options, padded to a multiple of 4 bytes (ihl above 5) */
  options?: Buffer;
}

export function ip4Header(h: Ip4HeaderSpec): Buffer {
  const optLen = Math.ceil((h.options?.length ?? 0) / 4) * 4;
  if (optLen > 40) throw new RangeError(`IPv4 options of ${optLen} bytes: at most 40`);
  const b = Buffer.alloc(20 + optLen);
  b[0] = 0x40 | (b.length / 4);
  h.options?.copy(b, 20);
  b.writeUInt16BE(b.length + h.payloadLen, 2);
  b.writeUInt16BE(h.id ?? 0x1234, 4);
  b.writeUInt16BE((h.df ? 0x4000 : 0) | (h.moreFragments ? 0x2000 : 0) | (h.fragOffset ?? 0), 6);
  b[8] = h.ttl ?? 64;
  b[9] = h.proto;
  u32be(ip4(h.src)).copy(b, 12);
  u32be(ip4(h.dst)).copy(b, 16);
  b.writeUInt16BE(checksum(b), 10);
  return b;
}

/** An Ethernet + IPv4 or IPv6 + TCP/UDP frame, every checksum valid (but a UDP one asked to be zero). */
export function frame(spec: FrameSpec): Buffer {
  const seg = l4Segment(spec, spec.src, spec.dst);
  const proto = spec.proto === 'tcp' ? IPPROTO_TCP : IPPROTO_UDP;
  if (!spec.src.includes(':')) {
    const ipSpec: Ip4HeaderSpec = { src: spec.src, dst: spec.dst, proto, payloadLen: seg.length };
    if (spec.ttl !== undefined) ipSpec.ttl = spec.ttl;
    if (spec.id !== undefined) ipSpec.id = spec.id;
    if (spec.df !== undefined) ipSpec.df = spec.df;
    if (spec.options !== undefined) ipSpec.options = spec.options;
    return Buffer.concat([eth(ETH_P_IP, spec.srcMac, spec.dstMac), ip4Header(ipSpec), seg]);
  }
  return ip6Frame(spec.src, spec.dst, proto, seg, spec.ext ?? [], spec.ttl ?? 64, spec.srcMac, spec.dstMac);
}

/** Extension headers: each padded to a multiple of 8 bytes (AH: of 4, with its own length rule). */
function extHeaders(ext: Array<{ type: number; body?: Buffer }>, last: number): { bytes: Buffer; first: number } {
  const parts: Buffer[] = [];
  for (let i = 0; i < ext.length; i++) {
    const e = ext[i]!;
    const next = i + 1 < ext.length ? ext[i + 1]!.type : last;
    const body = e.body ?? Buffer.alloc(0);
    const unit = e.type === NEXTHDR_AUTH ? 4 : 8;
    const total = Math.max(unit === 4 ? 12 : 8, Math.ceil((2 + body.length) / unit) * unit);
    const h = Buffer.alloc(total);
    h[0] = next;
    h[1] = e.type === NEXTHDR_AUTH ? total / 4 - 2 : total / 8 - 1;
    // PadN options fill what the body leaves (Hop-by-Hop and Destination Options).
    body.copy(h, 2);
    const pad = total - 2 - body.length;
    if ((e.type === NEXTHDR_DEST || e.type === NEXTHDR_HOP) && pad >= 2) {
      h[2 + body.length] = 1;
      h[3 + body.length] = pad - 2;
    }
    parts.push(h);
  }
  return { bytes: Buffer.concat(parts), first: ext.length ? ext[0]!.type : last };
}

function ip6Frame(src: string, dst: string, proto: number, l4: Buffer, ext: Array<{ type: number; body?: Buffer }>, hop: number,
  srcMac?: string, dstMac?: string): Buffer {
  const { bytes, first } = extHeaders(ext, proto);
  const h = Buffer.alloc(40);
  h.writeUInt32BE(0x60000000, 0);
  h.writeUInt16BE(bytes.length + l4.length, 4);
  h[6] = first;
  h[7] = hop;
  ip6(src).copy(h, 8);
  ip6(dst).copy(h, 24);
  return Buffer.concat([eth(ETH_P_IPV6, srcMac, dstMac), h, bytes, l4]);
}

/**
 * One IPv4 datagram split into fragments of the transport segment at the
 * given byte offsets (multiples of 8): the first carries the ports and MF,
 * the later ones only data. The segment's checksum covers the whole.
 */
export function fragments4(spec: FrameSpec, cuts: number[]): Buffer[] {
  const seg = l4Segment(spec, spec.src, spec.dst);
  const proto = spec.proto === 'tcp' ? IPPROTO_TCP : IPPROTO_UDP;
  const bounds = [0, ...cuts, seg.length];
  const out: Buffer[] = [];
  for (let i = 0; i + 1 < bounds.length; i++) {
    const [from, to] = [bounds[i]!, bounds[i + 1]!];
    if (from % 8) throw new RangeError('fragment offsets are multiples of 8');
    const part = seg.subarray(from, to);
    const h = ip4Header({ src: spec.src, dst: spec.dst, proto, payloadLen: part.length, ttl: spec.ttl ?? 64, id: spec.id ?? 0x4242,
      moreFragments: i + 2 < bounds.length, fragOffset: from / 8 });
    out.push(Buffer.concat([eth(ETH_P_IP, spec.srcMac, spec.dstMac), h, part]));
  }
  return out;
}

/**
 * One IPv6 datagram split into fragments of the transport segment at the
 * given byte offsets (multiples of 8): each fragment is the IPv6 header,
 * `spec.ext` (the unfragmentable part), a Fragment header (offset, M,
 * identification `id`) and its part; the first carries the ports. The
 * segment's checksum covers the whole.
 */
export function fragments6(spec: FrameSpec, cuts: number[], id = 0x6060): Buffer[] {
  const seg = l4Segment(spec, spec.src, spec.dst);
  const proto = spec.proto === 'tcp' ? IPPROTO_TCP : IPPROTO_UDP;
  const { bytes: ext, first } = extHeaders(spec.ext ?? [], NEXTHDR_FRAGMENT);
  const bounds = [0, ...cuts, seg.length];
  const out: Buffer[] = [];
  for (let i = 0; i + 1 < bounds.length; i++) {
    const [from, to] = [bounds[i]!, bounds[i + 1]!];
    if (from % 8) throw new RangeError('fragment offsets are multiples of 8');
    const part = seg.subarray(from, to);
    const fh = Buffer.alloc(8);
    fh[0] = proto;
    fh.writeUInt16BE(from | (i + 2 < bounds.length ? 1 : 0), 2);
    fh.writeUInt32BE(id >>> 0, 4);
    const h = Buffer.alloc(40);
    h.writeUInt32BE(0x60000000, 0);
    h.writeUInt16BE(ext.length + fh.length + part.length, 4);
    h[6] = first;
    h[7] = spec.ttl ?? 64;
    ip6(spec.src).copy(h, 8);
    ip6(spec.dst).copy(h, 24);
    out.push(Buffer.concat([eth(ETH_P_IPV6, spec.srcMac, spec.dstMac), h, ext, fh, part]));
  }
  return out;
}

/** The IP packet of a frame (the frame without its Ethernet header). */
export function ipPacket(spec: FrameSpec): Buffer {
  return frame(spec).subarray(ETH_HLEN);
}

export interface IcmpSpec {
  /** the error's own addresses (the family follows `src`) */
  src: string;
  dst: string;
  type: number;
  code: number;
  /** the header's last 4 bytes: the next-hop MTU of "fragmentation needed" (in its low 16 bits), the MTU of "packet too big" */
  rest?: number;
  /** what follows the 8-byte header: for an error, the quoted IP packet (possibly cut short) */
  body: Buffer;
  ttl?: number;
  srcMac?: string;
  dstMac?: string;
}

/** An ICMP or ICMPv6 message in a frame, its checksums valid (ICMPv6: over the pseudo header). */
export function icmpFrame(spec: IcmpSpec): Buffer {
  const v6 = spec.src.includes(':');
  const msg = Buffer.alloc(8 + spec.body.length);
  msg[0] = spec.type;
  msg[1] = spec.code;
  msg.writeUInt32BE((spec.rest ?? 0) >>> 0, 4);
  spec.body.copy(msg, 8);
  if (!v6) {
    msg.writeUInt16BE(checksum(msg), 2);
    const h = ip4Header({ src: spec.src, dst: spec.dst, proto: IPPROTO_ICMP, payloadLen: msg.length, ttl: spec.ttl ?? 64, id: 0x3131 });
    return Buffer.concat([eth(ETH_P_IP, spec.srcMac, spec.dstMac), h, msg]);
  }
  msg.writeUInt16BE(checksum(msg, pseudoSum(ip6(spec.src), ip6(spec.dst), IPPROTO_ICMPV6, msg.length)), 2);
  return ip6Frame(spec.src, spec.dst, IPPROTO_ICMPV6, msg, [], spec.ttl ?? 64, spec.srcMac, spec.dstMac);
}

/**
 * An ICMP error quoting `quoted` (an IP packet, e.g. from ipPacket()), cut to
 * `quoteLen` bytes when given: 28 is RFC 792's IPv4 header and 8 bytes.
 */
export function icmpError(spec: Omit<IcmpSpec, 'body'> & { quoted: Buffer; quoteLen?: number }): Buffer {
  const body = spec.quoteLen === undefined ? spec.quoted : spec.quoted.subarray(0, spec.quoteLen);
  return icmpFrame({ ...spec, body });
}

/** An ICMP echo request (ping), or ICMPv6's. */
export function echoRequest(src: string, dst: string, srcMac?: string, dstMac?: string): Buffer {
  const v6 = src.includes(':');
  const spec: IcmpSpec = { src, dst, type: v6 ? ICMPV6_ECHO_REQUEST : ICMP_ECHO, code: 0, rest: 0x00010001, body: Buffer.from('lbctl ping') };
  if (srcMac !== undefined) spec.srcMac = srcMac;
  if (dstMac !== undefined) spec.dstMac = dstMac;
  return icmpFrame(spec);
}

/** An ARP request (who-has `target` tell `sender`). */
export function arpRequest(sender: string, target: string, srcMac = DEFAULT_SRC_MAC): Buffer {
  const b = Buffer.alloc(28);
  b.writeUInt16BE(1, 0); // Ethernet
  b.writeUInt16BE(ETH_P_IP, 2);
  b[4] = 6;
  b[5] = 4;
  b.writeUInt16BE(1, 6); // request
  mac(srcMac).copy(b, 8);
  u32be(ip4(sender)).copy(b, 14);
  u32be(ip4(target)).copy(b, 24);
  return Buffer.concat([eth(ETH_P_ARP, srcMac, 'ff:ff:ff:ff:ff:ff'), b]);
}

/** An ICMPv6 neighbour solicitation for `target`, to its solicited-node multicast address. */
export function neighbourSolicitation(src: string, target: string, srcMac = DEFAULT_SRC_MAC): Buffer {
  const t = ip6(target);
  const dst = ip6('ff02::1:ff00:0');
  t.copy(dst, 13, 13);
  const body = Buffer.alloc(32);
  body[0] = 135;
  t.copy(body, 8);
  body[24] = 1; // source link-layer address option
  body[25] = 1;
  mac(srcMac).copy(body, 26);
  body.writeUInt16BE(checksum(body, pseudoSum(ip6(src), dst, IPPROTO_ICMPV6, body.length)), 2);
  const dstMac = `33:33:${[...dst.subarray(12)].map((x) => x.toString(16).padStart(2, '0')).join(':')}`;
  return ip6Frame(src, ip6String(dst), IPPROTO_ICMPV6, body, [], 255, srcMac, dstMac);
}

// ---- parser

/** An IP packet read from its first byte: a frame's, or the one an ICMP error quotes (maybe cut short). */
export interface ParsedPacket {
  family: 4 | 6;
  src: string;
  dst: string;
  /** TTL or hop limit */
  ttl: number;
  proto: number;
  /** IPv4 */
  id?: number;
  /** IPv4: DF */
  dontFragment?: boolean;
  /** IPv4, and IPv6 with a Fragment header */
  moreFragments?: boolean;
  /** in 8-byte units */
  fragOffset?: number;
  /** IPv4: the header checksum verifies */
  ipChecksumOk?: boolean;
  /** offset of the transport header in the frame */
  l4Offset: number;
  /** the transport bytes this frame carries (a fragment's part for IPv4 fragments) */
  l4: Buffer;
  /** TCP/UDP of an unfragmented packet or a first fragment */
  sport?: number;
  dport?: number;
  tcpFlags?: number;
  /** the transport checksum field as sent */
  l4Checksum?: number;
  /**
   * The transport checksum verifies over the pseudo header (unfragmented
   * packets only; undefined for fragments and UDP sent without one, and
   * for a quote cut short of the whole segment).
   */
  l4ChecksumOk?: boolean;
  /** ICMP and ICMPv6 */
  icmp?: {
    type: number;
    code: number;
    /** the header's last 4 bytes */
    rest: number;
    /** over the message, and for ICMPv6 the pseudo header too */
    checksumOk: boolean;
    /** what follows the 8-byte header */
    body: Buffer;
    /** an error's quoted packet, as far as it is quoted */
    inner?: ParsedPacket;
  };
}

export interface ParsedFrame extends ParsedPacket {
  dstMac: string;
  srcMac: string;
  ethType: number;
}

/** Whether a transport segment's checksum verifies for these pseudo-header addresses. */
export function l4ChecksumOk(seg: Buffer, src: string, dst: string, proto: number): boolean {
  return fold(onesSum(seg, pseudoSum(addrBytes(src), addrBytes(dst), proto, seg.length))) === 0xffff;
}

export function parseFrame(f: Buffer): ParsedFrame {
  const ethType = f.readUInt16BE(12);
  const base = { dstMac: macString(f.subarray(0, 6)), srcMac: macString(f.subarray(6, 12)), ethType };
  if (ethType !== ETH_P_IP && ethType !== ETH_P_IPV6) throw new RangeError(`not an IP frame (ethertype 0x${ethType.toString(16)})`);
  const p = parsePacket(f, ETH_HLEN, ethType === ETH_P_IP ? 4 : 6);
  return { ...base, ...p };
}

const ICMP_ERRORS = {
  4: [ICMP_DEST_UNREACH, ICMP_TIME_EXCEEDED, 12],
  6: [ICMPV6_DEST_UNREACH, ICMPV6_PKT_TOOBIG, 3, 4],
};

/**
 * The IP packet at `at` in `f`, which may end early (an ICMP error's quote):
 * what is there is read, checksums that need what is missing are left
 * undefined. l4Offset is an offset in `f`.
 */
export function parsePacket(f: Buffer, at: number, family: 4 | 6): ParsedPacket {
  let out: ParsedPacket;
  let whole = true;
  let l4End: number;
  if (family === 4) {
    const ihl = (f[at]! & 0x0f) * 4;
    const totLen = f.readUInt16BE(at + 2);
    const frag = f.readUInt16BE(at + 6);
    const l4Offset = at + ihl;
    l4End = at + totLen;
    out = {
      family: 4,
      src: ip4String(f.readUInt32BE(at + 12)), dst: ip4String(f.readUInt32BE(at + 16)),
      ttl: f[at + 8]!, proto: f[at + 9]!, id: f.readUInt16BE(at + 4),
      dontFragment: (frag & 0x4000) !== 0, moreFragments: (frag & 0x2000) !== 0, fragOffset: frag & 0x1fff,
      ipChecksumOk: fold(onesSum(f.subarray(at, at + ihl))) === 0xffff,
      l4Offset, l4: f.subarray(l4Offset, Math.min(l4End, f.length)),
    };
    whole = !out.moreFragments && out.fragOffset === 0;
    if (out.fragOffset !== 0) return out;
  } else {
    let nh = f[at + 6]!;
    let off = at + 40;
    let frag: { fragOffset: number; moreFragments: boolean } | undefined;
    while ([NEXTHDR_HOP, NEXTHDR_ROUTING, NEXTHDR_DEST, NEXTHDR_AUTH, NEXTHDR_FRAGMENT].includes(nh)) {
      const len = nh === NEXTHDR_AUTH ? (f[off + 1]! + 2) * 4 : nh === NEXTHDR_FRAGMENT ? 8 : (f[off + 1]! + 1) * 8;
      if (nh === NEXTHDR_FRAGMENT) {
        whole = false;
        const fo = f.readUInt16BE(off + 2);
        frag = { fragOffset: fo >> 3, moreFragments: (fo & 1) !== 0 };
      }
      nh = f[off]!;
      off += len;
    }
    l4End = at + 40 + f.readUInt16BE(at + 4);
    out = {
      family: 6, src: ip6String(f.subarray(at + 8, at + 24)), dst: ip6String(f.subarray(at + 24, at + 40)),
      ttl: f[at + 7]!, proto: nh, l4Offset: off, l4: f.subarray(off, Math.min(l4End, f.length)), ...frag,
    };
    if (frag && frag.fragOffset !== 0) return out;
  }
  const complete = out.l4.length === l4End - out.l4Offset;
  if (out.proto === IPPROTO_ICMP || out.proto === IPPROTO_ICMPV6) {
    if (out.l4.length < 8) return out;
    const sum = out.proto === IPPROTO_ICMP ? onesSum(out.l4) : onesSum(out.l4, pseudoSum(addrBytes(out.src), addrBytes(out.dst), IPPROTO_ICMPV6, out.l4.length));
    const type = out.l4[0]!;
    const body = out.l4.subarray(8);
    out.icmp = { type, code: out.l4[1]!, rest: out.l4.readUInt32BE(4), checksumOk: complete && fold(sum) === 0xffff, body };
    if (ICMP_ERRORS[out.family].includes(type) && body.length >= (out.family === 4 ? 20 : 40)) {
      out.icmp.inner = parsePacket(body, 0, out.family);
    }
    return out;
  }
  if (out.proto !== IPPROTO_TCP && out.proto !== IPPROTO_UDP) return out;
  if (out.l4.length < 4) return out;
  out.sport = out.l4.readUInt16BE(0);
  out.dport = out.l4.readUInt16BE(2);
  const csumOff = out.proto === IPPROTO_TCP ? 16 : 6;
  if (out.l4.length >= csumOff + 2) out.l4Checksum = out.l4.readUInt16BE(csumOff);
  if (out.proto === IPPROTO_TCP && out.l4.length >= 14) out.tcpFlags = out.l4[13]!;
  if (whole && complete && out.l4Checksum !== undefined && !(out.proto === IPPROTO_UDP && out.family === 4 && out.l4Checksum === 0)) {
    out.l4ChecksumOk = l4ChecksumOk(out.l4, out.src, out.dst, out.proto);
  }
  return out;
}
