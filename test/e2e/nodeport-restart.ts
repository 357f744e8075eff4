// The tc datapath through agent restarts (issue 14): a steady load of new
// connections from the external client to a NodePort served by both pods
// (the local one directly, the remote one through SNAT), and two long-lived
// connections (one to each pod, a request every 200 ms), while node 1's
// agent is, in each tc attach mode, (a) killed with SIGKILL and started
// again, (b) stopped with SIGTERM and started again, (c) upgraded: started
// on other socket and tc objects (--bpf-object, --tc-object), whose
// programs' bytes differ. Where the kernel has tcx the agent then switches
// to clsact and back, each a restart with another --tc-attach. Not one
// request may fail. The CT entries and SNAT reservations live in pinned
// maps the new agent adopts, and the tc attachments switch programs in
// place (a tcx link updated, a clsact filter replaced at its handle): the
// long connections keep their pod and their SNAT port throughout, and each
// hook runs exactly one program of ours, the new agent's.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync } from 'node:fs';
import path from 'node:path';
import t, { type Test } from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import {
  ECHO_PORT, endpoint, EXT, hostOf, makeLab, NODE1, NODE1_TO_N2, northSouth, ourPrograms, POD1, POD2, portOf, tcAttachModes, type HookProgram, type Lab, type LongRun,
} from '../helpers/nodeport-lab.js';
import { CLI_TIMEOUT_MS, createSandbox, LBCTL, ROOT, run, SLOW, type LoadResult, type LoadRun, type Sandbox, type SyncReport } from '../helpers/sandbox.js';
import { datapathObject } from '../../src/datapath/loader.js';
import type { AttachMode } from '../../src/datapath/nodeport.js';

const HTTP = 8080;
const WEB_PORT = 30080;
const LOCAL_ECHO = 30071;
const REMOTE_ECHO = 30072;
// New connections a second: ~100 in all (IPv4 and IPv6), fewer where everything runs slower.
const RATE4 = Math.max(10, Math.round(75 / SLOW));
const RATE6 = Math.max(5, Math.round(25 / SLOW));
const TOTAL_RATE = RATE4 + RATE6;
const NODE_ARGS = ['--devices', 'n1e,n1b', '--node-name', 'node1'];

function manifests(): string {
  const both = { 4: [endpoint(1, 4), endpoint(2, 4)], 6: [endpoint(1, 6), endpoint(2, 6)] };
  return yamlDocs([
    ...northSouth({ name: 'web', clusterIPs: ['10.96.0.10', 'fd00:96::10'], ports: [{ name: 'http', port: 80, targetPort: HTTP, nodePort: WEB_PORT }] }, both),
    // One pod each, so each long connection knows where it goes: the local pod, and the remote one through SNAT.
    ...northSouth({ name: 'echo-local', clusterIPs: ['10.96.0.11'], ports: [{ name: 'echo', port: 7000, targetPort: ECHO_PORT, nodePort: LOCAL_ECHO }] }, { 4: [endpoint(1, 4)] }),
    ...northSouth({ name: 'echo-remote', clusterIPs: ['10.96.0.12'], ports: [{ name: 'echo', port: 7000, targetPort: ECHO_PORT, nodePort: REMOTE_ECHO }] }, { 4: [endpoint(2, 4)] }),
  ]);
}

/** The datapath keeps serving after `what`: about 2 s more of the load succeed, none fails; and both long connections answer. */
async function servesThrough(t: Test, load: LoadRun, longs: readonly LongRun[], what: string): Promise<void> {
  const before = load.progress()!;
  const p = await load.waitFor((x) => x.ok >= before.ok + 2 * TOTAL_RATE, `${2 * TOTAL_RATE} more connections ${what}`, 30_000);
  t.equal(p.failed, 0, `${what}: new connections keep succeeding (${p.ok - before.ok} more, ${p.failed} failed so far${p.failed ? `: ${JSON.stringify(p.failures)}` : ''})`);
  for (const l of longs) await l.answered(5, `5 more answers ${what}`);
  const failed = longs.map((l) => l.progress()?.failed ?? -1);
  t.same(failed, [0, 0], `${what}: the long connections answer, none failed`);
}

