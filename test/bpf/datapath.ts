// The datapath object on the real kernel: load (verifier), pinned maps,
// links into a child cgroup, the reconciler writing real maps, restore.
import { appendFileSync, mkdirSync, readFileSync, rmdirSync } from 'node:fs';
import path from 'node:path';
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { COMPAT_OBJECT, DEFAULT_OBJECT, cgroup2Root, cleanupDatapath, lacksSetRetval, loadDatapath, openPinnedMaps } from '../../src/datapath/loader.js';
import { dumpMaps, verifyMapLayout, type ByteMap } from '../../src/datapath/maps.js';
import { mapSpecs } from '../../src/datapath/abi.gen.js';
import { desiredState } from '../../src/model/desired.js';
import { validateEndpointSlice, validateService } from '../../src/model/k8s.js';
import { Reconciler } from '../../src/reconcile/reconciler.js';
import { lbList } from '../../src/cli/commands/lb-list.js';
import { pinnedLinkInfo } from '../../src/native/bpf.js';
import { service, slice } from '../fakes/objects.js';
import { createSandbox } from '../helpers/sandbox.js';

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
  t.equal(dp.programs.length, 11, 'every program passed the verifier and is attached');
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

// The verifier's own words for a helper call it refuses, from a three-instruction
// program (call HELPER; r0 = 0; exit) loaded with BPF_PROG_LOAD through python3's
// ctypes: no BPF object and no compiler needed, so it runs in the vmtest guests too.
const PROBE_PY = String.raw`
import ctypes, json, os, struct, sys
helper, prog_type, attach = (int(a) for a in sys.argv[1:4])
insns = b"".join(struct.pack("<BBhi", code, 0, 0, imm) for code, imm in ((0x85, helper), (0xb7, 0), (0x95, 0)))
ib = ctypes.create_string_buffer(insns, len(insns))
lic = ctypes.create_string_buffer(b"GPL")
log = ctypes.create_string_buffer(1 << 16)
attr = ctypes.create_string_buffer(struct.pack("<IIQQIIQII16sII", prog_type, 3, ctypes.addressof(ib), ctypes.addressof(lic),
                                               1, len(log), ctypes.addressof(log), 0, 0, b"lbctl_probe", 0, attach), 128)
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(321, 5, attr, 128)  # bpf(BPF_PROG_LOAD), x86_64
err = ctypes.get_errno()
if fd >= 0:
    os.close(fd)
print(json.dumps({"loaded": fd >= 0, "errno": err, "log": log.value.decode()}))
`;
const BPF_PROG_TYPE_SOCKET_FILTER = 1;
const BPF_PROG_TYPE_CGROUP_SOCK_ADDR = 18;
const BPF_CGROUP_INET4_CONNECT = 10;
const SET_RETVAL = 187;

function verifierSays(helper: number, progType: number, attachType = 0): { loaded: boolean; errno: number; log: string } {
  return JSON.parse(execFileSync('python3', ['-c', PROBE_PY, String(helper), String(progType), String(attachType)], { encoding: 'utf8' }));
}

/** A helper id no kernel has (the verifier checks ids against its own __BPF_FUNC_MAX_ID). */
const NO_SUCH_HELPER = 100_000;

