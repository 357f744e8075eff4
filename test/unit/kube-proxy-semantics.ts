// Endpoint selection checked against kube-proxy's own code and test tables,
// re-expressed as lbctl objects. Each test names the kube-proxy behaviour it
// follows. Read in kubernetes/kubernetes:
//   pkg/proxy/endpointslicecache.go  addEndpoints (commit c2c7d507620b)
//   pkg/proxy/topology.go            CategorizeEndpoints, topologyModeFromHints,
//                                    availableForTopology (commit 008b3652959c)
//   pkg/proxy/topology_test.go       TestCategorizeEndpoints (commit 02756999a07f;
//                                    the newest copy that could be read, older than
//                                    node hints: their cases here follow topology.go)
//   cmd/kube-proxy/app/server.go     the informers' label selector
// kube-proxy's "local" is an endpoint whose nodeName is this node; its
// clusterEndpoints and localEndpoints are lbctl's selectable backends under
// internalTrafficPolicy Cluster and Local.
import t from 'tap';
import { DesiredModel, desiredState, serviceId } from '../../src/model/desired.js';
import {
  validateEndpointSlice,
  validateNode,
  validateService,
  HEADLESS_LABEL,
  type EndpointSlice,
  type Node,
  type RawEndpointSlice,
  type Service,
} from '../../src/model/k8s.js';
import type { Frontend } from '../../src/model/types.js';
import { service } from '../fakes/objects.js';

const THIS = 'node-1';
const FE = '10.96.0.10:80/TCP';

/** One endpoint: `ip` is its addresses[0] (or all of them); `local` puts it on this node. */
interface Ep {
  readonly ip: string | string[];
  readonly ready?: boolean;
  readonly serving?: boolean;
  readonly terminating?: boolean;
  readonly local?: boolean;
  readonly node?: string;
  readonly zones?: string[];
  readonly nodes?: string[];
}

type RawEndpoint = NonNullable<RawEndpointSlice['endpoints']>[number];

function rawEndpoint(e: Ep): RawEndpoint {
  const hints = e.zones || e.nodes ? { forZones: e.zones?.map((name) => ({ name })), forNodes: e.nodes?.map((name) => ({ name })) } : undefined;
  const ready = e.ready ?? true;
  return {
    addresses: typeof e.ip === 'string' ? [e.ip] : e.ip,
    conditions: { ready, serving: e.serving ?? ready, terminating: e.terminating ?? false },
    nodeName: e.node ?? (e.local ? THIS : 'node-2'),
    ...(hints ? { hints } : {}),
  };
}

function slice(name: string, eps: Ep[]): EndpointSlice {
  const v = validateEndpointSlice({
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name, namespace: 'default', labels: { 'kubernetes.io/service-name': 'web' } },
    addressType: 'IPv4',
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
    endpoints: eps.map(rawEndpoint),
  });
  if (!v.ok) throw new Error(v.reason);
  return v.value;
}

function web(extra: Record<string, unknown> = {}, labels?: Record<string, string>): Service {
  const raw = service('web', ['10.96.0.10'], [{ name: 'http', port: 80 }], extra);
  if (labels) raw.metadata!.labels = labels;
  const v = validateService(raw);
  if (!v.ok) throw new Error(v.reason);
  return v.value;
}

function node(zone?: string, name = THIS): Node {
  const v = validateNode({ metadata: { name, labels: zone ? { 'topology.kubernetes.io/zone': zone } : {} } });
  if (!v.ok) throw new Error(v.reason);
  return v.value;
}

const LOCAL = { internalTrafficPolicy: 'Local' };

/** The service's frontend with its slices handed to the model one by one, in this order. */
function inOrder(svc: Service, slices: EndpointSlice[], n: Node | undefined = node()): Frontend {
  const m = new DesiredModel();
  m.setNode(n);
  m.setService(serviceId(svc.namespace, svc.name), svc);
  for (const s of slices) {
    m.setSlice(serviceId(s.namespace, s.name), s);
    m.flush();
  }
  const fe = m.frontends.get(FE as never);
  if (!fe) throw new Error(`no frontend ${FE}`);
  return fe;
}

