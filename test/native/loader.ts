// The loader's layout checks against the real kernel: a pinned map whose
// layout cannot be converted, and one without BTF, stop the load with an
// error naming the map, before anything is staged or switched.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { cgroup2Root, cleanupDatapath, loadDatapath } from '../../src/datapath/loader.js';
import { BpfObject, openPinnedMap, pinnedLinkInfo, unpin } from '../../src/native/bpf.js';

if (process.getuid?.() !== 0) t.bailout('test/native needs root (real BPF: CAP_BPF, CAP_NET_ADMIN): run `make test` as root');

const run = `lbctl-test-loader-${process.pid}`;
const bpfRoot = `/sys/fs/bpf/${run}`;
const cgroup = path.join(cgroup2Root(), run);
const tmp = mkdtempSync(path.join(os.tmpdir(), 'lbctl-loader-'));
mkdirSync(cgroup, { recursive: true });
t.teardown(() => {
  try {
    if (existsSync(bpfRoot)) cleanupDatapath(bpfRoot);
  } finally {
    rmdirSync(cgroup);
    rmSync(tmp, { recursive: true, force: true });
  }
});
const sbin = { ...process.env, PATH: `${process.env['PATH'] ?? ''}:/usr/sbin:/sbin` };
const triple = execFileSync('gcc', ['-dumpmachine'], { encoding: 'utf8' }).trim();
const bpfDir = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..', '..', 'bpf');

/** An "old" object of the test's own: `source` compiled (with bpf/ on the include path) into tmp/NAME.o. */
/** An "old" lb_metrics of the given type and size, as an earlier lbctl (or a broken one) pinned it. */
const oldMetrics = (type: string, entries: number): string => `#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
struct {
	__uint(type, ${type});
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, ${entries});
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_metrics SEC(".maps");
char LICENSE[] SEC("license") = "GPL";
`;

function compile(name: string, source: string): string {
  const src = path.join(tmp, `${name}.bpf.c`);
  const obj = path.join(tmp, `${name}.o`);
  writeFileSync(src, source);
  execFileSync('clang', ['-O2', '-g', '-target', 'bpf', `-I/usr/include/${triple}`, `-I${bpfDir}`, '-c', src, '-o', obj]);
  return obj;
}

t.test('a pinned map whose layout cannot be converted stops the load, naming map and field; nothing moves', async (t) => {
  // An "old" lb4_reverse_nat whose port was host order: a copy cannot keep its meaning.
  const obj = compile('old_revnat', `#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
struct lb4_reverse_nat { __be32 address; __u16 port; __u8 pad[2]; };
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_reverse_nat);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb4_reverse_nat SEC(".maps");
char LICENSE[] SEC("license") = "GPL";
`);
  const old = BpfObject.open(obj, { pinRoot: path.join(bpfRoot, 'maps') });
  await old.load();
  const oldId = old.map('lb4_reverse_nat').id;
  old.close();

  await t.rejects(loadDatapath({ bpfRoot, cgroup }), {
    code: 'ECONFIG',
    message: /map lb4_reverse_nat value field port: byte order changed \(host to network order\): cannot convert/,
  });
  const m = openPinnedMap(path.join(bpfRoot, 'maps', 'lb4_reverse_nat'));
  t.equal(m.id, oldId, 'the pinned map is untouched');
  m.close();
  t.notOk(existsSync(path.join(bpfRoot, 'maps-next')), 'nothing was staged');
  t.notOk(existsSync(path.join(bpfRoot, 'maps', 'lb4_services')), 'nothing was loaded');
  t.notOk(existsSync(path.join(bpfRoot, 'links', 'lb_connect4')), 'nothing was attached');
  unpin(path.join(bpfRoot, 'maps', 'lb4_reverse_nat'));
});

t.test('a pinned map without BTF is refused by name, with lbctl cleanup as the way out; the links keep their programs', async (t) => {
  const dp = await loadDatapath({ bpfRoot, cgroup });
  dp.close();
  const link = path.join(bpfRoot, 'links', 'lb_connect4');
  const before = pinnedLinkInfo(link).progId;
  const pin = path.join(bpfRoot, 'maps', 'lb_affinity');
  unpin(pin);
  execFileSync('bpftool', ['map', 'create', pin, 'type', 'lru_hash', 'key', '16', 'value', '16', 'entries', '65536', 'name', 'lb_affinity'], { env: sbin });
  await t.rejects(loadDatapath({ bpfRoot, cgroup }), { code: 'ECONFIG', message: /map lb_affinity pinned at .* has no BTF.*lbctl cleanup/ });
  t.equal(pinnedLinkInfo(link).progId, before, 'lb_connect4 still runs its program');
  t.notOk(existsSync(path.join(bpfRoot, 'maps-next')), 'nothing was staged');
});

