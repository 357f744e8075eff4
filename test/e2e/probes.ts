// Readiness probes in standalone mode (issue 17) with real servers in the
// backend netns: a backend that stops answering its probe is quarantined
// within failureThreshold x periodSeconds (+ timeoutSeconds), new
// connections avoid it while an established connection to it keeps
// working, and it returns after successThreshold passes: for httpGet,
// tcpSocket and grpc (test/helpers/probe-backend.mjs serves all three, and
// the TCP line echo the long-lived connections use). All backends failing:
// --probe-all-failed open keeps serving them, closed refuses.
import t from 'tap';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { CLI_TIMEOUT_MS, CLIENT_PY, createSandbox, HTTP_PORT, LBCTL, ROOT, run, SLOW, type Sandbox } from '../helpers/sandbox.js';
import { serviceObject, sliceObject, yamlDocs } from '../helpers/manifests.js';
import type { FrontendStatus } from '../../src/http/view.js';
import { hasSetRetval } from '../../src/datapath/features.js';

const HELPER = path.join(ROOT, 'test/helpers/probe-backend.mjs');
const ECHO = 7000;
const PERIOD = 1;
const TIMEOUT = 1;
const FAILURE = 2;
const SUCCESS = 2;

const KINDS = {
  http: { vip: '10.96.0.20', probe: { httpGet: { path: '/healthz', port: 'health' } } },
  tcp: { vip: '10.96.0.21', probe: { tcpSocket: { port: 8082 } } },
  grpc: { vip: '10.96.0.22', probe: { grpc: { port: 8083, service: 'lbctl.test' } } },
} as const;
type Kind = keyof typeof KINDS;

function probedService(name: string, vip: string, probe: object | string, addresses: readonly string[]): string {
  const svc = serviceObject({ name, clusterIPs: [vip], ports: [{ name: 'http', port: 80 }, { name: 'echo', port: ECHO }] }) as { metadata: Record<string, unknown> };
  const text = typeof probe === 'string' ? probe : JSON.stringify({ ...probe, periodSeconds: PERIOD, timeoutSeconds: TIMEOUT, failureThreshold: FAILURE, successThreshold: SUCCESS });
  svc.metadata.annotations = { 'lbctl.io/readiness-probe': text };
  const slice = sliceObject({
    name: `${name}-v4`,
    service: name,
    family: 4,
    // 'health' is no port of the Service: it names the probe's port, as a container port would.
    ports: [{ name: 'http', port: HTTP_PORT }, { name: 'echo', port: ECHO }, { name: 'health', port: 8081 }],
    addresses,
  });
  return yamlDocs([svc, slice]);
}

async function serviceList(sb: Sandbox): Promise<FrontendStatus[]> {
  const r = await run(LBCTL, ['service', 'list', '-o', 'json', '--api-socket', sb.apiSocket], CLI_TIMEOUT_MS);
  return JSON.parse(r.stdout) as FrontendStatus[];
}

const scrape = (sb: Sandbox): Promise<string> => sb.scrapeMetrics();

/**
 * The agent runs in the client netns: its probes must reach the backends,
 * which only that netns routes to (the machine's own namespace is never
 * touched). The tc datapath and the mesh stay off there, as in the machine's.
 */
const AGENT_ARGS = ['--no-nodeport', '--health-mesh-port', '0'];
async function probeSandbox(t: Parameters<typeof createSandbox>[0], backends: number): Promise<Sandbox> {
  const sb = await createSandbox(t, { backends, agent: false, agentInClientNetns: true });
  await sb.startAgent(AGENT_ARGS);
  return sb;
}

/** The probe states of one frontend, by backend address. */
function states(list: readonly FrontendStatus[], frontend: string): Record<string, string> {
  const fe = list.find((f) => f.frontend === frontend);
  return Object.fromEntries((fe?.probes ?? []).map((p) => [p.address, p.state]));
}