function frontend(svc: Service, eps: Ep[], n: Node | undefined = node()): Frontend {
  const fe = desiredState({ services: [svc], slices: [slice('web-1', eps)], node: n }).frontends.get(FE as never);
  if (!fe) throw new Error(`no frontend ${FE}`);
  return fe;
}

const addrs = (bs: readonly { address: string }[]): string[] => bs.map((b) => b.address);
const selected = (fe: Frontend): string[] => addrs(fe.backends);

t.test("kube-proxy endpointslicecache: only the first of an endpoint's addresses is used", async (t) => {
  const s = slice('web-1', [{ ip: ['10.0.0.1', '10.0.0.2'] }, { ip: '10.0.0.3' }]);
  t.equal(s.endpoints[0]!.address, '10.0.0.1', 'the model keeps addresses[0] only');
  t.notOk('addresses' in s.endpoints[0]!, 'and no list');
  const fe = frontend(web(), [{ ip: ['10.0.0.1', '10.0.0.2'] }, { ip: '10.0.0.3' }]);
  t.same(selected(fe), ['10.0.0.1', '10.0.0.3'], 'one slot per endpoint: the second address doubles no weight');
  // The other addresses are still validated: a slice lbctl cannot read is refused whole.
  const bad = validateEndpointSlice({
    kind: 'EndpointSlice',
    metadata: { name: 's', labels: { 'kubernetes.io/service-name': 'web' } },
    addressType: 'IPv4',
    endpoints: [{ addresses: ['10.0.0.1', 'fd00::1'] }],
  });
  t.notOk(bad.ok);
  if (!bad.ok) t.match(bad.reason, /addresses\[1\] fd00::1 is not IPv4/);
});

t.test('kube-proxy endpointslicecache: of two entries for one IP the non-terminating one is kept, in either arrival order', async (t) => {
  // The reported case: the old pod serving and terminating, its IP reused by
  // a new pod that is not ready yet. kube-proxy keeps the new pod's entry, so
  // there is no ready endpoint and no serving-terminating one: refused.
  const old = slice('web-a', [{ ip: '10.0.0.5', ready: false, serving: true, terminating: true, node: 'node-2' }]);
  const reused = slice('web-b', [{ ip: '10.0.0.5', ready: false, serving: false, terminating: false, node: 'node-3' }]);
  for (const order of [[old, reused], [reused, old]]) {
    const name = order.map((s) => s.name).join(', then ');
    const fe = inOrder(web(), order);
    t.same(fe.backends, [], `${name}: nothing selectable`);
    t.same(fe.terminating, [], `${name}: and no terminating slot for the old pod`);
  }
  // kubernetes#135266: the old pod's entry not serving, the new one ready.
  const ghost = slice('web-a', [{ ip: '10.0.0.6', ready: false, serving: false, terminating: true }]);
  const running = slice('web-b', [{ ip: '10.0.0.6' }]);
  for (const order of [[ghost, running], [running, ghost]]) {
    const fe = inOrder(web(), order);
    t.same(fe.backends.map((b) => `${b.address} ${b.state}`), ['10.0.0.6 active'], `${order.map((s) => s.name).join(', then ')}: the running pod`);
  }
});

t.test('kube-proxy endpointslicecache (before it left the order undefined): a local and a remote entry for one ready IP keep the local one', async (t) => {
  const local = slice('web-a', [{ ip: '10.0.0.7', local: true }]);
  const remote = slice('web-b', [{ ip: '10.0.0.7', node: 'node-2' }]);
  for (const order of [[local, remote], [remote, local]]) {
    const name = order.map((s) => s.name).join(', then ');
    t.same(selected(inOrder(web(LOCAL), order)), ['10.0.0.7'], `${name}: internalTrafficPolicy Local has its backend`);
    t.same(selected(inOrder(web(), order)), ['10.0.0.7'], `${name}: Cluster too`);
  }
});

