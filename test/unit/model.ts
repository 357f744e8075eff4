import t from 'tap';
import { desiredState, ModelMemo, type ModelInput } from '../../src/model/from-k8s.js';
import { validateEndpointSlice, validateNode, validateService, type EndpointSlice, type Node, type Service } from '../../src/model/k8s.js';
import type { DesiredState, Frontend } from '../../src/model/types.js';
import { service, slice } from '../fakes/objects.js';

function svc(raw: unknown): Service {
  const v = validateService(raw);
  if (!v.ok) throw new Error(v.reason);
  return v.value;
}
function eps(raw: unknown): EndpointSlice {
  const v = validateEndpointSlice(raw);
  if (!v.ok) throw new Error(v.reason);
  return v.value;
}

t.test('a ClusterIP service with one port and ready endpoints', async (t) => {
  const out = desiredState({
    services: [svc(service('web', ['10.96.0.10'], [{ name: 'http', port: 80, targetPort: 'http' }]))],
    slices: [
      eps(slice('web-a', 'web', 'IPv4', [{ name: 'http', port: 8080 }], [{ addresses: ['10.0.0.3'] }, { addresses: ['10.0.0.2'] }, { addresses: ['10.0.0.4'], ready: false }])),
    ],
  });
  t.same([...out.frontends.keys()], ['10.96.0.10:80/TCP']);
  const fe = out.frontends.get('10.96.0.10:80/TCP' as never)!;
  t.same(fe.backends.map((b) => `${b.address}:${b.port}`), ['10.0.0.2:8080', '10.0.0.3:8080'], 'ready only, sorted');
  t.same(fe.service, { namespace: 'default', name: 'web', portName: 'http' });
});

t.test('dual-stack, several ports and protocols, named ports per slice, slices merged', async (t) => {
  const out = desiredState({
    services: [
      svc(
        service('dns', ['10.96.0.53', 'fd00:96::35'], [
          { name: 'dns', port: 53, protocol: 'UDP', targetPort: 'dns' },
          { name: 'dns-tcp', port: 53, protocol: 'TCP', targetPort: 'dns-tcp' },
        ]),
      ),
    ],
    slices: [
      eps(slice('dns-1', 'dns', 'IPv4', [{ name: 'dns', port: 5353, protocol: 'UDP' }, { name: 'dns-tcp', port: 5353, protocol: 'TCP' }], [{ addresses: ['10.0.0.2'] }])),
      // a second slice whose pods name the same port differently numbered
      eps(slice('dns-2', 'dns', 'IPv4', [{ name: 'dns', port: 53, protocol: 'UDP' }], [{ addresses: ['10.0.0.3'] }])),
      eps(slice('dns-v6', 'dns', 'IPv6', [{ name: 'dns', port: 53, protocol: 'UDP' }], [{ addresses: ['FD00:244::0002'] }])),
    ],
  });
  t.same([...out.frontends.keys()].sort(), ['10.96.0.53:53/TCP', '10.96.0.53:53/UDP', '[fd00:96::35]:53/TCP', '[fd00:96::35]:53/UDP']);
  const udp4 = out.frontends.get('10.96.0.53:53/UDP' as never)!;
  t.same(udp4.backends.map((b) => `${b.address}:${b.port}`), ['10.0.0.2:5353', '10.0.0.3:53']);
  const tcp4 = out.frontends.get('10.96.0.53:53/TCP' as never)!;
  t.same(tcp4.backends.map((b) => `${b.address}:${b.port}`), ['10.0.0.2:5353']);
  const udp6 = out.frontends.get('[fd00:96::35]:53/UDP' as never)!;
  t.same(udp6.backends.map((b) => b.address), ['fd00:244::2'], 'IPv6 canonicalised');
  t.same(out.frontends.get('[fd00:96::35]:53/TCP' as never)!.backends, [], 'no v6 slice port for dns-tcp');
});

t.test('headless and ExternalName services are skipped, with a reason', async (t) => {
  const out = desiredState({
    services: [
      svc(service('hl', ['None'], [{ port: 80 }])),
      svc({ kind: 'Service', metadata: { name: 'ext' }, spec: { type: 'ExternalName', externalName: 'example.org' } }),
    ],
    slices: [],
  });
  t.equal(out.frontends.size, 0);
  t.same(out.skipped.map((s) => s.reason).sort(), ['external-name', 'headless']);
});

