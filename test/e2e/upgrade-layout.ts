// An upgrade across a change of map layout, under load. The "old" datapath is
// bpf/.output/sock_layout_test.bpf.o (bpf/sock.c built with LB_LAYOUT_TEST:
// lb_service reordered, with a wider count and a field the standard layout
// drops, 24 bytes instead of 20; lb4_backend reordered at the same size). The
// test loads and attaches it itself and fills its maps with what a fresh
// agent writes for the manifests, converted into the old layout. A client
// then opens fresh connections at a steady rate while the real agent starts
// with the standard object on the same bpf root: it must convert every entry
// into the standard layout, switch the links, and lose no connection.
import { existsSync } from 'node:fs';
import path from 'node:path';
import t, { type Test } from 'tap';
import { hasSetRetval } from '../../src/datapath/features.js';
import { converter } from '../../src/datapath/layout.js';
import { DEFAULT_OBJECT } from '../../src/datapath/loader.js';
import { BpfObject, openPinnedMap } from '../../src/native/bpf.js';
import { serviceObject, serviceWithBackends, sliceObject, yamlDocs } from '../helpers/manifests.js';
import { createSandbox, HTTP_PORT, ROOT, SLOW, UDP_PORT, type LoadRun, type Sandbox } from '../helpers/sandbox.js';

// Built both ways, as the datapath is: kernels without bpf_set_retval (before 5.18) take the compat build.
const VARIANT = path.join(ROOT, 'bpf/.output', (await hasSetRetval()) ? 'sock_layout_test.bpf.o' : 'sock_layout_test_compat.bpf.o');
const WEB = '10.96.0.10';
const WEB6 = 'fd00:96::10';
const ECHO = '10.96.0.20';
const DIVISOR = SLOW > 1 ? 2 * SLOW : 1;
const RATE = Math.round(300 / DIVISOR);
const SIDE_RATE = Math.round(100 / DIVISOR);
const TOTAL_RATE = RATE + 2 * SIDE_RATE;
/** The maps the agent writes; their entries are the state the upgrade must carry over. */
const STATE_MAPS = ['lb4_services', 'lb6_services', 'lb4_backends', 'lb6_backends', 'lb4_reverse_nat', 'lb6_reverse_nat'];

function manifests(sb: Sandbox): Record<string, string> {
  const v4 = sb.backends.map((b) => b.v4);
  return {
    'web.yaml': serviceWithBackends({ name: 'web', clusterIPs: [WEB, WEB6], ports: [{ name: 'http', port: 80 }] }, [
      { name: 'web-v4', family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: v4 },
      { name: 'web-v6', family: 6, ports: [{ name: 'http', port: HTTP_PORT }], addresses: sb.backends.map((b) => b.v6) },
    ]),
    'echo.yaml': yamlDocs([
      serviceObject({ name: 'echo', clusterIPs: [ECHO], ports: [{ name: 'echo', port: 53000, protocol: 'UDP' }] }),
      sliceObject({ name: 'echo-v4', service: 'echo', family: 4, ports: [{ name: 'echo', port: UDP_PORT, protocol: 'UDP' }], addresses: v4 }),
    ]),
  };
}

const bytes = (hex: string[]): Buffer => Buffer.from(hex.map((h) => parseInt(h, 16)));
type RawEntry = { key: string[]; value: string[] };
const canonical = (entries: unknown[]): string[] => entries.map((e) => JSON.stringify({ key: (e as RawEntry).key, value: (e as RawEntry).value })).sort();

async function servesThrough(t: Test, load: LoadRun, what: string): Promise<void> {
  const before = load.progress()!;
  const p = await load.waitFor((x) => x.ok >= before.ok + 2 * TOTAL_RATE, `${2 * TOTAL_RATE} more connections ${what}`);
  t.equal(p.failed, 0, `${what}: connections keep succeeding (${p.ok - before.ok} more, ${p.failed} failed so far${p.failed ? `: ${JSON.stringify(p.failures)}` : ''})`);
}