t.test("the set_retval detection, against the verifier's real words", async (t) => {
  // A kernel without the helper (before 5.18) refuses every id at or above its
  // own helper count with one format, "invalid func %s#%d", where %s is
  // "unknown" for an id it has no name for. This kernel says it for an id no
  // kernel has; a kernel before 5.18 says it, in the same words, for #187.
  const missing = verifierSays(NO_SUCH_HELPER, BPF_PROG_TYPE_CGROUP_SOCK_ADDR, BPF_CGROUP_INET4_CONNECT);
  t.notOk(missing.loaded, 'a call to a helper the kernel lacks is refused');
  t.match(missing.log, new RegExp(`^invalid func unknown#${NO_SUCH_HELPER}$`, 'm'), 'in these words');
  t.notOk(lacksSetRetval({ log: missing.log }), 'another missing helper is not taken for set_retval');
  t.ok(lacksSetRetval({ log: missing.log.replaceAll(`#${NO_SUCH_HELPER}`, `#${SET_RETVAL}`) }), 'the same words for #187 are');

  // The helper itself, where this kernel refuses it: a program type without
  // it (6.18: "program of this type cannot use helper bpf_set_retval#187";
  // 6.1: "unknown func bpf_set_retval#187"; 5.10, which has no such helper
  // at all: "invalid func unknown#187").
  const elsewhere = verifierSays(SET_RETVAL, BPF_PROG_TYPE_SOCKET_FILTER);
  t.notOk(elsewhere.loaded);
  t.match(elsewhere.log, /(bpf_set_retval|unknown)#187/, `the kernel names it: ${elsewhere.log.split('\n').find((l) => l.includes('#187') && !l.includes('call'))}`);
  t.ok(lacksSetRetval({ log: elsewhere.log }), 'recognised');

  // And where lbctl calls it, the kernel has it or not: the verdict decides which object the loader uses.
  const here = verifierSays(SET_RETVAL, BPF_PROG_TYPE_CGROUP_SOCK_ADDR, BPF_CGROUP_INET4_CONNECT);
  t.equal(lacksSetRetval({ log: here.log }), !here.loaded, here.loaded ? 'cgroup/connect4 may call bpf_set_retval on this kernel' : 'this kernel lacks bpf_set_retval');
  t.notOk(lacksSetRetval({ log: 'R1 invalid mem access' }), 'an unrelated verifier error is not');
});

t.test('refusals through each object, with real sockets: ECONNREFUSED (standard), EPERM (compat)', async (t) => {
  const hasSetRetval = verifierSays(SET_RETVAL, BPF_PROG_TYPE_CGROUP_SOCK_ADDR, BPF_CGROUP_INET4_CONNECT).loaded;
  // Its own cgroup, client netns (no default route) and bpf root, removed at teardown.
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const cases = [
    { name: 'standard', object: DEFAULT_OBJECT, errno: 'ECONNREFUSED' },
    { name: 'compat', object: COMPAT_OBJECT, errno: 'EPERM' },
  ];
  for (const c of cases) {
    await t.test(`${c.name} object`, async (t) => {
      if (c.name === 'standard' && !hasSetRetval) {
        // A kernel before 5.18: the standard object must be refused, in words the loader recognises.
        const err = await loadDatapath({ bpfRoot: sb.bpfRoot, cgroup: sb.cgroup, object: c.object }).then(
          (dp) => (dp.close(), undefined),
          (e: unknown) => e,
        );
        t.ok(err && lacksSetRetval(err), 'the standard object is refused for want of bpf_set_retval, and the loader sees why');
        cleanupDatapath(sb.bpfRoot);
        return;
      }
      const dp = await loadDatapath({ bpfRoot: sb.bpfRoot, cgroup: sb.cgroup, object: c.object });
      try {
        // One service at 10.96.0.0:80/TCP with no endpoint, and the address's wildcard entry.
        new Reconciler(dp.maps).sync(model(1, 0), { prune: true });
        const refused = async (args: string[]): Promise<string | null> => (await sb.client<{ error: string | null }>(['refused', ...args])).error;
        const tcp = await refused(['10.96.0.0', '80', '--proto', 'tcp']);
        t.equal(tcp, c.errno, `TCP connect() to a service without backends: ${c.errno}`);
        // The object the agent loads on this kernel: what its refusals measured, for docs/kernels.md (scripts/vmtest).
        if (process.env.LBCTL_KERNEL_FACTS && (c.name === 'standard') === hasSetRetval) {
          appendFileSync(process.env.LBCTL_KERNEL_FACTS, `measured: refused-connect ${tcp} ${path.basename(c.object)}\n`);
        }
        t.equal(await refused(['10.96.0.0', '5353', '--proto', 'udp']), c.errno, `UDP sendto() to an unserved port of a service address: ${c.errno}`);
        t.equal(await refused(['::ffff:10.96.0.0', '80', '--proto', 'tcp']), c.errno, `the same through connect6 (v4-mapped): ${c.errno}`);
        // Not refused by lbctl: an address that is no service fails as the netns makes it (no route).
        t.equal(await refused(['10.98.0.1', '80', '--proto', 'tcp']), 'ENETUNREACH', 'an address that is no service is left to the kernel');
      } finally {
        dp.close();
        cleanupDatapath(sb.bpfRoot);
      }
    });
  }
});