t.test('a frontend claimed twice is reported, first by namespace/name wins', async (t) => {
  const out = desiredState({
    services: [svc(service('b', ['10.96.0.1'], [{ port: 80 }])), svc(service('a', ['10.96.0.1'], [{ port: 80 }]))],
    slices: [],
  });
  t.equal(out.frontends.get('10.96.0.1:80/TCP' as never)!.service.name, 'a');
  t.match(out.skipped, [{ service: 'default/b', reason: 'conflict' }]);
});

t.test('validation names what is wrong', async (t) => {
  const cases: Array<[unknown, RegExp]> = [
    [{ kind: 'Service', spec: {} }, /metadata is missing/],
    [service('x', ['10.96.0.300'], [{ port: 80 }]), /clusterIPs\[0\] "10.96.0.300" is not an IP/],
    [service('x', ['10.96.0.1'], [{ port: 70000 }]), /ports\[0\]\.port 70000 is not a port/],
    [service('x', ['10.96.0.1'], [{ port: 80, protocol: 'ICMP' }]), /protocol "ICMP"/],
    [service('x', ['10.96.0.1'], Array.from({ length: 2000 }, (_, i) => ({ port: i + 1 }))), /2000 entries/],
    [service('x', ['10.96.0.1', '10.96.0.2'], [{ port: 80 }]), /two IPv4/],
    [service('x', ['10.96.0.1'], [{ port: 80 }, { port: 80 }]), /repeats port 80\/TCP/],
    [service('Bad_Name', ['10.96.0.1'], [{ port: 80 }]), /not a valid name/],
  ];
  for (const [obj, re] of cases) {
    const v = validateService(obj);
    t.notOk(v.ok);
    if (!v.ok) t.match(v.reason, re);
  }
  const bad = validateEndpointSlice(slice('s', 'web', 'IPv4', [{ port: 80 }], [{ addresses: ['fd00::1'] }]));
  t.notOk(bad.ok);
  if (!bad.ok) t.match(bad.reason, /is not IPv4/);
  const nolabel = validateEndpointSlice({ kind: 'EndpointSlice', metadata: { name: 's' }, addressType: 'IPv4' });
  t.notOk(nolabel.ok);
  const fqdn = validateEndpointSlice({ ...slice('s', 'web', 'IPv4', [], []), addressType: 'FQDN' });
  t.notOk(fqdn.ok);
});

t.test('SCTP ports are dropped with a note; the rest is served', async (t) => {
  const s = svc(service('m', ['10.96.0.9'], [{ name: 'a', port: 80 }, { name: 'b', port: 9, protocol: 'SCTP' }]));
  t.same(s.unsupportedPorts, ['9/SCTP']);
  const out = desiredState({ services: [s], slices: [] });
  t.same([...out.frontends.keys()], ['10.96.0.9:80/TCP']);
  t.match(out.skipped, [{ reason: 'unsupported-protocol', detail: '9/SCTP' }]);
});

// ModelMemo: a service whose objects did not change keeps its Frontend
// objects (the reconciler skips those by identity).

function node(name: string, zone?: string): Node {
  const v = validateNode({ metadata: { name, labels: zone ? { 'topology.kubernetes.io/zone': zone } : {} } });
  if (!v.ok) throw new Error(v.reason);
  return v.value;
}

/** Two ports per service (two frontends each), one slice per service. */
function cluster(): { web: Service; dns: Service; webSlice: EndpointSlice; dnsSlice: EndpointSlice; input: ModelInput } {
  const web = svc(service('web', ['10.96.0.10'], [{ name: 'http', port: 80 }, { name: 'https', port: 443 }]));
  const dns = svc(service('dns', ['10.96.0.53'], [{ name: 'dns', port: 53, protocol: 'UDP' }, { name: 'dns-tcp', port: 53, protocol: 'TCP' }]));
  const webSlice = eps(slice('web-1', 'web', 'IPv4', [{ name: 'http', port: 8080 }, { name: 'https', port: 8443 }], [{ addresses: ['10.0.0.2'] }]));
  const dnsSlice = eps(
    slice('dns-1', 'dns', 'IPv4', [{ name: 'dns', port: 5353, protocol: 'UDP' }, { name: 'dns-tcp', port: 5353, protocol: 'TCP' }], [{ addresses: ['10.0.0.7'] }]),
  );
  return { web, dns, webSlice, dnsSlice, input: { services: [web, dns], slices: [webSlice, dnsSlice], node: node('n1', 'z1') } };
}

