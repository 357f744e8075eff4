// The tc datapath through agent restarts (issue 14): a steady load of new
// connections from the external client to a NodePort served by both pods
// (the local one directly, the remote one through SNAT), and two long-lived
// connections (one to each pod, a request every 200 ms), while node 1's
// agent is (a) killed with SIGKILL and started again, (b) stopped with
// SIGTERM and started again, (c) upgraded: started on a copy of the built
// socket object (--bpf-object). Not one request may fail. The CT entries
// and SNAT reservations live in pinned maps the new agent adopts, and the
// tc attachments (tcx links here, clsact filters before 6.6) switch
// programs in place: the long connections keep their pod and their SNAT
// port throughout.
import { createHash } from 'node:crypto';
import { copyFileSync } from 'node:fs';
import path from 'node:path';
import t, { type Test } from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import { ECHO_PORT, endpoint, EXT, hostOf, makeLab, NODE1, NODE1_TO_N2, northSouth, POD1, POD2, portOf, type Lab, type LongRun } from '../helpers/nodeport-lab.js';
import { CLI_TIMEOUT_MS, createSandbox, LBCTL, run, SLOW, type LoadResult, type LoadRun, type Sandbox, type SyncReport } from '../helpers/sandbox.js';
import { datapathObject } from '../../src/datapath/loader.js';

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

/** Links of the tc datapath (tc-<ifindex>-<direction>) and of the socket programs, by pin name. */
async function links(sb: Sandbox): Promise<Record<string, { linkId: number; progId: number }>> {
  return sb.links();
}

async function linksKept(t: Test, sb: Sandbox, before: Record<string, { linkId: number; progId: number }>, what: string): Promise<Record<string, { linkId: number; progId: number }>> {
  const now = await links(sb);
  const tc = Object.keys(before).filter((n) => n.startsWith('tc-'));
  t.equal(tc.length, 4, `${what}: tcx links on n1e and n1b, ingress and egress (${tc.join(', ')})`);
  t.same(Object.keys(now).sort(), Object.keys(before).sort(), `${what}: the same pinned links`);
  const kept = Object.keys(before).filter((n) => now[n]?.linkId === before[n]!.linkId);
  t.equal(kept.length, Object.keys(before).length, `${what}: every link kept its id (updated in place, not re-created)`);
  const switched = Object.keys(before).filter((n) => now[n] && now[n]!.progId !== before[n]!.progId);
  t.same(switched.sort(), Object.keys(before).sort(), `${what}: every link runs a newly loaded program`);
  return now;
}

/**
 * Every Maglev table's contents, by its key in lb_maglev (the frontend's
 * rev-NAT id): a restart rewrites each table once, and must write the same
 * slots (the same flow goes to the same backend before and after).
 */
async function maglevTables(sb: Sandbox): Promise<Record<string, string>> {
  const outer = (await sb.mapEntries('lb_maglev')) as Array<{ key: string[]; value: string[] }>;
  const bytes = (hex: string[]): Buffer => Buffer.from(hex.map((h) => parseInt(h, 16)));
  const out: Record<string, string> = {};
  for (const e of outer) {
    const id = bytes(e.value).readUInt32LE(0); // the inner map's id
    const slots = await sb.bpftool<Array<{ key: string[]; value: string[] }>>(['map', 'dump', 'id', String(id)]);
    const key = bytes(e.key).readUInt32LE(0);
    out[String(key)] = createHash('sha256').update(slots.map((x) => x.value.join('')).join(',')).digest('hex').slice(0, 16) + `/${slots.length}`;
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

t.test('NodePort under load through SIGKILL, SIGTERM and an upgrade of the agent: zero failed requests, long connections kept', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab: Lab = await makeLab(sb);
  sb.writeManifest('services.yaml', manifests());
  // The upgrade's object: a copy of the built socket object at a path of its own.
  const v2 = path.join(sb.runDir, 'sock-v2.bpf.o');
  copyFileSync(await datapathObject(), v2);

  const first = await lab.agent.start(NODE_ARGS);
  t.ok(first.frontends > 0, `the agent synced (${first.frontends} frontends)`);
  const linksBefore = await links(sb);
  const tablesBefore = await maglevTables(sb);
  t.equal(Object.keys(tablesBefore).length, MAGLEV_TABLES, `${MAGLEV_TABLES} Maglev tables (${JSON.stringify(tablesBefore)})`);

  const load = lab.startLoad({ tcp: [`${NODE1.v4}:${WEB_PORT}@${RATE4}`, `[${NODE1.v6}]:${WEB_PORT}@${RATE6}`], maxSeconds: 110 * SLOW });
  await load.waitFor((p) => p.ok >= TOTAL_RATE, 'the load to run');
  const localLong = lab.startLong(NODE1.v4, LOCAL_ECHO);
  const remoteLong = lab.startLong(NODE1.v4, REMOTE_ECHO);
  const longs = [localLong, remoteLong];
  for (const l of longs) await l.answered(3, 'the first answers');
  const remoteLocal = remoteLong.progress()!.local!;
  const ctBefore = await ctOf(sb, remoteLocal, `${NODE1.v4}:${REMOTE_ECHO}`);
  t.ok(ctBefore?.flags.includes('snat') && ctBefore.snat?.startsWith(`${NODE1_TO_N2.v4}:`), `the remote long connection is SNATed (${JSON.stringify(ctBefore)})`);
  const natBefore = JSON.parse((await sb.lbctl(['bpf', 'nat', 'list', '-o', 'json'])).stdout) as Array<{ direction: string; source: string; to: string }>;
  t.ok(natBefore.some((n) => n.direction === 'OUT' && n.source === remoteLocal && n.to === ctBefore?.snat), 'bpf nat list: its SNAT reservation');

  // (a) A crash, and a start.
  t.same(await lab.agent.kill('SIGKILL'), { code: null, signal: 'SIGKILL' }, 'the agent died of SIGKILL');
  await servesThrough(t, load, longs, 'with the agent dead');
  const restarted = await lab.agent.start(NODE_ARGS);
  adopted(t, restarted, 'after SIGKILL');
  let now = await linksKept(t, sb, linksBefore, 'after SIGKILL and a start');
  await servesThrough(t, load, longs, 'after SIGKILL and a start');

  // (b) SIGTERM, and a start.
  t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM');
  await servesThrough(t, load, longs, 'with the agent stopped');
  const again = await lab.agent.start(NODE_ARGS);
  adopted(t, again, 'after SIGTERM');
  now = await linksKept(t, sb, now, 'after SIGTERM and a start');
  await servesThrough(t, load, longs, 'after SIGTERM and a start');

  // (c) An upgrade: the agent on another socket object.
  t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM before the upgrade');
  const upgraded = await lab.agent.start([...NODE_ARGS, '--bpf-object', v2]);
  adopted(t, upgraded, 'the upgrade');
  await linksKept(t, sb, now, 'after the upgrade');
  const status = await run(LBCTL, ['status', '--api-socket', lab.agent.place.apiSocket], CLI_TIMEOUT_MS);
  t.match(status.stdout, /Datapath:\s+custom;/, `lbctl status: the socket programs come from the --bpf-object given (${status.stdout.split('\n').find((l) => l.startsWith('Datapath')) ?? status.stderr})`);
  t.match(status.stdout, /NodePort:\s+nodeport\.bpf\.o at tc \((tcx|clsact)\) on n1e .*n1b/, 'lbctl status: the tc datapath serves n1e and n1b after the upgrade');
  await servesThrough(t, load, longs, 'after the upgrade');

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
