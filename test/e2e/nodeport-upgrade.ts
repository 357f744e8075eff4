// The tc datapath's flows through upgrades that change its maps (issue 34,
// item 10): a steady load of new connections through a NodePort served by
// both pods, and two long-lived connections (to the local pod, and through
// SNAT to the remote one), while node 1's agent is restarted on
//
//   (a) the previous release's layout (bpf/.output/tests/nodeport_nat_in_ct
//       .bpf.o: the SNAT translations in lb*_ct, no lb*_nat), then the
//       standard object: the translations are moved out into lb*_nat;
//   (b) the standard object with other map sizes (--ct-max, --nat-max): the
//       flows are carried into maps of the new size;
//   (c) another layout of the CT entries (nodeport_ct_layout.bpf.o: fields
//       reordered, one added), and back: converted field by field.
//
// In each tc attach mode; and (b) again with --nodeport-acceleration native,
// where the XDP programs, loaded on the new maps, must be switched in
// before the old maps' last entries are carried over (the commit). Not one request may fail, the long connections keep
// their pod and their SNAT port, and the maps end as the standard object lays
// them out.
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import { ECHO_PORT, endpoint, hookPrograms, hostOf, makeLab, NODE1, NODE1_TO_N2, northSouth, perMode, POD1, POD2, tcAttachModes, wireForXdp, xdpProgram, type Lab, type LongRun } from '../helpers/nodeport-lab.js';
import { mapsDir } from '../../src/datapath/loader.js';
import type { AttachMode } from '../../src/datapath/nodeport.js';
import { createSandbox, SLOW, type LoadRun, type Sandbox } from '../helpers/sandbox.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const PREVIOUS = path.join(ROOT, 'bpf/.output/tests/nodeport_nat_in_ct.bpf.o');
const RELAID = path.join(ROOT, 'bpf/.output/tests/nodeport_ct_layout.bpf.o');

const HTTP = 8080;
const WEB_PORT = 30120;
const LOCAL_ECHO = 30121;
const REMOTE_ECHO = 30122;
const RATE = Math.max(10, Math.round(60 / SLOW));
const NODE_ARGS = ['--devices', 'n1e,n1b', '--node-name', 'node1'];

const manifests = (): string =>
  yamlDocs([
    ...northSouth({ name: 'web', clusterIPs: ['10.96.0.40'], ports: [{ name: 'http', port: 80, targetPort: HTTP, nodePort: WEB_PORT }] }, { 4: [endpoint(1, 4), endpoint(2, 4)] }),
    ...northSouth({ name: 'echo-local', clusterIPs: ['10.96.0.41'], ports: [{ name: 'echo', port: 7000, targetPort: ECHO_PORT, nodePort: LOCAL_ECHO }] }, { 4: [endpoint(1, 4)] }),
    ...northSouth({ name: 'echo-remote', clusterIPs: ['10.96.0.42'], ports: [{ name: 'echo', port: 7000, targetPort: ECHO_PORT, nodePort: REMOTE_ECHO }] }, { 4: [endpoint(2, 4)] }),
  ]);

interface Nat { direction: string; source: string; to: string }
interface Ct { direction: string; source: string; destination: string; flags: string[] }

const list = async <T>(sb: Sandbox, what: 'ct' | 'nat'): Promise<T[]> => JSON.parse((await sb.lbctl(['bpf', what, 'list', '-o', 'json'])).stdout) as T[];

/** The datapath's counters that grew since `since` (what a failure's message shows: drops, repairs, rebalances). */
async function grown(sb: Sandbox, since: Record<string, number>): Promise<Record<string, number>> {
  const now = await sb.metrics();
  return Object.fromEntries(Object.entries(now).filter(([k, v]) => v > (since[k] ?? 0) && !/^np_(fwd|rev|xdp_fwd)$/.test(k)).map(([k, v]) => [k, v - (since[k] ?? 0)]));
}

/**
 * The load and both long connections keep working: about 2 s more of the
 * load, none failed; 5 more answers each. A failure's message names the
 * datapath counters that grew since `since` (taken before the restart).
 */
