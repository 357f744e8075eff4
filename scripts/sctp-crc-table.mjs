#!/usr/bin/env node
// Prints the constant table of bpf/lib/sctp.h: x^(8k) and x^(2048k) mod P
// for k = 0..255, P CRC32c's polynomial in the reflected representation
// (x^0 is bit 31), as C initialisers. test/bpf/sctp-csum.ts checks every
// entry against CRCs of real buffers.
//
// Usage: node scripts/sctp-crc-table.mjs
const POLY = 0x82f63b78;

/** a * b mod P (zlib's multmodp). */
function mul(a, b) {
  let p = 0;
  for (let m = 0x80000000; m; m >>>= 1) {
    if (a & m) p ^= b;
    b = b & 1 ? (b >>> 1) ^ POLY : b >>> 1;
  }
  return p >>> 0;
}

const ONE = 0x80000000; // x^0
const X8 = 0x00800000; // x^8
const row = (step) => {
  const out = [ONE];
  for (let k = 1; k < 256; k++) out.push(mul(out[k - 1], step));
  return out;
};
const x8 = row(X8);
let x2048 = ONE;
for (let i = 0; i < 256; i++) x2048 = mul(x2048, X8); // x^(8 * 256)
const hex = (v) => `0x${v.toString(16).padStart(8, '0')}`;
for (const [name, r] of [['x^(8k)', x8], ['x^(2048k)', row(x2048)]]) {
  console.log(`\t{ /* ${name} */`);
  for (let i = 0; i < 256; i += 8) console.log(`\t\t${r.slice(i, i + 8).map(hex).join(', ')},`);
  console.log('\t},');
}
