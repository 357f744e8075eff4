// The Kubernetes source against the fake API server (the real list/watch
// wire protocol over loopback HTTP; no privileges needed): what gates the
// first sync, and what happens when this node's Node cannot be listed.
import t, { type Test } from 'tap';
import type { Node } from '../../src/model/k8s.js';
import { KubernetesSource, type KubernetesSourceOptions } from '../../src/sources/kubernetes.js';
import type { SourceEvent } from '../../src/sources/source.js';
import { FakeApiServer } from '../helpers/fake-apiserver.js';

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

async function setup(t: Test, opts: Partial<KubernetesSourceOptions> = {}) {
  const api = new FakeApiServer();
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
