// IP address parsing and canonical forms (ipaddr.js underneath).
import ipaddr from 'ipaddr.js';
import type { Family } from './types.js';

export interface ParsedIp {
  /** Canonical text: dotted quad, or RFC 5952 for IPv6. */
  readonly address: string;
  readonly family: Family;
  /** Network-order bytes: 4 or 16. */
  readonly bytes: Buffer;
}

/** Parses an IP literal; undefined if it is not one (no hostnames, no zones, no CIDR). */
export function parseIp(text: unknown): ParsedIp | undefined {
  if (typeof text !== 'string' || text.length === 0 || text.length > 45) return undefined;
  if (ipaddr.IPv4.isValidFourPartDecimal(text)) {
    const ip = ipaddr.IPv4.parse(text);
    return { address: ip.toString(), family: 4, bytes: Buffer.from(ip.toByteArray()) };
  }
  if (text.includes(':') && !text.includes('%') && ipaddr.IPv6.isValid(text)) {
    const ip = ipaddr.IPv6.parse(text);
    return { address: ip.toRFC5952String(), family: 6, bytes: Buffer.from(ip.toByteArray()) };
  }
  return undefined;
}

export function ipFromBytes(bytes: Buffer): string {
  const ip = ipaddr.fromByteArray([...bytes]);
  return ip.kind() === 'ipv6' ? (ip as ipaddr.IPv6).toRFC5952String() : ip.toString();
}

/** IPv4 text → the uint32 whose big-endian bytes are the address. */
export function ipv4ToUint(address: string): number {
  const b = ipaddr.IPv4.parse(address).toByteArray();
  return ((b[0]! << 24) | (b[1]! << 16) | (b[2]! << 8) | b[3]!) >>> 0;
}

export function uintToIpv4(n: number): string {
  return `${n >>> 24}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
}