t.test("where kube-proxy's endpointslicecache keeps whichever entry came last, lbctl keeps the more usable one", async (t) => {
  // Both entries non-terminating (an endpoint moving between slices while it
  // turns unready), or both terminating: kube-proxy's result depends on the order.
  const pairs: Array<[string, Ep, Ep, string[], string[]]> = [
    ['ready over unready', { ip: '10.0.0.8' }, { ip: '10.0.0.8', ready: false, serving: false }, ['10.0.0.8'], []],
    [
      'serving-terminating over terminating',
      { ip: '10.0.0.9', ready: false, serving: true, terminating: true },
      { ip: '10.0.0.9', ready: false, serving: false, terminating: true },
      ['10.0.0.9'],
      [],
    ],
  ];
  for (const [name, a, b, backends, terminating] of pairs) {
    for (const order of [[slice('web-a', [a]), slice('web-b', [b])], [slice('web-a', [b]), slice('web-b', [a])]]) {
      for (const slices of [order, [...order].reverse()]) {
        const fe = inOrder(web(), slices);
        t.same([selected(fe), addrs(fe.terminating)], [backends, terminating], `${name}: ${slices.map((s) => s.name).join(', then ')}`);
      }
    }
  }
});

t.test('kube-proxy TestCategorizeEndpoints cases (topology.go CategorizeEndpoints), re-expressed', async (t) => {
  const zoned = (z3: boolean): Ep[] => [
    { ip: '10.1.2.3', zones: ['zone-a'] },
    { ip: '10.1.2.4', zones: ['zone-b'] },
    { ip: '10.1.2.5', zones: ['zone-c'] },
    { ip: '10.1.2.6', zones: ['zone-a'], ready: z3 },
  ];
  // name, service extra, node zone, endpoints, expected selectable (clusterEndpoints, or localEndpoints for Local)
  const cases: Array<[string, Record<string, unknown>, string | undefined, Ep[], string[]]> = [
    ['hints, normal endpoint filtering', {}, 'zone-a', zoned(true), ['10.1.2.3', '10.1.2.6']],
    [
      'internalTrafficPolicy: Local, topology ignored for Local endpoints',
      LOCAL,
      'zone-a',
      [
        { ip: '10.1.2.3', zones: ['zone-a'], local: true },
        { ip: '10.1.2.4', zones: ['zone-b'], local: true },
        { ip: '10.1.2.5', zones: ['zone-c'] },
        { ip: '10.1.2.6', zones: ['zone-a'] },
      ],
      ['10.1.2.3', '10.1.2.4'],
    ],
    ['empty node labels', {}, undefined, [{ ip: '10.1.2.3', zones: ['zone-a'] }], ['10.1.2.3']],
    ['node in different zone, no endpoint filtering', {}, 'zone-b', [{ ip: '10.1.2.3', zones: ['zone-a'] }], ['10.1.2.3']],
    ['unready endpoint', {}, 'zone-a', zoned(false), ['10.1.2.3']],
    [
      'only unready endpoints in same zone (should not filter)',
      {},
      'zone-a',
      [
        { ip: '10.1.2.3', zones: ['zone-a'], ready: false },
        { ip: '10.1.2.4', zones: ['zone-b'] },
        { ip: '10.1.2.5', zones: ['zone-c'] },
        { ip: '10.1.2.6', zones: ['zone-a'], ready: false },
      ],
      ['10.1.2.4', '10.1.2.5'],
    ],
    [
      'missing hints, no filtering applied',
      {},
      'zone-a',
      [
        { ip: '10.1.2.3', zones: ['zone-a'] },
        { ip: '10.1.2.4', zones: ['zone-b'] },
        { ip: '10.1.2.5' },
        { ip: '10.1.2.6', zones: ['zone-a'] },
      ],
      ['10.1.2.3', '10.1.2.4', '10.1.2.5', '10.1.2.6'],
    ],
    [
      'multiple hints per endpoint, filtering includes any endpoint with zone included',
      {},
      'zone-c',
      [
        { ip: '10.1.2.3', zones: ['zone-a', 'zone-b', 'zone-c'] },
        { ip: '10.1.2.4', zones: ['zone-b', 'zone-c'] },
        { ip: '10.1.2.5', zones: ['zone-b', 'zone-d'] },
        { ip: '10.1.2.6', zones: ['zone-c'] },
      ],
      ['10.1.2.3', '10.1.2.4', '10.1.2.6'],
    ],
    ['internalTrafficPolicy: Local, with empty endpoints', LOCAL, undefined, [], []],
    ['internalTrafficPolicy: Local, but all endpoints are remote', LOCAL, undefined, [{ ip: '10.0.0.0' }, { ip: '10.0.0.1' }], []],
    ['internalTrafficPolicy: Local, all endpoints are local', LOCAL, undefined, [{ ip: '10.0.0.0', local: true }, { ip: '10.0.0.1', local: true }], ['10.0.0.0', '10.0.0.1']],
    ['internalTrafficPolicy: Local, some endpoints are local', LOCAL, undefined, [{ ip: '10.0.0.0', local: true }, { ip: '10.0.0.1' }], ['10.0.0.0']],
    ['Cluster traffic policy, endpoints not Ready', {}, undefined, [{ ip: '10.0.0.0', ready: false }, { ip: '10.0.0.1', ready: false }], []],
    ['Cluster traffic policy, some endpoints are Ready', {}, undefined, [{ ip: '10.0.0.0', ready: false }, { ip: '10.0.0.1' }], ['10.0.0.1']],
    [
      'Cluster traffic policy, all endpoints are terminating',
      {},
      undefined,
      [
        { ip: '10.0.0.0', ready: false, serving: true, terminating: true, local: true },
        { ip: '10.0.0.1', ready: false, serving: true, terminating: true },
      ],
      ['10.0.0.0', '10.0.0.1'],
    ],
    [
      'iTP: Local, all endpoints remote and terminating',
      LOCAL,
      undefined,
      [
        { ip: '10.0.0.0', ready: false, serving: true, terminating: true },
        { ip: '10.0.0.1', ready: false, serving: true, terminating: true },
      ],
      [],
    ],
    [
      'Local policy with terminating endpoints: the local serving-terminating one (their eTP: Local case)',
      LOCAL,
      undefined,
      [
        { ip: '10.0.0.0' },
        { ip: '10.0.0.1', ready: false, serving: false, local: true },
        { ip: '10.0.0.2', ready: false, serving: true, terminating: true, local: true },
        { ip: '10.0.0.3', ready: false, serving: true, terminating: true },
      ],
      ['10.0.0.2'],
    ],
    [
      'Cluster policy with terminating endpoints: the ready one (their iTP: Cluster case)',
      {},
      undefined,
      [
        { ip: '10.0.0.0' },
        { ip: '10.0.0.1', ready: false, serving: false, local: true },
        { ip: '10.0.0.2', ready: false, serving: true, terminating: true, local: true },
        { ip: '10.0.0.3', ready: false, serving: true, terminating: true },
      ],
      ['10.0.0.0'],
    ],
    ['no cluster endpoints for iTP:Local internal-only service', LOCAL, undefined, [{ ip: '10.0.0.0' }, { ip: '10.0.0.1', local: true }], ['10.0.0.1']],
  ];
  for (const [name, extra, zone, eps, want] of cases) {
    t.same(selected(frontend(web(extra), eps, node(zone))), want, name);
  }
});

