// The native addon against the real kernel: compiles two fixture objects,
// loads them, exercises maps, pinning, cgroup links and test runs. Root only.
import t from 'tap';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { LbError } from '../../src/base/errors.js';
import {
  BPF_EXIST,
  BPF_NOEXIST,
  BpfError,
  BpfObject,
  enableRunTimeStats,
  type BpfMap,
  holdPinnedLink,
  isErrno,
  libbpfVersion,
  mapCreate,
  numPossibleCpus,
  openPinnedMap,
  pinnedLinkInfo,
  pinnedLinkUpdate,
  progTestRun,
  unpin,
} from '../../src/native/bpf.js';
import { loadBinding } from '../../src/native/binding.js';
import { SLOW } from '../helpers/sandbox/run.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const fixtures = path.resolve(here, '..', 'fixtures');

const XDP_DROP = 1;
const XDP_PASS = 2;
const BPF_MAP_TYPE_HASH = 1;
const BPF_MAP_TYPE_PERCPU_ARRAY = 6;
const BPF_MAP_TYPE_LRU_HASH = 9;
const BPF_MAP_TYPE_LPM_TRIE = 11;
const BPF_F_NO_PREALLOC = 1;
const BPF_PROG_TYPE_XDP = 6;
const BPF_LINK_TYPE_CGROUP = 3;
const BPF_CGROUP_INET4_CONNECT = 10;

function mounts(): string[][] {
  return fs.readFileSync('/proc/mounts', 'utf8').trim().split('\n').map((l) => l.split(' '));
}

function ensureBpffs(): void {
  if (mounts().some((m) => m[1] === '/sys/fs/bpf' && m[2] === 'bpf')) return;
  execFileSync('mount', ['-t', 'bpf', 'bpf', '/sys/fs/bpf']);
}

function cgroup2Root(): string | undefined {
  return mounts().find((m) => m[2] === 'cgroup2')?.[1];
}

function compile(name: string, outDir: string): string {
  const triple = execFileSync('gcc', ['-dumpmachine'], { encoding: 'utf8' }).trim();
  const out = path.join(outDir, `${name}.o`);
  execFileSync('clang', [
    '-O2', '-g', '-target', 'bpf', `-I/usr/include/${triple}`,
    '-c', path.join(fixtures, `${name}.bpf.c`), '-o', out,
  ]);
  return out;
}

const u32 = (n: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n);
  return b;
};
const u64 = (n: number): Buffer => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt(n));
  return b;
};
const lruKey = (i: number): Buffer => {
  const b = Buffer.alloc(8);
  b.writeUInt32LE(0x0a000000 + i, 0);
  b.writeUInt16LE(8000 + i, 4);
  return b;
};
const lruVal = (i: number): Buffer => {
  const b = Buffer.alloc(16);
  b.writeBigUInt64LE(BigInt(i), 0);
  b.writeBigUInt64LE(BigInt(i * 1000), 8);
  return b;
};
const openFds = (): number => fs.readdirSync('/proc/self/fd').length;

/**
 * Program ids bpftool sees attached to a cgroup through links (bpftool is
 * part of the toolchain: its absence fails the test). `bpftool link show`,
 * not `cgroup show`: Debian's bpftool 7.1 queries cgroups with a
 * BPF_PROG_QUERY field that kernels before 6.3 refuse, so `cgroup show`
 * fails on 5.10 (exit 255, an empty list); links carry the cgroup's id.
 */
function cgroupProgIds(cgroup: string): number[] {
  const out = execFileSync('bpftool', ['link', 'show', '-j'], {
    encoding: 'utf8',
    env: { ...process.env, PATH: `${process.env['PATH'] ?? ''}:/usr/sbin:/sbin` },
  });
  const id = fs.statSync(cgroup).ino;
  const rows = JSON.parse(out.trim() || '[]') as Array<{ type: string; prog_id: number; cgroup_id?: number }>;
  return rows.filter((r) => r.type === 'cgroup' && r.cgroup_id === id).map((r) => r.prog_id);
}