/** `count` fresh connections to vip:80 (GET /): the backends that answered, and the errors. */
async function fresh(sb: Sandbox, vip: string, count = 30): Promise<{ bodies: Map<string, number>; errors: string[] }> {
  const r = await sb.client<{ results: Array<{ body?: string; error?: string }> }>(['tcp', vip, '80', '--count', String(count)]);
  const bodies = new Map<string, number>();
  const errors: string[] = [];
  for (const x of r.results) {
    if (x.error) errors.push(x.error);
    else bodies.set(x.body!, (bodies.get(x.body!) ?? 0) + 1);
  }
  return { bodies, errors };
}

interface Long {
  readonly server: string;
  progress(): { ok: number; failed: number; servers: Record<string, number> };
  stop(): Promise<{ ok: number; failed: number; failures: unknown[]; servers: Record<string, number>; end: string }>;
}

/** A long-lived TCP connection (client.py tcp-long) to vip:ECHO, retried until it lands on `want` (any backend when undefined). */
async function longTo(sb: Sandbox, vip: string, want: string | undefined, tag: string): Promise<Long> {
  for (let i = 0; i < 40; i++) {
    const stopFile = path.join(sb.runDir, `long-${tag}-${i}.stop`);
    const progressFile = path.join(sb.runDir, `long-${tag}-${i}.json`);
    const done = sb.client<{ ok: number; failed: number; failures: unknown[]; servers: Record<string, number>; end: string }>(
      ['tcp-long', vip, String(ECHO), '--interval', '0.2', '--seconds', '600', '--stop-file', stopFile, '--progress', progressFile],
      700_000,
    );
    const progress = (): { ok: number; failed: number; servers: Record<string, number> } => JSON.parse(readFileSync(progressFile, 'utf8'));
    await sb.waitUntil(() => existsSync(progressFile) && Object.keys(progress().servers).length > 0, `tcp-long ${tag} answered`, 10_000);
    const server = Object.keys(progress().servers)[0]!;
    const stop = async () => {
      writeFileSync(stopFile, '');
      return done;
    };
    if (want === undefined || server === `${want}:${ECHO}`) return { server, progress, stop };
    await stop();
  }
  throw new Error(`no long connection to ${vip} landed on ${want} in 40 tries`);
}

async function startHelper(sb: Sandbox): Promise<string> {
  const control = path.join(sb.runDir, 'probe-control');
  mkdirSync(control, { recursive: true });
  await sb.startServerIn(sb.backendNs, [process.execPath, HELPER, '--control', control, ...sb.backends.flatMap((b) => ['--addr', b.v4])]);
  return control;
}

const LOG_QUARANTINED = /^backend quarantined/;
const LOG_BACK = /^backend passes its readiness probe again/;

