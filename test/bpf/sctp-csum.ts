// bpf/lib/sctp.h through BPF_PROG_TEST_RUN on the real kernel
// (bpf/tests/sctp_test.c, maps unpinned): an SCTP packet's ports rewritten
// and its CRC32c updated incrementally, checked against the CRC32c computed
// here over the packet that comes out (test/helpers/sctp-packet.ts), for
// INIT, DATA of several sizes, IPv4 and IPv6; and the update's arithmetic
// against CRCs of real buffers up to 64 KiB, beyond what a test run's
// packet can be (one page, linear).
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { BpfObject, progTestRun } from '../../src/native/bpf.js';
import {
  chunk, crc32c, dataChunk, initChunk, SCTP_CID_SACK, SCTP_CID_SHUTDOWN_COMPLETE, sctpChecksumField, sctpChecksumOk, sctpCrc, sctpFrame, type SctpFrameSpec,
} from '../helpers/sctp-packet.js';

// Privileged: as root (make test, CI) these always run; elsewhere they stop loudly.
if (process.getuid?.() !== 0) t.bailout('the BPF suites need root (CAP_BPF, CAP_NET_ADMIN): run `make test` as root');

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const obj = BpfObject.open(path.join(ROOT, 'bpf/.output/tests/sctp_test.bpf.o'));
t.teardown(() => obj.close());
await obj.load();

const TC_ACT_OK = 0;
const TC_ACT_SHOT = 2;

function setPorts(sport: number, dport: number): void {
  const v = Buffer.alloc(4);
  v.writeUInt16BE(sport, 0);
  v.writeUInt16BE(dport, 2);
  obj.map('sctp_test_ports').update(Buffer.alloc(4), v);
}

function rewrite(frame: Buffer, sport: number, dport: number): { rc: number; out: Buffer } {
  setPorts(sport, dport);
  const r = progTestRun(obj.progFd('test_sctp_ports'), { data: frame });
  return { rc: r.retval | 0, out: r.data };
}

/** lb_crc32c_shift(v, nbytes) in the kernel. */
function shift(v: number, nbytes: number): number {
  const data = Buffer.alloc(64);
  data.writeUInt16BE(0x0800, 12);
  data.writeUInt32LE(v >>> 0, 14);
  data.writeUInt32LE(nbytes, 18);
  return progTestRun(obj.progFd('test_crc32c_shift'), { data }).retval >>> 0;
}

t.test('the CRC32c computed here is CRC32c (RFC 3720 B.4 vectors)', async (t) => {
  t.equal(crc32c(Buffer.from('123456789')), 0xe3069283);
  t.equal(crc32c(Buffer.alloc(32)), 0x8a9136aa, '32 bytes of zeros');
  t.equal(crc32c(Buffer.alloc(32, 0xff)), 0x62a8ab43, '32 bytes of ones');
  t.equal(crc32c(Buffer.from(Array.from({ length: 32 }, (_, i) => i))), 0x46dd794e, 'an incrementing sequence');
});

const CLIENT4 = '10.0.0.5';
const NODE4 = '192.168.50.1';
const CLIENT6 = 'fd00:c::5';
const NODE6 = 'fd00:50::1';
const VTAG = 0x5ca1ab1e;
const payload = (n: number): Buffer => Buffer.from(Array.from({ length: n }, (_, i) => (i * 7 + 3) & 0xff));

const PACKETS: Array<[string, SctpFrameSpec]> = [
  ['INIT, IPv4, with two address parameters', { src: CLIENT4, dst: NODE4, sport: 40000, dport: 30868, vtag: 0, chunks: [initChunk(0x1234abcd, ['10.0.0.5', '10.1.0.5'])] }],
  ['INIT, IPv6', { src: CLIENT6, dst: NODE6, sport: 40000, dport: 30868, vtag: 0, chunks: [initChunk(0x1234abcd, ['fd00:c::5'])] }],
  ['DATA of 1 byte', { src: CLIENT4, dst: NODE4, sport: 40000, dport: 30868, vtag: VTAG, chunks: [dataChunk(1, payload(1))] }],
  ['DATA of 100 bytes', { src: CLIENT4, dst: NODE4, sport: 40000, dport: 30868, vtag: VTAG, chunks: [dataChunk(2, payload(100))] }],
  ['DATA of 1,400 bytes', { src: CLIENT4, dst: NODE4, sport: 40000, dport: 30868, vtag: VTAG, chunks: [dataChunk(3, payload(1400))] }],
  ['DATA of 3,000 bytes (a jumbo frame)', { src: CLIENT4, dst: NODE4, sport: 40000, dport: 30868, vtag: VTAG, chunks: [dataChunk(4, payload(3000))] }],
  ['DATA of 1,400 bytes, IPv6', { src: CLIENT6, dst: NODE6, sport: 40000, dport: 30868, vtag: VTAG, chunks: [dataChunk(5, payload(1400))] }],
  ['SACK and DATA bundled', { src: CLIENT4, dst: NODE4, sport: 40000, dport: 30868, vtag: VTAG, chunks: [chunk(SCTP_CID_SACK, Buffer.alloc(12)), dataChunk(6, payload(33))] }],
  // 14 + 20 + 16 = 50 bytes: an Ethernet frame is padded to 60, and the CRC covers only the IP payload
  ['SHUTDOWN COMPLETE in a padded frame', { src: CLIENT4, dst: NODE4, sport: 40000, dport: 30868, vtag: VTAG, chunks: [chunk(SCTP_CID_SHUTDOWN_COMPLETE, Buffer.alloc(0))], trailer: Buffer.alloc(10, 0xee) }],
];

