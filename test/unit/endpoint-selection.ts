// Endpoint selection as kube-proxy does it: ready first, then
// serving-and-terminating; internalTrafficPolicy Local; zone hints.
import t from 'tap';
import { desiredState } from '../../src/model/desired.js';
import { validateEndpointSlice, validateNode, validateService, type Node } from '../../src/model/k8s.js';
import type { Frontend } from '../../src/model/types.js';
import { service } from '../fakes/objects.js';

type Ep = { ip: string; ready?: boolean; serving?: boolean; terminating?: boolean; node?: string; zones?: string[] };

function frontend(eps: Ep[], extra: Record<string, unknown> = {}, node?: Node, labels?: Record<string, string>): Frontend | undefined {
  const raw = service('web', ['10.96.0.10'], [{ name: 'http', port: 80 }], extra);
  if (labels) raw.metadata!.labels = labels;
  const s = validateService(raw);
  if (!s.ok) throw new Error(s.reason);
  const e = validateEndpointSlice({
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name: 'web-1', labels: { 'kubernetes.io/service-name': 'web' } },
    addressType: 'IPv4',
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
    endpoints: eps.map((x) => ({
      addresses: [x.ip],
      conditions: { ready: x.ready ?? true, serving: x.serving ?? x.ready ?? true, terminating: x.terminating ?? false },
      ...(x.node ? { nodeName: x.node } : {}),
      ...(x.zones ? { hints: { forZones: x.zones.map((name) => ({ name })) } } : {}),
    })),
  });
  if (!e.ok) throw new Error(e.reason);
  return desiredState({ services: [s.value], slices: [e.value], ...(node ? { node } : {}) }).frontends.get('10.96.0.10:80/TCP' as never);
}

const addrs = (bs: readonly { address: string }[]) => bs.map((b) => b.address);
const node = (name: string, zone?: string): Node => {
  const v = validateNode({ metadata: { name, labels: zone ? { 'topology.kubernetes.io/zone': zone } : {} } });
  if (!v.ok) throw new Error(v.reason);
  return v.value;
};

t.test('ready endpoints are selectable; terminating ones follow as non-selectable slots', async (t) => {
  const fe = frontend([{ ip: '10.0.0.1' }, { ip: '10.0.0.2', ready: false, serving: true, terminating: true }, { ip: '10.0.0.3', ready: false, serving: false }])!;
  t.same(addrs(fe.backends), ['10.0.0.1']);
  t.same(addrs(fe.terminating), ['10.0.0.2']);
  t.equal(fe.terminating[0]!.state, 'terminating');
});

t.test('with no ready endpoint, serving-and-terminating ones are selectable', async (t) => {
  const fe = frontend([
    { ip: '10.0.0.1', ready: false, serving: true, terminating: true },
    { ip: '10.0.0.2', ready: false, serving: false, terminating: true },
  ])!;
  t.same(addrs(fe.backends), ['10.0.0.1'], 'the serving one is picked');
  t.same(addrs(fe.terminating), ['10.0.0.2'], 'the non-serving one stays for established flows');
  t.equal(fe.backends[0]!.state, 'terminating');
});

t.test('internalTrafficPolicy Local: only this node, with its own terminating fallback', async (t) => {
  const eps: Ep[] = [
    { ip: '10.0.0.1', node: 'a' },
    { ip: '10.0.0.2', node: 'b' },
    { ip: '10.0.0.3', node: 'b', ready: false, serving: true, terminating: true },
  ];
  t.same(addrs(frontend(eps, { internalTrafficPolicy: 'Local' }, node('a'))!.backends), ['10.0.0.1']);
  t.same(addrs(frontend(eps.slice(1), { internalTrafficPolicy: 'Local' }, node('b'))!.backends), ['10.0.0.2']);
  t.same(addrs(frontend(eps.slice(2), { internalTrafficPolicy: 'Local' }, node('b'))!.backends), ['10.0.0.3']);
  const none = frontend(eps, { internalTrafficPolicy: 'Local' }, node('c'))!;
  t.same(none.backends, [], 'no local endpoint: nothing selectable (refused), like kube-proxy');
  t.ok(none.localOnly);
});

t.test('zone hints: used when complete and one matches this zone', async (t) => {
  const eps: Ep[] = [
    { ip: '10.0.0.1', zones: ['z1'] },
    { ip: '10.0.0.2', zones: ['z2'] },
    { ip: '10.0.0.3', zones: ['z1', 'z2'] },
  ];
  t.same(addrs(frontend(eps, {}, node('a', 'z1'))!.backends), ['10.0.0.1', '10.0.0.3']);
  t.same(addrs(frontend(eps, {}, node('a', 'z2'))!.backends), ['10.0.0.2', '10.0.0.3']);
  t.same(addrs(frontend(eps, {}, node('a', 'z9'))!.backends), ['10.0.0.1', '10.0.0.2', '10.0.0.3'], 'no hint for this zone: all');
  t.same(addrs(frontend(eps, {}, node('a'))!.backends).length, 3, 'node without a zone: all');
  const incomplete = [...eps, { ip: '10.0.0.4' }];
  t.same(addrs(frontend(incomplete, {}, node('a', 'z1'))!.backends).length, 4, 'an endpoint without hints: all (kube-proxy fallback)');
  const notReadyUnhinted = [...eps, { ip: '10.0.0.5', ready: false, serving: false }];
  t.same(addrs(frontend(notReadyUnhinted, {}, node('a', 'z1'))!.backends), ['10.0.0.1', '10.0.0.3'], 'only ready endpoints need hints');
});

t.test('sessionAffinity ClientIP carries its timeout; bad values are refused', async (t) => {
  t.equal(frontend([{ ip: '10.0.0.1' }], { sessionAffinity: 'ClientIP' })!.affinityTimeout, 10800, 'API default');
  t.equal(frontend([{ ip: '10.0.0.1' }], { sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } } })!.affinityTimeout, 60);
  t.equal(frontend([{ ip: '10.0.0.1' }])!.affinityTimeout, 0);
  const bad = validateService(service('x', ['10.96.0.1'], [{ port: 80 }], { sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 0 } } }));
  t.notOk(bad.ok);
  if (!bad.ok) t.match(bad.reason, /timeoutSeconds 0 is not in 1\.\.86400/);
});

t.test('a service labelled for another proxy is skipped', async (t) => {
  t.equal(frontend([{ ip: '10.0.0.1' }], {}, undefined, { 'service.kubernetes.io/service-proxy-name': 'other' }), undefined);
});

t.test('a Node being deleted is noticed', async (t) => {
  const v = validateNode({ metadata: { name: 'a', deletionTimestamp: '2026-01-01T00:00:00Z' } });
  t.ok(v.ok && v.value.deleting);
});
