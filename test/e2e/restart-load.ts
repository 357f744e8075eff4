// Restart and upgrade without disruption. A client opens fresh connections
// to the services at a steady rate (hundreds a second) while the agent is
// killed with SIGKILL, restarted, and upgraded to a rebuilt datapath object
// (the pinned links switch programs with BPF_LINK_UPDATE). Not one
// connection may fail, and the maps must end as a fresh agent would write
// them. A second case resizes the maps under the same kind of load.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import t, { type Test } from 'tap';
import { hasSetRetval } from '../../src/datapath/features.js';
import { serviceObject, serviceWithBackends, sliceObject, yamlDocs } from '../helpers/manifests.js';
import { CLI_TIMEOUT_MS, createSandbox, HTTP_PORT, LBCTL, ROOT, rpsMasks, run, SLOW, UDP_PORT, type LoadResult, type LoadRun, type Sandbox } from '../helpers/sandbox.js';

const WEB = '10.96.0.10';
const WEB6 = 'fd00:96::10';
const ECHO = '10.96.0.20';
// Hundreds a second on real hardware. The emulated vmtest guest (SLOW) runs the
// client, the backends, the agent and lbctl on two emulated CPUs: there, 125
// attempts a second in all built a backlog of 600 and stretched one `lbctl bpf
// lb list` from 5 s to 15-30 s (past its deadline), while 50-75 a second kept
// the backlog under 10. So the guest gets an eighth of the rate (64 a second).
const LOAD_DIVISOR = SLOW > 1 ? 2 * SLOW : 1;
const RATE = Math.round(300 / LOAD_DIVISOR);
const SIDE_RATE = Math.round(100 / LOAD_DIVISOR);
/** Attempts a second over every target (see startLoad). */
const TOTAL_RATE = RATE + 2 * SIDE_RATE;
/** The maps a fresh sync must reproduce exactly (the socket and affinity maps record traffic, not intent). */
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

/**
 * Each flow's packets are received on one CPU (rps_cpus on the veth, see
 * steerFlows in test/helpers/sandbox/topology.ts). Without it, a kernel race
 * that is not lbctl's (the handshake's ACK and the request received on two
 * CPUs at once: the backend's listener answers the request with a RST) fails
 * a connection now and then (one in tens of thousands) in the emulated 5.10
 * guest, as ECONNRESET in recv: indistinguishable from one lbctl broke.
 */
function startLoad(sb: Sandbox, t: Test): LoadRun {
  for (const [ns, dev] of [[sb.clientNs, 'lbc0'], [sb.backendNs, 'lbb0']] as const) {
    const masks = rpsMasks(ns, dev);
    t.ok(masks.length > 0 && masks.every((m) => /[1-9a-f]/.test(m)), `${dev} steers each flow to one CPU (rps_cpus ${masks.join(' ')})`);
  }
  return sb.startLoad({ tcp: [`${WEB}:80@${RATE}`, `[${WEB6}]:80@${SIDE_RATE}`], udp: [`${ECHO}:53000@${SIDE_RATE}`], maxSeconds: 90 * SLOW });
}

/** The datapath keeps serving after `what`: about 2 s more of the load succeed, none fails. */
async function servesThrough(t: Test, load: LoadRun, what: string): Promise<void> {
  const before = load.progress()!;
  const p = await load.waitFor((x) => x.ok >= before.ok + 2 * TOTAL_RATE, `${2 * TOTAL_RATE} more connections ${what}`);
  t.equal(p.failed, 0, `${what}: connections keep succeeding (${p.ok - before.ok} more, ${p.failed} failed so far${p.failed ? `: ${JSON.stringify(p.failures)}` : ''})`);
}

/** Longest stretch (ms) without one successful attempt, between `from` and `to` (epoch ms). */
function longestGap(r: LoadResult, from: number, to: number): number {
  const buckets = Object.keys(r.okPer100ms).map(Number).filter((b) => b >= from && b <= to).sort((a, b) => a - b);
  let last = from;
  let gap = 0;
  for (const b of buckets) {
    gap = Math.max(gap, b - last);
    last = b;
  }
  return Math.max(gap, to - last);
}

