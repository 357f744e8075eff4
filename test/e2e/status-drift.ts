// The agent's local API and drift. `lbctl status` and `lbctl service list`
// read the running agent over its socket; entries changed behind the
// agent's back in the pinned maps show up as drift at once, and the periodic
// full resync (--sync-period) repairs them. /metrics carries kube-proxy's
// sync metrics and the datapath's counters.
import path from 'node:path';
import t, { type Test } from 'tap';
import { serviceObject, serviceWithBackends, sliceObject, yamlDocs } from '../helpers/manifests.js';
import { CLI_TIMEOUT_MS, createSandbox, HTTP_PORT, LBCTL, run, SLOW, UDP_PORT, type ExecResult, type LogLine, type Sandbox } from '../helpers/sandbox.js';

const WEB = '10.96.0.10';
const WEB6 = 'fd00:96::10';
const ECHO = '10.96.0.20';
const STRAY = '10.96.0.99';
// The sync period of the agents whose drift must be read before the next
// periodic resync repairs it: long enough for tampering (three bpftool runs)
// and two CLI reads side by side, as measured on this machine (driftPeriod),
// and never under 5 s * SLOW. A fixed period could not be right everywhere:
// those steps took 12.5-13.6 s in the TCG guests of one machine and 22-37 s
// in those of another (two guests side by side, as make test runs them;
// stop 25's CI lost the race there too), against 20 s.
const MIN_SYNC_PERIOD_MS = 5000 * SLOW;
let measuredPeriod: number | undefined;

/**
 * MIN_SYNC_PERIOD_MS, or 2.5 times what the steps between tampering and
 * reading cost here if that is longer: the same three bpftool starts and
 * two CLI starts side by side, against a socket nobody serves (a CLI start
 * is most of the cost in an emulated guest). The live reads took 0.9-1.6
 * times this measure in the guests (read 24-35 s after tampering, against
 * 15-29 s measured); the factor covers that. Measured once per file.
 */
async function driftPeriod(t: Test, sb: Sandbox): Promise<number> {
  if (measuredPeriod === undefined) {
    const started = Date.now();
    for (let i = 0; i < 3; i++) await sb.bpftool(['version']);
    const nobody = path.join(path.dirname(sb.apiSocket), 'nobody.sock');
    await Promise.all([lbctl(['service', 'list', '-o', 'json', '--api-socket', nobody]), lbctl(['service', 'list', '--api-socket', nobody])]);
    const cost = Date.now() - started;
    measuredPeriod = Math.max(MIN_SYNC_PERIOD_MS, Math.ceil(2.5 * cost));
    t.comment(`tampering and two reads cost ${cost} ms here: a sync period of ${measuredPeriod} ms`);
  }
  return measuredPeriod;
}

/** `n` sync periods as a helper's timeout (waitUntil, waitForLog), which scales it by SLOW again: a measured period already holds the machine's pace. */
const periods = (syncPeriod: number, n: number): number => (n * syncPeriod) / SLOW;

interface FrontendStatus {
  frontend: string;
  service?: string;
  desired?: { backends: string[]; terminating: string[]; revNatId: number };
  realized?: { backends: string[]; terminating: string[]; revNatId: number };
  drift: boolean;
  details: string[];
}

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

// ------------------------------------------------ keys and values, from the ABI (bpf/include/lb_types.h)

const hex = (b: Buffer): string[] => [...b].map((x) => x.toString(16).padStart(2, '0'));

function ip6Bytes(addr: string): Buffer {
  const [head, tail = ''] = addr.split('::');
  const h = head ? head.split(':') : [];
  const tl = tail ? tail.split(':') : [];
  const groups = [...h, ...Array<string>(8 - h.length - tl.length).fill('0'), ...tl];
  const b = Buffer.alloc(16);
  groups.forEach((g, i) => b.writeUInt16BE(parseInt(g, 16), i * 2));
  return b;
}

/** struct lb4_key / lb6_key: be32 address[1|4], be16 dport, u16 backend_slot (host order), u8 proto, u8 pad[3]. */
function serviceKey(address: string, port: number, slot: number, proto: 'TCP' | 'UDP'): Buffer {
  const addr = address.includes(':') ? ip6Bytes(address) : Buffer.from(address.split('.').map(Number));
  const rest = Buffer.alloc(8);
  rest.writeUInt16BE(port, 0);
  rest.writeUInt16LE(slot, 2);
  rest.writeUInt8(proto === 'TCP' ? 6 : 17, 4);
  return Buffer.concat([addr, rest]);
}

