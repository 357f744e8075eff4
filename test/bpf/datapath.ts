// The datapath object on the real kernel: load (verifier), pinned maps,
// links into a child cgroup, the reconciler writing real maps, restore.
import { mkdirSync, readFileSync, rmdirSync } from 'node:fs';
import path from 'node:path';
import t from 'tap';
import { COMPAT_OBJECT, cgroup2Root, cleanupDatapath, lacksSetRetval, loadDatapath, openPinnedMaps } from '../../src/datapath/loader.js';
import { dumpMaps, verifyMapLayout, type ByteMap } from '../../src/datapath/maps.js';
import { mapSpecs } from '../../src/datapath/abi.gen.js';
import { desiredState } from '../../src/model/desired.js';
import { validateEndpointSlice, validateService } from '../../src/model/k8s.js';
import { Reconciler } from '../../src/reconcile/reconciler.js';
import { lbList } from '../../src/cli/commands/lb-list.js';
import { pinnedLinkInfo } from '../../src/native/bpf.js';
import { service, slice } from '../fakes/objects.js';

// Privileged: as root (make test, CI) these always run; elsewhere they stop loudly.
if (process.getuid?.() !== 0) t.bailout('the BPF suites need root (CAP_BPF, CAP_NET_ADMIN): run `make test` as root');

const run = `lbctl-test-bpf-${process.pid}`;
const bpfRoot = `/sys/fs/bpf/${run}`;
const cgroup = path.join(cgroup2Root(), run);
mkdirSync(cgroup, { recursive: true });
t.teardown(() => {
  try {
    cleanupDatapath(bpfRoot);
  } finally {
    rmdirSync(cgroup);
  }
});

function model(n: number, backendsPer = 2) {
  const services = [];
  const slices = [];
  for (let i = 0; i < n; i++) {
    const s = validateService(service(`s${i}`, [`10.96.${i >> 8}.${i & 255}`, `fd00:96::${i.toString(16)}`], [{ name: 'p', port: 80 }]));
    if (!s.ok) throw new Error(s.reason);
    services.push(s.value);
    for (const [fam, mk] of [['IPv4', (j: number) => `10.244.0.${j + 1}`], ['IPv6', (j: number) => `fd00:244::${j + 1}`]] as const) {
      const e = validateEndpointSlice(slice(`s${i}-${fam.toLowerCase()}`, `s${i}`, fam, [{ name: 'p', port: 8080 }], Array.from({ length: backendsPer }, (_, j) => ({ addresses: [mk(j)] }))));
      if (!e.ok) throw new Error(e.reason);
      slices.push(e.value);
    }
  }
  return desiredState({ services, slices }).frontends;
}

t.test('load, attach to a child cgroup, program, list, restore', async (t) => {
  const dp = await loadDatapath({ bpfRoot, cgroup });
  t.equal(dp.programs.length, 9, 'every program passed the verifier and is attached');
  t.ok(dp.programs.every((p) => !p.updated), 'fresh links');
  const info = pinnedLinkInfo(path.join(bpfRoot, 'links', 'lb_connect4'));
  t.ok(info.progId > 0);

  const r = new Reconciler(dp.maps);
  const d = model(3);
  const res = r.sync(d, { prune: true });
  t.equal(res.applied, res.planned);
  t.equal(r.sync(d, { prune: true }).planned, 0);

  const pinned = openPinnedMaps(bpfRoot);
  const list = lbList(dumpMaps(pinned.maps));
  pinned.close();
  t.equal(list.length, 6, '3 services × 2 families');
  t.match(list[0], { frontend: '10.96.0.0:80/TCP', type: 'ClusterIP', backends: [{ address: '10.244.0.1:8080', slot: 1, state: 'active' }, { slot: 2 }] });
  t.match(list[3], { frontend: '[fd00:96::]:80/TCP' });
  dp.close();

  // A second agent: links are switched in place, ids and state adopted.
  const again = await loadDatapath({ bpfRoot, cgroup });
  t.ok(again.programs.every((p) => p.updated), 'existing pinned links updated, not re-created');
  t.equal(pinnedLinkInfo(path.join(bpfRoot, 'links', 'lb_connect4')).id, info.id, 'same link');
  const r2 = new Reconciler(again.maps);
  t.same(r2.restore(), { frontends: 6, backends: 4 });
  t.equal(r2.sync(d, { prune: true }).planned, 0, 'a restarted agent rewrites nothing');
  r2.sync(model(1), { prune: true });
  const after = openPinnedMaps(bpfRoot);
  t.equal(lbList(dumpMaps(after.maps)).length, 2);
  after.close();
  again.close();
});