t.test('a backend that stops answering its probe is quarantined in time, avoided by new connections, kept by established ones, and returns (httpGet, tcpSocket, grpc)', async (t) => {
  const sb = await probeSandbox(t, 3);
  const control = await startHelper(sb);
  const addrs = sb.backends.map((b) => b.v4);
  for (const [kind, k] of Object.entries(KINDS)) sb.writeManifest(`${kind}.yaml`, probedService(`web-${kind}`, k.vip, k.probe, addrs));
  await sb.waitForSync();
  const agent = sb.agent!;

  // Every backend of every service healthy: 3 backends x 3 distinct probes.
  await sb.waitUntil(async () => {
    const list = await serviceList(sb);
    return Object.values(KINDS).every((k) => Object.values(states(list, `${k.vip}:80/TCP`)).filter((s) => s === 'healthy').length === 3);
  }, 'every backend healthy', 20_000).catch(async (err) => {
    t.comment(JSON.stringify((await serviceList(sb)).map((f) => [f.frontend, f.probes])));
    t.comment(agent.tail(40));
    throw err;
  });
  t.pass('every backend healthy by its three probes');

  const victim = addrs[0]!;
  const longs = {} as Record<Kind, Long>;
  for (const kind of Object.keys(KINDS) as Kind[]) longs[kind] = await longTo(sb, KINDS[kind].vip, victim, kind);
  t.pass(`a long-lived connection to ${victim} through each service`);

  // Down: the file makes httpGet hang, closes the tcpSocket port, and grpc answer NOT_SERVING.
  const mark = agent.logs.length;
  const t0 = Date.now();
  writeFileSync(path.join(control, victim), '');
  const bound = (FAILURE * PERIOD + TIMEOUT) * 1000;
  const quarantinedAt: Record<string, number> = {};
  await sb.waitUntil(() => {
    for (const l of agent.logs.slice(mark)) {
      if (LOG_QUARANTINED.test(String(l.msg)) && l.backend === victim) quarantinedAt[String(l.port)] = (l.time as number) - t0;
    }
    return Object.keys(quarantinedAt).length === 3;
  }, 'three quarantine log lines', 15_000);
  t.comment(`quarantined after (ms, by probe port): ${JSON.stringify(quarantinedAt)}; bound ${bound} ms`);
  for (const [port, ms] of Object.entries(quarantinedAt)) {
    // The bound, plus what a tick's grid and the sync cost (and the guest's slowness).
    t.ok(ms <= bound + 500 * SLOW, `probe on port ${port}: quarantined ${ms} ms after the backend stopped (within ${FAILURE} x ${PERIOD} s + ${TIMEOUT} s)`);
  }

  await sb.waitUntil(async () => {
    const list = await sb.lbList();
    return Object.values(KINDS).every((k) => list.find((e) => e.frontend === `${k.vip}:80/TCP`)?.backends.find((b) => b.address === `${victim}:${HTTP_PORT}`)?.state === 'quarantined');
  }, 'bpf lb list shows the quarantined slots', 10_000);
  const list = await sb.lbList();
  for (const k of Object.values(KINDS)) {
    const fe = list.find((e) => e.frontend === `${k.vip}:80/TCP`)!;
    const slot = fe.backends.find((b) => b.address === `${victim}:${HTTP_PORT}`)!;
    t.equal(slot.slot, 3, `${k.vip}: the victim sits in the non-selectable slot after the two selectable ones`);
  }

  const svcList = await serviceList(sb);
  for (const k of Object.values(KINDS)) {
    const fe = svcList.find((f) => f.frontend === `${k.vip}:80/TCP`)!;
    t.same(fe.desired?.quarantined, [`${victim}:${HTTP_PORT}`], `${k.vip}: service list names the quarantined backend`);
    const p = fe.probes!.find((x) => x.address === victim)!;
    t.match(p, { state: 'quarantined', last: { ok: false } }, `${k.vip}: its probe state, with the last result (${p.last?.reason})`);
    t.ok(p.consecutive >= FAILURE, `${k.vip}: ${p.consecutive} failures in a row`);
  }
  const text = await run(LBCTL, ['service', 'list', '--api-socket', sb.apiSocket], CLI_TIMEOUT_MS);
  t.match(text.stdout, /PROBES/, 'the text form has the PROBES column');
  t.match(text.stdout, new RegExp(`${victim.replace(/\./g, '\\.')}:${HTTP_PORT} \\[quarantined\\]`));

  for (const [kind, k] of Object.entries(KINDS)) {
    const { bodies, errors } = await fresh(sb, k.vip);
    t.same(errors, [], `${kind}: every new connection succeeds`);
    t.notOk(bodies.has(`${victim}:${HTTP_PORT}`), `${kind}: no new connection reaches the quarantined backend (${JSON.stringify(Object.fromEntries(bodies))})`);
  }

  const before = Object.fromEntries(Object.entries(longs).map(([k, l]) => [k, l.progress().ok]));
  await new Promise((r) => setTimeout(r, 1500));
  for (const [kind, l] of Object.entries(longs)) {
    const p = l.progress();
    t.ok(p.ok > before[kind]!, `${kind}: the established connection to the quarantined backend keeps working (${before[kind]} → ${p.ok} answers)`);
    t.equal(p.failed, 0, `${kind}: without a failure`);
  }

  // Up again: back after successThreshold passes.
  const mark2 = agent.logs.length;
  const t1 = Date.now();
  rmSync(path.join(control, victim));
  const backAt: Record<string, number> = {};
  await sb.waitUntil(() => {
    for (const l of agent.logs.slice(mark2)) if (LOG_BACK.test(String(l.msg)) && l.backend === victim) backAt[String(l.port)] = (l.time as number) - t1;
    return Object.keys(backAt).length === 3;
  }, 'three "passes again" log lines', 15_000);
  // A probe already hanging when the backend came back still times out: successThreshold x period after that.
  const backBound = (SUCCESS * PERIOD + TIMEOUT) * 1000;
  t.comment(`back after (ms, by probe port): ${JSON.stringify(backAt)}; bound ${backBound} ms`);
  for (const [port, ms] of Object.entries(backAt)) t.ok(ms <= backBound + 500 * SLOW, `probe on port ${port}: selectable again ${ms} ms after it answers (${SUCCESS} passes)`);
  await sb.waitUntil(async () => {
    const l = await sb.lbList();
    return Object.values(KINDS).every((k) => l.find((e) => e.frontend === `${k.vip}:80/TCP`)?.backends.find((b) => b.address === `${victim}:${HTTP_PORT}`)?.state === 'active');
  }, 'the victim active again in the maps', 10_000);
  for (const [kind, k] of Object.entries(KINDS)) {
    const { bodies, errors } = await fresh(sb, k.vip, 40);
    t.same(errors, []);
    t.ok((bodies.get(`${victim}:${HTTP_PORT}`) ?? 0) > 0, `${kind}: new connections reach it again (${JSON.stringify(Object.fromEntries(bodies))})`);
  }

  for (const [kind, l] of Object.entries(longs)) {
    const r = await l.stop();
    t.equal(r.failed, 0, `${kind}: the long connection never failed (${r.ok} answers)`);
    t.same(Object.keys(r.servers), [`${victim}:${ECHO}`], `${kind}: every answer from the backend it was sent to`);
    t.equal(r.end, 'closed');
  }

  const metrics = await scrape(sb);
  t.match(metrics, /lbctl_probe_results_total\{service="default\/web-http",result="failure"\} [1-9]/);
  t.match(metrics, /lbctl_probe_results_total\{service="default\/web-grpc",result="success"\} [1-9]/);
  t.match(metrics, /lbctl_probe_duration_seconds_count\{kind="tcpSocket"\} [1-9]/);
  t.match(metrics, /lbctl_probe_backends\{state="healthy"\} 9/);
});