t.test('ports rewritten, CRC32c updated: it matches a CRC computed over the packet that comes out', async (t) => {
  for (const [name, spec] of PACKETS) {
    const { frame, l4Offset, sctpLength } = sctpFrame(spec);
    const before = frame.subarray(l4Offset, l4Offset + sctpLength);
    t.ok(sctpChecksumOk(before), `${name}: sent with a valid CRC`);
    const { rc, out } = rewrite(frame, 45000, 3868);
    t.equal(rc, TC_ACT_OK, `${name}: rewritten`);
    const after = out.subarray(l4Offset, l4Offset + sctpLength);
    t.same([after.readUInt16BE(0), after.readUInt16BE(2)], [45000, 3868], `${name}: the ports asked for`);
    t.equal(sctpChecksumField(after), sctpCrc(after), `${name}: the CRC matches the new packet`);
    // nothing else changed: the rest of the header, every chunk, the frame's padding
    const same = (a: Buffer, b: Buffer): boolean => a.subarray(4, 8).equals(b.subarray(4, 8)) && a.subarray(12).equals(b.subarray(12));
    t.ok(same(before, after) && out.subarray(0, l4Offset).equals(frame.subarray(0, l4Offset)) &&
      out.subarray(l4Offset + sctpLength).equals(frame.subarray(l4Offset + sctpLength)), `${name}: nothing else changed`);
    const back = rewrite(out, spec.sport, spec.dport);
    t.ok(back.out.equals(frame), `${name}: rewritten back, the packet is the original again`);
  }
});

t.test('the first chunk: INIT opens an association, SHUTDOWN COMPLETE ends one; none in a bare header', async (t) => {
  const first = (spec: SctpFrameSpec): number => progTestRun(obj.progFd('test_sctp_first_chunk'), { data: sctpFrame(spec).frame }).retval | 0;
  const base = { src: CLIENT4, dst: NODE4, sport: 40000, dport: 30868, vtag: VTAG };
  t.equal(first({ ...base, vtag: 0, chunks: [initChunk(1)] }), 1, 'INIT');
  t.equal(first({ ...base, chunks: [dataChunk(1, payload(10))] }), 0, 'DATA');
  t.equal(first({ ...base, chunks: [chunk(SCTP_CID_SHUTDOWN_COMPLETE, Buffer.alloc(0))], trailer: Buffer.alloc(10) }), 14, 'SHUTDOWN COMPLETE, padded frame');
  t.equal(first({ ...base, src: CLIENT6, dst: NODE6, chunks: [chunk(SCTP_CID_SACK, Buffer.alloc(12))] }), 3, 'SACK, IPv6');
  t.equal(first({ ...base, chunks: [] }), -1, 'a common header alone: no chunk');
});

t.test('a CRC not computed yet (0: CHECKSUM_PARTIAL, GSO, zero checksum) is left 0', async (t) => {
  const { frame, l4Offset } = sctpFrame({ src: CLIENT4, dst: NODE4, sport: 40000, dport: 30868, vtag: VTAG, chunks: [dataChunk(7, payload(200))], checksum: 0 });
  const { rc, out } = rewrite(frame, 45000, 3868);
  t.equal(rc, TC_ACT_OK);
  t.same([out.readUInt16BE(l4Offset), out.readUInt16BE(l4Offset + 2)], [45000, 3868], 'ports rewritten');
  t.equal(out.readUInt32LE(l4Offset + 8), 0, 'checksum field still 0');
});

