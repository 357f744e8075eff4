import t from 'tap';
import { spawnSync } from 'node:child_process';
import net from 'node:net';
import { chmodSync, existsSync, lstatSync, mkdtempSync, readdirSync, rmSync, statSync, watch, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { AgentUnreachableError, apiGet, startApiServer, type AgentStatus } from '../../src/http/api.js';
import type { FrontendStatus } from '../../src/http/view.js';
import { failingChecks, formatBrief, formatStatus, statusCommand } from '../../src/cli/commands/status.js';
import { sctpStatus } from '../../src/datapath/sctp.js';
import { driftCount, formatServiceList, serviceListCommand } from '../../src/cli/commands/service-list.js';
import { FakeView } from '../fakes/fake-view.js';

type T = { teardown(fn: () => unknown): void };

function tempDir(t: T): string {
  const dir = mkdtempSync(path.join(tmpdir(), 'lbctl-api-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function serve(t: T, view: FakeView) {
  // A directory that does not exist yet: the server creates it.
  const socketPath = path.join(tempDir(t), 'run', 'agent.sock');
  const srv = await startApiServer({ view, socketPath, version: '0.1.0-test' });
  t.teardown(() => srv.close());
  return socketPath;
}

const FES: FrontendStatus[] = [
  {
    frontend: '10.96.0.10:53/UDP',
    service: 'kube-system/kube-dns:dns',
    desired: { backends: ['10.244.1.5:53', '10.244.2.7:53'], terminating: [], revNatId: 7 },
    realized: { backends: ['10.244.2.7:53', '10.244.1.5:53'], terminating: [], revNatId: 7 },
    drift: false,
    details: [],
  },
  {
    frontend: '10.96.0.20:80/TCP',
    service: 'default/web:http',
    desired: { backends: ['10.244.1.9:8080'], terminating: ['10.244.1.8:8080'], revNatId: 8 },
    realized: { backends: ['10.244.1.8:8080'], terminating: [], revNatId: 8 },
    drift: true,
    details: ['backend 10.244.1.9:8080 missing', '10.244.1.8:8080 active in the maps, terminating in the intent'],
  },
  {
    frontend: '10.96.0.99:443/TCP',
    realized: { backends: [], terminating: [], revNatId: 12 },
    drift: true,
    details: ['not intended: left over in the maps'],
  },
];

t.test('GET /v1/status: every check, syncs, counts, uptime, version', async (t) => {
  const view = new FakeView();
  view.startedAt = Date.now() - 90_500;
  view.stats = { count: 12, lastAttempt: Date.parse('2024-05-01T10:00:00Z'), lastSuccess: Date.parse('2024-05-01T10:00:00Z'), inProgress: false };
  view.programmed = { services: 2, frontends: 3, backends: 4 };
  view.maps = [{ map: 'lb4_reverse_nat', entries: 4, maxEntries: 4 }];
  const sock = await serve(t, view);
  const s = await apiGet<AgentStatus>(sock, '/v1/status');
  t.equal(s.version, '0.1.0-test');
  t.ok(s.uptimeSeconds >= 90 && s.uptimeSeconds < 100, `uptime ${s.uptimeSeconds}`);
  t.equal(s.startedAt, new Date(view.startedAt).toISOString());
  t.same(s.livez, { ok: true, checks: [{ name: 'ping', ok: true }, { name: 'eventloop', ok: true }, { name: 'datapath', ok: true }, { name: 'canary', ok: true }] });
  t.same(s.readyz.checks.map((c) => c.name), ['ping', 'datapath', 'source-synced', 'synced']);
  t.equal(s.readyz.ok, true);
  t.same(s.healthz, { healthy: true, nodeEligible: true, lastUpdated: s.time });
  t.same(s.sync, { count: 12, inProgress: false, lastAttempt: '2024-05-01T10:00:00.000Z', lastSuccess: '2024-05-01T10:00:00.000Z' });
  t.same(s.counts, { services: 2, frontends: 3, backends: 4 });
  t.same(s.maps, [{ map: 'lb4_reverse_nat', entries: 4, maxEntries: 4 }], 'and the fill of each map');
});

t.test('GET /v1/services, and errors as JSON', async (t) => {
  const view = new FakeView();
  view.fes = FES;
  const sock = await serve(t, view);
  t.same(await apiGet(sock, '/v1/services'), FES);
  await t.rejects(apiGet(sock, '/v1/nope'), { code: 'EAPI', message: /HTTP 404: no such endpoint: \/v1\/nope/ });
  view.throws = new Error('lb4_services: EPERM');
  await t.rejects(apiGet(sock, '/v1/services'), { code: 'EAPI', message: /HTTP 500: lb4_services: EPERM/ });
});

t.test('the socket: mode 0600, a live one or a file refused, removed on close', async (t) => {
  const dir = tempDir(t);
  const socketPath = path.join(dir, 'agent.sock');
  const view = new FakeView();
  const a = await startApiServer({ view, socketPath, version: 'a' });
  t.equal(statSync(socketPath).mode & 0o777, 0o600);
  await t.rejects(startApiServer({ view, socketPath, version: 'b' }), { code: 'EADDRINUSE' }, 'a live agent keeps its socket');
  t.equal((await apiGet<AgentStatus>(socketPath, '/v1/status')).version, 'a');
  await a.close();
  t.notOk(existsSync(socketPath), 'removed on close');

  writeFileSync(socketPath, 'not a socket');
  await t.rejects(startApiServer({ view, socketPath, version: 'c' }), { code: 'EEXIST' });
});

t.test('the socket is never reachable by others, not even for a moment: it is bound in a 0700 directory and renamed into place', async (t) => {
  const dir = tempDir(t);
  chmodSync(dir, 0o1777); // as /tmp: anyone may look in
  const socketPath = path.join(dir, 'agent.sock');
  // Every name that appears in the directory, looked at as it appears.
  const seen: string[] = [];
  const watcher = watch(dir, (_event, name) => {
    if (!name) return;
    try {
      const st = lstatSync(path.join(dir, name));
      seen.push(`${name} ${st.isSocket() ? 'socket' : st.isDirectory() ? 'dir' : 'file'} ${(st.mode & 0o777).toString(8)}`);
    } catch {
      // gone already (the private directory, once the socket left it)
    }
  });
  t.teardown(() => watcher.close());
  const srv = await startApiServer({ view: new FakeView(), socketPath, version: 'v' });
  t.teardown(() => srv.close());
  // The rename into place is the last name the server makes appear; inotify
  // reports in order, so once it is seen every earlier name has been too.
  for (const end = Date.now() + 5000; !seen.some((s) => s.startsWith('agent.sock ')) && Date.now() < end; ) {
    await new Promise((r) => setTimeout(r, 10));
  }
  t.ok(seen.some((s) => s === 'agent.sock socket 600'), `the socket appeared with mode 0600 (${seen.join(', ')})`);
  t.ok(seen.some((s) => / dir 700$/.test(s)), 'it was bound inside a private 0700 directory first (a bind in place would be 0755 until chmod)');
  for (const s of seen) t.match(s, / (socket 600|dir 700)$/, `no name was ever reachable by others: ${s}`);
  t.same(readdirSync(dir), ['agent.sock'], 'the private directory is gone');
});

t.test('a stale socket file (nobody listening) is replaced', async (t) => {
  const dir = tempDir(t);
  const socketPath = path.join(dir, 'agent.sock');
  // An agent killed with SIGKILL leaves its socket file behind, with nobody listening.
  const child = spawnSync(process.execPath, ['-e', `require('net').createServer().listen(process.argv[1], () => process.kill(process.pid, 'SIGKILL'))`, socketPath]);
  t.equal(child.signal, 'SIGKILL');
  t.ok(statSync(socketPath).isSocket());
  await t.rejects(apiGet(socketPath, '/v1/status'), { code: 'EUNREACHABLE', message: /nothing is listening on .*stale/ });
  const srv = await startApiServer({ view: new FakeView(), socketPath, version: 'new' });
  t.teardown(() => srv.close());
  t.equal((await apiGet<AgentStatus>(socketPath, '/v1/status')).version, 'new');
});

t.test('apiGet says clearly when the agent is not there', async (t) => {
  const missing = path.join(tempDir(t), 'none.sock');
  const err = await apiGet(missing, '/v1/status').catch((e: unknown) => e);
  t.type(err, AgentUnreachableError);
  t.match(err, { code: 'EUNREACHABLE', message: `cannot reach the agent: no API socket at ${missing}: is the agent running (lbctl agent)?` });
  const lines: string[] = [];
  await t.rejects(statusCommand({ apiSocket: missing, brief: true }, (s) => lines.push(s)), { code: 'EUNREACHABLE' });
  await t.rejects(serviceListCommand({ apiSocket: missing }, (s) => lines.push(s)), { code: 'EUNREACHABLE' });
  t.same(lines, [], 'nothing on stdout');
});

t.test('apiGet times out on an agent that does not answer', async (t) => {
  const socketPath = path.join(tempDir(t), 'mute.sock');
  const mute = net.createServer(() => undefined);
  await new Promise<void>((r) => mute.listen(socketPath, r));
  t.teardown(() => new Promise<void>((r) => { mute.close(() => r()); }));
  const conns: net.Socket[] = [];
  mute.on('connection', (c) => conns.push(c));
  t.teardown(() => conns.forEach((c) => c.destroy()));
  await t.rejects(apiGet(socketPath, '/v1/status', { timeoutMs: 100 }), { code: 'EUNREACHABLE', message: /did not answer .* within 0.1 s/ });
});

const status = (over: Partial<AgentStatus> = {}): AgentStatus => ({
  version: '0.1.0',
  time: '2024-05-01T10:00:10.000Z',
  startedAt: '2024-05-01T08:00:00.000Z',
  uptimeSeconds: 7210,
  livez: { ok: true, checks: [{ name: 'ping', ok: true }, { name: 'eventloop', ok: true }, { name: 'datapath', ok: true }, { name: 'canary', ok: true }] },
  readyz: { ok: true, checks: [{ name: 'ping', ok: true }, { name: 'datapath', ok: true }, { name: 'source-synced', ok: true }, { name: 'synced', ok: true }] },
  healthz: { healthy: true, nodeEligible: true, lastUpdated: '2024-05-01T10:00:10.000Z' },
  sync: { count: 42, inProgress: false, lastAttempt: '2024-05-01T10:00:08.000Z', lastSuccess: '2024-05-01T10:00:08.000Z' },
  counts: { services: 1, frontends: 3, backends: 9 },
  ...over,
});

t.test('status --brief: OK, or the failing checks one per line, and the exit code', async (t) => {
  t.same(formatBrief(status()), { text: 'OK\n', exitCode: 0 });
  const bad = status({
    livez: { ok: false, checks: [{ name: 'ping', ok: true }, { name: 'datapath', ok: false, message: 'link sock4_connect missing' }] },
    readyz: { ok: false, checks: [{ name: 'datapath', ok: false, message: 'link sock4_connect missing' }, { name: 'synced', ok: false, message: 'the last sync failed: E2BIG' }] },
    healthz: { healthy: false, nodeEligible: false, lastUpdated: '2024-05-01T09:00:00.000Z', reason: 'the node is being deleted' },
  });
  t.same(failingChecks(bad), ['datapath: link sock4_connect missing', 'synced: the last sync failed: E2BIG', 'healthz: the node is being deleted']);
  t.same(formatBrief(bad), { text: 'datapath: link sock4_connect missing\nsynced: the last sync failed: E2BIG\nhealthz: the node is being deleted\n', exitCode: 1 });
});

t.test('status: the readable summary', async (t) => {
  const ok = formatStatus(status());
  t.equal(ok.exitCode, 0);
  t.equal(
    ok.text,
    [
      'Agent:       lbctl 0.1.0, up 2h0m (since 2024-05-01T08:00:00.000Z)',
      'Liveness:    ok',
      '  [+]ping ok',
      '  [+]eventloop ok',
      '  [+]datapath ok',
      '  [+]canary ok',
      'Readiness:   ok',
      '  [+]ping ok',
      '  [+]datapath ok',
      '  [+]source-synced ok',
      '  [+]synced ok',
      'Healthz:     ok (node eligible)',
      'Syncs:       42, last success 2s ago, last attempt 2s ago',
      'Pending:     none',
      'Programmed:  1 service, 3 frontends, 9 backends',
      '',
    ].join('\n'),
  );
  const bad = formatStatus(
    status({
      readyz: { ok: false, checks: [{ name: 'ping', ok: true }, { name: 'synced', ok: false, message: 'the last sync failed: E2BIG' }] },
      sync: { count: 43, inProgress: true, lastAttempt: '2024-05-01T10:00:09.500Z', lastSuccess: '2024-05-01T10:00:08.000Z', lastError: 'E2BIG', oldestPending: '2024-05-01T10:00:05.000Z' },
    }),
  );
  t.equal(bad.exitCode, 1);
  t.match(bad.text, 'Readiness:   FAILED\n  [+]ping ok\n  [-]synced failed: the last sync failed: E2BIG\n');
  t.match(bad.text, 'Syncs:       43, last success 2s ago, last attempt 500ms ago, one in progress\n');
  t.match(bad.text, 'Pending:     a change has waited 5s\n');
  t.match(bad.text, 'Last error:  E2BIG\n');
  const full = formatStatus(status({ maps: [{ map: 'lb4_services', entries: 3, maxEntries: 1008 }, { map: 'lb4_reverse_nat', entries: 4, maxEntries: 4 }] }));
  t.match(full.text, 'Programmed:  1 service, 3 frontends, 9 backends\nMaps:        lb4_services 3/1008 (0%), lb4_reverse_nat 4/4 (100%, FULL)\n', 'the fill of each map, a full one marked');
  const noted = formatStatus(status({ source: { name: 'kubernetes:https://10.0.0.1:6443', notes: ["without this node's Node (zone hints ignored): nodes is forbidden"] } }));
  t.match(noted.text, "Agent:       lbctl 0.1.0, up 2h0m (since 2024-05-01T08:00:00.000Z)\nSource:      kubernetes:https://10.0.0.1:6443\n  note: without this node's Node (zone hints ignored): nodes is forbidden\nLiveness:", 'the source and its notes');
  t.equal(noted.exitCode, 0, 'a note fails nothing');
});

t.test('status: the tc datapath line says the attach mode and why', async (t) => {
  const kernel = (mode: string, modeReason: string): AgentStatus['kernel'] => ({
    release: '5.10.0-32-amd64',
    features: [{ name: 'tcx', required: false, available: false, since: '6.6', detail: 'tc programs attach through clsact and cls_bpf (EINVAL)' }],
    object: 'compat',
    udpTermination: 'inet-diag',
    nodePort: { state: 'serving', mode, modeReason, devices: [{ name: 'eth0', index: 2, addresses: ['10.0.0.5/24'] }], nodeAddresses: ['10.0.0.5'], waiting: [], problems: [] },
  });
  t.match(formatStatus(status({ kernel: kernel('clsact', '--tc-attach auto: the kernel has no tcx') })).text, 'NodePort:    nodeport.bpf.o at tc (clsact; --tc-attach auto: the kernel has no tcx) on eth0 (10.0.0.5/24); NodePorts on 10.0.0.5\n');
  t.match(formatStatus(status({ kernel: kernel('clsact', '--tc-attach clsact') })).text, 'at tc (clsact; --tc-attach clsact) on eth0');
  const dsr = (forwarding: string): string => {
    const k = kernel('clsact', '--tc-attach clsact')!;
    return formatStatus(status({ kernel: { ...k, nodePort: { ...k.nodePort!, forwarding } } })).text;
  };
  t.match(dsr('dsr'), 'NodePorts on 10.0.0.5; remote backends by DSR (--nodeport-mode dsr)\n', '--nodeport-mode dsr is said');
  t.match(dsr('hybrid'), 'remote backends by DSR (TCP) and SNAT (UDP) (--nodeport-mode hybrid)', '--nodeport-mode hybrid is said');
  t.notMatch(dsr('snat'), 'remote backends', 'snat, the default, is not');
  const k = kernel('clsact', '--tc-attach clsact')!;
  const xdp = formatStatus(status({ kernel: { ...k, nodePort: { ...k.nodePort!, acceleration: 'native', devices: [{ name: 'eth0', index: 2, addresses: ['10.0.0.5/24'], xdp: true }, { name: 'eth1', index: 3, addresses: ['10.1.0.5/24'] }] } } })).text;
  t.match(xdp, 'on eth0 [XDP] (10.0.0.5/24), eth1 (10.1.0.5/24); NodePorts on 10.0.0.5; XDP acceleration native on eth0\n', '--nodeport-acceleration: the devices at XDP are marked and named');
  t.notMatch(dsr('snat'), 'XDP', 'without acceleration, no word of XDP');
});

t.test('status through the socket: exit codes', async (t) => {
  const view = new FakeView();
  const sock = await serve(t, view);
  const out: string[] = [];
  await statusCommand({ apiSocket: sock, brief: true }, (s) => out.push(s));
  t.same(out, ['OK\n']);
  view.canary = { ok: false, message: 'update lb4_services: EPERM' };
  out.length = 0;
  await t.rejects(statusCommand({ apiSocket: sock, brief: true }, (s) => out.push(s)), { code: 'EUNHEALTHY', message: 'the agent is unhealthy: 1 check failing' });
  t.same(out, ['canary: update lb4_services: EPERM\n']);
  out.length = 0;
  await t.rejects(statusCommand({ apiSocket: sock }, (s) => out.push(s)), { code: 'EUNHEALTHY' });
  t.match(out.join(''), 'Liveness:    FAILED\n');
});

t.test('service list: desired versus realized, drift flagged', async (t) => {
  t.equal(
    formatServiceList(FES),
    [
      'FRONTEND            SERVICE                   BACKENDS (desired)                              REALIZED         STATUS',
      '10.96.0.10:53/UDP   kube-system/kube-dns:dns  10.244.1.5:53, 10.244.2.7:53                    (same)           ok',
      '10.96.0.20:80/TCP   default/web:http          10.244.1.9:8080, 10.244.1.8:8080 [terminating]  10.244.1.8:8080  DRIFT: backend 10.244.1.9:8080 missing; 10.244.1.8:8080 active in the maps, terminating in the intent',
      '10.96.0.99:443/TCP  -                         -                                               (none)           DRIFT: not intended: left over in the maps',
      '',
    ].join('\n'),
  );
  t.equal(driftCount(FES), 2);
  t.equal(formatServiceList([]), 'FRONTEND  SERVICE  BACKENDS (desired)  REALIZED  STATUS\n');
});

t.test('service list through the socket: text, JSON, exit 1 on drift', async (t) => {
  const view = new FakeView();
  view.fes = [FES[0]!];
  const sock = await serve(t, view);
  const out: string[] = [];
  await serviceListCommand({ apiSocket: sock, output: 'json' }, (s) => out.push(s));
  t.same(JSON.parse(out.join('')), [FES[0]]);
  view.fes = FES;
  out.length = 0;
  await t.rejects(serviceListCommand({ apiSocket: sock }, (s) => out.push(s)), { code: 'EDRIFT', message: '2 frontends drift from the desired state' });
  t.match(out.join(''), /^FRONTEND/);
  t.match(out.join(''), 'DRIFT: not intended');
});

t.test('GET /v1/health: the mesh\'s status, or 404 saying the mesh is off', async (t) => {
  const view = new FakeView();
  const off = await serve(t, view);
  await t.rejects(apiGet(off, '/v1/health'), { code: 'EAPI', message: /HTTP 404: the health mesh is off \(--health-mesh-port 0\)/ });
  const socketPath = path.join(tempDir(t), 'mesh.sock');
  const mesh = { status: () => ({ probeTime: 'now', periodMs: 10_000, timeoutMs: 1000, port: 4240, inFlight: 0, queued: 0, nodes: [], reachable: 0, unreachable: 0, total: 0 }) };
  const srv = await startApiServer({ view, socketPath, version: 'x', mesh });
  t.teardown(() => srv.close());
  t.same(await apiGet(socketPath, '/v1/health'), mesh.status());
});

t.test('status: the SCTP row says what SCTP frontends get, and why not', async (t) => {
  const kernel = (sctp: ReturnType<typeof sctpStatus>): NonNullable<AgentStatus['kernel']> => ({
    release: '6.1.0-50-amd64', features: [], object: 'standard', udpTermination: 'inet-diag', nodePort: { state: 'off' }, sctp,
  });
  const row = (s: ReturnType<typeof sctpStatus>): string | undefined => formatStatus(status({ kernel: kernel(s) })).text.split('\n').find((l) => l.startsWith('SCTP:'));
  t.equal(
    row(sctpStatus('serving')),
    'SCTP:        programmed, balanced in part: ClusterIP at the socket hooks no (the kernel runs no cgroup connect or sendmsg program for SCTP sockets); ' +
      'NodePort/LoadBalancer/external IPs at tc yes (nodeport.bpf.o translates SCTP (CRC32c updated))',
  );
  t.match(row(sctpStatus('off')), /at tc no \(the tc datapath is off\)$/, '--no-nodeport');
  t.match(row(sctpStatus('serving', false)), /^SCTP: +programmed, not balanced: .*at tc no \(nodeport\.bpf\.o does not translate SCTP yet\)$/,
    'an object that does not translate SCTP');
  t.notOk(formatStatus(status()).text.includes('SCTP:'), 'an agent that reports no kernel has no SCTP row');
});