t.test('kube-proxy topologyModeFromHints: node hints, then zone hints, then cluster-wide', async (t) => {
  const n = node('zone-a');
  // What the EndpointSlice controller writes for trafficDistribution PreferSameNode:
  // a forNodes hint with the endpoint's node, and forZones for proxies without node hints.
  const sameNode: Ep[] = [
    { ip: '10.0.0.1', nodes: [THIS], zones: ['zone-a'], local: true },
    { ip: '10.0.0.2', nodes: ['node-2'], zones: ['zone-a'], node: 'node-2' },
    { ip: '10.0.0.3', nodes: ['node-3'], zones: ['zone-b'], node: 'node-3' },
  ];
  const cases: Array<[string, Ep[], Node | undefined, string[]]> = [
    ['every ready endpoint has a node hint and one is for this node: PreferSameNode', sameNode, n, ['10.0.0.1']],
    ['a ready endpoint without a node hint: zone hints instead', [...sameNode, { ip: '10.0.0.4', zones: ['zone-a'] }], n, ['10.0.0.1', '10.0.0.2', '10.0.0.4']],
    ['no endpoint hinted for this node: zone hints instead', sameNode, node('zone-a', 'node-9'), ['10.0.0.1', '10.0.0.2']],
    ['no node hint for this node and incomplete zone hints: cluster-wide', [...sameNode, { ip: '10.0.0.4', nodes: ['node-4'] }], node('zone-a', 'node-9'), ['10.0.0.1', '10.0.0.2', '10.0.0.3', '10.0.0.4']],
    ['node hints for this node but no zone on this node: still PreferSameNode', sameNode, node(undefined), ['10.0.0.1']],
    ['an unready endpoint needs no hint', [...sameNode, { ip: '10.0.0.4', ready: false, serving: false }], n, ['10.0.0.1']],
    [
      'an unready endpoint hinted for this node does not count: zone hints instead',
      [{ ...sameNode[0]!, ready: false, serving: false }, sameNode[1]!, sameNode[2]!],
      n,
      ['10.0.0.2'],
    ],
    [
      'no ready endpoint: the serving-terminating ones, whatever their hints',
      sameNode.map((e) => ({ ...e, ready: false, serving: true, terminating: true })),
      n,
      ['10.0.0.1', '10.0.0.2', '10.0.0.3'],
    ],
  ];
  for (const [name, eps, nd, want] of cases) t.same(selected(frontend(web(), eps, nd)), want, name);
  t.same(selected(frontend(web(LOCAL), sameNode, node('zone-a', 'node-2'))), ['10.0.0.2'], 'internalTrafficPolicy Local ignores hints: this node only');

  // Endpoints keep one literal shape, hints or none (a shared hidden class).
  const s = slice('web-1', [sameNode[0]!, { ip: '10.0.0.9' }]);
  t.same(Object.keys(s.endpoints[0]!), Object.keys(s.endpoints[1]!), 'same keys in the same order');
  t.same(s.endpoints[0]!.nodeHints, [THIS]);
  t.equal(s.endpoints[1]!.nodeHints, undefined);
});

