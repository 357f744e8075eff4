// The agent against a Kubernetes API server: a local server that speaks the
// real list/watch protocol (test/helpers/fake-apiserver.ts), reached through
// an ordinary kubeconfig. Real Kubernetes YAML in, real clients out.
import t, { type Test } from 'tap';
import { FakeApiServer, type FakeApiServerOptions } from '../helpers/fake-apiserver.js';
import { createSandbox, HTTP_PORT, SLOW, type Sandbox } from '../helpers/sandbox.js';

// Eight agents started one after another, each with its own API server:
// 60-75 s on a quiet host, 85-126 s while a qemu guest shares the two cores,
// 330 s and more in the TCG guest. The default 120 s per file is too tight
// for that (this overrides tap's --timeout, so it scales with SLOW); each
// wait inside still has its own deadline.
t.setTimeout(300_000 * SLOW);

const WEB = '10.96.0.10';
const NODE = 'node-a';

interface TcpResult {
  results: Array<{ peer?: string; body?: string; error?: string }>;
}

function webService(extra = ''): string {
  return `apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  type: ClusterIP
  clusterIP: ${WEB}
  clusterIPs: [${WEB}]
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: http
${extra}`;
}

function webSlice(endpoints: string): string {
  return `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abcde
  namespace: default
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  port: ${HTTP_PORT}
  protocol: TCP
endpoints:
${endpoints}`;
}

function endpoint(ip: string, opts: { ready?: boolean; serving?: boolean; terminating?: boolean; node?: string } = {}): string {
  const ready = opts.ready ?? true;
  return `- addresses: [${ip}]
  conditions: {ready: ${ready}, serving: ${opts.serving ?? ready}, terminating: ${opts.terminating ?? false}}
  nodeName: ${opts.node ?? NODE}
`;
}

const nodeYaml = (extra = ''): string => `apiVersion: v1
kind: Node
metadata:
  name: ${NODE}
  labels:
    topology.kubernetes.io/zone: zone-a
${extra}`;

async function setup(t: Test, server: FakeApiServerOptions = {}): Promise<{ sb: Sandbox; api: FakeApiServer }> {
  const api = new FakeApiServer(server);
  await api.start();
  t.teardown(() => api.stop());
  const sb = await createSandbox(t, { backends: 3, agent: false });
  sb.sourceArgs = ['--kubeconfig', api.kubeconfig, '--node-name', NODE, '--sync-period', '600000'];
  api.apply(nodeYaml());
  return { sb, api };
}

async function backendsOf(sb: Sandbox, frontend: string): Promise<string[]> {
  const fe = (await sb.lbList()).find((e) => e.frontend === frontend);
  return fe ? fe.backends.map((b) => `${b.address}${b.state === 'active' ? '' : ` ${b.state}`}`) : [];
}

async function requests(sb: Sandbox, count: number): Promise<TcpResult['results']> {
  return (await sb.client<TcpResult>(['tcp', WEB, '80', '--count', String(count)])).results;
}

function agentPort(sb: Sandbox, which: 'health' | 'metrics'): number {
  const line = sb.agent!.logs.find((l) => l.msg === 'serving health, metrics and the local API');
  return Number(line?.[which]);
}

t.test('list, then watch: objects in the cluster are served, and changes apply at once', async (t) => {
  const { sb, api } = await setup(t);
  const [a, b, c] = sb.backends.map((x) => x.v4) as [string, string, string];
  api.apply(`${webService()}---\n${webSlice(endpoint(a) + endpoint(b))}`);
  const first = await sb.startAgent();
  t.ok(first.planned > 0, 'the first sync programs what the list returned');
  t.same(await backendsOf(sb, `${WEB}:80/TCP`), [`${a}:${HTTP_PORT}`, `${b}:${HTTP_PORT}`]);
  const res = await requests(sb, 10);
  t.same(res.filter((r) => r.error), [], 'connections through the service succeed');
  t.same([...new Set(res.map((r) => r.peer))], [`${WEB}:80`]);

  api.apply(webSlice(endpoint(a) + endpoint(b) + endpoint(c)));
  await sb.waitUntil(async () => (await backendsOf(sb, `${WEB}:80/TCP`)).length === 3, 'the watch delivers the new endpoint');

  api.delete('Service', 'web');
  await sb.waitUntil(async () => (await backendsOf(sb, `${WEB}:80/TCP`)).length === 0 && (await sb.lbList()).length === 0, 'the deleted service is removed');
});

