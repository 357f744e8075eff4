// The agent without its Node: a cluster where this node's Node cannot be
// listed (RBAC without `nodes`, a node not registered yet) still gets its
// services programmed, after a capped wait, and the Node's zone is applied
// when it arrives. Against the fake API server (test/helpers/fake-apiserver.ts),
// through an ordinary kubeconfig, as test/e2e/kubernetes.ts.
import t, { type Test } from 'tap';
import { FakeApiServer } from '../helpers/fake-apiserver.js';
import { CLI_TIMEOUT_MS, createSandbox, HTTP_PORT, LBCTL, run, SLOW, type LogLine, type Sandbox } from '../helpers/sandbox.js';

const WEB = '10.96.0.10';
const NODE = 'node-a';
/** The agent's default --node-sync-timeout (src/base/defaults.ts). */
const DEFAULT_GRACE_MS = 5_000;

function service(name: string, ip: string, extra = ''): string {
  return `apiVersion: v1
kind: Service
metadata:
  name: ${name}
  namespace: default
spec:
  type: ClusterIP
  clusterIP: ${ip}
  clusterIPs: [${ip}]
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: http
${extra}`;
}

function slice(svc: string, endpoints: string): string {
  return `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ${svc}-abcde
  namespace: default
  labels:
    kubernetes.io/service-name: ${svc}
addressType: IPv4
ports:
- name: http
  port: ${HTTP_PORT}
  protocol: TCP
endpoints:
${endpoints}`;
}

function endpoint(ip: string, opts: { node?: string; zone?: string } = {}): string {
  return `- addresses: [${ip}]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: ${opts.node ?? NODE}
${opts.zone ? `  hints: {forZones: [{name: ${opts.zone}}]}\n` : ''}`;
}

const nodeYaml = `apiVersion: v1
kind: Node
metadata:
  name: ${NODE}
  labels:
    topology.kubernetes.io/zone: zone-a
`;

async function setup(t: Test): Promise<{ sb: Sandbox; api: FakeApiServer }> {
  const api = new FakeApiServer();
  await api.start();
  t.teardown(() => api.stop());
  const sb = await createSandbox(t, { backends: 3, agent: false });
  sb.sourceArgs = ['--kubeconfig', api.kubeconfig, '--node-name', NODE, '--sync-period', '600000'];
  // The agent's service account may list Services and EndpointSlices, not Nodes.
  api.forbidden.add('Node');
  api.apply(nodeYaml);
  return { sb, api };
}

async function backendsOf(sb: Sandbox, frontend: string): Promise<string[]> {
  const fe = (await sb.lbList()).find((e) => e.frontend === frontend);
  return fe ? fe.backends.map((b) => `${b.address}${b.state === 'active' ? '' : ` ${b.state}`}`) : [];
}

function agentPort(sb: Sandbox, which: 'health' | 'metrics'): number {
  const line = sb.agent!.logs.find((l) => l.msg === 'serving health, metrics and the local API');
  return Number(line?.[which]);
}

const GOING_ON = "going on without this node's Node: its zone is unknown, so zone hints are ignored until it arrives";
const indexOf = (logs: readonly LogLine[], msg: string): number => logs.findIndex((l) => l.msg === msg);