t.test('map sizes are set at load, and a pinned map of another size is refused by name', async (t) => {
  const root = `${bpfRoot}-sizes`;
  t.teardown(() => cleanupDatapath(root));
  // The services map: a master and a wildcard entry per frontend, a slot per backend.
  const dp = await loadDatapath({ bpfRoot: root, cgroup, sizes: { services: 4, backends: 4, sockRevNat: 1024 } });
  t.equal(dp.object.map('lb4_services').maxEntries, 12, '2 * services + backends');
  t.equal(dp.object.map('lb6_backends').maxEntries, 4);
  t.equal(dp.object.map('lb4_reverse_nat').maxEntries, 4, 'one rev-NAT id per frontend');
  t.equal(dp.object.map('lb4_sock_revnat').maxEntries, 1024);

  // Full maps: what does not fit is reported by name, and what was there stays.
  const r = new Reconciler(dp.maps);
  r.sync(model(4, 1), { prune: true });
  t.equal(r.sync(model(4, 1), { prune: true }).planned, 0, 'as many frontends as --max-services fit, wildcards and all');
  // Liveness' write probe on a full rev-NAT map: it passes, and changes nothing.
  t.equal(dp.object.map('lb4_reverse_nat').entries().length, 4, 'the rev-NAT map is full');
  // The same entries (a rewrite may move an entry within its hash bucket, so in any order).
  const contents = (): Record<string, string[]> => {
    const pinned = openPinnedMaps(root);
    try {
      return Object.fromEntries(Object.entries(dumpMaps(pinned.maps)).map(([k, v]) => [k, (v as unknown[]).map((e) => JSON.stringify(e)).sort()]));
    } finally {
      pinned.close();
    }
  };
  const full = contents();
  t.doesNotThrow(() => r.probeWrite(), 'the write probe passes with the map full');
  t.same(contents(), full, 'and leaves the maps as they were');
  t.throws(() => dp.maps.putRevNat(0, 4, { address: '0.0.0.0', port: 0 }), { code: 'E2BIG' }, 'where a new entry (the old canary) has no room');
  r.sync(model(2, 1), { prune: true });
  const before = JSON.stringify(dumpMaps(openPinnedMaps(root).maps));
  const over = r.sync(model(5, 1), { prune: true });
  t.ok(over.notProgrammed.length > 0, `a full map does not stop the sync: ${over.notProgrammed.length} frontends reported not programmed`);
  t.ok(over.notProgrammed.every((n) => /E2BIG|ENOSPC|too long|No space/.test(n.reason)), 'each naming the kernel’s "no room"');
  const pinned = openPinnedMaps(root);
  const list = lbList(dumpMaps(pinned.maps));
  pinned.close();
  t.ok(list.some((e) => e.frontend === '10.96.0.0:80/TCP' && e.backends.length === 1), 'the first service still served');
  t.ok(JSON.parse(before).services.length > 0);
  r.sync(model(2, 1), { prune: true }); // back to what fits
  dp.close();
  const fits = openPinnedMaps(root);
  const listNow = lbList(dumpMaps(fits.maps));
  fits.close();
  t.equal(listNow.length, 4);

  // Bigger maps asked for: every entry migrates, ids and all, and the links switch.
  const bigger = await loadDatapath({ bpfRoot: root, cgroup, sizes: { services: 8, backends: 4, sockRevNat: 1024 } });
  t.match(bigger.migrated.find((m) => m.map === 'lb4_services'), { from: 12, to: 20 }, 'lb4_services resized');
  t.equal(bigger.object.map('lb4_services').maxEntries, 20);
  t.ok(bigger.programs.every((p) => p.updated), 'the pinned links were switched to programs using the new maps');
  const afterMigration = openPinnedMaps(root);
  t.equal(afterMigration.maps.lb4_services.maxEntries, 20, 'the new maps are pinned in place');
  t.same(lbList(dumpMaps(afterMigration.maps)), listNow, 'every entry carried over');
  afterMigration.close();
  const r2 = new Reconciler(bigger.maps);
  r2.restore();
  t.equal(r2.sync(model(2, 1), { prune: true }).planned, 0, 'ids and state kept: nothing to rewrite');
  bigger.close();

  // Smaller than the contents: refused by name, and nothing changes.
  await t.rejects(loadDatapath({ bpfRoot: root, cgroup, sizes: { services: 1, backends: 1, sockRevNat: 1024 } }), {
    code: 'ECONFIG',
    message: /cannot carry/,
  });
  const still = openPinnedMaps(root);
  t.equal(still.maps.lb4_services.maxEntries, 20, 'the old maps stay pinned');
  t.same(lbList(dumpMaps(still.maps)), listNow);
  still.close();

  // Sizes each in range whose services map the kernel would refuse (E2BIG).
  await t.rejects(loadDatapath({ bpfRoot: root, cgroup, sizes: { services: 1 << 26, backends: 1 << 26, sockRevNat: 1024 } }), {
    code: 'ECONFIG',
    message: /2 \* services \+ backends = 201326592 entries, more than 134217728/,
  });
});