function checkLoad(t: Test, r: LoadResult, events: Array<[string, number]>): void {
  const expected = r.seconds * TOTAL_RATE;
  t.comment(
    `load: ${r.attempted} connections attempted over ${r.seconds} s, ${r.failed} failed; max latency ${r.maxLatencyMs} ms, max backlog ${r.maxBacklog}; ` +
      Object.entries(r.targets).map(([k, v]) => `${k} ${v.ok}/${v.attempted}`).join(', '),
  );
  t.same(r.failures, [], 'no connection failed');
  t.equal(r.failed, 0, `zero failed out of ${r.attempted}`);
  t.equal(r.attempted, r.issued, 'every attempt the client issued completed');
  t.ok(r.attempted >= 0.9 * expected, `a steady rate: ${r.attempted} attempts in ${r.seconds} s (expected about ${Math.round(expected)})`);
  for (const [target, s] of Object.entries(r.targets)) {
    t.ok(Object.keys(s.backends).length >= 2, `${target} is balanced over ${Object.keys(s.backends).length} backends`);
  }
  const end = r.started + r.seconds * 1000 - 200;
  const gap = longestGap(r, r.started + 500, end);
  t.ok(gap <= 1500, `the services answered throughout: the longest stretch without a successful connection is ${gap} ms`);
  for (const [what, at] of events) {
    const after = Object.entries(r.okPer100ms).filter(([b]) => Number(b) >= at && Number(b) < at + 1000).reduce((n, [, v]) => n + v, 0);
    t.ok(after > 0, `${after} connections succeeded in the second after ${what}`);
  }
}

function programLogs(sb: Sandbox, from: number): Array<{ program: string; linkId: number; updated: boolean }> {
  return sb.agent!.logs.slice(from).filter((l) => l.msg === 'program replaced on pinned link' || l.msg === 'program attached') as never;
}

/** Sorted, so two dumps compare as sets of entries. */
function canonical(entries: unknown[]): string[] {
  return entries.map((e) => JSON.stringify(e)).sort();
}

t.test('SIGKILL, restart and upgrade under load: zero failed connections, and the maps end as a fresh sync', async (t) => {
  const sb = await createSandbox(t, { backends: 3, agent: false });
  for (const [name, text] of Object.entries(manifests(sb))) sb.writeManifest(name, text);

  // The rebuilt object: the same source with one harmless extra instruction
  // (a volatile stack store beside bpf_get_socket_cookie), so the programs'
  // bytes differ, as after an upgrade. bpf/ itself is untouched.
  const v2 = path.join(sb.runDir, 'sock-v2.bpf.o');
  const arch = execFileSync('gcc', ['-dumpmachine'], { encoding: 'utf8' }).trim();
  execFileSync(
    'clang',
    ['-O2', '-g', '-target', 'bpf', '-Wall', '-Werror', `-I/usr/include/${arch}`, '-Ibpf',
      '-Dlb_sock_cookie(ctx)=({ volatile __u32 lb_build_tag = 2; (void)lb_build_tag; bpf_get_socket_cookie(ctx); })',
      // Built as the object the agent loads here: the compat build before 5.18.
      ...((await hasSetRetval()) ? [] : ['-DLB_HAVE_SET_RETVAL=0']),
      '-c', 'bpf/sock.c', '-o', v2],
    { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] },
  );

  const first = await sb.startAgent();
  t.ok(first.planned > 0, `the first agent programs the maps (${first.planned} writes)`);
  const listBefore = await sb.lbList();
  const linksBefore = await sb.links();
  const names = Object.keys(linksBefore);
  t.ok(names.length >= 8, `${names.length} pinned links`);

  const load = startLoad(sb, t);
  await load.waitFor((p) => p.ok >= RATE, 'the load to run');
  const events: Array<[string, number]> = [];

  // 1. A crash.
  events.push(['SIGKILL', Date.now()]);
  const killed = await sb.killAgent('SIGKILL');
  t.same(killed, { code: null, signal: 'SIGKILL' }, 'the agent died of SIGKILL');
  await servesThrough(t, load, 'with the agent dead');
  t.same(await sb.lbList(), listBefore, 'the maps are untouched while the agent is dead');

  // 2. Restart: ids and state adopted, nothing written, links switched in place.
  let mark = 0;
  const restarted = await sb.startAgent();
  events.push(['the restart', Date.now()]);
  t.equal(restarted.planned, 0, 'the restarted agent plans 0 writes');
  t.equal(restarted.applied, 0, 'and applies none');
  t.equal(restarted.frontends, first.frontends, `for the same ${first.frontends} frontends`);
  let progs = programLogs(sb, mark);
  t.same(progs.map((p) => [p.program, p.updated]).sort(), names.map((n) => [n, true]), 'every program replaced on its pinned link (updated: true)');
  const linksRestarted = await sb.links();
  for (const n of names) {
    t.equal(linksRestarted[n]!.linkId, linksBefore[n]!.linkId, `${n}: the same link`);
  }
  t.same(await sb.lbList(), listBefore, 'ids, slots and rev-NAT ids are the adopted ones');
  await servesThrough(t, load, 'after the restart');

  // 3. Upgrade: stop, start with the rebuilt object.
  t.equal(await sb.stopAgent(), 0, 'the agent exits 0 on SIGTERM');
  mark = 0;
  events.push(['the upgrade began', Date.now()]);
  const upgraded = await sb.startAgent(['--bpf-object', v2]);
  events.push(['the upgrade', Date.now()]);
  t.equal(upgraded.planned, 0, 'the upgraded agent plans 0 writes');
  progs = programLogs(sb, mark);
  t.same(progs.map((p) => [p.program, p.updated]).sort(), names.map((n) => [n, true]), 'the log says every program was replaced on its pinned link');
  const linksUpgraded = await sb.links();
  let tagsChanged = 0;
  for (const n of names) {
    const [was, now] = [linksRestarted[n]!, linksUpgraded[n]!];
    t.equal(now.linkId, was.linkId, `${n}: link ${now.linkId} kept`);
    t.equal(progs.find((p) => p.program === n)?.linkId, was.linkId, `${n}: the agent logged that link id`);
    t.not(now.progId, was.progId, `${n}: program ${was.progId} → ${now.progId}`);
    if (now.progTag !== was.progTag) tagsChanged++;
  }
  t.ok(tagsChanged > 0, `the rebuilt object's instructions differ (${tagsChanged} program tags changed)`);
  await servesThrough(t, load, 'after the upgrade');
  const status = await run(LBCTL, ['status', '--brief', '--api-socket', sb.apiSocket], CLI_TIMEOUT_MS);
  t.equal(status.stdout, 'OK\n', 'lbctl status --brief: OK (the links run the upgraded programs)');

  const result = await load.stop();
  checkLoad(t, result, events);

  // 4. The maps equal what a fresh agent writes for the same manifests.
  const after = await sb.lbList();
  t.same(after, listBefore, 'lbctl bpf lb list is unchanged since the first sync');
  const raw: Record<string, unknown[]> = {};
  for (const m of STATE_MAPS) raw[m] = await sb.mapEntries(m);
  const fresh = await sb.freshSync({ maps: STATE_MAPS });
  t.ok(fresh.sync.planned > 0, `the fresh agent wrote ${fresh.sync.planned} entries`);
  t.same(after, fresh.list, 'identical frontends, backends, slots and ids as a fresh sync');
  for (const m of STATE_MAPS) t.same(canonical(raw[m]!), canonical(fresh.maps[m]!), `${m}: the same ${raw[m]!.length} raw entries`);
});

