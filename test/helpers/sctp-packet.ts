// SCTP packets for BPF_PROG_TEST_RUN: the common header, chunks (INIT,
// DATA, and any other by type), the CRC32c of RFC 9260 appendix B computed
// here, independently of bpf/lib/sctp.h, and Ethernet frames with IPv4 or
// IPv6 around them. Addresses are strings ('10.0.0.5', 'fd00::1').
import { ip4Header, ip6, mac } from './packet.js';

export const IPPROTO_SCTP = 132;
export const SCTP_CID_DATA = 0;
export const SCTP_CID_INIT = 1;
export const SCTP_CID_SACK = 3;
export const SCTP_CID_SHUTDOWN_COMPLETE = 14;

const ETH_HLEN = 14;
const POLY = 0x82f63b78;
const TABLE = Uint32Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ POLY : c >>> 1;
  return c >>> 0;
});

/** CRC32c (Castagnoli), as SCTP and iSCSI use it: reflected, initial value and final XOR 0xffffffff. */
export function crc32c(b: Buffer, crc = 0): number {
  let c = ~crc >>> 0;
  for (let i = 0; i < b.length; i++) c = (TABLE[(c ^ b[i]!) & 0xff]! ^ (c >>> 8)) >>> 0;
  return ~c >>> 0;
}

/** The CRC32c an SCTP packet (common header first) should carry: over the packet with its checksum field zero. */
export function sctpCrc(pkt: Buffer): number {
  const copy = Buffer.from(pkt);
  copy.writeUInt32LE(0, 8);
  return crc32c(copy);
}

/** The checksum field as sent (RFC 9260 appendix A: the CRC's bytes, least significant first). */
export const sctpChecksumField = (pkt: Buffer): number => pkt.readUInt32LE(8);

export const sctpChecksumOk = (pkt: Buffer): boolean => sctpChecksumField(pkt) === sctpCrc(pkt);

/** One chunk: type, flags and value, padded to 4 bytes (the length field excludes the padding). */
export function chunk(type: number, value: Buffer, flags = 0): Buffer {
  const len = 4 + value.length;
  const c = Buffer.alloc((len + 3) & ~3);
  c[0] = type;
  c[1] = flags;
  c.writeUInt16BE(len, 2);
  value.copy(c, 4);
  return c;
}

/** An INIT chunk (RFC 9260 3.3.2) with IPv4/IPv6 address parameters, as a multi-homed client sends it. */
export function initChunk(tag: number, addresses: readonly string[] = []): Buffer {
  const fixed = Buffer.alloc(16);
  fixed.writeUInt32BE(tag >>> 0, 0); // initiate tag
  fixed.writeUInt32BE(106496, 4); // a_rwnd
  fixed.writeUInt16BE(10, 8); // outbound streams
  fixed.writeUInt16BE(65535, 10); // inbound streams
  fixed.writeUInt32BE(0x1000, 12); // initial TSN
  const params = addresses.map((a) => {
    const v6 = a.includes(':');
    const p = Buffer.alloc(v6 ? 20 : 8);
    p.writeUInt16BE(v6 ? 6 : 5, 0);
    p.writeUInt16BE(p.length, 2);
    if (v6) ip6(a).copy(p, 4);
    else Buffer.from(a.split('.').map(Number)).copy(p, 4);
    return p;
  });
  return chunk(SCTP_CID_INIT, Buffer.concat([fixed, ...params]));
}

/** A DATA chunk (RFC 9260 3.3.1) of `payload`, one whole message (B and E set). */
export function dataChunk(tsn: number, payload: Buffer): Buffer {
  const fixed = Buffer.alloc(12);
  fixed.writeUInt32BE(tsn >>> 0, 0);
  fixed.writeUInt16BE(0, 4); // stream
  fixed.writeUInt16BE(0, 6); // stream sequence
  fixed.writeUInt32BE(46, 8); // payload protocol: Diameter
  return chunk(SCTP_CID_DATA, Buffer.concat([fixed, payload]), 0x03);
}

export interface SctpSpec {
  sport: number;
  dport: number;
  vtag: number;
  chunks: readonly Buffer[];
  /** Write this in the checksum field instead of the CRC: 0 for a packet whose CRC is left to the device (CHECKSUM_PARTIAL). */
  checksum?: number;
}

/** The SCTP packet: common header and chunks, its CRC32c in place. */
export function sctpPacket(spec: SctpSpec): Buffer {
  const h = Buffer.alloc(12);
  h.writeUInt16BE(spec.sport, 0);
  h.writeUInt16BE(spec.dport, 2);
  h.writeUInt32BE(spec.vtag >>> 0, 4);
  const pkt = Buffer.concat([h, ...spec.chunks]);
  pkt.writeUInt32LE(spec.checksum ?? sctpCrc(pkt), 8);
  return pkt;
}

export interface SctpFrameSpec extends SctpSpec {
  src: string;
  dst: string;
  /** Bytes after the IP packet, as an Ethernet frame's padding brings them (not counted in the IP length). */
  trailer?: Buffer;
}

/** Ethernet + IPv4 or IPv6 (no extension headers) + SCTP. */
export function sctpFrame(spec: SctpFrameSpec): { frame: Buffer; l4Offset: number; sctpLength: number } {
  const pkt = sctpPacket(spec);
  const v6 = spec.src.includes(':');
  const eth = Buffer.concat([mac('02:00:00:00:01:01'), mac('02:00:00:00:00:fe'), Buffer.from(v6 ? [0x86, 0xdd] : [0x08, 0x00])]);
  let ip: Buffer;
  if (v6) {
    ip = Buffer.alloc(40);
    ip.writeUInt32BE(0x60000000, 0);
    ip.writeUInt16BE(pkt.length, 4);
    ip[6] = IPPROTO_SCTP;
    ip[7] = 64;
    ip6(spec.src).copy(ip, 8);
    ip6(spec.dst).copy(ip, 24);
  } else {
    ip = ip4Header({ src: spec.src, dst: spec.dst, proto: IPPROTO_SCTP, payloadLen: pkt.length });
  }
  return { frame: Buffer.concat([eth, ip, pkt, spec.trailer ?? Buffer.alloc(0)]), l4Offset: ETH_HLEN + ip.length, sctpLength: pkt.length };
}