t.test('every backend failing: fail open keeps serving them all, fail closed refuses; an invalid probe is bad input and its service is served', async (t) => {
  const sb = await probeSandbox(t, 3);
  const control = await startHelper(sb);
  // The service with the bad probe has a backend of its own: the maps keep one state per backend.
  const addrs = sb.backends.slice(0, 2).map((b) => b.v4);
  const VIP = KINDS.http.vip;
  sb.writeManifest('web.yaml', probedService('web', VIP, KINDS.http.probe, addrs));
  sb.writeManifest('bad.yaml', probedService('bad', '10.96.0.30', '{"httpGet": {"port": 8081}, "periodSeconds": "often"}', [sb.backends[2]!.v4]));
  await sb.waitForSync();
  const agent = sb.agent!;
  await sb.waitUntil(() => agent.logs.some((l) => l.msg === 'bad input skipped' && /readiness-probe\]: periodSeconds "often" is not an integer/.test(String(l.reason))), 'the bad probe reported');
  const bad = agent.logs.find((l) => l.msg === 'bad input skipped')!;
  t.match(bad, { where: /bad\.yaml: document 0$/, object: 'Service default/bad', category: 'invalid' }, 'reported with its file, document and object');
  t.same((await fresh(sb, '10.96.0.30', 6)).errors, [], 'the service with the bad probe is served from its endpoint conditions');

  await sb.waitUntil(async () => Object.values(states(await serviceList(sb), `${VIP}:80/TCP`)).filter((s) => s === 'healthy').length === 2, 'both healthy', 20_000);
  const long = await longTo(sb, VIP, undefined, 'all');

  // Fail open (the default). On a slow machine the backends may have failed
  // their first probes before they answered: count from here.
  const allFailedTotal = (m: string): number => Number(/lbctl_probe_all_failed_total\{policy="open"\} (\d+)/.exec(m)?.[1] ?? 0);
  const totalBefore = allFailedTotal(await scrape(sb));
  let mark = agent.logs.length;
  for (const a of addrs) writeFileSync(path.join(control, a), '');
  const open = await agent.waitForLog((l) => /^every backend of the service failed its readiness probe/.test(String(l.msg)), mark, 15_000 * SLOW);
  t.match(open, { service: 'default/web', policy: 'open', msg: /serving them all/ }, 'one log line says so');
  await sb.waitUntil(async () => (await serviceList(sb)).find((f) => f.frontend === `${VIP}:80/TCP`)?.probeAllFailed === 'open', 'service list says all failed, open');
  const o = await fresh(sb, VIP, 20);
  t.same(o.errors, [], 'fail open: new connections still succeed');
  t.equal(o.bodies.size, 2, 'to both backends');
  t.match(await scrape(sb), /lbctl_probe_all_failed_services\{policy="open"\} 1/);
  t.equal(allFailedTotal(await scrape(sb)) - totalBefore, 1, 'lbctl_probe_all_failed_total counts the event once');
  t.equal(agent.logs.slice(mark).filter((l) => /^every backend of the service failed/.test(String(l.msg))).length, 1, 'logged once, not per sync');

  // Fail closed: the agent restarted with the flag; the datapath (and the long connection) outlive it.
  await sb.stopAgent();
  await sb.startAgent([...AGENT_ARGS, '--probe-all-failed', 'closed']);
  const agent2 = sb.agent!;
  const closed = await agent2.waitForLog((l) => /^every backend of the service failed its readiness probe/.test(String(l.msg)), 0, 15_000 * SLOW);
  t.match(closed, { service: 'default/web', policy: 'closed', msg: /refusing new connections/ });
  await sb.waitUntil(async () => (await sb.lbList()).find((e) => e.frontend === `${VIP}:80/TCP`)?.backends.every((b) => b.state === 'quarantined') ?? false, 'every slot quarantined', 10_000);
  const refused = await sb.client<{ error: string | null }>(['refused', VIP, '80', '--proto', 'tcp']);
  // Before 5.18 the compat object refuses with EPERM (no bpf_set_retval; docs/kernels.md).
  const errno = (await hasSetRetval()) ? 'ECONNREFUSED' : 'EPERM';
  t.equal(refused.error, errno, `fail closed: a new connection is refused (${errno})`);
  t.match(await scrape(sb), /lbctl_probe_all_failed_services\{policy="closed"\} 1/);
  const before = long.progress().ok;
  await new Promise((r) => setTimeout(r, 1000));
  t.ok(long.progress().ok > before, 'the established connection keeps working through fail closed');

  mark = agent2.logs.length;
  for (const a of addrs) rmSync(path.join(control, a));
  await agent2.waitForLog((l) => /no longer all failed/.test(String(l.msg)), mark, 15_000 * SLOW);
  await sb.waitUntil(async () => (await fresh(sb, VIP, 4)).errors.length === 0, 'served again', 10_000);
  t.pass('served again once the backends pass');
  const r = await long.stop();
  t.equal(r.failed, 0, `the long connection never failed (${r.ok} answers)`);
});