t.test('more than 65,535 frontends in one family: 32-bit rev-NAT ids end to end', async (t) => {
  const N = 70_000;
  const root = `${bpfRoot}-wide`;
  t.teardown(() => cleanupDatapath(root));
  const vip = (i: number): string => `10.${100 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`;
  const services = [];
  const slices = [];
  for (let i = 0; i < N; i++) {
    const s = validateService(service(`w${i}`, [vip(i)], [{ name: 'p', port: 80 }]));
    if (!s.ok) throw new Error(s.reason);
    const e = validateEndpointSlice(slice(`w${i}-ipv4`, `w${i}`, 'IPv4', [{ name: 'p', port: 8080 }], [{ addresses: ['10.244.0.1'] }]));
    if (!e.ok) throw new Error(e.reason);
    services.push(s.value);
    slices.push(e.value);
  }
  const d = desiredState({ services, slices }).frontends;
  const dp = await loadDatapath({ bpfRoot: root, cgroup, sizes: { services: N, backends: N, sockRevNat: 1024 } });
  t.equal(dp.object.map('lb4_reverse_nat').maxEntries, N, 'no 65536 cap');
  const r = new Reconciler(dp.maps);
  const res = r.sync(d, { prune: true });
  t.equal(res.applied, res.planned, `${N} frontends programmed`);
  const pinned = openPinnedMaps(root);
  const dump = dumpMaps(pinned.maps);
  pinned.close();
  const ids = dump.revNat.filter((e) => e.family === 4).map((e) => e.id).sort((a, b) => a - b);
  t.equal(new Set(ids).size, N, 'one distinct rev-NAT id per frontend');
  t.equal(ids.at(-1), N, 'ids run past 0xffff');
  const masters = lbList(dump).map((e) => e.revNatId).sort((a, b) => a - b);
  t.equal(masters.join(), ids.join(), 'the master entries carry the whole ids');
  dp.close();
  const again = await loadDatapath({ bpfRoot: root, cgroup, sizes: { services: N, backends: N, sockRevNat: 1024 } });
  const r2 = new Reconciler(again.maps);
  t.same(r2.restore(), { frontends: N, backends: 1 });
  t.equal(r2.sync(d, { prune: true }).planned, 0, 'a restarted agent adopts every id, those above 0xffff too');
  again.close();
});

t.test('a map whose layout differs from the codecs stops with a clear message', async (t) => {
  const fake = { name: 'lb4_services', keySize: 16, valueSize: 16, maxEntries: 1 } as ByteMap;
  t.throws(() => verifyMapLayout(fake, mapSpecs.lb4_services), {
    code: 'ECONFIG',
    message: /map lb4_services: key is 16 bytes, lbctl expects 12 \(lb4_key\).*lbctl cleanup/,
  });
});

t.test('the object carries no map lbctl has no codec for', async (t) => {
  const dp = await loadDatapath({ bpfRoot, cgroup });
  t.same(dp.object.mapNames().filter((n) => !(n in mapSpecs)).sort(), []);
  dp.close();
  t.ok(readFileSync('/proc/mounts', 'utf8').includes(' bpf '));
});

t.test('the compat object (no bpf_set_retval, for kernels before 5.18) passes the verifier and shares the maps', async (t) => {
  const root = `${bpfRoot}-compat`;
  t.teardown(() => cleanupDatapath(root));
  const dp = await loadDatapath({ bpfRoot: root, cgroup, object: COMPAT_OBJECT });
  t.equal(dp.programs.length, 9);
  t.equal(dp.variant, 'custom');
  dp.close();
  t.ok(lacksSetRetval({ log: 'call unknown#187\ninvalid func unknown#187' }), 'old kernels are recognised');
  t.notOk(lacksSetRetval({ log: 'R1 invalid mem access' }));
});