t.test(`kube-proxy informers (label selector !${HEADLESS_LABEL}): a Service with the headless label is not proxied`, async (t) => {
  for (const value of ['', 'true']) {
    const svc = web({}, { [HEADLESS_LABEL]: value });
    t.ok(svc.headlessLabel, `label value ${JSON.stringify(value)} recorded`);
    const out = desiredState({ services: [svc], slices: [slice('web-1', [{ ip: '10.0.0.1' }])], node: node() });
    t.equal(out.frontends.size, 0, 'no frontend, though it has a cluster IP and endpoints');
    t.same(out.skipped, [{ service: 'default/web', reason: 'headless', detail: `it carries the label ${HEADLESS_LABEL}` }]);
  }
  t.notOk(web().headlessLabel);
});

t.test('kube-proxy proxier (iptables, nftables): internalTrafficPolicy Local with only remote endpoints drops; lbctl refuses', async (t) => {
  // kube-proxy: hasAnyEndpoints but no local endpoint → the clusterIP's
  // traffic is dropped (a client waits for its timeout). lbctl writes the
  // frontend with no selectable backend, so connect() fails at once.
  const fe = frontend(web(LOCAL), [{ ip: '10.0.0.1', node: 'node-2' }, { ip: '10.0.0.2', node: 'node-3' }]);
  t.same(fe.backends, [], 'nothing selectable: refused at connect()');
  t.ok(fe.localOnly, 'the frontend is marked Local');
});

// externalTrafficPolicy, read in kubernetes/kubernetes:
//   pkg/proxy/topology.go  CategorizeEndpoints: localEndpoints (ready local
//                          ones, else serving-and-terminating local ones)
//                          serve external traffic under Local; clusterEndpoints
//                          serve it under Cluster, whatever internalTrafficPolicy says
//   pkg/proxy/iptables/proxier.go  the external traffic chain: Local keeps the
//                          client's traffic on this node's endpoints, but
//                          traffic from this node and its pods is sent on
//                          (lbctl's internal-scope twin; kube-proxy sends it to
//                          the cluster endpoints, lbctl to what internalTrafficPolicy
//                          picks, as Cilium's two scopes: they differ only under
//                          internalTrafficPolicy Local)
const NP = '0.0.0.0:30080/TCP';
const NP_INT = '0.0.0.0:30080/TCP/internal';
const nodePortWeb = (spec: Record<string, unknown> = {}): Service =>
  web({ type: 'NodePort', ports: [{ name: 'http', port: 80, nodePort: 30080 }], ...spec });