/** struct lb_service: u32 backend_id, u32 rev_nat_index, u32 affinity_timeout, u16 count, u16 qcount, u8 type, u8 flags, u8 pad[2]. */
function serviceValue(v: { backendId?: number; count?: number; revNat?: number; type?: number }): Buffer {
  const b = Buffer.alloc(20);
  b.writeUInt32LE(v.backendId ?? 0, 0);
  b.writeUInt32LE(v.revNat ?? 0, 4);
  b.writeUInt16LE(v.count ?? 0, 12);
  b.writeUInt8(v.type ?? 0, 16);
  return b;
}

// ------------------------------------------------ helpers

function lbctl(args: readonly string[]): Promise<ExecResult> {
  return run(LBCTL, args, CLI_TIMEOUT_MS);
}

async function serviceList(sb: Sandbox): Promise<{ code: number | null; list: FrontendStatus[]; stderr: string }> {
  const r = await lbctl(['service', 'list', '-o', 'json', '--api-socket', sb.apiSocket]);
  return { code: r.code, list: JSON.parse(r.stdout) as FrontendStatus[], stderr: r.stderr };
}

async function scrape(sb: Sandbox): Promise<string> {
  const r = await fetch(`http://127.0.0.1:${sb.agentPort('metrics')}/metrics`);
  if (r.status !== 200) throw new Error(`/metrics answered ${r.status}`);
  return r.text();
}