t.test('a pinned map of another type or flags is made anew with its entries; per-CPU against shared values is refused', async (t) => {
  cleanupDatapath(bpfRoot);
  // An "old" lb4_reverse_nat in the standard layout, created without BPF_F_NO_PREALLOC.
  const obj = compile('prealloc_revnat', `#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "include/lb_types.h"
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_reverse_nat);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb4_reverse_nat SEC(".maps");
char LICENSE[] SEC("license") = "GPL";
`);
  const old = BpfObject.open(obj, { pinRoot: path.join(bpfRoot, 'maps') });
  await old.load();
  const key = Buffer.from([7, 0, 0, 0]);
  const value = Buffer.from([10, 96, 0, 10, 0, 80, 0, 0]);
  old.map('lb4_reverse_nat').update(key, value);
  t.equal(old.map('lb4_reverse_nat').flags, 0, 'the old map is preallocated');
  old.close();

  const dp = await loadDatapath({ bpfRoot, cgroup });
  t.match(dp.migrated.find((m) => m.map === 'lb4_reverse_nat'), { entries: 1, converted: false }, 'lb4_reverse_nat was made anew with its entry');
  dp.close();
  const m = openPinnedMap(path.join(bpfRoot, 'maps', 'lb4_reverse_nat'));
  t.equal(m.flags, 1, 'the pinned map now has BPF_F_NO_PREALLOC');
  t.same(m.lookup(key), value, 'and the entry');
  m.close();
  t.notOk(existsSync(path.join(bpfRoot, 'maps-next')), 'the migration committed');

  // lb_metrics (per-CPU) pinned as a plain array: refused by name.
  cleanupDatapath(bpfRoot);
  mkdirSync(path.join(bpfRoot, 'maps'), { recursive: true });
  const mobj = compile('shared_metrics', oldMetrics('BPF_MAP_TYPE_ARRAY', 9));
  const o2 = BpfObject.open(mobj, { pinRoot: path.join(bpfRoot, 'maps') });
  await o2.load();
  o2.close();
  await t.rejects(loadDatapath({ bpfRoot, cgroup }), { code: 'ECONFIG', message: /map lb_metrics pinned at .* is not per-CPU and .* declares it per-CPU.*lbctl cleanup/ });
  t.notOk(existsSync(path.join(bpfRoot, 'maps-next')), 'nothing was staged');
});

t.test('lb_metrics pinned at the size lbctl used before (9, the enum) grows to its slots with every counter', async (t) => {
  cleanupDatapath(bpfRoot);
  mkdirSync(path.join(bpfRoot, 'maps'), { recursive: true });
  const obj = compile('old_metrics', oldMetrics('BPF_MAP_TYPE_PERCPU_ARRAY', 9));
  const old = BpfObject.open(obj, { pinRoot: path.join(bpfRoot, 'maps') });
  await old.load();
  const m9 = old.map('lb_metrics');
  const counters = Buffer.alloc(m9.valueBufSize);
  for (let cpu = 0; cpu * 8 < counters.length; cpu++) counters.writeBigUInt64LE(BigInt(1000 + cpu), cpu * 8);
  m9.update(Buffer.from([8, 0, 0, 0]), counters);
  old.close();

  const dp = await loadDatapath({ bpfRoot, cgroup });
  t.match(dp.migrated.find((m) => m.map === 'lb_metrics'), { from: 9, to: 64 }, 'lb_metrics migrated from 9 to 64 entries');
  dp.close();
  const m = openPinnedMap(path.join(bpfRoot, 'maps', 'lb_metrics'));
  t.equal(m.maxEntries, 64);
  t.same(m.lookup(Buffer.from([8, 0, 0, 0])), counters, 'every CPU of the last counter carried over');
  m.close();
  t.notOk(existsSync(path.join(bpfRoot, 'maps-next')), 'the migration committed');
});