/** The tc datapath's drop counters (lbctl bpf metrics list). */
const DROPS = ['np_no_backend', 'np_local_none', 'np_src_range', 'np_snat_exhausted', 'np_fib_fail', 'np_ct_full', 'np_frag', 'np_no_snat_addr', 'np_bad_packet', 'np_ttl', 'np_frag_needed', 'backend_missing'];

/** Maglev tables of the services: web (IPv4, IPv6), echo-local, echo-remote. */
const MAGLEV_TABLES = 4;

/**
 * A start on adopted maps writes nothing but the Maglev tables, each once
 * (an atomic swap of the same content: a table found at start has no
 * fingerprint, src/reconcile/reconciler.ts readNorthSouth).
 */
function adopted(t: Test, sync: SyncReport, what: string): void {
  const byKind = Object.fromEntries(Object.entries((sync.byKind ?? {}) as Record<string, number>).filter(([, n]) => n > 0));
  t.same(byKind, { 'put-maglev': MAGLEV_TABLES }, `${what}: the maps are adopted; only the ${MAGLEV_TABLES} Maglev tables are rewritten, once (${JSON.stringify(byKind)})`);
  t.equal(sync.planned, MAGLEV_TABLES, `${what}: ${sync.planned} writes planned`);
}

const DEVICES = ['n1e', 'n1b'];
type Links = Record<string, { linkId: number; progId: number }>;

/**
 * The socket programs' pinned links are kept (their ids) and each runs a
 * newly loaded program; the tc links (tc-<ifindex>-<direction>) are there
 * in tcx mode only, kept across restarts in it.
 */
async function linksKept(t: Test, sb: Sandbox, before: Links, mode: AttachMode, what: string): Promise<Links> {
  const now: Links = await sb.links();
  const sock = (l: Links): string[] => Object.keys(l).filter((n) => !n.startsWith('tc-')).sort();
  t.same(sock(now), sock(before), `${what}: the same pinned links of the socket programs`);
  t.same(sock(before).filter((n) => now[n]?.linkId !== before[n]!.linkId), [], `${what}: every one kept its id (updated in place, not re-created)`);
  t.same(sock(before).filter((n) => now[n]?.progId === before[n]!.progId), [], `${what}: every one runs a newly loaded program`);
  const tc = Object.keys(now).filter((n) => n.startsWith('tc-')).sort();
  if (mode === 'clsact') {
    t.same(tc, [], `${what}: no tcx link pinned in clsact mode`);
  } else {
    t.equal(tc.length, 4, `${what}: tcx links on n1e and n1b, ingress and egress (${tc.join(', ')})`);
    const kept = tc.filter((n) => before[n] !== undefined);
    t.same(kept.filter((n) => now[n]!.linkId !== before[n]!.linkId), [], `${what}: the tcx links that were there kept their ids (${kept.length} of ${tc.length})`);
  }
  return now;
}

type Programs = Record<string, HookProgram>;

/**
 * Every hook of n1e and n1b runs exactly one program of ours, attached with
 * `mode` (the kernel's answer: tcx programs and every cls_bpf filter), newly
 * loaded by this agent, with the tags of the object it loaded.
 */
async function tcReplaced(t: Test, lab: Lab, before: Programs, mode: AttachMode, tags: Record<string, string>, what: string): Promise<Programs> {
  const now = await ourPrograms(t, lab, DEVICES, mode, what);
  t.same(Object.keys(now).filter((k) => now[k]!.id === before[k]?.id), [], `${what}: every hook runs a newly loaded program (${Object.entries(now).map(([k, p]) => `${k} ${before[k]?.id ?? '-'} → ${p.id}`).join(', ')})`);
  t.same(Object.keys(now).filter((k) => now[k]!.tag !== tags[k.split('/')[1]!]), [], `${what}: the programs of the object it loaded (tags ${JSON.stringify(tags)})`);
  const refused = lab.agent.requireAgent().logs.filter((l) => l.msg === 'tc datapath: device not attached');
  t.same(refused.map((l) => l.problem), [], `${what}: the agent attached every device`);
  return now;
}

/**
 * Every Maglev table's contents, by its key in lb_maglev_index (the
 * frontend's rev-NAT id): a restart rewrites each table once, and must write
 * the same slots (the same flow goes to the same backend before and after).
 * Read with bpftool, not lbctl: the index names a row, the row's chunk (an
 * inner map of lb_maglev) holds its blocks.
 */