/** The value of one sample (`name{labels} value`), or undefined. */
function sample(text: string, name: string, labels = ''): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels ? `{${labels}}` : ''} `));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

const isSync = (reason: string) => (l: LogLine): boolean => l.msg === 'sync done' && l.reason === reason;

async function traffic(t: Test, sb: Sandbox, count: number): Promise<void> {
  const r = await sb.client<{ results: Array<{ error?: string; body?: string }> }>(['tcp', WEB, '80', '--count', String(count)]);
  t.same(r.results.filter((x) => x.error), [], `${count} connections through ${WEB}:80 succeed`);
}

// ------------------------------------------------ tests

t.test('lbctl status and service list read the running agent', async (t) => {
  const sb = await createSandbox(t, { backends: 3, agent: false });
  for (const [name, text] of Object.entries(manifests(sb))) sb.writeManifest(name, text);
  await sb.startAgent(['--sync-period', String(MIN_SYNC_PERIOD_MS)]);

  // The reads are independent: side by side, as a CLI start costs seconds
  // in an emulated guest.
  const [brief, full, { code, list }, text] = await Promise.all([
    lbctl(['status', '--brief', '--api-socket', sb.apiSocket]),
    lbctl(['status', '--api-socket', sb.apiSocket]),
    serviceList(sb),
    lbctl(['service', 'list', '--api-socket', sb.apiSocket]),
  ]);
  t.equal(brief.stdout, 'OK\n', 'status --brief prints OK once synced');
  t.equal(brief.code, 0, 'and exits 0');

  t.equal(full.code, 0, 'status exits 0');
  for (const check of ['ping', 'eventloop', 'datapath', 'canary', 'source-synced', 'synced']) {
    t.match(full.stdout, new RegExp(`\\[\\+\\]${check} ok`), `status shows the ${check} check passing`);
  }
  t.match(full.stdout, /Liveness: +ok/, 'liveness ok');
  t.match(full.stdout, /Readiness: +ok/, 'readiness ok');
  t.match(full.stdout, /Programmed: +2 services, 3 frontends, 9 backends/, 'and the counts');

  t.equal(code, 0, 'service list exits 0 with no drift');
  t.same(list.map((f) => f.frontend), [`${WEB}:80/TCP`, `${ECHO}:53000/UDP`, `[${WEB6}]:80/TCP`].sort(), 'every frontend is listed');
  t.same(list.filter((f) => f.drift), [], 'none drifts');
  const web = list.find((f) => f.frontend === `${WEB}:80/TCP`)!;
  t.equal(web.service, 'default/web:http', 'named by its service and port');
  t.same(web.realized, web.desired, 'realized equals desired');
  t.same(web.desired!.backends, sb.backends.map((b) => `${b.v4}:${HTTP_PORT}`), 'the three backends');

  t.match(text.stdout, /^FRONTEND +SERVICE +BACKENDS \(desired\) +REALIZED +STATUS/, 'the text form has its header');
  t.match(text.stdout, new RegExp(`${WEB.replace(/\./g, '\\.')}:80/TCP +default/web:http .*\\(same\\) +ok`), 'and a row per frontend');

  await sb.stopAgent();
  const [down, downList] = await Promise.all([
    lbctl(['status', '--brief', '--api-socket', sb.apiSocket]),
    lbctl(['service', 'list', '--api-socket', sb.apiSocket]),
  ]);
  t.equal(down.code, 1, 'status exits 1 when the agent is down');
  t.match(down.stderr, /agent/, `and says why: ${down.stderr.trim()}`);
  t.equal(downList.code, 1, 'so does service list');
});

t.test('drift behind the agent’s back is shown at once and repaired by the periodic full resync', async (t) => {
  const sb = await createSandbox(t, { backends: 3, agent: false });
  for (const [name, text] of Object.entries(manifests(sb))) sb.writeManifest(name, text);
  const syncPeriod = await driftPeriod(t, sb);
  await sb.startAgent(['--sync-period', String(syncPeriod), '--log-level', 'debug']);
  const listBefore = await sb.lbList();
  const rawBefore = await sb.mapEntries('lb4_services');
  const maps = path.join(sb.bpfRoot, 'maps');
  const web6 = listBefore.find((e) => e.frontend === `[${WEB6}]:80/TCP`)!;

  // Right after a periodic resync, so the next one is a whole period away.
  const agent = sb.agent!;
  let mark = agent.logs.length;
  let tampered = 0;
  let mark2 = 0;
  let drifted: Awaited<ReturnType<typeof serviceList>>;
  let text: ExecResult;
  let elapsed = 0;
  // Tampering and the two CLI starts can outlast a period on a busy machine
  // or in the TCG guest: a sync logged in between (it repaired the drift
  // before it was read), or the period gone by. Then the race was lost, not
  // the behaviour: go again right after the next periodic resync (3 tries).
  for (let attempt = 1; ; attempt++) {
    await agent.waitForLog(isSync('periodic'), mark, periods(syncPeriod, 3));
    tampered = Date.now();
    mark2 = agent.logs.length;
    // 1. A slot deleted.
    await sb.bpftool(['map', 'delete', 'pinned', `${maps}/lb4_services`, 'key', 'hex', ...hex(serviceKey(WEB, 80, 3, 'TCP'))]);
    // 2. A slot changed: slot 1 of the IPv6 frontend names slot 2's backend.
    const slot2 = web6.backends.find((b) => b.slot === 2)!;
    await sb.bpftool([
      'map', 'update', 'pinned', `${maps}/lb6_services`,
      'key', 'hex', ...hex(serviceKey(WEB6, 80, 1, 'TCP')),
      'value', 'hex', ...hex(serviceValue({ backendId: slot2.id })),
    ]);
    // 3. A frontend nobody intends.
    await sb.bpftool([
      'map', 'update', 'pinned', `${maps}/lb4_services`,
      'key', 'hex', ...hex(serviceKey(STRAY, 80, 0, 'TCP')),
      'value', 'hex', ...hex(serviceValue({ count: 0, revNat: 77, type: 1 })),
    ]);

    // Both forms at once: each CLI start costs seconds in a TCG guest, and
    // both must read the drift before the next periodic resync repairs it.
    [drifted, text] = await Promise.all([serviceList(sb), lbctl(['service', 'list', '--api-socket', sb.apiSocket])]);
    elapsed = Date.now() - tampered;
    const raced = agent.logs.slice(mark2).some((l) => l.msg === 'sync done') || elapsed >= syncPeriod;
    if (!raced || attempt === 3) break;
    t.comment(`attempt ${attempt}: read ${elapsed} ms after tampering, a sync in between or the period gone by; again after the next periodic resync`);
    mark = agent.logs.length;
  }
  t.ok(elapsed < syncPeriod, `checked ${elapsed} ms after tampering, before the next periodic resync`);
  t.notOk(agent.logs.slice(mark2).some((l) => l.msg === 'sync done'), 'no sync ran in between');
  t.equal(drifted.code, 1, 'service list exits 1');
  t.match(drifted.stderr, /3 frontends drift/, `and counts the drift on stderr: ${drifted.stderr.trim()}`);
  const by = new Map(drifted.list.map((f) => [f.frontend, f]));
  t.match(by.get(`${WEB}:80/TCP`), { drift: true, details: [`slot 3 is missing, intended ${sb.backends[2]!.v4}:${HTTP_PORT}`] }, 'the deleted slot');
  t.same(by.get(`${WEB}:80/TCP`)!.realized!.backends, sb.backends.slice(0, 2).map((b) => `${b.v4}:${HTTP_PORT}`), 'realized: the two slots left');
  t.match(
    by.get(`[${WEB6}]:80/TCP`),
    { drift: true, details: [`slot 1 is [${sb.backends[1]!.v6}]:${HTTP_PORT}, intended [${sb.backends[0]!.v6}]:${HTTP_PORT}`] },
    'the changed slot',
  );
  t.match(by.get(`${STRAY}:80/TCP`), { drift: true, details: ['in the maps but not intended'] }, 'the stray frontend');
  t.notOk(by.get(`${STRAY}:80/TCP`)!.desired, 'with nothing desired');
  t.match(by.get(`${ECHO}:53000/UDP`), { drift: false, details: [] }, 'the untouched frontend does not drift');
  t.match(text.stdout, /DRIFT: slot 3 is missing, intended /, 'the text form flags it too');

  // The next periodic resync re-reads the maps and repairs all three.
  const repair = await agent.waitForLog((l) => isSync('periodic')(l) && Number(l.planned) > 0, mark2, periods(syncPeriod, 3));
  t.comment(`repaired ${Date.now() - tampered} ms after tampering: ${JSON.stringify(repair)}`);
  t.equal(repair.planned, repair.applied, `the periodic resync applied its ${String(repair.planned)} repairs`);
  t.notOk(agent.logs.slice(mark2).some((l) => l.msg === 'sync failed; the maps keep their last good state'), 'without a failed sync');
  const fixed = await serviceList(sb);
  t.equal(fixed.code, 0, 'service list exits 0 again');
  t.same(fixed.list.filter((f) => f.drift), [], 'no drift is left');
  t.same(await sb.lbList(), listBefore, 'the maps are back as they were: same slots and ids');
  const canon = (xs: unknown[]): string[] => xs.map((x) => JSON.stringify(x)).sort();
  t.same(canon(await sb.mapEntries('lb4_services')), canon(rawBefore), 'lb4_services holds exactly its former entries');
  await traffic(t, sb, 15);
});

t.test('/metrics: kube-proxy’s sync metrics, the counts, and the datapath counters', async (t) => {
  const sb = await createSandbox(t, { backends: 3, agent: false });
  for (const [name, text] of Object.entries(manifests(sb))) sb.writeManifest(name, text);
  const started = Date.now() / 1000;
  await sb.startAgent();

  const before = await scrape(sb);
  t.match(before, /^# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram$/m, 'kubeproxy_sync_proxy_rules_duration_seconds is a histogram');
  t.ok(sample(before, 'kubeproxy_sync_proxy_rules_duration_seconds_count')! >= 1, 'that observed the first sync');
  t.ok(sample(before, 'kubeproxy_sync_proxy_rules_duration_seconds_bucket', 'le="+Inf"')! >= 1, 'in its +Inf bucket');
  const last = sample(before, 'kubeproxy_sync_proxy_rules_last_timestamp_seconds');
  t.ok(last !== undefined && last >= started - 1 && last <= Date.now() / 1000 + 1, `kubeproxy_sync_proxy_rules_last_timestamp_seconds is the last sync (${last})`);
  t.equal(sample(before, 'lbctl_backends'), 9, 'lbctl_backends: 3 web v4, 3 web v6 and 3 echo backends');
  t.equal(sample(before, 'lbctl_frontends'), 3, 'lbctl_frontends');
  t.equal(sample(before, 'lbctl_services'), 2, 'lbctl_services');
  t.ok(sample(before, 'lbctl_syncs_total', 'type="partial",result="success"')! >= 1, 'lbctl_syncs_total counts the first sync');

  await traffic(t, sb, 20);
  const after = await scrape(sb);
  const fwdBefore = sample(before, 'lbctl_datapath_events_total', 'reason="xlate_fwd"') ?? 0;
  const fwd = sample(after, 'lbctl_datapath_events_total', 'reason="xlate_fwd"');
  t.ok(fwd !== undefined && fwd - fwdBefore >= 20, `lbctl_datapath_events_total{reason="xlate_fwd"} grew by ${(fwd ?? 0) - fwdBefore} over 20 connections`);
  t.ok(sample(after, 'lbctl_datapath_events_total', 'reason="xlate_rev"')! > 0, 'xlate_rev too (getpeername)');
  const cli = await sb.metrics();
  t.equal(fwd, cli.xlate_fwd, 'the same value as lbctl bpf metrics list');

  const health = await fetch(`http://127.0.0.1:${sb.agentPort('metrics')}/healthz`);
  t.equal(await health.text(), 'ok', 'the metrics port answers /healthz with ok, as kube-proxy’s does');
});