t.test('deletions missed while disconnected are applied: replayed, or found by a relist after 410 Gone', async (t) => {
  const { sb, api } = await setup(t);
  const [a] = sb.backends.map((x) => x.v4) as [string];
  api.apply(`${webService()}---\n${webSlice(endpoint(a))}`);
  api.apply(webService().replace(/web/g, 'db').replaceAll(WEB, '10.96.0.11'));
  api.apply(webService().replace(/web/g, 'cache').replaceAll(WEB, '10.96.0.12'));
  await sb.startAgent();
  t.equal((await sb.lbList()).length, 3);

  // The watch breaks; a deletion happens meanwhile; the resourceVersion is still valid.
  const before = api.requests.length;
  api.dropWatches();
  api.silently(() => api.delete('Service', 'db'));
  await sb.waitUntil(async () => !(await sb.lbList()).some((e) => e.frontend.startsWith('10.96.0.11')), 'the missed deletion is replayed');
  t.ok(api.requests.slice(before).some((r) => r.url.includes('watch=true')), 'the agent re-watched');

  // Again, but history is compacted: the re-watch gets 410 Gone and the agent relists.
  const mark = api.requests.length;
  api.dropWatches();
  api.silently(() => api.delete('Service', 'cache'));
  api.compact();
  await sb.waitUntil(async () => !(await sb.lbList()).some((e) => e.frontend.startsWith('10.96.0.12')), 'the relist finds the deletion');
  t.ok(
    api.requests.slice(mark).some((r) => r.url.startsWith('/api/v1/services?') && !r.url.includes('watch=true')),
    'the agent relisted after 410 Gone',
  );
  t.ok((await sb.lbList()).some((e) => e.frontend === `${WEB}:80/TCP`), 'the rest is untouched');
});

t.test('watches ask for bookmarks: a quiet watch resumes after compaction without relisting', async (t) => {
  const { sb, api } = await setup(t);
  const [a, b] = sb.backends.map((x) => x.v4) as [string, string];
  api.apply(`${webService()}---\n${webSlice(endpoint(a))}`);
  await sb.startAgent();
  await sb.waitUntil(() => api.openWatches >= 3, 'watches open');
  const watches = api.requests.filter((r) => r.url.includes('watch=true'));
  t.ok(watches.length >= 3 && watches.every((r) => r.url.includes('allowWatchBookmarks=true')), 'every watch asks for bookmarks');

  // Only EndpointSlices change: the Service watch hears nothing, and its
  // last resourceVersion falls behind. A bookmark brings it forward, so
  // after compaction and a broken connection it resumes where it was.
  api.apply(webSlice(endpoint(a) + endpoint(b)));
  await sb.waitUntil(async () => (await backendsOf(sb, `${WEB}:80/TCP`)).length === 2, 'the slice change applied');
  await sb.waitUntil(() => api.openWatches >= 3, 'watches open');
  await api.bookmark();
  const mark = api.requests.length;
  api.compact();
  api.dropWatches();
  await sb.waitUntil(() => api.requests.slice(mark).filter((r) => r.url.includes('watch=true')).length >= 3, 'the watches resumed');
  // Each resumed watch is open, none refused with 410 Gone (after which the
  // agent would relist): so every relist that could happen has happened.
  await sb.waitUntil(() => api.openWatches >= 3, 'the resumed watches open');
  const lists = api.requests.slice(mark).filter((r) => !r.url.includes('watch=true'));
  t.same(lists, [], 'no relist: each watch resumed from its bookmark, newer than the compaction');
  t.same(await backendsOf(sb, `${WEB}:80/TCP`), [`${a}:${HTTP_PORT}`, `${b}:${HTTP_PORT}`], 'the maps are unchanged');
});

t.test('a restart with the API server down changes nothing; the first complete sync prunes', async (t) => {
  const { sb, api } = await setup(t);
  const [a] = sb.backends.map((x) => x.v4) as [string];
  api.apply(`${webService()}---\n${webSlice(endpoint(a))}`);
  api.apply(webService().replace(/web/g, 'db').replaceAll(WEB, '10.96.0.11'));
  await sb.startAgent();
  const programmed = await sb.lbList();
  t.equal(programmed.length, 2, 'web and db programmed');
  await sb.stopAgent();

  api.available = false;
  api.delete('Service', 'db');
  const proc = sb.startAgent().catch((e: unknown) => e); // no first sync while the API server is down
  await sb.waitUntil(() => sb.agent?.logs.some((l) => l.msg === 'list or watch failed; retrying after backoff') ?? false, 'the agent retries the API server');
  t.same(await sb.lbList(), programmed, 'nothing was written or removed');
  t.same((await requests(sb, 3)).filter((r) => r.error), [], 'and the service still works');

  api.available = true;
  await proc;
  await sb.waitUntil(async () => (await sb.lbList()).length === 1, 'once synced, the stale service is pruned');
  t.same((await sb.lbList()).map((e) => e.frontend), [`${WEB}:80/TCP`]);
});