async function maglevTables(sb: Sandbox): Promise<Record<string, string>> {
  const bytes = (hex: string[]): Buffer => Buffer.from(hex.map((h) => parseInt(h, 16)));
  const index = (await sb.mapEntries('lb_maglev_index')) as Array<{ key: string[]; value: string[] }>;
  const chunks = new Map<number, Map<number, string>>();
  for (const e of (await sb.mapEntries('lb_maglev')) as Array<{ key: string[]; value: string[] }>) {
    const blocks = await sb.bpftool<Array<{ key: string[]; value: string[] }>>(['map', 'dump', 'id', String(bytes(e.value).readUInt32LE(0))]);
    chunks.set(bytes(e.key).readUInt32LE(0), new Map(blocks.map((b) => [bytes(b.key).readUInt32LE(0), b.value.join('')])));
  }
  const out: Record<string, string> = {};
  for (const e of index) {
    const row = bytes(e.value).readUInt32LE(0);
    const chunk = chunks.get(Math.floor(row / 16));
    const perTable = chunk ? chunk.size / 16 : 0;
    const blocks = Array.from({ length: perTable }, (_, b) => chunk!.get((row % 16) * perTable + b) ?? '');
    out[String(bytes(e.key).readUInt32LE(0))] = createHash('sha256').update(blocks.join(',')).digest('hex').slice(0, 16) + `/${blocks.length}`;
  }
  return out;
}

/** The CT entry (IN) of the long connection from `local` to `frontend`. */
async function ctOf(sb: Sandbox, local: string, frontend: string): Promise<{ snat?: string; translatedTo: string; flags: string[] } | undefined> {
  const r = await sb.lbctl(['bpf', 'ct', 'list', '-o', 'json']);
  const ct = JSON.parse(r.stdout) as Array<{ direction: string; source: string; destination: string; snat?: string; translatedTo: string; flags: string[] }>;
  return ct.find((c) => c.direction === 'IN' && c.source === local && c.destination === frontend);
}

function checkLoad(t: Test, r: LoadResult): void {
  t.comment(
    `load: ${r.attempted} connections over ${r.seconds} s, ${r.failed} failed; max latency ${r.maxLatencyMs} ms, max backlog ${r.maxBacklog}; ` +
      Object.entries(r.targets).map(([k, v]) => `${k} ${v.ok}/${v.attempted} ${JSON.stringify(v.backends)}`).join(', '),
  );
  t.same(r.failures, [], 'no request of the load failed');
  t.equal(r.failed, 0, `zero failed out of ${r.attempted}`);
  t.equal(r.attempted, r.issued, 'every attempt the client issued completed');
  t.ok(r.attempted >= 0.8 * r.seconds * TOTAL_RATE, `a steady rate: ${r.attempted} attempts in ${r.seconds} s (about ${TOTAL_RATE}/s)`);
  for (const [target, s] of Object.entries(r.targets)) {
    const v6 = target.includes('fd00');
    const pods = Object.keys(s.backends).map(hostOf).sort();
    t.same(pods, (v6 ? [POD1.v6, POD2.v6] : [POD1.v4, POD2.v4]).sort(), `${target}: both pods served, the local and the remote one (${JSON.stringify(s.backends)})`);
  }
}

/** nodeport.c built again with one harmless extra instruction (a volatile stack store beside bpf_ktime_get_ns), so its programs' bytes differ, as after an upgrade. bpf/ itself is untouched. */
function buildTcV2(out: string): void {
  const arch = execFileSync('gcc', ['-dumpmachine'], { encoding: 'utf8' }).trim();
  execFileSync(
    'clang',
    ['-O2', '-g', '-target', 'bpf', '-Wall', '-Werror', `-I/usr/include/${arch}`, '-Ibpf',
      '-Dbpf_ktime_get_ns()=({ volatile __u32 lb_build_tag = 2; (void)lb_build_tag; bpf_ktime_get_ns(); })',
      '-c', 'bpf/nodeport.c', '-o', out],
    { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] },
  );
}

const tagsOf = (p: Programs): Record<string, string> => ({ ingress: p['n1e/ingress']!.tag, egress: p['n1e/egress']!.tag });