t.test('a packet that arrived with a bad CRC still has one after the rewrite (no laundering)', async (t) => {
  const spec: SctpFrameSpec = { src: CLIENT4, dst: NODE4, sport: 40000, dport: 30868, vtag: VTAG, chunks: [dataChunk(8, payload(500))] };
  const { frame, l4Offset, sctpLength } = sctpFrame(spec);
  const corrupt = Buffer.from(frame);
  corrupt[l4Offset + 100]! ^= 0x10; // a bit flipped in transit
  const { rc, out } = rewrite(corrupt, 45000, 3868);
  t.equal(rc, TC_ACT_OK);
  const after = Buffer.from(out.subarray(l4Offset, l4Offset + sctpLength));
  t.notOk(sctpChecksumOk(after), 'the CRC does not match the corrupted packet');
  after[100]! ^= 0x10;
  t.ok(sctpChecksumOk(after), 'it matches the packet as it was sent, with the new ports');
});

t.test('ports unchanged: the packet is untouched', async (t) => {
  const { frame } = sctpFrame({ src: CLIENT4, dst: NODE4, sport: 40000, dport: 30868, vtag: VTAG, chunks: [dataChunk(9, payload(64))] });
  const { rc, out } = rewrite(frame, 40000, 30868);
  t.equal(rc, TC_ACT_OK);
  t.ok(out.equals(frame));
});

t.test('a length beyond the IP payload or below the common header is refused', async (t) => {
  const { frame } = sctpFrame({ src: CLIENT4, dst: NODE4, sport: 40000, dport: 30868, vtag: VTAG, chunks: [dataChunk(10, payload(64))] });
  const short = Buffer.from(frame);
  short.writeUInt16BE(20 + 8, 16); // IPv4 tot_len: 8 bytes of SCTP, less than its header
  t.equal(rewrite(short, 45000, 3868).rc, TC_ACT_SHOT);
});

t.test('the arithmetic against CRCs of real buffers: every table entry, every length class up to 64 KiB', async (t) => {
  // Two bytes changed `m` bytes before the end of an (m + 2)-byte buffer: the CRCs differ by d * x^(8m).
  const check = (m: number): boolean => {
    const buf = randomBytes(m + 2);
    const changed = Buffer.from(buf);
    randomBytes(2).copy(changed, 0);
    const d = (buf[0]! ^ changed[0]!) | ((buf[1]! ^ changed[1]!) << 8);
    return shift(d, m + 2) === (crc32c(buf) ^ crc32c(changed)) >>> 0;
  };
  const lows = Array.from({ length: 256 }, (_, k) => k);
  const highs = Array.from({ length: 255 }, (_, k) => ((k + 1) << 8) | ((k * 37) & 0xff));
  const wrong = [...lows, ...highs, 65533].filter((m) => !check(m));
  t.same(wrong, [], `x^(8m) right for m = 0..255, for each multiple of 256 below 64 KiB with some low byte, and for 65,533 (${lows.length + highs.length + 1} lengths)`);
  // and as a rewrite sees them: the SCTP length and the port's offset
  for (const n of [12, 13, 16, 100, 1500, 9000, 32768, 65535]) {
    for (const at of [0, 2]) {
      const m = randomBytes(n);
      m.writeUInt32LE(0, 8);
      const changed = Buffer.from(m);
      randomBytes(2).copy(changed, at);
      const d = (m[at]! ^ changed[at]!) | ((m[at + 1]! ^ changed[at + 1]!) << 8);
      t.equal(shift(d, n - at), (crc32c(m) ^ crc32c(changed)) >>> 0, `${n} bytes, a port at offset ${at}`);
    }
  }
});

t.test('cost of the CRC update (reported, not asserted)', async (t) => {
  // A repeated test run reuses its packet, rewritten by the first run: the shift alone is timed instead.
  const runs = 20000;
  const time = (v: number, nbytes: number): number => {
    const data = Buffer.alloc(64);
    data.writeUInt16BE(0x0800, 12);
    data.writeUInt32LE(v, 14);
    data.writeUInt32LE(nbytes, 18);
    return progTestRun(obj.progFd('test_crc32c_shift'), { data, repeat: runs }).duration;
  };
  const parts = [[0, 'none'], [200, '200 (one multiplication)'], [1448, '1,448 (two)'], [65535, '65,535 (two)']] as const;
  t.comment(`one port's update, by SCTP length: ${parts.map(([n, what]) => `${what}: ${time(0x1234, n)} ns`).join(', ')} (a run, the test run's own cost included)`);
  t.pass('measured');
});