t.test('an upgrade that changes map layouts converts every entry under load: zero failed connections', async (t) => {
  t.ok(existsSync(VARIANT), `${VARIANT} is built (make build)`);
  const sb = await createSandbox(t, { backends: 3, agent: false });
  for (const [name, text] of Object.entries(manifests(sb))) sb.writeManifest(name, text);
  // What the standard agent writes for these manifests (raw bytes, standard layout).
  const fresh = await sb.freshSync({ maps: STATE_MAPS });
  t.ok(fresh.sync.planned > 0, `a fresh agent writes ${fresh.sync.planned} entries`);

  // The old datapath: the variant object, attached and filled in its own layout.
  const old = BpfObject.open(VARIANT, { pinRoot: path.join(sb.bpfRoot, 'maps') });
  const standard = BpfObject.open(DEFAULT_OBJECT);
  try {
    await old.load();
    for (const p of old.programNames()) old.attachCgroup(p, sb.cgroup, path.join(sb.bpfRoot, 'links', p));
    for (const m of STATE_MAPS) {
      const [s, v] = [standard.mapLayout(m), old.mapLayout(m)];
      const key = converter(s.key!, v.key!, `fixture ${m} key`);
      const value = converter(s.value!, v.value!, `fixture ${m} value`);
      for (const e of fresh.maps[m] as RawEntry[]) old.map(m).update(key.convert(bytes(e.key)), value.convert(bytes(e.value)));
    }
    t.equal(old.map('lb4_services').valueSize, 24, 'the old lb_service is 24 bytes');
  } finally {
    old.close();
    standard.close();
  }
  const oldLinks = await sb.links();
  const oldBackendId = (await sb.bpftool<{ id: number }>(['map', 'show', 'pinned', path.join(sb.bpfRoot, 'maps', 'lb4_backends')])).id;

  // The old programs serve the old layout (the fixture is right).
  const probe = await sb.client<{ results: Array<{ body?: string; error?: string }> }>(['tcp', WEB, '80', '--count', '3']);
  t.ok(probe.results.every((r) => sb.backends.some((b) => r.body === `${b.v4}:${HTTP_PORT}`)), `the old datapath balances ${WEB}:80 (${JSON.stringify(probe.results)})`);

  const load = sb.startLoad({ tcp: [`${WEB}:80@${RATE}`, `[${WEB6}]:80@${SIDE_RATE}`], udp: [`${ECHO}:53000@${SIDE_RATE}`], maxSeconds: 60 * SLOW });
  await load.waitFor((p) => p.ok >= RATE, 'the load to run on the old datapath');
  await servesThrough(t, load, 'on the old datapath');

  const upgradeAt = Date.now();
  const sync = await sb.startAgent();
  t.equal(sync.planned, 0, 'the upgraded agent plans 0 writes: every entry arrived converted, ids and all');
  await servesThrough(t, load, 'after the upgrade');
  const r = await load.stop();
  t.comment(`load: ${r.attempted} connections over ${r.seconds} s, ${r.failed} failed; ` + Object.entries(r.targets).map(([k, v]) => `${k} ${v.ok}/${v.attempted}`).join(', '));
  t.same(r.failures, [], 'no connection failed');
  t.equal(r.failed, 0, `zero failed out of ${r.attempted}`);
  t.equal(r.attempted, r.issued, 'every attempt completed');
  t.ok(r.attempted >= 0.9 * r.seconds * TOTAL_RATE, `a steady rate (${r.attempted} in ${r.seconds} s)`);
  const after = Object.entries(r.okPer100ms).filter(([b]) => Number(b) >= upgradeAt && Number(b) < upgradeAt + 1000).reduce((n, [, v]) => n + v, 0);
  t.ok(after > 0, `${after} connections succeeded in the second after the upgrade began`);

  // The maps: the standard layout now, holding exactly what a fresh agent writes.
  t.same(await sb.lbList(), fresh.list, 'lbctl bpf lb list right afterwards: what a fresh agent programs');
  for (const m of STATE_MAPS) {
    const raw = await sb.mapEntries(m);
    t.same(canonical(raw), canonical(fresh.maps[m]!), `${m}: all ${raw.length} entries converted, byte for byte the standard layout`);
  }
  const pinned = openPinnedMap(path.join(sb.bpfRoot, 'maps', 'lb4_backends'));
  const layout = pinned.layout();
  const valueSize = openPinnedMap(path.join(sb.bpfRoot, 'maps', 'lb4_services'));
  t.same(layout?.value?.members?.map((m) => m.name), ['address', 'port', 'proto', 'state'], 'lb4_backends has the standard layout');
  t.not(pinned.id, oldBackendId, 'a new lb4_backends took the pin (libbpf alone would have reused the reordered one)');
  t.equal(valueSize.valueSize, 20, 'lb4_services values are 20 bytes');
  pinned.close();
  valueSize.close();
  t.notOk(existsSync(path.join(sb.bpfRoot, 'maps-next')), 'no staging maps are left');
  const links = await sb.links();
  for (const [n, l] of Object.entries(oldLinks)) {
    t.equal(links[n]?.linkId, l.linkId, `${n}: the same link`);
    t.not(links[n]?.progId, l.progId, `${n}: a new program`);
  }
});