const WEB = ['10.96.0.10:80/TCP', '10.96.0.10:443/TCP'];
const DNS = ['10.96.0.53:53/UDP', '10.96.0.53:53/TCP'];
const fe = (d: DesiredState, key: string): Frontend => {
  const f = d.get(key as never);
  if (!f) throw new Error(`no frontend ${key}`);
  return f;
};

t.test('memo: the same objects give back the very same Frontend objects', async (t) => {
  const memo = new ModelMemo();
  const { input } = cluster();
  const a = desiredState(input, memo).frontends;
  const b = desiredState(input, memo).frontends;
  t.equal(a.size, 4);
  t.not(a, b, 'a new map each time');
  for (const key of [...WEB, ...DNS]) t.equal(fe(b, key), fe(a, key), `${key}: same object`);
  // Fresh arrays holding the same objects (as a source's snapshot would be) count as the same too.
  const c = desiredState({ services: [...input.services], slices: [...input.slices], ...(input.node ? { node: input.node } : {}) }, memo).frontends;
  for (const key of [...WEB, ...DNS]) t.equal(fe(c, key), fe(a, key), `${key}: same object from fresh arrays`);
});

t.test('memo: a replaced EndpointSlice recomputes its service only', async (t) => {
  const memo = new ModelMemo();
  const { web, dns, dnsSlice, input } = cluster();
  const before = desiredState(input, memo).frontends;
  const webSlice2 = eps(slice('web-1', 'web', 'IPv4', [{ name: 'http', port: 8080 }, { name: 'https', port: 8443 }], [{ addresses: ['10.0.0.3'] }, { addresses: ['10.0.0.2'] }]));
  const after = desiredState({ services: [web, dns], slices: [webSlice2, dnsSlice], node: input.node! }, memo).frontends;
  for (const key of WEB) {
    t.not(fe(after, key), fe(before, key), `${key}: a new object`);
    t.same(fe(after, key).backends.map((b) => b.address), ['10.0.0.2', '10.0.0.3'], `${key}: the new endpoints`);
  }
  for (const key of DNS) t.equal(fe(after, key), fe(before, key), `${key}: untouched`);
  // ... and the memo now holds the new result: the next sync hands it back.
  const again = desiredState({ services: [web, dns], slices: [webSlice2, dnsSlice], node: input.node! }, memo).frontends;
  for (const key of [...WEB, ...DNS]) t.equal(fe(again, key), fe(after, key), `${key}: reused`);
});

t.test('memo: a slice added, removed or a Service replaced recomputes that service only', async (t) => {
  const memo = new ModelMemo();
  const { web, dns, webSlice, dnsSlice, input } = cluster();
  const n = input.node!;
  const before = desiredState(input, memo).frontends;

  const extra = eps(slice('web-2', 'web', 'IPv4', [{ name: 'http', port: 8080 }], [{ addresses: ['10.0.0.9'] }]));
  const added = desiredState({ services: [web, dns], slices: [webSlice, extra, dnsSlice], node: n }, memo).frontends;
  t.same(fe(added, WEB[0]!).backends.map((b) => b.address), ['10.0.0.2', '10.0.0.9'], 'slice added: web sees it');
  for (const key of DNS) t.equal(fe(added, key), fe(before, key), `slice added: ${key} untouched`);

  const removed = desiredState({ services: [web, dns], slices: [webSlice, dnsSlice], node: n }, memo).frontends;
  t.same(fe(removed, WEB[0]!).backends.map((b) => b.address), ['10.0.0.2'], 'slice removed: web forgets it');
  for (const key of DNS) t.equal(fe(removed, key), fe(before, key), `slice removed: ${key} untouched`);

  const web2 = svc(service('web', ['10.96.0.10'], [{ name: 'http', port: 80 }, { name: 'https', port: 443 }], { sessionAffinity: 'ClientIP' }));
  const replaced = desiredState({ services: [web2, dns], slices: [webSlice, dnsSlice], node: n }, memo).frontends;
  for (const key of WEB) {
    t.not(fe(replaced, key), fe(removed, key), `Service replaced: ${key} new`);
    t.ok(fe(replaced, key).affinityTimeout > 0, `Service replaced: ${key} has the new spec`);
  }
  for (const key of DNS) t.equal(fe(replaced, key), fe(before, key), `Service replaced: ${key} untouched`);
});