t.test('Nodes forbidden: services are programmed once the Node’s grace is over, and reachable; the log says why', async (t) => {
  const { sb, api } = await setup(t);
  const [a, b] = sb.backends.map((x) => x.v4) as [string, string];
  // Zone hints for two zones: without the node's zone they are ignored, as kube-proxy ignores them.
  api.apply(`${service('web', WEB)}---\n${slice('web', endpoint(a, { zone: 'zone-a' }) + endpoint(b, { node: 'node-b', zone: 'zone-b' }))}`);
  const started = Date.now();
  const first = await sb.startAgent(); // the default --node-sync-timeout
  const tookMs = Date.now() - started;
  t.ok(first.planned > 0, 'the first sync programs the services');
  t.ok(tookMs >= DEFAULT_GRACE_MS, `the Node had its grace first (${tookMs} ms)`);
  t.ok(tookMs < DEFAULT_GRACE_MS + 15_000 * SLOW, `and no more (${tookMs} ms)`);

  const logs = sb.agent!.logs;
  const line = logs.find((l) => l.msg === GOING_ON);
  t.match(line, { level: 40, node: NODE, reason: /^Node "node-a" not listed within 5000 ms of the Services and EndpointSlices: list \/api\/v1\/nodes: HTTP 403: nodes is forbidden/ }, 'one warning names the cause');
  t.equal(logs.filter((l) => l.msg === GOING_ON).length, 1, 'once');
  t.ok(indexOf(logs, GOING_ON) < indexOf(logs, 'sync done'), 'before the first write');

  t.same(await backendsOf(sb, `${WEB}:80/TCP`), [`${a}:${HTTP_PORT}`, `${b}:${HTTP_PORT}`], 'zone hints ignored: every endpoint');
  const res = (await sb.client<{ results: Array<{ error?: string }> }>(['tcp', WEB, '80', '--count', '10'])).results;
  t.same(res.filter((r) => r.error), [], 'connections through the service succeed');
  const port = agentPort(sb, 'health');
  await sb.waitUntil(async () => (await fetch(`http://127.0.0.1:${port}/readyz`)).status === 200, 'ready without the Node');
  const status = await run(LBCTL, ['status', '--api-socket', sb.apiSocket], CLI_TIMEOUT_MS);
  t.match(status.stdout, /\n  note: without this node's Node \(zone hints ignored\): Node "node-a" not listed within 5000 ms[^\n]*nodes is forbidden/, 'lbctl status says the agent runs without its Node, and why');

  // The Node is still asked for, with backoff.
  const mark = api.requests.length;
  await sb.waitUntil(() => api.requests.slice(mark).some((r) => r.url.startsWith('/api/v1/nodes?')), 'the Node list is retried', 40_000);
});

t.test('the Node arriving later with a zone: hinted services are recomputed', async (t) => {
  const { sb, api } = await setup(t);
  sb.sourceArgs.push('--node-sync-timeout', '500');
  const [a, b, c] = sb.backends.map((x) => x.v4) as [string, string, string];
  const DB = '10.96.0.11';
  api.apply(`${service('web', WEB)}---\n${slice('web', endpoint(a, { zone: 'zone-a' }) + endpoint(b, { node: 'node-b', zone: 'zone-b' }))}`);
  // Unhinted: the Node's zone changes nothing for it.
  api.apply(`${service('db', DB)}---\n${slice('db', endpoint(b, { node: 'node-b' }) + endpoint(c, { node: 'node-c' }))}`);
  await sb.startAgent();
  t.same(await backendsOf(sb, `${WEB}:80/TCP`), [`${a}:${HTTP_PORT}`, `${b}:${HTTP_PORT}`], 'without the zone: every endpoint');
  const dbBefore = await backendsOf(sb, `${DB}:80/TCP`);

  const mark = sb.agent!.logs.length;
  api.forbidden.delete('Node'); // the RBAC rule is fixed
  await sb.waitUntil(async () => JSON.stringify(await backendsOf(sb, `${WEB}:80/TCP`)) === JSON.stringify([`${a}:${HTTP_PORT}`]), 'the zone-a endpoint alone', 40_000);
  t.match(
    sb.agent!.logs.slice(mark).find((l) => l.msg === "this node's Node arrived: services are recomputed with its zone"),
    { level: 30, node: NODE, zone: 'zone-a' },
    'the arrival is logged',
  );
  t.same(await backendsOf(sb, `${DB}:80/TCP`), dbBefore, 'the unhinted service is unchanged');
  const res = (await sb.client<{ results: Array<{ error?: string; body?: string }> }>(['tcp', WEB, '80', '--count', '10'])).results;
  t.same(res.filter((r) => r.error), []);
  t.equal(new Set(res.map((r) => r.body)).size, 1, 'every connection goes to the endpoint of this zone');
});

t.test('internalTrafficPolicy Local and node hints need only --node-name: right without the Node, and after it is deleted', async (t) => {
  const { sb, api } = await setup(t);
  sb.sourceArgs.push('--node-sync-timeout', '0');
  const [a, b] = sb.backends.map((x) => x.v4) as [string, string];
  const LOCAL = '10.96.0.12';
  const NEAR = '10.96.0.13';
  api.apply(`${service('local', LOCAL, '  internalTrafficPolicy: Local\n')}---\n${slice('local', endpoint(a) + endpoint(b, { node: 'node-b' }))}`);
  const nodeHint = (ip: string, node: string): string => `- addresses: [${ip}]\n  conditions: {ready: true}\n  nodeName: ${node}\n  hints: {forNodes: [{name: ${node}}]}\n`;
  api.apply(`${service('near', NEAR, '  trafficDistribution: PreferSameNode\n')}---\n${slice('near', nodeHint(a, NODE) + nodeHint(b, 'node-b'))}`);
  await sb.startAgent();
  t.ok(sb.agent!.logs.some((l) => l.msg === GOING_ON), 'the Node is not there');
  t.same(await backendsOf(sb, `${LOCAL}:80/TCP`), [`${a}:${HTTP_PORT}`], 'Local: this node’s endpoint');
  t.same(await backendsOf(sb, `${NEAR}:80/TCP`), [`${a}:${HTTP_PORT}`], 'node hints: the endpoint hinted for this node');
  const res = (await sb.client<{ results: Array<{ error?: string }> }>(['tcp', LOCAL, '80', '--count', '3'])).results;
  t.same(res.filter((r) => r.error), [], 'the Local service is served');

  // The Node arrives, then is deleted (a node re-registering): the node is still this one.
  api.forbidden.delete('Node');
  const arrived = await sb.agent!.waitForLog((l) => l.msg === "this node's Node arrived: services are recomputed with its zone", 0, 40_000);
  await sb.agent!.waitForLog((l) => l.msg === 'sync done', sb.agent!.logs.indexOf(arrived)); // the arrival's own sync
  const mark = sb.agent!.logs.length;
  api.delete('Node', NODE);
  await sb.agent!.waitForLog((l) => l.msg === 'sync done', mark);
  t.same(await backendsOf(sb, `${LOCAL}:80/TCP`), [`${a}:${HTTP_PORT}`], 'Local keeps this node’s endpoint');
  t.same(await backendsOf(sb, `${NEAR}:80/TCP`), [`${a}:${HTTP_PORT}`], 'node hints still apply');
});
