// A start that cannot succeed ends, and SIGTERM always stops the agent
// (issue 34, item 13). Tried as a new user would during a migration, with
// kube-proxy still on the node holding its ports: the agent runs in a
// network namespace of this run (the client netns) on its default ports,
// kube-proxy's, and a process this test started holds one of them (or the
// API socket). The agent must exit within a bounded time, non-zero, with
// one line on stderr that names the flag to change, and no stack. Then
// SIGTERM at each stage of a start: at once, while the datapath loads,
// while the source cannot reach its API server (refused, or accepted and
// never answered), and after the first sync. The healthCheckNodePort
// servers are not here: they are per service and retried at every sync.
import t, { type Test } from 'tap';
import net from 'node:net';
import { FakeApiServer } from '../helpers/fake-apiserver.js';
import { serviceWithBackends } from '../helpers/manifests.js';
import { createSandbox, HTTP_PORT, SLOW, type AgentProcess, type LogLine, type Sandbox } from '../helpers/sandbox.js';
import { DEFAULT_HEALTH_PORT, DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT } from '../../src/base/defaults.js';

t.setTimeout(240_000 * SLOW);

/** How long a failed start or a stop may take (the DaemonSet gives SIGTERM 10 s before SIGKILL). */
const EXIT_BOUND_MS = 5_000 * SLOW;
const MESH_PORT = 4240;

/** The agent's own defaults, said explicitly: the sandbox's slot otherwise picks free ports. */
const DEFAULT_PORTS = [
  '--health-port', String(DEFAULT_HEALTH_PORT), '--health-bind-address', '0.0.0.0',
  '--metrics-port', String(DEFAULT_METRICS_PORT), '--metrics-bind-address', DEFAULT_METRICS_HOST,
  '--health-mesh-port', String(MESH_PORT),
  // The tc datapath is not what is tried here.
  '--no-nodeport',
];

/** A listener that holds `where` (host:port, or a unix socket path) until killed; prints "ready" once it listens. */
const HOLDER = `
import os, socket, sys, time
where = sys.argv[1]
if where.startswith('/'):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(where):
        os.unlink(where)  # a socket file left by an agent killed earlier
    s.bind(where)
else:
    host, port = where.rsplit(':', 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((host, int(port)))
s.listen(16)
print('ready', flush=True)
time.sleep(3600)
`;

/** Resolves with how the agent ended, or undefined when it still runs after `ms`. */
async function exitWithin(agent: AgentProcess, ms: number): Promise<{ code: number | null; signal: NodeJS.Signals | null; ms: number } | undefined> {
  const t0 = performance.now();
  let timer: NodeJS.Timeout | undefined;
  const code = await Promise.race([agent.exited, new Promise<'running'>((r) => (timer = setTimeout(() => r('running'), ms)))]);
  clearTimeout(timer);
  if (code === 'running') return undefined;
  return { code, signal: agent.exitSignal ?? null, ms: Math.round(performance.now() - t0) };
}

const nonJson = (logs: readonly LogLine[]): string[] => logs.filter((l) => l.msg === 'non-json').map((l) => String(l.line));

t.test('each port the agent listens on already taken: a prompt exit with one line naming the flag', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false, agentInClientNetns: true });

  // The control: nothing taken, and the agent serves on these very ports.
  const control = sb.spawnAgent(DEFAULT_PORTS);
  const serving = await control.waitForLog((l) => l.msg === 'serving health, metrics and the local API');
  t.match(serving, { health: DEFAULT_HEALTH_PORT, metrics: DEFAULT_METRICS_PORT }, 'with nothing in the way the agent serves on its default ports');
  await control.waitForLog((l) => l.msg === 'sync done');
  t.equal(await sb.stopAgent(), 0, 'and stops on SIGTERM');

  const cases = [
    { flag: '--health-port', holds: `0.0.0.0:${DEFAULT_HEALTH_PORT}`, value: String(DEFAULT_HEALTH_PORT), who: /kube-proxy/ },
    { flag: '--metrics-port', holds: `${DEFAULT_METRICS_HOST}:${DEFAULT_METRICS_PORT}`, value: String(DEFAULT_METRICS_PORT), who: /kube-proxy/ },
    { flag: '--health-mesh-port', holds: `0.0.0.0:${MESH_PORT}`, value: String(MESH_PORT), who: /cilium/i },
    { flag: '--api-socket', holds: sb.apiSocket, value: sb.apiSocket, who: /another/ },
  ];
  for (const c of cases) {
    const holder = await sb.startServerIn(sb.clientNs, [sb.python, '-c', HOLDER, c.holds]);
    const agent = sb.spawnAgent(DEFAULT_PORTS);
    const end = await exitWithin(agent, EXIT_BOUND_MS);
    if (!end) {
      sb.node.killNow();
      await agent.exited;
    }
    holder.kill('SIGKILL');
    await new Promise((r) => holder.once('exit', r));
    t.ok(end, `${c.holds} taken: the agent exited by itself${end ? ` in ${end.ms} ms` : `: still running after ${EXIT_BOUND_MS} ms (killed)`}`);
    if (!end) continue;
    t.ok(end.code !== null && end.code !== 0, `non-zero exit code (${end.code ?? end.signal})`);
    const lines = agent.logs.map((l) => (l.msg === 'non-json' ? String(l.line) : JSON.stringify(l)));
    t.equal(lines.length, 1, `one line on stderr, got ${lines.length}:\n${lines.join('\n')}`);
    const [line = ''] = nonJson(agent.logs);
    t.ok(line.startsWith(`lbctl: ${c.flag} ${c.value}: `), `it names the flag and its value: ${line}`);
    t.match(line, c.who, 'and what may hold it');
    t.notMatch(lines.join('\n'), /\n\s+at |EADDRINUSE/, 'no stack trace, no errno jargon');
  }
});