t.test('drift is repaired within a sync period even while changes keep coming', async (t) => {
  const sb = await createSandbox(t, { backends: 3, agent: false });
  for (const [name, text] of Object.entries(manifests(sb))) sb.writeManifest(name, text);
  const syncPeriod = await driftPeriod(t, sb);
  await sb.startAgent(['--sync-period', String(syncPeriod)]);
  const listBefore = await sb.lbList();
  // Start right after a periodic resync, so the whole sync period is left to
  // make the drift and see it before the next one repairs it (two CLI runs
  // can take most of a period in the emulated guest).
  const fullSyncs = async (): Promise<number> => sample(await scrape(sb), 'lbctl_syncs_total', 'type="full",result="success"') ?? 0;
  const fullBefore = await fullSyncs();
  await sb.waitUntil(async () => (await fullSyncs()) > fullBefore, 'a periodic resync', periods(syncPeriod, 2));
  await sb.bpftool(['map', 'delete', 'pinned', `${path.join(sb.bpfRoot, 'maps')}/lb4_services`, 'key', 'hex', ...hex(serviceKey(WEB, 80, 3, 'TCP'))]);
  t.equal((await serviceList(sb)).code, 1, 'the deleted slot is drift');

  // An unrelated service changes several times a sync period, as in a busy
  // cluster: each change is a sync. The periodic full resync must still come.
  // (Counted in events, not wall time: the emulated vmtest guest is slow.)
  const other = (port: number): string =>
    yamlDocs([serviceObject({ name: 'other', clusterIPs: ['10.96.0.30'], ports: [{ name: 'p', port }] })]);
  const mark = sb.agent!.logs.length;
  const started = Date.now();
  const deadline = started + 2 * syncPeriod + 1000 * SLOW;
  const repairs = (): LogLine[] => sb.agent!.logs.slice(mark).filter((l) => l.msg === 'sync done' && l.reason === 'periodic' && Number(l.planned) > 0);
  let changes = 0;
  // At least 3 changes, so the resync is shown to come while they do.
  while (Date.now() < deadline && (repairs().length === 0 || changes < 3)) {
    sb.writeManifest('other.yaml', other(1000 + changes++));
    await sb.waitForSync();
    // The pace of the changes is what is tested (several a sync period), not a wait for the agent.
    await new Promise((r) => setTimeout(r, syncPeriod / 3));
  }
  const changeSyncs = sb.agent!.logs.slice(mark).filter((l) => l.msg === 'sync done' && l.reason === 'change');
  const times = [started, ...changeSyncs.map((l) => Number(l.time))];
  const widest = Math.max(...times.slice(1).map((x, i) => x - times[i]!));
  t.ok(changeSyncs.length >= 3, `${changes} changes, ${changeSyncs.length} change syncs meanwhile`);
  t.ok(widest < syncPeriod, `changes kept coming: at most ${widest} ms between change syncs, under the ${syncPeriod} ms sync period`);
  const repair = repairs()[0];
  t.ok(repair, `a periodic full resync repaired the drift within ${2 * syncPeriod + 1000 * SLOW} ms`);
  if (repair) t.ok(Number(repair.time) - started <= 2 * syncPeriod + 1000 * SLOW, `after ${Number(repair.time) - started} ms`);
  t.equal((await serviceList(sb)).code, 0, 'lbctl service list shows no drift');
  sb.removeManifest('other.yaml');
  await sb.waitForSync();
  t.ok((await sb.lbList()).every((e) => listBefore.some((b) => b.frontend === e.frontend)), 'the extra service is gone again');
});