/** Polls `cond` until it holds or `ms` (scaled by SLOW) have passed. */
async function until(cond: () => boolean, ms = 3000): Promise<boolean> {
  const end = Date.now() + ms * SLOW;
  while (Date.now() < end) {
    if (cond()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return cond();
}

// Privileged: as root (make test, CI) this always runs; elsewhere it stops
// loudly instead of passing with nothing tested.
if (process.getuid?.() !== 0) {
  t.bailout('test/native needs root (real BPF: CAP_BPF, CAP_NET_ADMIN): run `make test` as root');
} else {
  try {
    loadBinding();
  } catch (err) {
    t.fail(`addon not built: ${(err as Error).message}`);
  }

  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'lbctl-native-'));
  ensureBpffs();
  const pinRoot = `/sys/fs/bpf/lbctl-native-test-${process.pid}`;
  const cgRoot = cgroup2Root();
  const cgDir = cgRoot ? path.join(cgRoot, `lbctl-native-test-${process.pid}`) : undefined;
  const cgDir2 = cgDir ? `${cgDir}-b` : undefined;
  const objects: BpfObject[] = [];
  const track = (o: BpfObject): BpfObject => (objects.push(o), o);

  t.teardown(() => {
    for (const o of objects) o.close();
    fs.rmSync(pinRoot, { recursive: true, force: true });
    for (const d of [cgDir, cgDir2]) if (d && fs.existsSync(d)) fs.rmdirSync(d);
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  const testObj = compile('native_test', tmp);
  const badObj = compile('native_bad', tmp);

  // Shared across the sequential subtests below.
  let obj1!: BpfObject;
  let obj2!: BpfObject;

  t.test('binding basics', async (t) => {
    t.match(libbpfVersion(), /^\d+\.\d+$/);
    t.ok(numPossibleCpus() >= 1);
  });

  t.test('open errors', async (t) => {
    const missing = path.join(tmp, 'missing.o');
    t.throws(() => BpfObject.open(missing), { code: 'ENOENT', errno: 2, op: 'bpf_object__open_file', path: missing });
    try {
      BpfObject.open(testObj, { maxEntries: { no_such_map: 8 } });
      t.fail('should throw');
    } catch (err) {
      t.ok(err instanceof BpfError && err instanceof LbError);
      t.match(err, { code: 'ENOENT', op: 'bpf_map__set_max_entries', map: 'no_such_map' });
      t.match((err as Error).message, /no_such_map/);
    }
    t.throws(() => BpfObject.open(testObj, { maxEntries: { nt_hash: 0 } }), { code: 'EINVAL', op: 'argument' });
  });

  t.test('open + load with pinRoot and maxEntries override', async (t) => {
    obj1 = track(BpfObject.open(testObj, { pinRoot, maxEntries: { nt_lru: 256 } }));
    t.equal(obj1.path, testObj);
    t.same(obj1.mapNames().sort(), ['nt_hash', 'nt_lru', 'nt_percpu']);
    t.same(obj1.programNames().sort(), ['nt_connect4', 'nt_connect4_alt', 'nt_xdp']);
    t.throws(() => obj1.map('nt_hash'), { code: 'EINVAL' }, 'map() before load');
    const loading = obj1.load();
    t.throws(() => obj1.mapNames(), { code: 'EBUSY' }, 'busy while loading');
    await loading;
    await t.rejects(obj1.load(), { code: 'EALREADY' });
    t.ok(fs.existsSync(path.join(pinRoot, 'nt_hash')), 'hash map pinned by name');
    t.notOk(fs.existsSync(path.join(pinRoot, 'nt_lru')), 'lru map not pinned');
    const lru = obj1.map('nt_lru');
    t.match(lru, { name: 'nt_lru', type: BPF_MAP_TYPE_LRU_HASH, keySize: 8, valueSize: 16, maxEntries: 256, perCpu: false });
    const h = obj1.map('nt_hash');
    t.match(h, { name: 'nt_hash', type: BPF_MAP_TYPE_HASH, keySize: 4, valueSize: 8, maxEntries: 64, valueBufSize: 8 });
    t.ok(h.id > 0 && h.fd >= 0);
    t.throws(() => obj1.map('nope'), { code: 'ENOENT', map: 'nope' });
    t.throws(() => obj1.progFd('nope'), { code: 'ENOENT', prog: 'nope' });
    const pi = obj1.progInfo('nt_xdp');
    t.equal(pi.type, BPF_PROG_TYPE_XDP);
    t.match(pi.tag, /^[0-9a-f]{16}$/);
    t.ok(pi.id > 0);
  });

  t.test('without a pin root nothing is pinned (not under /sys/fs/bpf itself, as libbpf would)', async (t) => {
    const atRoot = '/sys/fs/bpf/nt_hash';
    const before = fs.existsSync(atRoot);
    const o = BpfObject.open(testObj);
    t.teardown(() => o.close());
    await o.load();
    t.ok(o.map('nt_hash').fd >= 0, 'the map is made');
    t.notOk(!before && fs.existsSync(atRoot), 'and not pinned at the bpffs root');
  });

  t.test('hash map round trips', async (t) => {
    const h = obj1.map('nt_hash');
    t.equal(h.lookup(u32(5)), null);
    h.update(u32(5), u64(500));
    h.update(u32(6), u64(600));
    t.same(h.lookup(u32(5)), u64(500));
    h.update(u32(5), u64(501), BPF_EXIST);
    t.same(h.lookup(u32(5)), u64(501));
    t.same(h.keys().map((k) => k.readUInt32LE()).sort(), [5, 6]);
    const ents = h.entries().map(([k, v]) => [k.readUInt32LE(), Number(v.readBigUInt64LE())]);
    t.same(ents.sort(), [[5, 501], [6, 600]]);
    t.equal(h.delete(u32(6)), true);
    t.equal(h.delete(u32(6)), false);
    t.same(h.keys().map((k) => k.readUInt32LE()), [5]);
  });

  t.test('size checks and errno errors', async (t) => {
    const h = obj1.map('nt_hash');
    try {
      h.lookup(Buffer.alloc(3));
      t.fail('should throw');
    } catch (err) {
      t.ok(err instanceof BpfError);
      t.match(err, { code: 'EINVAL', errno: 22, op: 'size-check', map: 'nt_hash' });
      t.match((err as Error).message, /nt_hash.*key is 3 bytes, expected 4/);
    }
    t.throws(() => h.update(u32(1), Buffer.alloc(4)), { code: 'EINVAL', op: 'size-check', message: /value is 4 bytes, expected 8/ });
    t.throws(() => h.update(u32(5), u64(1), BPF_NOEXIST), {
      code: 'EEXIST', errno: 17, op: 'bpf_map_update_elem', map: 'nt_hash',
      message: 'bpf_map_update_elem(nt_hash): File exists (EEXIST)',
    });
    t.throws(() => h.update(u32(99), u64(1), BPF_EXIST), { code: 'ENOENT', op: 'bpf_map_update_elem' });
    try {
      h.update(u32(5), u64(1), BPF_NOEXIST);
    } catch (err) {
      t.ok(isErrno(err, 'EEXIST'));
      t.ok(isErrno(err, 'ENOENT', 'EEXIST'));
      t.notOk(isErrno(err, 'ENOENT'));
      t.match((err as Error).stack, /test[/\\]native[/\\]bpf\.ts/, 'stack points at the caller');
    }
  });

  t.test('batchUpdate and entries on LRU', async (t) => {
    const lru = obj1.map('nt_lru');
    const n = 10;
    const keys = Buffer.concat(Array.from({ length: n }, (_, i) => lruKey(i)));
    const vals = Buffer.concat(Array.from({ length: n }, (_, i) => lruVal(i)));
    t.equal(lru.batchUpdate(keys, vals, n), n);
    const ents = lru.entries();
    t.equal(ents.length, n);
    for (const [k, v] of ents) {
      const i = k.readUInt32LE(0) - 0x0a000000;
      t.same(v, lruVal(i), `entry ${i}`);
    }
    t.equal(lru.keys().length, n);
    t.throws(() => lru.batchUpdate(keys, vals, n + 1), { code: 'EINVAL', op: 'size-check', message: /keys is 80 bytes, expected 88/ });
    t.equal(lru.batchUpdate(Buffer.alloc(0), Buffer.alloc(0), 0), 0);

    // NOEXIST with the second key already present: one written, then EEXIST.
    const h = obj1.map('nt_hash');
    try {
      h.batchUpdate(Buffer.concat([u32(20), u32(5), u32(21)]), Buffer.concat([u64(1), u64(2), u64(3)]), 3, BPF_NOEXIST);
      t.fail('should throw');
    } catch (err) {
      t.match(err, { code: 'EEXIST', count: 1 });
    }
    t.same(h.lookup(u32(20)), u64(1));
    t.equal(h.lookup(u32(21)), null);
    t.equal(h.batchUpdate(Buffer.concat([u32(20), u32(5)]), Buffer.concat([u64(2), u64(501)]), 2, BPF_EXIST), 2);
    t.same(h.lookup(u32(20)), u64(2));
    t.throws(() => h.batchUpdate(u32(22), u64(1), 1, BPF_EXIST), { code: 'ENOENT', count: 0 });
    t.equal(h.delete(u32(20)), true);
  });

  t.test('entriesFlat packs what entries() lists: batch lookups, the walk where a map type has none, per-CPU strides', async (t) => {
    /** Entries as sorted hex pairs, from entries() or from entriesFlat()'s two buffers. */
    const pairs = (m: BpfMap): string[] => m.entries().map(([k, v]) => `${k.toString('hex')}=${v.toString('hex')}`).sort();
    const flatPairs = (m: BpfMap): string[] => {
      const { keys, values, count } = m.entriesFlat();
      t.equal(keys.length, count * m.keySize, `${m.name}: keys are keySize each`);
      t.equal(values.length, count * m.valueBufSize, `${m.name}: values are valueBufSize each`);
      return Array.from({ length: count }, (_, i) =>
        `${keys.subarray(i * m.keySize, (i + 1) * m.keySize).toString('hex')}=${values.subarray(i * m.valueBufSize, (i + 1) * m.valueBufSize).toString('hex')}`,
      ).sort();
    };
    const lru = obj1.map('nt_lru');
    t.ok(pairs(lru).length >= 10, 'the LRU map holds the batch written above');
    t.same(flatPairs(lru), pairs(lru), 'LRU hash (BPF_MAP_LOOKUP_BATCH)');
    t.same(flatPairs(obj1.map('nt_percpu')), pairs(obj1.map('nt_percpu')), 'per-CPU array: one valueBufSize per entry');

    const empty = mapCreate({ type: BPF_MAP_TYPE_HASH, keySize: 4, valueSize: 8, maxEntries: 8, name: 'nt_empty' });
    t.teardown(() => empty.close());
    t.same(empty.entriesFlat(), { keys: Buffer.alloc(0), values: Buffer.alloc(0), count: 0 }, 'an empty map');
    // More entries than one batch chunk (1024): the cursor carries on.
    const big = mapCreate({ type: BPF_MAP_TYPE_HASH, keySize: 4, valueSize: 8, maxEntries: 5000, name: 'nt_big' });
    t.teardown(() => big.close());
    const n = 3000;
    big.batchUpdate(Buffer.concat(Array.from({ length: n }, (_, i) => u32(i))), Buffer.concat(Array.from({ length: n }, (_, i) => u64(i * 7))), n);
    const all = flatPairs(big);
    t.equal(all.length, n, `${n} entries across chunks, none twice`);
    t.same(all, pairs(big), 'the same as entries()');

    // An LPM trie has no batch lookup (the kernel answers ENOTSUPP): the get_next_key walk.
    const lpm = mapCreate({ type: BPF_MAP_TYPE_LPM_TRIE, keySize: 8, valueSize: 4, maxEntries: 16, flags: BPF_F_NO_PREALLOC, name: 'nt_lpm' });
    t.teardown(() => lpm.close());
    const lpmKey = (len: number, a: number): Buffer => Buffer.concat([u32(len), Buffer.from([10, a, 0, 0])]);
    lpm.update(lpmKey(16, 1), u32(1));
    lpm.update(lpmKey(24, 2), u32(2));
    lpm.update(lpmKey(32, 3), u32(3));
    t.equal(flatPairs(lpm).length, 3, 'every entry of the trie');
    t.same(flatPairs(lpm), pairs(lpm), 'the same as entries()');
  });

  t.test('per-CPU map and progTestRun', async (t) => {
    const ncpu = numPossibleCpus();
    const pc = obj1.map('nt_percpu');
    t.match(pc, { type: BPF_MAP_TYPE_PERCPU_ARRAY, perCpu: true, valueSize: 8, valueBufSize: ncpu * 8 });
    const before = pc.lookup(u32(0));
    t.equal(before?.length, ncpu * 8);
    const sum = (b: Buffer | null): bigint => {
      let s = 0n;
      for (let i = 0; b && i < ncpu; i++) s += b.readBigUInt64LE(i * 8);
      return s;
    };
    const fd = obj1.progFd('nt_xdp');
    const pkt = Buffer.alloc(64, 0xab);
    const r = progTestRun(fd, { data: pkt, repeat: 5 });
    t.equal(r.retval, XDP_PASS);
    t.same(r.data, pkt);
    t.equal(typeof r.duration, 'number');
    t.equal(progTestRun(fd, { data: Buffer.alloc(20) }).retval, XDP_DROP, 'runt dropped');
    t.equal(sum(pc.lookup(u32(0))) - sum(before), 6n, 'program counted its runs');

    const vals = Buffer.alloc(ncpu * 8);
    for (let i = 0; i < ncpu; i++) vals.writeBigUInt64LE(BigInt(i + 1), i * 8);
    pc.update(u32(3), vals);
    t.same(pc.lookup(u32(3)), vals);
    // one CPU's value where every possible CPU's is due (with one possible CPU, one too many)
    t.throws(() => pc.update(u32(3), ncpu > 1 ? u64(1) : Buffer.alloc(16)), { code: 'EINVAL', op: 'size-check' }, `a value of the wrong size for ${ncpu} CPU(s) refused`);
    const ents = pc.entries();
    t.equal(ents.length, 4, 'array entries: all indices');
    t.same(ents.find(([k]) => k.readUInt32LE() === 3)?.[1], vals);
    t.throws(() => progTestRun(-1, { data: pkt }), { code: 'EBADF', op: 'bpf_prog_test_run_opts' });
  });

  t.test('enableRunTimeStats: a program\'s runs counted while it is held, the sysctl left as it was', async (t) => {
    const SYSCTL = '/proc/sys/kernel/bpf_stats_enabled';
    const was = fs.readFileSync(SYSCTL, 'utf8');
    const { id } = obj1.progInfo('nt_xdp');
    const runs = (): number => (JSON.parse(execFileSync('bpftool', ['-j', 'prog', 'show', 'id', String(id)], { encoding: 'utf8' })) as { run_cnt?: number }).run_cnt ?? 0;
    const pkt = Buffer.alloc(64, 0xab);
    // one run a call: a test run of many stops at a pending signal (EINTR), and bpftool's exit leaves one
    const hundredRuns = (): void => {
      for (let i = 0; i < 100; i++) progTestRun(obj1.progFd('nt_xdp'), { data: pkt });
    };
    const stats = enableRunTimeStats();
    try {
      const before = runs();
      hundredRuns();
      t.ok(runs() - before >= 100, `100 test runs counted (run_cnt +${runs() - before})`);
      t.equal(fs.readFileSync(SYSCTL, 'utf8'), was, 'kernel.bpf_stats_enabled as it was');
    } finally {
      stats.close();
    }
    stats.close(); // twice: nothing
    // (another process holding the stats, or the sysctl on, would count them still)
    if (was.trim() === '0') {
      const after = runs();
      hundredRuns();
      t.equal(runs(), after, 'closed: no longer counted');
    }
  });

  t.test('second object reuses the pinned map', async (t) => {
    obj2 = track(BpfObject.open(testObj, { pinRoot, maxEntries: { nt_lru: 256 } }));
    await obj2.load();
    const h1 = obj1.map('nt_hash');
    const h2 = obj2.map('nt_hash');
    t.equal(h2.id, h1.id, 'same kernel map');
    h1.update(u32(77), u64(7700));
    t.same(h2.lookup(u32(77)), u64(7700));
    t.not(obj2.map('nt_lru').id, obj1.map('nt_lru').id, 'unpinned maps are per object');

    const pinned = openPinnedMap(path.join(pinRoot, 'nt_hash'));
    t.match(pinned, { name: 'nt_hash', id: h1.id, keySize: 4, valueSize: 8, maxEntries: 64 });
    t.same(pinned.lookup(u32(77)), u64(7700));
    pinned.close();
    pinned.close();
    t.throws(() => pinned.lookup(u32(77)), { code: 'EBADF' });
    t.throws(() => openPinnedMap(path.join(pinRoot, 'missing')), { code: 'ENOENT', op: 'bpf_obj_get' });
  });

  t.test('maxEntries mismatch with a pinned map', async (t) => {
    const o = track(BpfObject.open(testObj, { pinRoot, maxEntries: { nt_hash: 32 } }));
    const err = await o.load().then(
      () => undefined,
      (e: unknown) => e,
    );
    t.ok(err instanceof BpfError, 'rejects with BpfError');
    const be = err as BpfError;
    t.equal(be.op, 'bpf_object__load');
    t.equal(be.code, 'EINVAL');
    t.match(be.message, /nt_hash/);
    t.match(be.log, /mismatch/);
    t.ok(fs.existsSync(path.join(pinRoot, 'nt_hash')), 'pinned map survives');
    t.same(obj1.map('nt_hash').lookup(u32(77)), u64(7700));
  });

  t.test('verifier rejection is readable', async (t) => {
    const o = track(BpfObject.open(badObj, { pinRoot }));
    const err = await o.load().then(
      () => undefined,
      (e: unknown) => e,
    );
    t.ok(err instanceof BpfError);
    const be = err as BpfError;
    t.match(be, { code: 'EACCES', errno: 13, op: 'bpf_object__load', path: badObj });
    t.match(be.log, /invalid access to packet/);
    t.match(be.message, /invalid access to packet/);
    t.match(be.message, /^bpf_object__load\(.*native_bad\.o\): Permission denied \(EACCES\)/);
    t.match(be.stack, /test[/\\]native[/\\]bpf\.ts/, 'async stack spliced from the caller');
  });

  t.test('close during load, close semantics', async (t) => {
    // Always a private pinRoot: without one libbpf pins nt_hash in /sys/fs/bpf itself.
    const o = BpfObject.open(testObj, { pinRoot });
    const p = o.load();
    o.close();
    await p;
    t.throws(() => o.mapNames(), { code: 'EBADF' });
    await t.rejects(o.load(), { code: 'EBADF' });

    const o2 = BpfObject.open(testObj, { pinRoot });
    await o2.load();
    const m = o2.map('nt_hash');
    m.update(u32(1), u64(1));
    o2.close();
    o2.close();
    t.throws(() => m.lookup(u32(1)), { code: 'EBADF', map: 'nt_hash', message: /object .*closed/ });
    t.equal(m.fd, -1);
  });

  t.test('cgroup attach through a pinned link', async (t) => {
    // No cgroup v2 mount is a broken test host, not a reason to skip.
    if (!cgDir || !cgDir2) {
      t.fail('no cgroup2 mount in /proc/mounts');
      return;
    }
    fs.mkdirSync(cgDir);
    fs.mkdirSync(cgDir2);
    const cgId = Number(fs.statSync(cgDir, { bigint: true }).ino);
    const linkPin = path.join(pinRoot, 'links', 'connect4');
    const fds = openFds();

    const a = obj1.attachCgroup('nt_connect4', cgDir, linkPin);
    t.same(a.updated, false);
    t.ok(a.linkId > 0);
    t.ok(fs.existsSync(linkPin), 'link pinned, parent dir created');
    const p1 = obj1.progInfo('nt_connect4').id;
    t.same(pinnedLinkInfo(linkPin), {
      id: a.linkId, progId: p1, type: BPF_LINK_TYPE_CGROUP, attachType: BPF_CGROUP_INET4_CONNECT, cgroupId: cgId,
    });
    t.same(cgroupProgIds(cgDir), [p1], 'bpftool sees the program on the cgroup');

    const b = obj2.attachCgroup('nt_connect4', cgDir, linkPin);
    t.same(b, { linkId: a.linkId, updated: true });
    const p2 = obj2.progInfo('nt_connect4').id;
    t.not(p2, p1);
    t.equal(pinnedLinkInfo(linkPin).progId, p2, 'pinned link now runs the new program');

    const alt = obj1.progInfo('nt_connect4_alt').id;
    pinnedLinkUpdate(linkPin, obj1.progFd('nt_connect4_alt'));
    t.equal(pinnedLinkInfo(linkPin).progId, alt);
    t.throws(() => pinnedLinkUpdate(linkPin, obj1.progFd('nt_xdp')), { code: 'EINVAL', op: 'bpf_link_update' });

    t.throws(() => obj1.attachCgroup('nt_connect4', cgDir2, linkPin), { code: 'EEXIST', op: 'attachCgroup' },
      'same pin, other cgroup');
    t.throws(() => openPinnedMap(linkPin), { code: 'EINVAL', message: /bpf-link, not a BPF map/ });
    t.throws(() => pinnedLinkInfo(path.join(pinRoot, 'nt_hash')), { code: 'EINVAL', message: /not a BPF link/ });
    t.throws(() => obj1.attachCgroup('nt_connect4', path.join(cgDir, 'nope'), linkPin + '2'), { code: 'ENOENT', op: 'open' });
    t.equal(openFds(), fds, 'no fd leaked');

    unpin(linkPin);
    t.throws(() => pinnedLinkInfo(linkPin), { code: 'ENOENT' });
    t.throws(() => unpin(linkPin), { code: 'ENOENT', op: 'unlink', path: linkPin });
    t.ok(await until(() => cgroupProgIds(cgDir).length === 0), 'detached after unpin');
  });

  t.test('a held link restores the program it ran, even after that program lost its last other holder', async (t) => {
    if (!cgDir) {
      t.fail('no cgroup2 mount in /proc/mounts');
      return;
    }
    const linkPin = path.join(pinRoot, 'links', 'held');
    const a = track(BpfObject.open(testObj, { pinRoot }));
    await a.load();
    a.attachCgroup('nt_connect4', cgDir, linkPin);
    const pa = a.progInfo('nt_connect4').id;
    const held = holdPinnedLink(linkPin);
    t.match(held, { progId: pa, path: linkPin });
    t.equal(held.id, pinnedLinkInfo(linkPin).id);
    // Only the link and the hold keep program pa alive once its object is closed.
    a.close();
    const b = track(BpfObject.open(testObj, { pinRoot }));
    await b.load();
    b.attachCgroup('nt_connect4', cgDir, linkPin);
    const pb = b.progInfo('nt_connect4').id;
    t.equal(pinnedLinkInfo(linkPin).progId, pb, 'switched to the new program');
    held.restore();
    t.equal(pinnedLinkInfo(linkPin).progId, pa, 'restored to the program it ran when held');
    t.same(cgroupProgIds(cgDir), [pa], 'bpftool sees the restored program on the cgroup');
    held.restore();
    t.equal(pinnedLinkInfo(linkPin).progId, pa, 'restoring again is a no-op');
    const fds = openFds();
    held.close();
    held.close();
    t.equal(openFds(), fds - 2, 'close() releases the link and program fds');
    t.throws(() => held.restore(), { code: 'EBADF', op: 'bpf_link_update', message: /held link is closed/ });
    t.throws(() => holdPinnedLink(path.join(pinRoot, 'nt_hash')), { code: 'EINVAL', message: /not a BPF link/ });
    t.throws(() => holdPinnedLink(path.join(pinRoot, 'links', 'missing')), { code: 'ENOENT', op: 'bpf_obj_get' });
    unpin(linkPin);
    t.ok(await until(() => cgroupProgIds(cgDir).length === 0), 'detached after unpin');
  });

  t.test('BTF layouts of map keys and values: declared (before load) and kept by the kernel', async (t) => {
    const lruKey = {
      kind: 'struct', name: 'nt_lru_key', size: 8,
      members: [
        { name: 'addr', offset: 0, type: { kind: 'int', name: '__u32', size: 4, signed: false } },
        { name: 'port', offset: 4, type: { kind: 'int', name: '__u16', size: 2, signed: false } },
        { name: 'pad', offset: 6, type: { kind: 'int', name: '__u16', size: 2, signed: false } },
      ],
    };
    const o = track(BpfObject.open(testObj, { pinRoot }));
    t.same(o.mapLayout('nt_lru').key, lruKey, 'declared, before load');
    t.match(o.mapLayout('nt_hash'), { key: { kind: 'int', name: '__u32', size: 4 }, value: { kind: 'int', name: '__u64', size: 8 } });
    t.throws(() => o.mapLayout('nope'), { code: 'ENOENT', map: 'nope' });
    await o.load();
    t.same(o.map('nt_lru').layout()?.key, lruKey, 'the kernel keeps the same layout with the map');
    const pinned = openPinnedMap(path.join(pinRoot, 'nt_hash'));
    t.match(pinned.layout(), { key: { kind: 'int', size: 4 }, value: { kind: 'int', size: 8 } }, 'and with a map opened by its pin');
    pinned.close();
    // Arrays and byte-order typedefs, from the datapath object.
    const sock = path.resolve(here, '..', '..', 'bpf', '.output', 'sock.bpf.o');
    const d = BpfObject.open(sock, { pinRoot: path.join(pinRoot, 'sock') });
    try {
      t.match(d.mapLayout('lb6_backends').value, {
        kind: 'struct', name: 'lb6_backend', size: 20,
        members: [
          { name: 'address', offset: 0, type: { kind: 'array', count: 4, size: 16, elem: { kind: 'int', name: '__be32', size: 4 } } },
          { name: 'port', offset: 16, type: { kind: 'int', name: '__be16', size: 2 } },
          { name: 'proto', offset: 18, type: { kind: 'int', name: '__u8', size: 1 } },
          { name: 'state', offset: 19 },
        ],
      });
    } finally {
      d.close();
    }
    // A map created without BTF has no layout.
    const raw = execFileSync('bpftool', ['map', 'create', path.join(pinRoot, 'nobtf'), 'type', 'hash', 'key', '4', 'value', '8', 'entries', '4', 'name', 'nobtf'], {
      env: { ...process.env, PATH: `${process.env['PATH'] ?? ''}:/usr/sbin:/sbin` },
    });
    t.ok(raw !== undefined);
    const nobtf = openPinnedMap(path.join(pinRoot, 'nobtf'));
    t.equal(nobtf.layout(), null, 'no BTF: null');
    nobtf.close();
  });

  t.end();
}