t.test('bad objects are logged, counted and skipped; the agent and the other services carry on', async (t) => {
  const { sb, api } = await setup(t);
  const [a] = sb.backends.map((x) => x.v4) as [string];
  api.apply(`${webService()}---\n${webSlice(endpoint(a))}`);
  await sb.startAgent();
  const ports = Array.from({ length: 2000 }, (_, i) => `  - {name: p${i}, port: ${i + 1}, protocol: TCP}`).join('\n');
  api.apply(`apiVersion: v1
kind: Service
metadata: {name: huge, namespace: default}
spec:
  clusterIP: 10.96.0.99
  ports:
${ports}
`);
  api.apply(webService().replace(/name: web/, 'name: broken').replace(`clusterIP: ${WEB}\n  clusterIPs: [${WEB}]`, 'clusterIP: 10.96.0.300'));
  await sb.waitUntil(() => sb.agent!.logs.filter((l) => l.msg === 'bad input skipped').length >= 2, 'both are reported');
  const reasons = sb.agent!.logs.filter((l) => l.msg === 'bad input skipped').map((l) => `${l.where}: ${l.reason}`);
  t.match(reasons.join('\n'), /Service default\/huge.*2000 entries/);
  t.match(reasons.join('\n'), /Service default\/broken.*10\.96\.0\.300/);
  const metrics = await (await fetch(`http://127.0.0.1:${agentPort(sb, 'metrics')}/metrics`)).text();
  t.match(metrics, /lbctl_skipped_objects_total\{kind="Service"/, 'counted in a metric');
  t.ok(sb.agent!.running, 'the agent is still running');
  t.same(await backendsOf(sb, `${WEB}:80/TCP`), [`${a}:${HTTP_PORT}`], 'the maps are not flushed');
  t.same((await requests(sb, 3)).filter((r) => r.error), []);
});

t.test('internalTrafficPolicy Local, terminating endpoints, session affinity', async (t) => {
  const { sb, api } = await setup(t);
  const [a, b, c] = sb.backends.map((x) => x.v4) as [string, string, string];
  api.apply(`${webService('  internalTrafficPolicy: Local\n')}---\n${webSlice(endpoint(a) + endpoint(b, { node: 'node-b' }))}`);
  await sb.startAgent();
  t.same(await backendsOf(sb, `${WEB}:80/TCP`), [`${a}:${HTTP_PORT}`], 'only this node’s endpoint');

  // Terminating endpoints stay as non-selectable slots after the ready ones.
  api.apply(webService());
  api.apply(webSlice(endpoint(a) + endpoint(b, { ready: false, serving: true, terminating: true })));
  await sb.waitUntil(
    async () => JSON.stringify(await backendsOf(sb, `${WEB}:80/TCP`)) === JSON.stringify([`${a}:${HTTP_PORT}`, `${b}:${HTTP_PORT} terminating`]),
    'the terminating endpoint sits after the ready one',
  );
  const res = await requests(sb, 12);
  t.same([...new Set(res.map((r) => r.body))].length, 1, 'new connections never pick the terminating endpoint');

  // No ready endpoint left: serving-and-terminating ones take the traffic.
  api.apply(webSlice(endpoint(b, { ready: false, serving: true, terminating: true })));
  await sb.waitUntil(async () => (await backendsOf(sb, `${WEB}:80/TCP`)).length === 1, 'fallback applied');
  t.same((await requests(sb, 3)).filter((r) => r.error), [], 'served by the terminating endpoint');

  // sessionAffinity ClientIP: every connection of this client lands on one backend.
  api.apply(webService('  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n'));
  api.apply(webSlice(endpoint(a) + endpoint(b) + endpoint(c)));
  await sb.waitUntil(async () => (await backendsOf(sb, `${WEB}:80/TCP`)).length === 3, 'three backends');
  const sticky = await requests(sb, 20);
  t.same(sticky.filter((r) => r.error), []);
  t.equal(new Set(sticky.map((r) => r.body)).size, 1, 'one backend for every connection of the client');
  t.ok((await sb.metrics()).affinity_hit! >= 19, 'the datapath counted the affinity hits');
});

t.test('health follows the cluster: a Node being deleted fails /healthz', async (t) => {
  const { sb, api } = await setup(t);
  const [a] = sb.backends.map((x) => x.v4) as [string];
  api.apply(`${webService()}---\n${webSlice(endpoint(a))}`);
  await sb.startAgent();
  const port = agentPort(sb, 'health');
  const healthz = async (): Promise<{ status: number; body: Record<string, unknown> }> => {
    const r = await fetch(`http://127.0.0.1:${port}/healthz`);
    return { status: r.status, body: (await r.json()) as Record<string, unknown> };
  };
  await sb.waitUntil(async () => (await fetch(`http://127.0.0.1:${port}/readyz`)).status === 200, 'ready once synced');
  t.equal((await healthz()).status, 200);
  t.equal((await fetch(`http://127.0.0.1:${port}/livez`)).status, 200, 'live');

  api.apply(nodeYaml().replace('metadata:\n', 'metadata:\n  deletionTimestamp: "2026-11-22T00:00:00Z"\n'));
  await sb.waitUntil(async () => (await healthz()).status === 503, '/healthz answers 503 while the node is deleted');
  t.match((await healthz()).body, { nodeEligible: false });
  t.equal((await fetch(`http://127.0.0.1:${port}/livez`)).status, 200, 'liveness does not depend on the cluster');
});

t.test('the first list is at resourceVersion 0, answered whole by the cache; a consistent list comes in pages of 500, and an expired continue token ends in one full list', async (t) => {
  // A 1.30 server: consistent lists, and their continue tokens, read through to etcd.
  const { sb, api } = await setup(t, { version: '1.30' });
  const n = 1_100; // three pages
  const ip = (i: number): string => `10.97.${i >> 8}.${i & 255}`;
  const name = (i: number): string => `svc-${String(i).padStart(4, '0')}`;
  api.silently(() => {
    for (let i = 0; i < n; i++) {
      api.put({
        apiVersion: 'v1',
        kind: 'Service',
        metadata: { name: name(i), namespace: 'paged' },
        spec: { type: 'ClusterIP', clusterIP: ip(i), clusterIPs: [ip(i)], ports: [{ name: 'http', port: 80, protocol: 'TCP' }] },
      } as never);
    }
  });
  const first = await sb.startAgent();
  t.equal(first.frontends, n, 'every service is programmed, once');
  const lists = (since = 0) =>
    api.requests
      .slice(since)
      .filter((r) => r.url.startsWith('/api/v1/services?') && !/[?&]watch=/.test(r.url))
      .map((r) => {
        const q = new URL(r.url, 'http://x').searchParams;
        return [r.kind, r.status, q.get('resourceVersion'), q.get('limit'), q.has('continue')];
      });
  t.same(lists(), [['list-cache', 200, '0', '500', false]], 'one list at resourceVersion 0: the cache answers with all of it, its limit ignored');

  // A relist the API server's lagging cache refuses: a consistent list in
  // pages, whose continue token then expires.
  await sb.waitUntil(() => api.openWatches >= 3, 'watches open');
  const mark = api.requests.length;
  api.cacheBehind = 1_000_000;
  api.expireContinue = true;
  api.dropWatches();
  api.silently(() => api.delete('Service', name(0), 'paged'));
  api.compact();
  await sb.waitUntil(async () => !(await sb.lbList()).some((e) => e.frontend === `${ip(0)}:80/TCP`), 'the relist finds the deletion', 60_000);
  t.same(
    lists(mark),
    [
      ['list-cache', 504, String(api.resourceVersion - 1), null, false],
      ['list-storage', 200, null, '500', false],
      ['list-storage', 410, null, '500', true],
      ['list-storage', 200, null, null, false],
    ],
    'the last version seen, refused as too new; a consistent list in pages of 500; its continue token expired; one full list (client-go\'s pager)',
  );
  const listed = await sb.lbList();
  t.equal(listed.length, n - 1, 'the others stay');
  t.ok(listed.some((e) => e.frontend === `${ip(1)}:80/TCP`) && listed.some((e) => e.frontend === `${ip(n - 1)}:80/TCP`), 'the first and the last of the rest are in the maps');
  t.ok(sb.agent!.logs.some((l) => /410/.test(JSON.stringify(l))), "the agent logged the watch's 410");
});