async function serves(t: Test, sb: Sandbox, load: LoadRun, longs: readonly LongRun[], what: string, since: Record<string, number>): Promise<void> {
  const before = load.progress()!;
  const p = await load.waitFor((x) => x.ok >= before.ok + 2 * RATE, `${2 * RATE} more connections ${what}`, 30_000);
  t.equal(p.failed, 0, `${what}: new connections keep succeeding (${p.ok - before.ok} more${p.failed ? `; failed: ${JSON.stringify(p.failures)}; counters grown since the restart: ${JSON.stringify(await grown(sb, since))}` : ''})`);
  for (const l of longs) await l.answered(5, `5 more answers ${what}`);
  t.same(longs.map((l) => l.progress()?.failed ?? -1), [0, 0], `${what}: the long connections answer, none failed`);
}

/** How long the new programs ran before the entries the old ones wrote meanwhile were carried (the commit's log; ms). */
const windowOf = (logs: readonly Record<string, unknown>[]): string => {
  const c = logs.find((l) => l.msg === 'tc maps carried over: committed after the switch (entries the old programs wrote meanwhile carried too)');
  return c ? `switch to commit ${String(c['ms'])} ms, ${JSON.stringify(c['after'])} carried after it` : 'no commit logged';
};

async function scenario(t: Test, sb: Sandbox, lab: Lab, mode: AttachMode): Promise<void> {
  const node = [...NODE_ARGS, '--tc-attach', mode];
  let since: Record<string, number> = {};
  const restart = async (args: readonly string[], what: string): Promise<Record<string, unknown>[]> => {
    since = await sb.metrics();
    t.equal(await lab.agent.stop(10_000), 0, `the agent exits 0 on SIGTERM before ${what}`);
    await lab.agent.start([...node, ...args]);
    return lab.agent.agent!.logs;
  };

  // (a) the previous release's layout first
  await lab.agent.start([...node, '--tc-object', PREVIOUS]);
  const load = lab.startLoad({ tcp: [`${NODE1.v4}:${WEB_PORT}@${RATE}`], maxSeconds: 120 * SLOW });
  await load.waitFor((p) => p.ok >= RATE, 'the load to run');
  const localLong = lab.startLong(NODE1.v4, LOCAL_ECHO);
  const remoteLong = lab.startLong(NODE1.v4, REMOTE_ECHO);
  const longs = [localLong, remoteLong];
  for (const l of longs) await l.answered(3, 'the first answers');
  const remoteLocal = remoteLong.progress()!.local!;
  const snatOf = async (): Promise<string | undefined> => (await list<Nat>(sb, 'nat')).find((n) => n.direction === 'OUT' && n.source === remoteLocal)?.to;
  const snat = await snatOf();
  t.ok(snat?.startsWith(`${NODE1_TO_N2.v4}:`), `the remote long connection is SNATed (${snat})`);
  const inCt = (await list<Ct>(sb, 'ct')).filter((c) => c.direction === 'OUT' && c.flags.includes('snat'));
  t.ok(inCt.length > 0, `the previous layout keeps the translations in lb4_ct (${inCt.length}; no lb4_nat pinned)`);
  await serves(t, sb, load, longs, 'on the previous release\'s layout', since);

  let logs = await restart([], 'the upgrade to the standard object');
  t.ok(logs.some((l) => l.msg === 'tc maps carried over: committed after the switch (entries the old programs wrote meanwhile carried too)'), 'the agent moved the translations out and committed');
  await serves(t, sb, load, longs, `after the upgrade from the previous layout (${windowOf(logs)})`, since);
  t.equal(await snatOf(), snat, 'the remote long connection keeps its SNAT port, now in lb4_nat');
  // lb4_ct (struct lb4_ct_key: dir at byte 13; struct lb4_ct_entry: flags at byte 28) holds no translation any more
  const ct = (await sb.mapEntries('lb4_ct')) as Array<{ key: string[]; value: string[] }>;
  const left = ct.filter((e) => parseInt(e.key[13]!, 16) === 1 && (parseInt(e.value[28]!, 16) & 1) === 1);
  t.equal(left.length, 0, `no SNAT translation left in lb4_ct (${ct.length} entries there)`);

  // (b) other sizes
  logs = await restart(['--ct-max', '65536', '--nat-max', '32768'], 'the resize');
  const resized = logs.filter((l) => l.msg === 'tc flows carried into a map of another size').map((l) => l['map']);
  t.same([...resized].sort(), ['lb4_ct', 'lb4_nat', 'lb6_ct', 'lb6_nat'], `every flow map carried into its new size (${resized.join(', ')})`);
  await serves(t, sb, load, longs, `after the resize (${windowOf(logs)})`, since);
  t.equal(await snatOf(), snat, 'the SNAT port kept through the resize');

  // (c) another entry layout, and back
  logs = await restart(['--ct-max', '65536', '--nat-max', '32768', '--tc-object', RELAID], 'the change of layout');
  const converted = logs.filter((l) => l.msg === 'tc flows carried into a map of another layout, converted field by field').map((l) => l['map']);
  t.ok(['lb4_ct', 'lb4_nat'].every((m) => converted.includes(m)), `the flow maps converted to the other layout (${converted.join(', ') || JSON.stringify(logs.filter((l) => /tc|maps/.test(String(l.msg))))})`);
  await serves(t, sb, load, longs, `on another layout (${windowOf(logs)})`, since);
  logs = await restart(['--ct-max', '65536', '--nat-max', '32768'], 'the change of layout back');
  t.ok(logs.some((l) => l.msg === 'tc flows carried into a map of another layout, converted field by field' && l['map'] === 'lb4_ct'), 'and converted back');
  await serves(t, sb, load, longs, `after the layout came back (${windowOf(logs)})`, since);
  t.equal(await snatOf(), snat, 'the SNAT port kept through both conversions');

  const r = await load.stop();
  t.equal(r.failed, 0, `no connection of the load failed (${r.attempted} in ${r.seconds} s)${r.failed ? `: ${JSON.stringify(r.failures)}` : ''}`);
  const [local, remote] = [await localLong.stop(), await remoteLong.stop()];
  for (const [what, l, pod] of [['local', local, POD1.v4], ['remote', remote, POD2.v4]] as const) {
    t.same(l.failures, [], `${what} long connection: no request failed`);
    t.same(Object.keys(l.servers), [`${pod}:${ECHO_PORT}`], `${what} long connection: one pod throughout`);
    t.equal(Object.keys(l.seenAs).length, 1, `${what} long connection: the pod saw one client address and port throughout`);
  }
  t.equal(hostOf(Object.keys(remote.seenAs)[0] ?? ''), NODE1_TO_N2.v4, 'the remote pod saw node 1\'s SNAT address');
  const m = await sb.metrics();
  t.equal((m['np_nat_repair'] ?? 0) + (m['np_nat_stolen'] ?? 0), 0, 'no translation was lost on the way (np_nat_repair, np_nat_stolen 0)');
  await lab.agent.stop(10_000);
}