t.test('map resize under load: zero failed connections, ids kept, unchanged maps shared; shrinking below the contents is refused', async (t) => {
  const sb = await createSandbox(t, { backends: 3, agent: false });
  for (const [name, text] of Object.entries(manifests(sb))) sb.writeManifest(name, text);
  const small = ['--max-services', '64', '--max-backends', '128', '--max-sock-revnat', '4096'];
  const big = ['--max-services', '128', '--max-backends', '512', '--max-sock-revnat', '4096'];
  await sb.startAgent(small);
  const listBefore = await sb.lbList();
  const linksBefore = await sb.links();
  const sizesBefore = await sb.mapSizes();
  const servicesBefore = (await sb.mapEntries('lb4_services')).length;
  // The socket rev-NAT, affinity and counter maps keep their size in this resize.
  const KEPT = ['lb4_sock_revnat', 'lb6_sock_revnat', 'lb_affinity', 'lb_metrics'];
  const keptIds = async (): Promise<Record<string, number>> => {
    const out: Record<string, number> = {};
    for (const n of KEPT) out[n] = (await sb.bpftool<{ id: number }>(['map', 'show', 'pinned', path.join(sb.bpfRoot, 'maps', n)])).id;
    return out;
  };
  const idsBefore = await keptIds();

  const load = startLoad(sb, t);
  await load.waitFor((p) => p.ok >= RATE, 'the load to run');
  const events: Array<[string, number]> = [];

  t.equal(await sb.stopAgent(), 0, 'the agent exits 0 on SIGTERM');
  events.push(['the resize began', Date.now()]);
  const grown = await sb.startAgent(big);
  events.push(['the resize', Date.now()]);
  t.equal(grown.planned, 0, 'the resized agent plans 0 writes');
  const resized = sb.agent!.logs.filter((l) => l.msg === 'map resized: entries carried over, links switched');
  t.same(
    resized.map((l) => [l.map, l.from, l.to]).sort(),
    [
      ['lb4_backends', 128, 512], ['lb4_reverse_nat', 64, 128], ['lb4_services', 256, 768],
      ['lb6_backends', 128, 512], ['lb6_reverse_nat', 64, 128], ['lb6_services', 256, 768],
    ],
    'the agent logs "map resized" for every resized map, and only for those',
  );
  t.equal(resized.find((l) => l.map === 'lb4_services')?.entries, servicesBefore, `lb4_services carried its ${servicesBefore} entries over`);
  t.match(await sb.mapSizes(), { lb4_services: 768, lb4_backends: 512, lb4_reverse_nat: 128, lb6_sock_revnat: 4096 }, 'the pinned maps have the new sizes');
  // The maps that kept their size are shared by the new programs (the same
  // kernel maps, not copies), so no lookup can miss across the link switch.
  t.same(await keptIds(), idsBefore, `unchanged maps are shared, not copied: ${KEPT.join(', ')}`);
  t.same(await sb.lbList(), listBefore, 'ids, slots and rev-NAT ids unchanged');
  const links = await sb.links();
  for (const n of Object.keys(linksBefore)) t.equal(links[n]!.linkId, linksBefore[n]!.linkId, `${n}: the same link`);
  await servesThrough(t, load, 'after the resize');

  // Shrinking below what the maps hold: refused, naming the map; nothing changes.
  t.equal(await sb.stopAgent(), 0, 'the agent exits 0 on SIGTERM');
  events.push(['the refused shrink', Date.now()]);
  const starting = sb.startAgent(['--max-services', '128', '--max-backends', '2', '--max-sock-revnat', '8192']).then(
    () => undefined,
    (e: unknown) => e as Error,
  );
  const failure = await sb.agent!.waitForLog((l) => l.msg === 'non-json' && /^lbctl: /.test(String(l.line)), 0, 30_000);
  t.match(String(failure.line), /lb4_backends/, `the agent fails, naming the map that would not fit: ${String(failure.line)}`);
  const code = await Promise.race([sb.agent!.exited, new Promise((r) => setTimeout(() => r(`still running ${3 * SLOW} s after its error`), 3_000 * SLOW))]);
  // lbctl agent starts its health, metrics and API servers before the datapath;
  // when the start fails they keep the process alive, and its SIGTERM handler
  // swallows SIGTERM. Reported; the fix belongs in src/cli/commands/agent.ts.
  t.equal(code, 1, 'it exits 1');
  if (sb.agent!.running) await sb.killAgent('SIGKILL');
  t.ok(await starting, 'no first sync');
  t.match(await sb.mapSizes(), { lb4_services: 768, lb4_backends: 512 }, 'the sizes are unchanged');
  t.notOk(existsSync(path.join(sb.bpfRoot, 'maps-next')), 'no staging maps are left');
  t.same(await sb.lbList(), listBefore, 'and so are the maps');
  await servesThrough(t, load, 'after the refused shrink');

  const again = await sb.startAgent(big);
  t.equal(again.planned, 0, 'an agent with the current sizes starts and writes nothing');
  t.notOk(sb.agent!.logs.some((l) => l.msg === 'map resized: entries carried over, links switched'), 'and resizes nothing');
  await servesThrough(t, load, 'after that restart');

  const result = await load.stop();
  checkLoad(t, result, events);

  // Resizing the socket rev-NAT map itself copies its entries (twice: before
  // the links switch and after, for sockets connected in between). Readers and
  // writers switch one program at a time, so a UDP reply in that instant could
  // miss (docs/kubernetes.md): not part of the zero-failure load above.
  const revNatBefore = (await sb.mapEntries('lb4_sock_revnat')).length;
  t.equal(await sb.stopAgent(), 0, 'the agent exits 0 on SIGTERM');
  await sb.startAgent(['--max-services', '128', '--max-backends', '512', '--max-sock-revnat', '8192']);
  const revNatResized = sb.agent!.logs.filter((l) => l.msg === 'map resized: entries carried over, links switched');
  t.same(revNatResized.map((l) => [l.map, l.from, l.to]).sort(), [['lb4_sock_revnat', 4096, 8192], ['lb6_sock_revnat', 4096, 8192]], 'only the socket rev-NAT maps are resized');
  t.ok((revNatResized.find((l) => l.map === 'lb4_sock_revnat')?.entries as number) >= revNatBefore, `lb4_sock_revnat carried its ${revNatBefore} entries over`);
  t.same(await sb.lbList(), listBefore, 'ids, slots and rev-NAT ids unchanged');
});
