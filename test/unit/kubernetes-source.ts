// The Kubernetes source against the fake API server (the real list/watch
// wire protocol over loopback HTTP; no privileges needed): what gates the
// first sync, and what happens when this node's Node cannot be listed.
import { readFileSync, writeFileSync } from 'node:fs';
import t, { type Test } from 'tap';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';
import type { Node } from '../../src/model/k8s.js';
import { KubernetesSource, type KubernetesSourceOptions } from '../../src/sources/kubernetes.js';
import type { SourceEvent } from '../../src/sources/source.js';
import { FakeApiServer, type FakeApiServerOptions } from '../helpers/fake-apiserver.js';

const NODE = 'n1';

const service = {
  apiVersion: 'v1',
  kind: 'Service',
  metadata: { name: 'web', namespace: 'default' },
  spec: { type: 'ClusterIP', clusterIP: '10.96.0.10', clusterIPs: ['10.96.0.10'], ports: [{ name: 'http', port: 80, protocol: 'TCP' }] },
};
const node = { apiVersion: 'v1', kind: 'Node', metadata: { name: NODE, labels: { 'topology.kubernetes.io/zone': 'zone-a' } } };

async function until(what: string, ok: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function setup(t: Test, opts: Partial<KubernetesSourceOptions> = {}, server: FakeApiServerOptions = {}) {
  const api = new FakeApiServer(server);
  await api.start();
  t.teardown(() => api.stop());
  const missing: string[] = [];
  const arrived: Node[] = [];
  const events: SourceEvent[] = [];
  let started = 0;
  /** Whether a Node had been delivered when the source first reported itself synced. */
  const firstSynced: { nodeSeen?: boolean } = {};
  const run = async (): Promise<KubernetesSource> => {
    const src = new KubernetesSource({
      kubeconfig: api.kubeconfig,
      nodeName: NODE,
      backoffMinMs: 5,
      backoffMaxMs: 50,
      onNodeMissing: (reason) => missing.push(reason),
      onNodeArrived: (n) => arrived.push(n),
      ...opts,
    });
    t.teardown(() => src.stop());
    started = performance.now();
    await src.start((e) => {
      if (e) events.push(e);
      if (firstSynced.nodeSeen === undefined && src.status().synced) firstSynced.nodeSeen = events.some((x) => x.kind === 'Node');
    });
    return src;
  };
  return { api, missing, arrived, events, firstSynced, run, elapsed: () => performance.now() - started };
}

const nodeRequests = (api: FakeApiServer): number => api.requests.filter((r) => r.url.startsWith('/api/v1/nodes?')).length;

t.test('Nodes forbidden: synced without the Node once its grace is over, saying why; the Node is still retried', async (t) => {
  const { api, missing, events, run, elapsed } = await setup(t, { nodeSyncTimeoutMs: 300 });
  api.forbidden.add('Node');
  api.put(service as never);
  const src = await run();
  await until('the source to be synced', () => src.status().synced);
  const tookMs = elapsed();
  t.ok(tookMs >= 300, `the Node had its grace of 300 ms first (synced after ${Math.round(tookMs)} ms)`);
  t.match(src.status(), { synced: true, complete: true, notes: [/^without this node's Node \(zone hints ignored\): Node "n1" not listed within 300 ms/] }, 'synced, with a note saying why the Node is missing');
  t.ok(events.some((e) => e.kind === 'Service' && e.id === 'default/web'), 'the Services were delivered');
  t.equal(missing.length, 1, 'going on without the Node is reported once');
  t.match(missing[0], /^Node "n1" not listed within 300 ms of the Services and EndpointSlices: list \/api\/v1\/nodes: HTTP 403: nodes is forbidden: User .* cannot list resource "nodes"/);

  const before = nodeRequests(api);
  await until('the Node list to be tried again', () => nodeRequests(api) > before + 2);
  t.equal(missing.length, 1, 'and not again on every retry');
});

t.test('a Node that can be listed later arrives with its zone, and says so', async (t) => {
  const { api, missing, arrived, events, run } = await setup(t, { nodeSyncTimeoutMs: 100 });
  api.forbidden.add('Node');
  api.put(service as never);
  api.put(node as never);
  const src = await run();
  await until('the source to be synced', () => src.status().synced);
  t.equal(missing.length, 1);
  t.notOk(events.some((e) => e.kind === 'Node'), 'no Node yet');

  api.forbidden.delete('Node'); // the RBAC rule is fixed
  await until('the Node to arrive', () => events.some((e) => e.kind === 'Node'));
  t.same(src.status().notes, undefined, 'the note goes once the Node is there');
  t.match(events.filter((e) => e.kind === 'Node'), [{ type: 'add', id: NODE, object: { name: NODE, zone: 'zone-a' } }]);
  t.match(arrived, [{ name: NODE, zone: 'zone-a' }], 'its arrival is reported');
  t.same(src.status(), { synced: true, complete: true });
});

t.test('with the Node at hand, the first synced state already holds it (the grace delays nothing)', async (t) => {
  const { api, missing, firstSynced, run, elapsed } = await setup(t, { nodeSyncTimeoutMs: 60_000 });
  api.put(service as never);
  api.put(node as never);
  const src = await run();
  await until('the source to be synced', () => src.status().synced);
  t.ok(elapsed() < 30_000, 'synced long before the grace would be over');
  t.equal(firstSynced.nodeSeen, true, 'the Node came with the first synced state');
  t.same(missing, []);
});

t.test('no Node of that name: synced as soon as the Node list answers, reported once', async (t) => {
  const { api, missing, run, elapsed } = await setup(t, { nodeSyncTimeoutMs: 60_000 });
  api.put(service as never);
  const src = await run();
  await until('the source to be synced', () => src.status().synced);
  t.ok(elapsed() < 30_000, 'the empty list answers the wait');
  t.same(missing, ['the cluster has no Node named "n1"']);
});

t.test('nodeSyncTimeoutMs 0: the Node is not waited for', async (t) => {
  const { api, missing, run } = await setup(t, { nodeSyncTimeoutMs: 0 });
  api.forbidden.add('Node');
  api.put(service as never);
  const src = await run();
  await until('the source to be synced', () => src.status().synced);
  t.match(missing, [/^Node "n1" not waited for \(--node-sync-timeout 0\): /]);
});

t.test('Services or EndpointSlices that cannot be listed still gate the first sync', async (t) => {
  for (const kind of ['Service', 'EndpointSlice']) {
    const { api, run } = await setup(t, { nodeSyncTimeoutMs: 0 });
    api.forbidden.add(kind);
    api.put(node as never);
    const src = await run();
    const path = kind === 'Service' ? '/api/v1/services?' : '/apis/discovery.k8s.io/v1/endpointslices?';
    await until(`${kind} lists to be refused a few times`, () => api.requests.filter((r) => r.url.startsWith(path)).length >= 3);
    const [resource, group] = kind === 'Service' ? ['services', ''] : ['endpointslices', 'discovery.k8s.io'];
    const refused = `list ${path.slice(0, -1)}: HTTP 403: ${resource} is forbidden: User "system:serviceaccount:kube-system:lbctl" cannot list resource "${resource}" in API group "${group}" at the cluster scope`;
    t.same(src.status(), { synced: false, complete: false, notes: [`${kind} list or watch failing, retrying: ${refused}`] }, `${kind} forbidden: not synced, and a note says why`);
    await src.stop();
  }
});

t.test('with the health mesh: every Node is watched and sent with its addresses; this node is still found by name', async (t) => {
  const { api, missing, events, run } = await setup(t, { nodeSyncTimeoutMs: 200, allNodes: true });
  api.put(service as never);
  const peer = (name: string, address: string) => ({ apiVersion: 'v1', kind: 'Node', metadata: { name }, status: { addresses: [{ type: 'InternalIP', address }, { type: 'Hostname', address: name }] } });
  api.put(peer('n2', '10.0.0.2') as never);
  api.put(peer('n3', '10.0.0.3') as never);
  const src = await run();
  await until('the source to be synced', () => src.status().synced);
  t.ok(api.requests.some((r) => r.url.startsWith('/api/v1/nodes?') && !r.url.includes('fieldSelector')), 'Nodes are listed without a field selector');
  t.match(events.filter((e) => e.kind === 'Node').map((e) => [e.id, e.type]).sort(), [['n2', 'add'], ['n3', 'add']], 'every Node is sent');
  t.match(events.find((e) => e.kind === 'Node' && e.id === 'n2'), { object: { name: 'n2', addresses: [{ type: 'InternalIP', address: '10.0.0.2' }] } }, 'with its IP addresses');
  t.equal(missing.length, 1, 'other Nodes do not stand for this one: its absence is reported');
  t.match(missing[0], /the cluster has no Node named "n1"/);
  api.put(node as never);
  await until('this node to arrive', () => events.some((e) => e.kind === 'Node' && e.id === NODE));
  t.same(src.status().notes, undefined, 'and its arrival ends the note');
  api.delete('Node', 'n3', '');
  await until('a peer to go', () => events.some((e) => e.kind === 'Node' && e.id === 'n3' && e.type === 'delete'));
  t.pass('a deleted Node is sent as deleted');
});

// ---------------------------------------------------------------------------
// What the source costs the API server: every list it can have served from
// the watch cache is served from there (the fake classifies each request as
// a server of that version would serve it: test/helpers/fake-apiserver.ts).

const SERVICES = '/api/v1/services?';
const SLICES = '/apis/discovery.k8s.io/v1/endpointslices?';
const NODES = '/api/v1/nodes?';
const VERSIONS = ['1.26', '1.30', '1.31', '1.32', '1.33', '1.34'] as const;

const db = { ...service, metadata: { name: 'db', namespace: 'default' }, spec: { ...service.spec, clusterIP: '10.96.0.11', clusterIPs: ['10.96.0.11'] } };

/** The requests to `path` from `since` on that are not watches, with their parameters. */
function lists(api: FakeApiServer, path: string, since = 0) {
  return api.requests
    .slice(since)
    .filter((r) => r.url.startsWith(path) && !/[?&]watch=/.test(r.url))
    .map((r) => ({ kind: r.kind, status: r.status, q: new URL(r.url, 'http://x').searchParams, acceptEncoding: r.acceptEncoding, contentEncoding: r.contentEncoding }));
}

/** A watch's 410 forces a relist: the watches break, a deletion is missed, history is compacted. */
function missDeletion(api: FakeApiServer, name: string, namespace = 'default'): void {
  api.dropWatches();
  api.silently(() => api.delete('Service', name, namespace));
  api.compact();
}

t.test('the first list asks for resourceVersion 0 and is served from the watch cache, on every server version', async (t) => {
  for (const version of VERSIONS) {
    const { api, run } = await setup(t, {}, { version });
    api.put(service as never);
    api.put(node as never);
    const src = await run();
    await until('synced, watching', () => src.status().synced && api.openWatches >= 3);
    for (const path of [SERVICES, SLICES, NODES]) t.same(api.requestKinds({ path }), { 'list-cache': 1, watch: 1 }, `${version}: ${path.slice(0, -1)}: one list, from the cache, then a watch`);
    const [first] = lists(api, SERVICES);
    t.equal(first?.q.get('resourceVersion'), '0', `${version}: at resourceVersion 0`);
    t.equal(first?.q.get('limit'), '500', `${version}: with client-go's limit, which the cache ignores (a server without a cache pages)`);
    await src.stop();
  }
});

t.test("a watch's 410 relists from the last version seen, with no limit: from the cache, after a jittered delay", async (t) => {
  const errors: Array<{ kind: string; message: string; retryInMs: number }> = [];
  const { api, events, run } = await setup(
    t,
    { random: () => 0.5, backoffMinMs: 40, backoffMaxMs: 1000, onWatchError: (kind, err, retryInMs) => errors.push({ kind, message: (err as Error).message, retryInMs }) },
    { version: '1.30' },
  );
  api.put(service as never);
  api.put(db as never);
  api.put(node as never);
  const src = await run();
  await until('synced, watching', () => src.status().synced && api.openWatches >= 3);
  api.put({ ...service, metadata: { ...service.metadata, labels: { app: 'web' } } } as never);
  await until('the update', () => events.some((e) => e.kind === 'Service' && e.type === 'update'));
  const lastSeen = String(api.resourceVersion);

  const mark = api.requests.length;
  missDeletion(api, 'db');
  await until('the missed deletion', () => events.some((e) => e.kind === 'Service' && e.id === 'default/db' && e.type === 'delete'));
  await until('watching again', () => api.openWatches >= 3);
  const relists = lists(api, SERVICES, mark);
  t.equal(relists.length, 1, 'one relist');
  t.equal(relists[0]!.q.get('resourceVersion'), lastSeen, 'at the last version seen (an event\'s)');
  t.notOk(relists[0]!.q.has('limit'), 'with no limit: a limit with a version asks for that exact version, which only etcd has');
  t.same(api.requestKinds({ since: mark, path: SERVICES }), { watch: 2, 'list-cache': 1 }, 'the refused watch, the relist from the cache, the new watch');
  t.notOk(api.requestKinds({ since: mark })['list-storage'], 'nothing of any kind read through to etcd');
  const gone = errors.find((e) => e.kind === 'Service' && /410/.test(e.message));
  t.equal(gone?.retryInMs, 30, 'the relist waits a jittered first step (half of 40 ms plus half of the rest, at random 0.5)');
  t.ok(events.some((e) => e.id === 'default/web') && !events.some((e) => e.id === 'default/web' && e.type === 'delete'), 'what is still there stays');
});

t.test('a version the cache refuses (504 Too large resource version): a consistent list at once, in pages; an expired continue token: one full list', async (t) => {
  const { api, events, run } = await setup(t, {}, { version: '1.30' });
  const n = 1_100; // three pages of 500
  const ip = (i: number): string => `10.97.${i >> 8}.${i & 255}`;
  for (let i = 0; i < n; i++) {
    api.put({ ...service, metadata: { name: `svc-${String(i).padStart(4, '0')}`, namespace: 'paged' }, spec: { ...service.spec, clusterIP: ip(i), clusterIPs: [ip(i)] } } as never);
  }
  api.put(node as never);
  const src = await run();
  await until('synced, watching', () => src.status().synced && api.openWatches >= 3);
  t.same(lists(api, SERVICES).map((l) => [l.kind, l.q.get('resourceVersion'), l.q.get('limit'), l.q.has('continue')]), [['list-cache', '0', '500', false]], 'the first list: one answer from the cache, all 1,100');

  // An API server whose cache lags far behind: the relist at the last version seen is refused.
  const mark = api.requests.length;
  api.cacheBehind = 1_000_000;
  api.expireContinue = true;
  missDeletion(api, 'svc-0000', 'paged');
  await until('watching again', () => api.requests.length > mark + 6 && api.openWatches >= 3);
  t.same(
    lists(api, SERVICES, mark).map((l) => [l.kind, l.status, l.q.get('resourceVersion'), l.q.get('limit'), l.q.has('continue')]),
    [
      ['list-cache', 504, String(api.resourceVersion - 1), null, false],
      ['list-storage', 200, null, '500', false],
      ['list-storage', 410, null, '500', true],
      ['list-storage', 200, null, null, false],
    ],
    "reflector.go: the version refused, a consistent list at once (from etcd on 1.30); pager.go: its expired continue token, one full list",
  );
  t.same(events.filter((e) => e.type === 'delete').map((e) => e.id), ['paged/svc-0000'], 'only what is gone is deleted: none by the lists that did not finish');

  // The cache catches up: the next relist is from the cache again.
  api.cacheBehind = 0;
  const again = api.requests.length;
  missDeletion(api, 'svc-0001', 'paged');
  await until('watching again', () => api.requests.length > again + 3 && api.openWatches >= 3);
  t.same(lists(api, SERVICES, again).map((l) => [l.kind, l.status, l.q.has('limit')]), [['list-cache', 200, false]], 'a version again, no limit, from the cache');
});

t.test('watch-list (--watch-list auto) where the server streams lists: one request per kind, and it goes on as the watch', async (t) => {
  const { api, events, run } = await setup(t, { watchList: 'auto' }, { version: '1.34' });
  api.put(service as never);
  api.put(db as never);
  api.put(node as never);
  const src = await run();
  await until('synced, watching', () => src.status().synced && api.openWatches >= 3);
  t.same(api.requestKinds(), { 'watch-list': 3 }, 'a watch-list per kind, and nothing else');
  const q = new URL(api.requests.find((r) => r.url.startsWith(SERVICES))!.url, 'http://x').searchParams;
  t.same(
    [q.get('watch'), q.get('sendInitialEvents'), q.get('resourceVersionMatch'), q.get('allowWatchBookmarks'), q.has('resourceVersion')],
    ['true', 'true', 'NotOlderThan', 'true', false],
    'sendInitialEvents with NotOlderThan and bookmarks, at resourceVersion "" (a consistent start, from the cache)',
  );
  t.match(events.filter((e) => e.kind === 'Service').map((e) => [e.type, e.id]).sort(), [['add', 'default/db'], ['add', 'default/web']], 'the initial events are the list');
  t.equal(src.watchList, 'auto');

  const count = api.requests.length;
  api.put({ ...service, metadata: { ...service.metadata, labels: { app: 'web' } } } as never);
  await until('the update', () => events.some((e) => e.kind === 'Service' && e.type === 'update'));
  t.equal(api.requests.length, count, 'changes come on the same stream: no new request');

  const lastSeen = String(api.resourceVersion);
  const mark = api.requests.length;
  missDeletion(api, 'db');
  await until('the missed deletion', () => events.some((e) => e.id === 'default/db' && e.type === 'delete'));
  t.same(api.requestKinds({ since: mark, path: SERVICES }), { watch: 1, 'watch-list': 1 }, "the watch's 410, then a watch-list");
  const relist = new URL(api.requests.slice(mark).filter((r) => r.url.startsWith(SERVICES) && r.kind === 'watch-list')[0]!.url, 'http://x').searchParams;
  t.equal(relist.get('resourceVersion'), lastSeen, 'from the last version seen (reflector.go rewatchResourceVersion)');
  t.notOk(events.some((e) => e.id === 'default/web' && e.type === 'delete'), 'what the initial events hold again is not deleted');
});

t.test('a server that refuses watch-lists (422): the source lists instead, says so once, and lists from then on', async (t) => {
  for (const version of ['1.33', '1.26'] as const) {
    const refusals: string[] = [];
    const { api, events, run } = await setup(t, { watchList: 'auto', onWatchListRefused: (kind, reason) => refusals.push(`${kind}: ${reason}`) }, { version });
    api.put(service as never);
    api.put(db as never);
    api.put(node as never);
    const src = await run();
    await until('synced, watching', () => src.status().synced && api.openWatches >= 3);
    t.equal(refusals.length, 1, `${version}: said once for the source, not once per kind`);
    t.match(
      refusals[0],
      version === '1.26'
        ? /HTTP 422: ListOptions\.meta\.k8s\.io "" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch$/
        : /HTTP 422: ListOptions\.meta\.k8s\.io "" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled$/,
      `${version}: with the server's own words`,
    );
    t.equal(src.watchList, 'off', 'the source lists from now on');
    const kinds = api.requestKinds();
    t.ok(kinds.invalid! >= 1 && kinds.invalid! <= 3, `at most one refused request per kind (${kinds.invalid})`);
    t.same({ ...kinds, invalid: 0 }, { 'list-cache': 3, watch: 3, invalid: 0 }, 'then lists from the cache, and watches');

    const mark = api.requests.length;
    missDeletion(api, 'db');
    await until('the missed deletion', () => events.some((e) => e.id === 'default/db' && e.type === 'delete'));
    await until('watching again', () => api.openWatches >= 3);
    t.notOk(api.requestKinds({ since: mark }).invalid, 'a relist does not ask again');
    t.equal(refusals.length, 1);
    await src.stop();
  }
});

t.test('a watch-list answered with an ERROR event among its initial events (etcd without progress notifications): a refusal too', async (t) => {
  const refusals: string[] = [];
  const { api, run } = await setup(t, { watchList: 'auto', onWatchListRefused: (kind, reason) => refusals.push(`${kind}: ${reason}`) }, { version: '1.34', features: { etcdProgressNotify: false } });
  api.put(service as never);
  api.put(node as never);
  const src = await run();
  await until('synced, watching', () => src.status().synced && api.openWatches >= 3);
  t.match(refusals, [/watch-list \/.*: watch error 500: a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled$/]);
  t.same([api.requestKinds()['list-cache'], api.requestKinds().watch], [3, 3], 'then lists from the cache at "0" (which needs no progress notification), and watches');
});

t.test('watch-list: items no API server would hold among the initial events are reported, and the list completes', async (t) => {
  const problems: string[] = [];
  const { api, events, run } = await setup(t, { watchList: 'on', onProblem: (p) => problems.push(p.reason) }, { version: '1.34' });
  api.put(service as never);
  api.put(node as never);
  api.rawListItems.set('Service', [null, 7, [], { metadata: null }]);
  const src = await run();
  await until('synced, watching', () => src.status().synced && api.openWatches >= 3);
  t.equal(problems.length, 4, 'each reported');
  t.ok(events.some((e) => e.id === 'default/web' && e.type === 'add'), 'the rest arrived');
});

t.test('--watch-list on: a refusal is an error, retried with backoff; nothing is listed', async (t) => {
  const errors: string[] = [];
  const { api, run } = await setup(t, { watchList: 'on', onWatchError: (kind, err) => errors.push(`${kind}: ${(err as Error).message}`) }, { version: '1.33' });
  api.put(service as never);
  const src = await run();
  await until('each kind refused twice', () => ['Service', 'EndpointSlice', 'Node'].every((k) => errors.filter((e) => e.startsWith(`${k}: `)).length >= 2));
  t.same(Object.keys(api.requestKinds()), ['invalid'], 'only watch-lists, each refused');
  t.equal(src.status().synced, false);
  t.match(src.status().notes, [/^Service list or watch failing, retrying: watch-list \/api\/v1\/services: HTTP 422: .*WatchList feature gate/]);
});

for (const outage of ['503', 'ECONNREFUSED'] as const) {
  t.test(`an outage (${outage}) ends when the server answers: what was deleted meanwhile arrives at once, not after a backoff that grew`, async (t) => {
    const errors: Array<{ kind: string; retryInMs: number }> = [];
    const { api, events, run } = await setup(t, { backoffMinMs: 20, backoffMaxMs: 4000, onWatchError: (kind, _err, retryInMs) => errors.push({ kind, retryInMs }) });
    api.put(service as never);
    api.put(db as never);
    api.put(node as never);
    let deletedAt = 0;
    const src = await run();
    await until('synced, watching', () => src.status().synced && api.openWatches >= 3);

    // The API server goes down (answering 503, or not at all), a Service is
    // deleted meanwhile, and the server comes back as a new process whose
    // watch cache starts after the deletion: the watches resumed from before
    // get 410, and only a relist finds it.
    if (outage === '503') {
      api.available = false;
      api.dropWatches();
    } else await api.goAway();
    api.delete('Service', 'db');
    // Once a Service retry waits 2 s or more, the next step waits 2 to 4 s.
    await until("the Service reflector's backoff to grow past 2 s", () => errors.some((e) => e.kind === 'Service' && e.retryInMs >= 2000), 20_000);
    const mark = api.requests.length;
    const onDelete = setInterval(() => {
      if (!deletedAt && events.some((e) => e.id === 'default/db' && e.type === 'delete')) deletedAt = performance.now();
    }, 1);
    t.teardown(() => clearInterval(onDelete));
    if (outage === '503') {
      api.restart();
      api.available = true;
    } else await api.comeBack();
    await until('the deletion', () => deletedAt > 0, 15_000);
    const answeredFor = (path: string): boolean => api.requests.slice(mark).some((r) => r.status === 200 && r.url.startsWith(path));
    await until('every kind answered again', () => [SERVICES, SLICES, NODES].every(answeredFor), 5000);
    const answered = api.requests.slice(mark).filter((r) => r.status === 200);
    const firstAnswer = answered[0]!.at;
    t.ok(deletedAt - firstAnswer < 1500, `the deletion arrived ${Math.round(deletedAt - firstAnswer)} ms after the server's first answer (a first step is 10-20 ms; the Service retry had grown to 2 s or more)`);
    for (const path of [SERVICES, SLICES, NODES]) {
      const first = answered.find((r) => r.url.startsWith(path));
      t.ok(first && first.at - firstAnswer < 1000, `${path.slice(0, -1)}: asked again within ${first ? Math.round(first.at - firstAnswer) : '?'} ms of the first answer: an answer to one reflector ends the others' wait for an unreachable server`);
    }
    t.same(api.requestKinds({ since: mark })['list-storage'], undefined, 'the relists after 410 came from the cache');
  });
}

t.test("a server that is up and too busy (429) for one kind: that kind backs off, however often the others get through", async (t) => {
  const retries: number[] = [];
  const { api, run } = await setup(t, { backoffMinMs: 5, backoffMaxMs: 160, random: () => 0, onWatchError: (kind, _err, retryInMs) => kind === 'Service' && retries.push(retryInMs) });
  api.put(node as never);
  api.throttled.add('Service');
  await run();
  // The other kinds' watches break and are answered again, over and over.
  const churn = setInterval(() => api.dropWatches(), 10);
  t.teardown(() => clearInterval(churn));
  await until('the Service retry to reach the cap', () => retries.includes(80), 10_000);
  t.same(retries.slice(0, 6), [2.5, 5, 10, 20, 40, 80].map(Math.round), 'doubling, never cut back to the first step by the answers to the others');
});

t.test('lists are asked for gzip, as client-go asks, and a list the server compresses is read whole; --disable-compression, or a kubeconfig that says so, asks for none', async (t) => {
  const N = 1_500; // about 350 KB of Services: past the server's 128 KiB threshold
  const fill = (api: FakeApiServer): void => {
    for (let i = 0; i < N; i++) {
      const ip = `10.96.${i >> 8}.${i & 255}`;
      api.put({ ...service, metadata: { name: `web-${i}`, namespace: 'default' }, spec: { ...service.spec, clusterIP: ip, clusterIPs: [ip] } } as never);
    }
    api.put(node as never);
  };
  for (const version of ['1.32', '1.34'] as const) {
    const { api, run, events } = await setup(t, {}, { version });
    fill(api);
    const src = await run();
    await until('synced', () => src.status().synced);
    t.equal(src.compression, true, `${version}: compression asked for by default`);
    t.equal(events.filter((e) => e.kind === 'Service').length, N, `${version}: every Service of the compressed list arrived`);
    const [list] = lists(api, SERVICES);
    t.match(list?.acceptEncoding, /\bgzip\b/, `${version}: the list asked for gzip`);
    t.equal(list?.contentEncoding, 'gzip', `${version}: and came compressed`);
    await src.stop();
  }
  {
    const { api, run, events } = await setup(t, { disableCompression: true });
    fill(api);
    const src = await run();
    await until('synced', () => src.status().synced);
    t.equal(src.compression, false, 'disableCompression: compression not asked for');
    t.equal(events.filter((e) => e.kind === 'Service').length, N, 'disableCompression: every Service arrived');
    const [list] = lists(api, SERVICES);
    t.notMatch(list?.acceptEncoding ?? '', /gzip/, 'disableCompression: the list did not ask for gzip');
    t.equal(list?.contentEncoding, undefined, 'disableCompression: and came plain');
    await src.stop();
  }
  // The kubeconfig's cluster says disable-compression: true (client-go's field, which client-node drops).
  const { api } = await setup(t);
  const doc = parseYaml(readFileSync(api.kubeconfig, 'utf8')) as { clusters: Array<{ cluster: Record<string, unknown> }> };
  doc.clusters[0]!.cluster['disable-compression'] = true;
  const quiet = `${api.kubeconfig}-quiet`;
  writeFileSync(quiet, stringifyYaml(doc));
  const viaFile = await setup(t, { kubeconfig: quiet });
  // That kubeconfig names the first server: fill it, and count there.
  fill(api);
  const src = await viaFile.run();
  await until('synced', () => src.status().synced);
  t.equal(src.compression, false, 'kubeconfig disable-compression: true: compression not asked for');
  const [list] = lists(api, SERVICES);
  t.notMatch(list?.acceptEncoding ?? '', /gzip/, 'kubeconfig: the list did not ask for gzip');
  t.equal(list?.contentEncoding, undefined, 'kubeconfig: and came plain');
  t.equal(viaFile.events.filter((e) => e.kind === 'Service').length, N);
  await src.stop();
  doc.clusters[0]!.cluster['disable-compression'] = 'yes';
  writeFileSync(quiet, stringifyYaml(doc));
  t.throws(() => new KubernetesSource({ kubeconfig: quiet, nodeName: NODE }), /kubeconfig .*-quiet: cluster "fake": disable-compression must be true or false, not "yes"/, 'a value that is not a boolean refuses the start, naming it');
});

t.test('a compressed list cut short mid-body (the server failed after committing to gzip) is a failed list, retried; once it is whole, the source syncs', async (t) => {
  const errors: string[] = [];
  const { api, run, events } = await setup(t, { onWatchError: (kind, err) => errors.push(`${kind}: ${(err as Error).message}`) });
  api.put(node as never);
  api.put(service as never);
  // Past the 128 KiB threshold (so the answer is already gzip), then an item the server cannot encode: it drops the connection there.
  const filler = { metadata: { name: 'x'.repeat(200), namespace: 'default' }, padding: 'y'.repeat(150_000) };
  api.rawListItems.set('Service', [filler, { toJSON: () => { throw new Error('unencodable'); } }]);
  const src = await run();
  await until('the cut list reported', () => errors.some((e) => e.startsWith('Service')));
  t.equal(src.status().synced, false, 'not synced on half a list');
  t.equal(api.requests.find((r) => r.url.startsWith(SERVICES))?.contentEncoding, 'gzip', 'the answer was compressed when it was cut');
  api.rawListItems.delete('Service');
  await until('synced once the list is whole', () => src.status().synced);
  t.ok(events.some((e) => e.kind === 'Service'), 'and the Service arrived');
  t.ok(lists(api, SERVICES).length >= 2, 'by a second list: the cut one was retried');
});