const NODE = 'node-a';
const apiSetup = async (t: Test): Promise<{ sb: Sandbox; api: FakeApiServer }> => {
  const api = new FakeApiServer();
  await api.start();
  t.teardown(() => api.stop());
  const sb = await createSandbox(t, { backends: 1, agent: false });
  api.apply(`apiVersion: v1\nkind: Node\nmetadata:\n  name: ${NODE}\n`);
  api.apply(serviceWithBackends({ name: 'web', clusterIPs: ['10.96.0.10'], ports: [{ name: 'http', port: 80 }] }, [
    { name: 'web-abcde', family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: [sb.backends[0]!.v4] },
  ]));
  sb.sourceArgs = ['--kubeconfig', api.kubeconfig, '--node-name', NODE];
  return { sb, api };
};

/** SIGTERM once `ready` says so; the agent must be gone within EXIT_BOUND_MS, by itself (or by the signal's default action before it handles signals). */
async function sigtermStops(t: Test, sb: Sandbox, stage: string, ready: (agent: AgentProcess) => Promise<unknown>, opts: { defaultActionOk?: boolean; args?: string[] } = {}): Promise<void> {
  const agent = sb.spawnAgent(opts.args);
  await ready(agent);
  t.ok(agent.running, `${stage}: the agent runs`);
  process.kill(agent.pid, 'SIGTERM');
  const end = await exitWithin(agent, EXIT_BOUND_MS);
  if (!end) {
    sb.node.killNow();
    await agent.exited;
    t.fail(`${stage}: still running ${EXIT_BOUND_MS} ms after SIGTERM (killed); last lines:\n${agent.tail()}`);
    return;
  }
  const byItself = end.code === 0;
  t.ok(byItself || (opts.defaultActionOk === true && end.signal === 'SIGTERM'), `${stage}: stopped ${end.ms} ms after SIGTERM (${end.code !== null ? `exit ${end.code}` : end.signal})`);
  if (byItself) t.ok(agent.logs.some((l) => l.msg === 'stopping' && l.signal === 'SIGTERM'), `${stage}: it said why it stops`);
}

t.test('SIGTERM stops the agent at every stage of a start', async (t) => {
  const { sb, api } = await apiSetup(t);
  await api.goAway();

  await sigtermStops(t, sb, 'at once', async () => undefined, { defaultActionOk: true });
  await sigtermStops(t, sb, 'while the datapath loads', (a) => a.waitForLog((l) => typeof l.msg === 'string' && l.msg.startsWith('datapath features')));
  await sigtermStops(t, sb, 'the API server refuses connections (no first sync)', (a) => a.waitForLog((l) => l.msg === 'list or watch failed; retrying after backoff'));
  // kube-proxy's minSyncPeriod, as operators set it: a sync waiting out the period holds no stop.
  await sigtermStops(t, sb, 'the API server refuses connections, --min-sync-period 30s', (a) => a.waitForLog((l) => l.msg === 'list or watch failed; retrying after backoff'), {
    args: ['--min-sync-period', '30s'],
  });

  // An API server that accepts connections and never answers (a hung one, a half-open path).
  const silent = net.createServer((s) => s.on('error', () => {}));
  const held = new Set<net.Socket>();
  silent.on('connection', (s) => (held.add(s), s.on('close', () => held.delete(s))));
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
  t.teardown(() => (held.forEach((s) => s.destroy()), new Promise((r) => silent.close(r))));
  const silentUrl = `http://127.0.0.1:${(silent.address() as net.AddressInfo).port}`;
  const saved = sb.sourceArgs;
  sb.sourceArgs = ['--kubeconfig', api.kubeconfig, '--master', silentUrl, '--node-name', NODE];
  await sigtermStops(t, sb, 'the API server accepts and never answers (no first sync)', async (a) => {
    await a.waitForLog((l) => l.msg === 'serving health, metrics and the local API');
    await sb.waitUntil(() => held.size >= 3, 'the agent has a request open to the silent server for each kind');
  });
  sb.sourceArgs = saved;

  await api.comeBack();
  await sigtermStops(t, sb, 'after the first sync', (a) => a.waitForLog((l) => l.msg === 'sync done'));

  // A start that failed (the metrics port held, here by this test on
  // loopback): gone by itself, or at the latest on SIGTERM.
  const holder = net.createServer();
  await new Promise<void>((r) => holder.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise((r) => holder.close(r)));
  const heldPort = String((holder.address() as net.AddressInfo).port);
  const failed = sb.spawnAgent(['--metrics-port', heldPort, '--metrics-bind-address', '127.0.0.1']);
  const line = await failed.waitForLog((l) => l.msg === 'non-json' && String(l.line).startsWith('lbctl: '), 0, 30_000);
  if (failed.running) process.kill(failed.pid, 'SIGTERM');
  const end = await exitWithin(failed, EXIT_BOUND_MS);
  if (!end) {
    sb.node.killNow();
    await failed.exited;
  }
  t.ok(end, `a start that failed (${String(line.line)}): the agent is gone${end ? '' : ` neither by itself nor ${EXIT_BOUND_MS} ms after SIGTERM (killed)`}`);
});