t.test('memo: a new Node object recomputes every service', async (t) => {
  const memo = new ModelMemo();
  const { web, dns, webSlice, dnsSlice, input } = cluster();
  const before = desiredState(input, memo).frontends;
  // Same facts, new object: still recomputed (the memo compares identities).
  const after = desiredState({ services: [web, dns], slices: [webSlice, dnsSlice], node: node('n1', 'z1') }, memo).frontends;
  for (const key of [...WEB, ...DNS]) {
    t.not(fe(after, key), fe(before, key), `${key}: recomputed`);
    t.same(fe(after, key), fe(before, key), `${key}: same content`);
  }
  // A node that matters: internalTrafficPolicy Local follows the node.
  const local = svc(service('loc', ['10.96.0.20'], [{ name: 'p', port: 80 }], { internalTrafficPolicy: 'Local' }));
  const raw = slice('loc-1', 'loc', 'IPv4', [{ name: 'p', port: 8080 }], [{ addresses: ['10.0.0.4'] }]);
  const locSlice = eps({ ...raw, endpoints: raw.endpoints!.map((e) => ({ ...e, nodeName: 'n2' })) });
  const on1 = desiredState({ services: [local], slices: [locSlice], node: node('n1') }, memo).frontends;
  const on2 = desiredState({ services: [local], slices: [locSlice], node: node('n2') }, memo).frontends;
  t.same(fe(on1, '10.96.0.20:80/TCP').backends, [], 'n1: no local endpoint');
  t.same(fe(on2, '10.96.0.20:80/TCP').backends.map((b) => b.address), ['10.0.0.4'], 'n2: its endpoint');
});

t.test('memo: results equal those without a memo, conflicts still settled by namespace/name', async (t) => {
  const memo = new ModelMemo();
  const { web, dns, webSlice, dnsSlice, input } = cluster();
  // b claims web:80 and wins it (b < web); z claims dns's 53/UDP and loses it (dns < z).
  const b = svc(service('b', ['10.96.0.10'], [{ name: 'x', port: 80 }]));
  const z = svc(service('z', ['10.96.0.53'], [{ name: 'x', port: 53, protocol: 'UDP' }]));
  const steps: ModelInput[] = [
    input,
    { services: [z, dns, web, b], slices: [dnsSlice, webSlice], node: input.node! },
    { services: [z, dns, web], slices: [dnsSlice, webSlice], node: input.node! },
    { services: [z, web, b], slices: [dnsSlice, webSlice], node: input.node! },
    { services: [z, web, b, dns], slices: [webSlice, dnsSlice], node: input.node! },
  ];
  for (const [i, step] of steps.entries()) {
    const withMemo = desiredState(step, memo);
    const without = desiredState(step);
    t.same([...withMemo.frontends.entries()], [...without.frontends.entries()], `step ${i}: same frontends, same order`);
    t.same(withMemo.skipped, without.skipped, `step ${i}: same skipped`);
  }
  const last = desiredState(steps[4]!, memo);
  t.equal(fe(last.frontends, '10.96.0.10:80/TCP').service.name, 'b', 'b (first by name) holds web:80');
  t.equal(fe(last.frontends, '10.96.0.53:53/UDP').service.name, 'dns', 'dns holds 53/UDP over z');
  t.same(last.skipped.map((s) => `${s.service} ${s.reason}`).sort(), ['default/web conflict', 'default/z conflict']);
});
