// IP address parsing and canonical forms (ipaddr.js underneath).
import ipaddr from 'ipaddr.js';
import type { Family } from './types.js';

export interface ParsedIp {
  /** Canonical text: dotted quad, or RFC 5952 for IPv6. */
  readonly address: string;
  readonly family: Family;
}

/** Parses an IP literal; undefined if it is not one (no hostnames, no zones, no CIDR). */
export function parseIp(text: unknown): ParsedIp | undefined {
  if (typeof text !== 'string' || text.length === 0 || text.length > 45) return undefined;
  // Nearly every address is already a canonical dotted quad: keep it as it is.
  if (canonicalIpv4ToUint(text) !== undefined) return { address: text, family: 4 };
  if (ipaddr.IPv4.isValidFourPartDecimal(text)) {
    const ip = ipaddr.IPv4.parse(text);
    return { address: ip.toString(), family: 4 };
  }
  if (text.includes(':') && !text.includes('%') && ipaddr.IPv6.isValid(text)) {
    const ip = ipaddr.IPv6.parse(text);
    return { address: ip.toRFC5952String(), family: 6 };
  }
  return undefined;
}

/**
 * A canonical dotted quad (four decimal parts 0-255, no leading zeros: the
 * form ipaddr's toString() gives) as the uint32 whose big-endian bytes are
 * the address; undefined for anything else. One scan, no regular expression:
 * it runs for every address validated and every map write.
 */
function canonicalIpv4ToUint(text: string): number | undefined {
  let n = 0;
  let part = 0;
  let digits = 0;
  let dots = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i) - 48;
    if (c >= 0 && c <= 9) {
      if (digits === 1 && part === 0) return undefined; // a leading zero
      part = part * 10 + c;
      if (++digits > 3 || part > 255) return undefined;
    } else if (c === -2 && digits > 0 && dots < 3) {
      n = n * 256 + part;
      part = 0;
      digits = 0;
      dots++;
    } else {
      return undefined;
    }
  }
  return dots === 3 && digits > 0 ? n * 256 + part : undefined;
}

/** IPv6 text → its 16 network-order bytes (computed when a map key or value needs them, not kept). */
export function ipv6Bytes(address: string): Buffer {
  const ip = parseIp(address);
  if (!ip || ip.family !== 6) throw new RangeError(`${address} is not an IPv6 address`);
  return Buffer.from(ipaddr.IPv6.parse(ip.address).toByteArray());
}

export function ipFromBytes(bytes: Buffer): string {
  const ip = ipaddr.fromByteArray([...bytes]);
  return ip.kind() === 'ipv6' ? (ip as ipaddr.IPv6).toRFC5952String() : ip.toString();
}

/** IPv4 text → the uint32 whose big-endian bytes are the address. */
export function ipv4ToUint(address: string): number {
  // Every validated address is canonical; anything else goes through ipaddr.
  const n = canonicalIpv4ToUint(address);
  if (n !== undefined) return n;
  const b = ipaddr.IPv4.parse(address).toByteArray();
  return ((b[0]! << 24) | (b[1]! << 16) | (b[2]! << 8) | b[3]!) >>> 0;
}

export function uintToIpv4(n: number): string {
  return `${n >>> 24}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
}