function frontends(svc: Service, eps: Ep[]): ReadonlyMap<string, Frontend> {
  return desiredState({ services: [svc], slices: [slice('web-1', eps)], node: node() }).frontends;
}
const at = (d: ReadonlyMap<string, Frontend>, key: string): Frontend => {
  const f = d.get(key);
  if (!f) throw new Error(`no frontend ${key}`);
  return f;
};

t.test('kube-proxy CategorizeEndpoints: externalTrafficPolicy Local serves outside clients from ready local endpoints; an internal twin serves the node', async (t) => {
  const eps: Ep[] = [{ ip: '10.0.0.1', local: true }, { ip: '10.0.0.2' }, { ip: '10.0.0.3', local: true, ready: false }];
  const d = frontends(nodePortWeb({ externalTrafficPolicy: 'Local' }), eps);
  t.same([...d.keys()].sort(), [NP, NP_INT, FE]);
  t.same(selected(at(d, NP)), ['10.0.0.1'], 'external entry: ready local endpoints only');
  t.ok(at(d, NP).externalLocal);
  t.equal(at(d, NP).scope, undefined, 'the external entry has the plain key');
  t.same(selected(at(d, NP_INT)), ['10.0.0.1', '10.0.0.2'], 'internal twin: every ready endpoint (internalTrafficPolicy Cluster)');
  t.equal(at(d, NP_INT).scope, 'internal');
  t.equal(at(d, NP_INT).type, 'NodePort');
  t.same(selected(at(d, FE)), ['10.0.0.1', '10.0.0.2'], 'the ClusterIP frontend is unchanged');
  t.notOk(at(d, FE).externalLocal);
});

t.test('kube-proxy CategorizeEndpoints: Local with no ready local endpoint falls back to serving-terminating local ones, else none (drop)', async (t) => {
  const d = frontends(nodePortWeb({ externalTrafficPolicy: 'Local' }), [
    { ip: '10.0.0.1', local: true, ready: false, serving: true, terminating: true },
    { ip: '10.0.0.2' },
  ]);
  t.same(selected(at(d, NP)), ['10.0.0.1'], 'the local serving-terminating endpoint');
  t.same(selected(at(d, NP_INT)), ['10.0.0.2'], 'the twin: the ready remote one');
  const none = frontends(nodePortWeb({ externalTrafficPolicy: 'Local' }), [{ ip: '10.0.0.2' }]);
  t.same(selected(at(none, NP)), [], 'no local endpoint: nothing selectable, the datapath drops');
  t.same(selected(at(none, NP_INT)), ['10.0.0.2'], 'clients on the node still reach it');
});

t.test('kube-proxy: external traffic follows externalTrafficPolicy only; internalTrafficPolicy Local shapes the ClusterIP and the twin', async (t) => {
  const eps: Ep[] = [{ ip: '10.0.0.1', local: true }, { ip: '10.0.0.2' }];
  const clusterExt = frontends(nodePortWeb({ internalTrafficPolicy: 'Local' }), eps);
  t.same([...clusterExt.keys()].sort(), [NP, FE], 'eTP Cluster: no twin');
  t.same(selected(at(clusterExt, NP)), ['10.0.0.1', '10.0.0.2'], 'NodePort under eTP Cluster: every ready endpoint, though iTP is Local');
  t.same(selected(at(clusterExt, FE)), ['10.0.0.1'], 'ClusterIP under iTP Local: local only');
  const bothLocal = frontends(nodePortWeb({ internalTrafficPolicy: 'Local', externalTrafficPolicy: 'Local' }), eps);
  t.same(selected(at(bothLocal, NP)), ['10.0.0.1']);
  t.same(selected(at(bothLocal, NP_INT)), ['10.0.0.1'], 'the twin follows iTP Local');
  t.ok(at(bothLocal, NP_INT).localOnly);
});