t.test('NodePort under load through SIGKILL, SIGTERM and an upgrade of the agent, in each tc attach mode and switching between them: zero failed requests, long connections kept', async (t) => {
  const modes = await tcAttachModes();
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab: Lab = await makeLab(sb);
  sb.writeManifest('services.yaml', manifests());
  // The upgrade's objects: a copy of the built socket object, and the tc object rebuilt with other bytes.
  const sockV2 = path.join(sb.runDir, 'sock-v2.bpf.o');
  copyFileSync(await datapathObject(), sockV2);
  const tcV2 = path.join(sb.runDir, 'nodeport-v2.bpf.o');
  buildTcV2(tcV2);
  const V2 = ['--bpf-object', sockV2, '--tc-object', tcV2];
  const args = (mode: AttachMode, more: readonly string[] = []): string[] => [...NODE_ARGS, '--tc-attach', mode, ...more];

  const first = await lab.agent.start(args(modes[0]!));
  t.ok(first.frontends > 0, `the agent synced (${first.frontends} frontends)`);
  let links: Links = await sb.links();
  let programs = await ourPrograms(t, lab, DEVICES, modes[0]!, `at first, with ${modes[0]}`);
  const v1 = tagsOf(programs);
  const tablesBefore = await maglevTables(sb);
  t.equal(Object.keys(tablesBefore).length, MAGLEV_TABLES, `${MAGLEV_TABLES} Maglev tables (${JSON.stringify(tablesBefore)})`);

  // Seconds of load: about 7 restarts a mode and 2 switches, each with its 2 s of traffic before and after.
  const load = lab.startLoad({ tcp: [`${NODE1.v4}:${WEB_PORT}@${RATE4}`, `[${NODE1.v6}]:${WEB_PORT}@${RATE6}`], maxSeconds: 100 * modes.length * SLOW });
  await load.waitFor((p) => p.ok >= TOTAL_RATE, 'the load to run');
  const localLong = lab.startLong(NODE1.v4, LOCAL_ECHO, { maxSeconds: 110 * modes.length * SLOW });
  const remoteLong = lab.startLong(NODE1.v4, REMOTE_ECHO, { maxSeconds: 110 * modes.length * SLOW });
  const longs = [localLong, remoteLong];
  for (const l of longs) await l.answered(3, 'the first answers');
  const remoteLocal = remoteLong.progress()!.local!;
  const ctBefore = await ctOf(sb, remoteLocal, `${NODE1.v4}:${REMOTE_ECHO}`);
  t.ok(ctBefore?.flags.includes('snat') && ctBefore.snat?.startsWith(`${NODE1_TO_N2.v4}:`), `the remote long connection is SNATed (${JSON.stringify(ctBefore)})`);
  const natBefore = JSON.parse((await sb.lbctl(['bpf', 'nat', 'list', '-o', 'json'])).stdout) as Array<{ direction: string; source: string; to: string }>;
  t.ok(natBefore.some((n) => n.direction === 'OUT' && n.source === remoteLocal && n.to === ctBefore?.snat), 'bpf nat list: its SNAT reservation');

  /** A start in `mode` after `what`: the maps adopted, the links kept, every hook replaced in place by the new programs, and served throughout. */
  const restarted = async (t: Test, mode: AttachMode, sync: SyncReport, tags: Record<string, string>, what: string): Promise<void> => {
    adopted(t, sync, what);
    links = await linksKept(t, sb, links, mode, what);
    programs = await tcReplaced(t, lab, programs, mode, tags, what);
    await servesThrough(t, load, longs, what);
  };

  for (const [i, mode] of modes.entries()) {
    await t.test(`--tc-attach ${mode}: SIGKILL, SIGTERM and an upgrade`, async (t) => {
      if (i > 0) {
        // A restart with another --tc-attach (and the built objects again after the last mode's upgrade).
        t.equal(await lab.agent.stop(10_000), 0, `the agent exits 0 on SIGTERM before the switch to ${mode}`);
        await restarted(t, mode, await lab.agent.start(args(mode)), v1, `the switch from ${modes[i - 1]} to ${mode}`);
      }
      // (a) A crash, and a start.
      t.same(await lab.agent.kill('SIGKILL'), { code: null, signal: 'SIGKILL' }, 'the agent died of SIGKILL');
      await servesThrough(t, load, longs, 'with the agent dead');
      await restarted(t, mode, await lab.agent.start(args(mode)), v1, 'after SIGKILL and a start');

      // (b) SIGTERM, and a start.
      t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM');
      await servesThrough(t, load, longs, 'with the agent stopped');
      await restarted(t, mode, await lab.agent.start(args(mode)), v1, 'after SIGTERM and a start');

      // (c) An upgrade: the agent on other objects.
      t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM before the upgrade');
      const upgraded = await lab.agent.start(args(mode, V2));
      const v2 = tagsOf(await ourPrograms(t, lab, DEVICES, mode, 'the upgrade'));
      t.ok(v2.ingress !== v1.ingress && v2.egress !== v1.egress, `the upgraded tc programs differ from the built ones (tags ${JSON.stringify(v1)} → ${JSON.stringify(v2)})`);
      await restarted(t, mode, upgraded, v2, 'after the upgrade');
      const status = await run(LBCTL, ['status', '--api-socket', lab.agent.place.apiSocket], CLI_TIMEOUT_MS);
      t.match(status.stdout, /Datapath:\s+custom;/, `lbctl status: the socket programs come from the --bpf-object given (${status.stdout.split('\n').find((l) => l.startsWith('Datapath')) ?? status.stderr})`);
      t.match(status.stdout, new RegExp(`NodePort:\\s+nodeport\\.bpf\\.o at tc \\(${mode}; --tc-attach ${mode}\\) on n1e .*n1b`), `lbctl status: the tc datapath serves n1e and n1b with ${mode} after the upgrade`);
    });
  }
  if (modes.length > 1) {
    await t.test(`back to --tc-attach ${modes[0]}`, async (t) => {
      t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM before the switch');
      await restarted(t, modes[0]!, await lab.agent.start(args(modes[0]!)), v1, `the switch from ${modes.at(-1)} back to ${modes[0]}`);
    });
  }

  t.same(await maglevTables(sb), tablesBefore, 'every Maglev table was rewritten with the same slots: new flows pick as before');
  const ctAfter = await ctOf(sb, remoteLocal, `${NODE1.v4}:${REMOTE_ECHO}`);
  t.equal(ctAfter?.snat, ctBefore?.snat, `the remote long connection's CT entry and SNAT port were adopted (${ctAfter?.snat})`);

  const r = await load.stop();
  checkLoad(t, r);
  // Every drop of the tc datapath is counted with its reason: none through the restarts.
  const metrics = await sb.metrics();
  const drops = Object.fromEntries(DROPS.map((d) => [d, metrics[d] ?? 0]).filter(([, n]) => n !== 0));
  t.same(drops, {}, `the tc datapath dropped no packet (${DROPS.join(', ')}: all 0); np_new ${metrics['np_new']}, np_rev ${metrics['np_rev']}`);
  const [local, remote] = [await localLong.stop(), await remoteLong.stop()];
  t.comment(`long connections: local ${local.ok}/${local.sent} (max ${local.maxLatencyMs} ms), remote ${remote.ok}/${remote.sent} (max ${remote.maxLatencyMs} ms)`);
  for (const [what, l, pod, seen] of [
    ['local', local, POD1.v4, EXT.v4],
    ['remote', remote, POD2.v4, NODE1_TO_N2.v4],
  ] as const) {
    t.equal(l.end, 'closed', `${what} long connection: open until the test closed it`);
    t.same(l.failures, [], `${what} long connection: no request failed`);
    t.ok(l.sent >= 40 && l.ok === l.sent, `${what} long connection: every one of ${l.sent} requests answered`);
    t.same(Object.keys(l.servers), [`${pod}:${ECHO_PORT}`], `${what} long connection: one pod throughout (${JSON.stringify(l.servers)})`);
    const seenAs = Object.keys(l.seenAs);
    t.equal(seenAs.length, 1, `${what} long connection: the pod saw one client address and port throughout (${seenAs.join(', ')})`);
    t.equal(hostOf(seenAs[0] ?? ''), seen, `${what}: the pod sees ${what === 'local' ? 'the client' : "node 1's SNAT address"}`);
  }
  t.equal(Object.keys(remote.seenAs)[0], ctBefore?.snat, 'the remote pod saw the SNAT port reserved before the restarts');
  t.ok(portOf(ctBefore?.snat ?? '') >= 32768, 'in the SNAT port range (32768-65535 by default)');
  await lab.agent.stop(10_000);
});