t.test('NodePort flows through upgrades that change the tc maps: layout, sizes, the split of SNAT from CT, in each attach mode', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab: Lab = await makeLab(sb);
  sb.writeManifest('services.yaml', manifests());
  await perMode(t, lab, (t, mode) => scenario(t, sb, lab, mode));
});

// (b) with XDP in front: node 1's agent resizes its flow maps twice under the
// load, with XDP programs on both its devices. Each time the new maps are
// the ones XDP runs on (and tc's program too, by the kernel's map ids), XDP
// goes on finishing remote flows (np_xdp_fwd grows), and the remote long
// connection, carried into the new maps, keeps its pod and SNAT port.
t.test('with XDP acceleration: flows carried into maps of new sizes, the XDP programs switched onto them, no connection failed', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab: Lab = await makeLab(sb);
  wireForXdp(lab);
  sb.writeManifest('services.yaml', manifests());
  const mode = (await tcAttachModes())[0]!;
  const node = [...NODE_ARGS, '--tc-attach', mode, '--nodeport-acceleration', 'native'];
  await lab.agent.start(node);
  const load = lab.startLoad({ tcp: [`${NODE1.v4}:${WEB_PORT}@${RATE}`], maxSeconds: 90 * SLOW });
  await load.waitFor((p) => p.ok >= RATE, 'the load to run');
  const remoteLong = lab.startLong(NODE1.v4, REMOTE_ECHO);
  const longs = [lab.startLong(NODE1.v4, LOCAL_ECHO), remoteLong];
  for (const l of longs) await l.answered(3, 'the first answers');
  const remoteLocal = remoteLong.progress()!.local!;
  const snatOf = async (): Promise<string | undefined> => (await list<Nat>(sb, 'nat')).find((n) => n.direction === 'OUT' && n.source === remoteLocal)?.to;
  const snat = await snatOf();
  t.ok(snat?.startsWith(`${NODE1_TO_N2.v4}:`), `the remote long connection is SNATed (${snat})`);

  const mapIds = async (id: number): Promise<number[]> => (await sb.bpftool<{ map_ids?: number[] }>(['prog', 'show', 'id', String(id)])).map_ids ?? [];
  const atXdp = async (what: string): Promise<void> => {
    const pinned = await Promise.all(['lb4_ct', 'lb4_nat'].map(async (m) => (await sb.bpftool<{ id: number }>(['map', 'show', 'pinned', path.join(mapsDir(sb.bpfRoot), m)])).id));
    const tc = (await hookPrograms(lab, lab.n1, ['n1e']))['n1e']!.ingress[0]!;
    const tcMaps = await mapIds(tc.id);
    t.same(pinned.filter((id) => !tcMaps.includes(id)), [], `${what}: tc's program on n1e runs on the pinned lb4_ct and lb4_nat`);
    for (const dev of ['n1e', 'n1b']) {
      const x = xdpProgram(lab.n1, dev);
      t.match(x, { mode: 1, name: 'lb_nodeport_xdp' }, `${what}: ${dev} runs lb_nodeport_xdp in the driver`);
      const ids = x ? await mapIds(x.id) : [];
      t.same(pinned.filter((id) => !ids.includes(id)), [], `${what}: ${dev}'s XDP program runs on the pinned lb4_ct and lb4_nat (ids ${pinned.join(', ')}; its maps ${ids.join(', ')})`);
    }
    const before = await sb.metrics();
    await remoteLong.answered(5, `5 more answers ${what}`);
    const after = await sb.metrics();
    const fwd = (after['np_xdp_fwd'] ?? 0) - (before['np_xdp_fwd'] ?? 0);
    t.ok(fwd >= 10, `${what}: remote flows finished at XDP while the long connection answered 5 more (np_xdp_fwd +${fwd})`);
  };
  await atXdp('at the start');

  for (const [args, what] of [[['--ct-max', '65536', '--nat-max', '32768'], 'the resize'], [[], 'the resize back']] as const) {
    const since = await sb.metrics();
    t.equal(await lab.agent.stop(10_000), 0, `the agent exits 0 on SIGTERM before ${what}`);
    await lab.agent.start([...node, ...args]);
    const logs = lab.agent.agent!.logs;
    const resized = logs.filter((l) => l.msg === 'tc flows carried into a map of another size').map((l) => l['map']);
    t.same([...resized].sort(), ['lb4_ct', 'lb4_nat', 'lb6_ct', 'lb6_nat'], `${what}: every flow map carried into its new size (${resized.join(', ')})`);
    t.ok(logs.some((l) => l.msg === 'tc maps carried over: committed after the switch (entries the old programs wrote meanwhile carried too)'), `${what}: committed after the switch`);
    await serves(t, sb, load, longs, `after ${what} (${windowOf(logs)})`, since);
    await atXdp(`after ${what}`);
    t.equal(await snatOf(), snat, `${what}: the SNAT port kept`);
  }

  const r = await load.stop();
  t.equal(r.failed, 0, `no connection of the load failed (${r.attempted} in ${r.seconds} s)${r.failed ? `: ${JSON.stringify(r.failures)}` : ''}`);
  const remote = await remoteLong.stop();
  await longs[0]!.stop();
  t.same(remote.failures, [], 'the remote long connection: no request failed');
  t.same(Object.keys(remote.servers), [`${POD2.v4}:${ECHO_PORT}`], 'the remote long connection: one pod throughout');
  t.equal(Object.keys(remote.seenAs).length, 1, 'the remote long connection: the pod saw one client address and port throughout');
  const m = await sb.metrics();
  t.equal((m['np_nat_repair'] ?? 0) + (m['np_nat_stolen'] ?? 0), 0, 'no translation was lost on the way (np_nat_repair, np_nat_stolen 0)');
  await lab.agent.stop(10_000);
});
