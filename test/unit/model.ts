import t from 'tap';
import { DesiredModel, desiredState, MAX_SLICES_PER_SERVICE, serviceId, type ModelInput } from '../../src/model/desired.js';
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

t.test('a validated EndpointSlice reads back every endpoint as it was given (packed as kept, made when read)', async (t) => {
  const longZone = 'z'.repeat(300); // longer than any name the validation shares
  const raw = {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name: 'web-a', namespace: 'shop', labels: { 'kubernetes.io/service-name': 'web' } },
    addressType: 'IPv4',
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
    endpoints: [
      { addresses: ['10.0.0.1'] },
      { addresses: ['10.0.0.2', '10.0.0.9'], nodeName: 'ip-10-0-1-23.ec2.internal', zone: 'us-east-1a', conditions: { ready: false, serving: true, terminating: true } },
      { addresses: ['10.0.0.3'], nodeName: 'ip-10-0-1-23.ec2.internal', zone: 'us-east-1a', conditions: { ready: false, serving: true, terminating: true } },
      { addresses: ['10.0.0.4'], zone: 'us-east-1b', conditions: { ready: true, serving: false } },
      { addresses: ['10.0.0.5'], nodeName: 'n5', zone: 'us-east-1a', hints: { forZones: [{ name: 'us-east-1a' }], forNodes: [{ name: 'n5' }] } },
      { addresses: ['10.0.0.6'], zone: longZone, conditions: { ready: false, serving: false } },
      { addresses: ['10.0.0.7'], zone: 'us-east-1a' },
    ],
  };
  const read = (e: EndpointSlice): unknown[] =>
    e.endpoints.map((ep) => ({ address: ep.address, ready: ep.ready, serving: ep.serving, terminating: ep.terminating, nodeName: ep.nodeName, zone: ep.zone, zoneHints: ep.zoneHints, nodeHints: ep.nodeHints }));
  const want = [
    { address: '10.0.0.1', ready: true, serving: true, terminating: false, nodeName: undefined, zone: undefined, zoneHints: undefined, nodeHints: undefined },
    { address: '10.0.0.2', ready: false, serving: true, terminating: true, nodeName: 'ip-10-0-1-23.ec2.internal', zone: 'us-east-1a', zoneHints: undefined, nodeHints: undefined },
    { address: '10.0.0.3', ready: false, serving: true, terminating: true, nodeName: 'ip-10-0-1-23.ec2.internal', zone: 'us-east-1a', zoneHints: undefined, nodeHints: undefined },
    { address: '10.0.0.4', ready: true, serving: false, terminating: false, nodeName: undefined, zone: 'us-east-1b', zoneHints: undefined, nodeHints: undefined },
    { address: '10.0.0.5', ready: true, serving: true, terminating: false, nodeName: 'n5', zone: 'us-east-1a', zoneHints: ['us-east-1a'], nodeHints: ['n5'] },
    { address: '10.0.0.6', ready: false, serving: false, terminating: false, nodeName: undefined, zone: longZone, zoneHints: undefined, nodeHints: undefined },
    { address: '10.0.0.7', ready: true, serving: true, terminating: false, nodeName: undefined, zone: 'us-east-1a', zoneHints: undefined, nodeHints: undefined },
  ];
  const e = eps(raw);
  t.same(read(e), want);
  t.same(read(e), want, 'and the same when read again');
  t.same([e.namespace, e.name, e.serviceName, e.family, e.ports], ['shop', 'web-a', 'web', 4, [{ name: 'http', port: 8080, protocol: 'TCP' }]]);
  // A second slice with the same zones and conditions (their shared form) reads back its own endpoints.
  const other = eps({ ...raw, metadata: { ...raw.metadata, name: 'web-b' }, endpoints: raw.endpoints.slice(1, 2).map((ep) => ({ ...ep, addresses: ['10.0.1.2'] })) });
  t.same(read(other), [{ ...want[1], address: '10.0.1.2' }]);
  t.same(read(e), want, 'the first slice is unchanged by the second');
  t.same(eps({ ...raw, endpoints: [] }).endpoints, [], 'no endpoints');

  // Past the shared names' bound (input built to grow it), each endpoint keeps its own name and zone.
  // This fills the process's tables (module state, as in the agent): the identity checks above run first.
  const many = Array.from({ length: 9000 }, (_, i) =>
    eps({ ...raw, metadata: { ...raw.metadata, name: `n-${i}` }, endpoints: [{ addresses: ['10.0.2.1'], nodeName: `node-${i}.example`, zone: `zone-${i}` }] }),
  );
  t.same(
    [0, 8191, 8192, 8999].map((i) => [many[i]!.endpoints[0]!.nodeName, many[i]!.endpoints[0]!.zone]),
    [0, 8191, 8192, 8999].map((i) => [`node-${i}.example`, `zone-${i}`]),
    'every name reads back, inside the bound and past it',
  );
});

t.test('SCTP ports are served as TCP and UDP ones: ClusterIP and NodePort, matched to slice ports by protocol', async (t) => {
  const out = desiredState({
    services: [
      svc(
        service('diameter', ['10.96.0.9', 'fd00:96::9'], [
          { name: 'diam', port: 3868, protocol: 'SCTP', targetPort: 'diam', nodePort: 30868 },
          { name: 'diam-tcp', port: 3868, protocol: 'TCP', targetPort: 'diam-tcp' },
        ], { type: 'NodePort' }),
      ),
    ],
    slices: [
      eps(slice('diameter-a', 'diameter', 'IPv4', [{ name: 'diam', port: 3869, protocol: 'SCTP' }, { name: 'diam-tcp', port: 3870, protocol: 'TCP' }], [{ addresses: ['10.0.0.2'] }])),
      // a slice port of the same name but another protocol is not this port's
      eps(slice('diameter-b', 'diameter', 'IPv4', [{ name: 'diam', port: 3871, protocol: 'TCP' }], [{ addresses: ['10.0.0.3'] }])),
      eps(slice('diameter-v6', 'diameter', 'IPv6', [{ name: 'diam', port: 3869, protocol: 'SCTP' }], [{ addresses: ['fd00:244::2'] }])),
    ],
  });
  t.same(out.skipped, [], 'nothing skipped');
  t.same([...out.frontends.keys()].sort(), [
    '0.0.0.0:30868/SCTP', '10.96.0.9:3868/SCTP', '10.96.0.9:3868/TCP', '[::]:30868/SCTP', '[fd00:96::9]:3868/SCTP', '[fd00:96::9]:3868/TCP',
  ]);
  const sctp4 = out.frontends.get('10.96.0.9:3868/SCTP' as never)!;
  t.same(sctp4.backends.map((b) => `${b.address}:${b.port}/${b.protocol}`), ['10.0.0.2:3869/SCTP'], 'only the SCTP slice port');
  t.same(out.frontends.get('10.96.0.9:3868/TCP' as never)!.backends.map((b) => `${b.address}:${b.port}/${b.protocol}`), ['10.0.0.2:3870/TCP']);
  t.same(out.frontends.get('0.0.0.0:30868/SCTP' as never)!.backends, sctp4.backends, 'the NodePort has the ClusterIP\'s backends');
  t.equal(out.frontends.get('0.0.0.0:30868/SCTP' as never)!.type, 'NodePort');
  t.same(out.frontends.get('[::]:30868/SCTP' as never)!.backends.map((b) => `${b.address}:${b.port}/${b.protocol}`), ['fd00:244::2:3869/SCTP']);
});

// DesiredModel: the desired state kept up to date object by object. Each
// flush recomputes only the services its changes touched and names the
// frontends that changed; everything else keeps its Frontend objects.

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
const id = (o: { namespace: string; name: string }): string => serviceId(o.namespace, o.name);

function model(input: ModelInput): DesiredModel {
  const m = new DesiredModel();
  m.setNode(input.node);
  for (const s of input.services) m.setService(id(s), s);
  for (const s of input.slices) m.setSlice(id(s), s);
  return m;
}
const changedKeys = (m: DesiredModel): string[] => [...m.flush().changed].sort();

t.test('model: the first flush names every frontend; one with no change names none', async (t) => {
  const m = model(cluster().input);
  t.same(changedKeys(m), [...WEB, ...DNS].sort());
  t.equal(m.frontends.size, 4);
  t.equal(m.serviceCount, 2);
  const before = new Map(m.frontends);
  t.same(changedKeys(m), [], 'nothing happened');
  // The very same objects again (a relist, a resync of the informer): marked, recomputed, equal.
  const { web, webSlice } = cluster();
  m.setService(id(web), web);
  m.setSlice(id(webSlice), webSlice);
  t.same(changedKeys(m), [], 'equal objects change nothing');
  for (const key of [...WEB, ...DNS]) t.equal(fe(m.frontends, key), before.get(key as never), `${key}: same object`);
});

t.test('model: a replaced EndpointSlice changes its service\'s frontends only', async (t) => {
  const m = model(cluster().input);
  m.flush();
  const before = new Map(m.frontends);
  const webSlice2 = eps(slice('web-1', 'web', 'IPv4', [{ name: 'http', port: 8080 }, { name: 'https', port: 8443 }], [{ addresses: ['10.0.0.3'] }, { addresses: ['10.0.0.2'] }]));
  m.setSlice(id(webSlice2), webSlice2);
  t.same(changedKeys(m), [...WEB].sort());
  for (const key of WEB) t.same(fe(m.frontends, key).backends.map((b) => b.address), ['10.0.0.2', '10.0.0.3'], `${key}: the new endpoints`);
  for (const key of DNS) t.equal(fe(m.frontends, key), before.get(key as never), `${key}: untouched`);
});

t.test('model: a slice added, removed, moved to another service, a Service replaced or deleted', async (t) => {
  const { web, dns, webSlice, input } = cluster();
  const m = model(input);
  m.flush();
  const before = new Map(m.frontends);

  const extra = eps(slice('web-2', 'web', 'IPv4', [{ name: 'http', port: 8080 }], [{ addresses: ['10.0.0.9'] }]));
  m.setSlice(id(extra), extra);
  t.same(changedKeys(m), [WEB[0]], 'slice added: only the port it serves');
  t.same(fe(m.frontends, WEB[0]!).backends.map((b) => b.address), ['10.0.0.2', '10.0.0.9']);

  m.setSlice(id(extra), undefined);
  t.same(changedKeys(m), [WEB[0]], 'slice removed');
  t.same(fe(m.frontends, WEB[0]!).backends.map((b) => b.address), ['10.0.0.2']);

  // The same slice name now labelled for dns: web loses it, dns gains it.
  const moved = eps(slice('web-1', 'dns', 'IPv4', [{ name: 'dns', port: 5353, protocol: 'UDP' }], [{ addresses: ['10.0.0.8'] }]));
  m.setSlice(id(webSlice), moved);
  t.same(changedKeys(m), [...WEB, DNS[0]].sort(), 'slice moved: both services');
  t.same(fe(m.frontends, WEB[0]!).backends, [], 'web has no endpoints left');
  t.same(fe(m.frontends, DNS[0]!).backends.map((b) => b.address), ['10.0.0.7', '10.0.0.8']);
  m.setSlice(id(webSlice), webSlice);
  t.same(changedKeys(m), [...WEB, DNS[0]].sort(), 'slice moved back');
  for (const key of DNS) before.set(key as never, fe(m.frontends, key));

  const web2 = svc(service('web', ['10.96.0.10'], [{ name: 'http', port: 80 }, { name: 'https', port: 443 }], { sessionAffinity: 'ClientIP' }));
  m.setService(id(web2), web2);
  t.same(changedKeys(m), [...WEB].sort(), 'Service replaced');
  for (const key of WEB) t.ok(fe(m.frontends, key).affinityTimeout > 0, `${key} has the new spec`);
  for (const key of DNS) t.equal(fe(m.frontends, key), before.get(key as never), `${key}: untouched`);

  m.setService(id(web), undefined);
  t.same(changedKeys(m), [...WEB].sort(), 'Service deleted');
  t.same([...m.frontends.keys()].sort(), [...DNS].sort());
  t.equal(m.serviceCount, 1);
  void dns;
});

t.test('model: one record per service, whatever form its parts take (one slice or several, one claimant or several, few frontends or many)', async (t) => {
  const m = new DesiredModel();
  const web = svc(service('web', ['10.96.0.10'], [{ name: 'http', port: 80 }]));
  const sl = (name: string, address: string): EndpointSlice => eps(slice(name, 'web', 'IPv4', [{ name: 'http', port: 8080 }], [{ addresses: [address] }]));
  const backends = (): string[] => fe(m.frontends, '10.96.0.10:80/TCP').backends.map((b) => b.address);
  // Slices before their Service, as a list may deliver them.
  for (const [name, address] of [['web-a', '10.0.0.1'], ['web-b', '10.0.0.2'], ['web-c', '10.0.0.3']] as const) m.setSlice(`default/${name}`, sl(name, address));
  m.setService(id(web), web);
  m.flush();
  t.same(backends(), ['10.0.0.1', '10.0.0.2', '10.0.0.3'], 'three slices');
  m.setSlice('default/web-a', undefined);
  m.setSlice('default/web-c', undefined);
  m.flush();
  t.same(backends(), ['10.0.0.2'], 'down to one');
  m.setSlice('default/web-b', sl('web-b', '10.0.0.5'));
  m.flush();
  t.same(backends(), ['10.0.0.5'], 'the one left, replaced');
  m.setSlice('default/web-d', sl('web-d', '10.0.0.4'));
  m.flush();
  t.same(backends(), ['10.0.0.4', '10.0.0.5'], 'two again');
  m.setService(id(web), undefined);
  m.flush();
  t.equal(m.frontends.size, 0, 'no Service: no frontend, its slices kept');
  m.setService(id(web), web);
  m.flush();
  t.same(backends(), ['10.0.0.4', '10.0.0.5'], 'the Service back: the slices kept meanwhile serve it');

  // Three services claim one address:port; they leave one by one.
  const claimant = (name: string): Service => svc(service(name, ['10.96.0.10'], [{ name: 'http', port: 80 }]));
  for (const name of ['x2', 'x1']) m.setService(`default/${name}`, claimant(name));
  m.flush();
  const holder = (): string => fe(m.frontends, '10.96.0.10:80/TCP').service.name;
  t.equal(holder(), 'web', 'the holder keeps it');
  t.same(m.skipped().filter((s) => s.reason === 'conflict').map((s) => s.service).sort(), ['default/x1', 'default/x2'], 'both newcomers named');
  m.setService(id(web), undefined);
  m.flush();
  t.equal(holder(), 'x1', 'then the first by name');
  m.setService('default/x1', undefined);
  m.flush();
  t.equal(holder(), 'x2', 'then the last claimant');
  t.same(m.skipped().filter((s) => s.reason === 'conflict'), [], 'no conflict left');
  m.setService('default/x2', undefined);
  m.flush();
  t.equal(m.frontends.size, 0, 'nobody claims it');

  // A service with more frontends than a scan is kept for (indexed by key).
  const ports = Array.from({ length: 20 }, (_, i) => ({ name: `p${i}`, port: 1000 + i }));
  const many = svc(service('many', ['10.96.0.20'], ports));
  m.setService(id(many), many);
  m.setSlice('default/many-a', eps(slice('many-a', 'many', 'IPv4', ports.map((p) => ({ name: p.name, port: p.port + 1000 })), [{ addresses: ['10.0.1.1'] }])));
  t.equal(m.flush().changed.size, 20, 'twenty frontends');
  const before = new Map(m.frontends);
  m.setService(id(many), svc(service('many', ['10.96.0.20'], ports)));
  t.equal(m.flush().changed.size, 0, 'an equal Service changes none');
  for (const [key, f] of before) t.equal(m.frontends.get(key), f, `${key}: the same object`);
  const fewer = svc(service('many', ['10.96.0.20'], ports.slice(0, 3)));
  m.setService(id(many), fewer);
  t.equal(m.flush().changed.size, 17, 'seventeen ports gone');
  t.same([...m.frontends.keys()].sort(), ['10.96.0.20:1000/TCP', '10.96.0.20:1001/TCP', '10.96.0.20:1002/TCP']);
  t.equal(m.frontends.get('10.96.0.20:1000/TCP' as never), before.get('10.96.0.20:1000/TCP' as never), 'a port kept keeps its object');
});

t.test('model: a Node change recomputes every service only when its name or zone changes', async (t) => {
  const m = model(cluster().input);
  m.flush();
  m.setNode(node('n1', 'z1'));
  t.same(changedKeys(m), [], 'a new Node object with the same name and zone (a status update)');
  // A node that matters: internalTrafficPolicy Local follows the node.
  const local = svc(service('loc', ['10.96.0.20'], [{ name: 'p', port: 80 }], { internalTrafficPolicy: 'Local' }));
  const raw = slice('loc-1', 'loc', 'IPv4', [{ name: 'p', port: 8080 }], [{ addresses: ['10.0.0.4'] }]);
  const locSlice = eps({ ...raw, endpoints: raw.endpoints!.map((e) => ({ ...e, nodeName: 'n2' })) });
  m.setService(id(local), local);
  m.setSlice(id(locSlice), locSlice);
  t.same(changedKeys(m), ['10.96.0.20:80/TCP']);
  t.same(fe(m.frontends, '10.96.0.20:80/TCP').backends, [], 'n1: no local endpoint');
  m.setNode(node('n2', 'z1'));
  t.same(changedKeys(m), ['10.96.0.20:80/TCP'], 'every service recomputed, only the one that differs changed');
  t.same(fe(m.frontends, '10.96.0.20:80/TCP').backends.map((b) => b.address), ['10.0.0.4'], 'n2: its endpoint');
});

t.test('model: incremental results equal a whole computation; a held frontend stays with its holder, a free one goes by namespace/name', async (t) => {
  const { web, dns, webSlice, dnsSlice, input } = cluster();
  // b claims web:80 (b < web by name) and z claims dns's 53/UDP (dns < z).
  const b = svc(service('b', ['10.96.0.10'], [{ name: 'x', port: 80 }]));
  const z = svc(service('z', ['10.96.0.53'], [{ name: 'x', port: 53, protocol: 'UDP' }]));
  const WEB = '10.96.0.10:80/TCP';
  const DNS = '10.96.0.53:53/UDP';
  // Each step, and who must hold the two contested frontends after it.
  const steps: Array<[ModelInput, Record<string, string>]> = [
    [input, { [WEB]: 'web', [DNS]: 'dns' }],
    // b and z arrive: web and dns hold their frontends, so they keep them.
    [{ services: [z, dns, web, b], slices: [dnsSlice, webSlice], node: input.node! }, { [WEB]: 'web', [DNS]: 'dns' }],
    [{ services: [z, dns, web], slices: [dnsSlice, webSlice], node: input.node! }, { [WEB]: 'web', [DNS]: 'dns' }],
    // dns goes: its frontend is free, and z, its only claimant, takes it.
    [{ services: [z, web, b], slices: [dnsSlice, webSlice], node: input.node! }, { [WEB]: 'web', [DNS]: 'z' }],
    // dns returns: z holds 53/UDP now and keeps it.
    [{ services: [z, web, b, dns], slices: [webSlice, dnsSlice], node: input.node! }, { [WEB]: 'web', [DNS]: 'z' }],
  ];
  const m = new DesiredModel();
  m.setNode(input.node);
  let present = new Map<string, Service>();
  for (const [i, [step, holders]] of steps.entries()) {
    const next = new Map([...step.services].map((s) => [id(s), s]));
    for (const [k] of present) if (!next.has(k)) m.setService(k, undefined);
    for (const [k, s] of next) if (present.get(k) !== s) m.setService(k, s);
    for (const s of step.slices) m.setSlice(id(s), s);
    present = next;
    const before = new Map(m.frontends);
    const { changed } = m.flush();
    const whole = desiredState(step);
    const uncontested = (d: ReadonlyMap<string, Frontend>): Array<[string, Frontend]> =>
      [...d.entries()].filter(([k]) => !(k in holders)).sort(([a], [b]) => (a < b ? -1 : 1));
    t.same(uncontested(m.frontends), uncontested(whole.frontends), `step ${i}: the uncontested frontends equal a whole computation`);
    for (const [key, holder] of Object.entries(holders)) t.equal(fe(m.frontends, key).service.name, holder, `step ${i}: ${holder} holds ${key}`);
    const claimants: Record<string, string[]> = { [WEB]: ['web', 'b'], [DNS]: ['dns', 'z'] };
    const present_ = new Set([...step.services].map((s) => s.name));
    const losers = Object.entries(holders).flatMap(([key, holder]) => claimants[key]!.filter((n) => n !== holder && present_.has(n)).map((n) => `default/${n}`));
    t.same(
      m.skipped().filter((s) => s.reason === 'conflict').map((s) => s.service).sort(),
      losers.sort(),
      `step ${i}: every other claimant is reported as a conflict`,
    );
    for (const [key, f] of m.frontends) if (!changed.has(key)) t.equal(f, before.get(key), `step ${i}: ${key} unchanged, same object`);
    for (const key of before.keys()) if (!m.frontends.has(key)) t.ok(changed.has(key), `step ${i}: ${key} removed, named`);
  }
  t.same(m.skipped().map((s) => `${s.service} ${s.reason}`).sort(), ['default/b conflict', 'default/dns conflict']);

  // Nothing held yet (a start): the first by namespace/name, in any arrival order.
  for (const order of [[z, dns, web, b], [b, web, dns, z]]) {
    const cold = new DesiredModel();
    cold.setNode(input.node);
    for (const s of order) cold.setService(id(s), s);
    for (const s of [dnsSlice, webSlice]) cold.setSlice(id(s), s);
    cold.flush();
    t.equal(fe(cold.frontends, WEB).service.name, 'b', `at start, b (first by name) takes ${WEB} (order ${order.map((s) => s.name).join(',')})`);
    t.equal(fe(cold.frontends, DNS).service.name, 'dns', `at start, dns takes ${DNS} over z`);
  }
});

t.test('model: a skip is reported by the flush where it first appears', async (t) => {
  const m = new DesiredModel();
  const headless = svc(service('h', [], [{ name: 'x', port: 80 }]));
  m.setService(id(headless), headless);
  t.same(m.flush().newSkips.map((s) => s.reason), ['headless']);
  m.setService(id(headless), headless);
  t.same(m.flush().newSkips, [], 'still skipped: not reported again');
  const a = svc(service('a', ['10.96.0.1'], [{ name: 'x', port: 80 }]));
  const c = svc(service('c', ['10.96.0.1'], [{ name: 'x', port: 80 }]));
  m.setService(id(c), c);
  m.flush();
  m.setService(id(a), a);
  t.same(m.flush().newSkips.map((s) => `${s.service} ${s.reason}`), ['default/a conflict'], 'a newcomer is refused the frontend c holds, first by name or not');
});

t.test(`model: more than ${MAX_SLICES_PER_SERVICE} EndpointSlices for one Service: the first ${MAX_SLICES_PER_SERVICE} by name are used, and it is said`, async (t) => {
  const m = new DesiredModel();
  const web = svc(service('web', ['10.96.0.10'], [{ name: 'http', port: 80 }]));
  m.setService(id(web), web);
  // Added in reverse name order: which ones count must not depend on arrival.
  for (let i = MAX_SLICES_PER_SERVICE + 4; i >= 0; i--) {
    const s = eps(slice(`web-${String(i).padStart(5, '0')}`, 'web', 'IPv4', [{ name: 'http', port: 8080 }], [{ addresses: [`10.1.${i >> 8}.${i & 255}`] }]));
    m.setSlice(id(s), s);
  }
  const { newSkips } = m.flush();
  t.same(newSkips.map((s) => [s.service, s.reason]), [['default/web', 'limit']]);
  t.match(newSkips[0]!.detail, `${MAX_SLICES_PER_SERVICE + 5} EndpointSlices, more than ${MAX_SLICES_PER_SERVICE}`);
  const backends = fe(m.frontends, '10.96.0.10:80/TCP').backends;
  t.equal(backends.length, MAX_SLICES_PER_SERVICE, 'one backend from each slice used');
  t.notOk(backends.some((b) => b.address === `10.1.3.${(MAX_SLICES_PER_SERVICE + 4) & 255}`), 'the last slices by name are left out');
});

t.test('model: a Service whose computation throws keeps its frontends, is reported, and the others are computed', async (t) => {
  const m = new DesiredModel();
  const web = svc(service('web', ['10.96.0.10'], [{ name: 'http', port: 80 }]));
  const dns = svc(service('dns', ['10.96.0.53'], [{ name: 'dns', port: 53, protocol: 'UDP' }]));
  m.setService(id(web), web);
  m.setService(id(dns), dns);
  m.flush();
  const held = fe(m.frontends, '10.96.0.10:80/TCP');
  // An object the validators would never produce: its ports throw when read.
  const poisoned = Object.create(web, { ports: { get(): never { throw new Error('poisoned'); } } }) as Service;
  const dns2 = svc(service('dns', ['10.96.0.54'], [{ name: 'dns', port: 53, protocol: 'UDP' }]));
  m.setService(id(web), poisoned);
  m.setService(id(dns2), dns2);
  const { newSkips } = m.flush();
  t.same(newSkips.map((s) => [s.service, s.reason]), [['default/web', 'error']]);
  t.match(newSkips[0]!.detail, /poisoned/);
  t.equal(m.frontends.get('10.96.0.10:80/TCP' as never), held, 'web keeps the frontend it had');
  t.ok(m.frontends.has('10.96.0.54:53/UDP' as never), 'dns moved in the same flush');
});

// North-south: NodePort, LoadBalancer and external IP frontends beside the
// ClusterIP ones (src/model/north-south.ts read by validateService, the
// range and the frontends in from-k8s.ts, conflicts in desired.ts).

const keysOf = (d: DesiredState): string[] => [...d.keys()].sort();
const backendsOf = (d: DesiredState, key: string): string[] => fe(d, key).backends.map((b) => `${b.address}:${b.port}`);
const WEB_SLICES = [
  eps(slice('web-v4', 'web', 'IPv4', [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }], [{ addresses: ['10.0.0.2'] }, { addresses: ['10.0.0.3'] }])),
  eps(slice('web-v6', 'web', 'IPv6', [{ name: 'http', port: 8080 }], [{ addresses: ['fd00::2'] }])),
];

t.test('north-south: a NodePort service gets a NodePort frontend per family and port, with the backends of its ClusterIP frontend', async (t) => {
  const np = svc(
    service('web', ['10.96.0.10', 'fd00:96::10'], [
      { name: 'http', port: 80, targetPort: 'http', nodePort: 30080 },
      { name: 'dns', port: 53, protocol: 'UDP', nodePort: 30053 },
    ], { type: 'NodePort' }),
  );
  const out = desiredState({ services: [np], slices: WEB_SLICES });
  t.same(keysOf(out.frontends), [
    '0.0.0.0:30053/UDP',
    '0.0.0.0:30080/TCP',
    '10.96.0.10:53/UDP',
    '10.96.0.10:80/TCP',
    '[::]:30053/UDP',
    '[::]:30080/TCP',
    '[fd00:96::10]:53/UDP',
    '[fd00:96::10]:80/TCP',
  ]);
  t.same(out.skipped, []);
  for (const [nodePort, clusterIP] of [['0.0.0.0:30080/TCP', '10.96.0.10:80/TCP'], ['0.0.0.0:30053/UDP', '10.96.0.10:53/UDP'], ['[::]:30080/TCP', '[fd00:96::10]:80/TCP']] as const) {
    t.same(backendsOf(out.frontends, nodePort), backendsOf(out.frontends, clusterIP), `${nodePort}: the backends of ${clusterIP}`);
  }
  t.same(backendsOf(out.frontends, '0.0.0.0:30080/TCP'), ['10.0.0.2:8080', '10.0.0.3:8080'], 'the named targetPort resolved per slice');
  t.same(backendsOf(out.frontends, '0.0.0.0:30053/UDP'), ['10.0.0.2:5353', '10.0.0.3:5353']);
  const n = fe(out.frontends, '0.0.0.0:30080/TCP');
  t.match(n, { address: '0.0.0.0', family: 4, port: 30080, protocol: 'TCP', type: 'NodePort', externalLocal: false, sourceRanges: [], service: { name: 'web', portName: 'http' } });
  t.equal(n.scope, undefined, 'the external scope: no scope');
  const c = fe(out.frontends, '10.96.0.10:80/TCP');
  t.match(c, { type: 'ClusterIP', externalLocal: false, sourceRanges: [], healthCheckNodePort: undefined, scope: undefined });
});

t.test('north-south: the key text of a ClusterIP frontend is what it always was, whatever else the service asks for', async (t) => {
  const plain = desiredState({ services: [svc(service('web', ['10.96.0.10', 'fd00:96::10'], [{ name: 'http', port: 80 }, { name: 'dns', port: 53, protocol: 'UDP' }]))], slices: WEB_SLICES });
  const KEYS = ['10.96.0.10:53/UDP', '10.96.0.10:80/TCP', '[fd00:96::10]:53/UDP', '[fd00:96::10]:80/TCP'];
  t.same(keysOf(plain.frontends), KEYS);
  const lb = desiredState({
    services: [svc({ ...service('web', ['10.96.0.10', 'fd00:96::10'], [{ name: 'http', port: 80, nodePort: 30080 }, { name: 'dns', port: 53, protocol: 'UDP', nodePort: 30053 }], { type: 'LoadBalancer', externalTrafficPolicy: 'Local', externalIPs: ['192.0.2.10'] }), status: { loadBalancer: { ingress: [{ ip: '198.51.100.7' }] } } })],
    slices: WEB_SLICES,
  });
  const clusterIPs = [...lb.frontends.values()].filter((f) => f.type === 'ClusterIP').map((f) => f.key).sort();
  t.same(clusterIPs, KEYS);
  for (const key of KEYS) t.same(fe(lb.frontends, key), fe(plain.frontends, key), `${key}: the same frontend, field by field`);
});

t.test('north-south: LoadBalancer ingress IPs and external IPs get frontends at the service port; ipMode Proxy and other families do not', async (t) => {
  const raw = {
    ...service('web', ['10.96.0.10'], [{ name: 'http', port: 80, nodePort: 30080 }], {
      type: 'LoadBalancer',
      externalIPs: ['192.0.2.10', 'fd00::10'],
      loadBalancerSourceRanges: ['203.0.113.0/24'],
    }),
    status: { loadBalancer: { ingress: [{ ip: '198.51.100.7' }, { ip: '198.51.100.8', ipMode: 'Proxy' }, { hostname: 'lb.example.com' }] } },
  };
  const out = desiredState({ services: [svc(raw)], slices: WEB_SLICES });
  t.same(keysOf(out.frontends), ['0.0.0.0:30080/TCP', '10.96.0.10:80/TCP', '192.0.2.10:80/TCP', '198.51.100.7:80/TCP']);
  const lbFe = fe(out.frontends, '198.51.100.7:80/TCP');
  t.match(lbFe, { type: 'LoadBalancer', port: 80, sourceRanges: [{ family: 4, address: '203.0.113.0', prefixLen: 24 }] });
  t.same(backendsOf(out.frontends, '198.51.100.7:80/TCP'), ['10.0.0.2:8080', '10.0.0.3:8080']);
  t.match(fe(out.frontends, '192.0.2.10:80/TCP'), { type: 'ExternalIP', port: 80, sourceRanges: [] });
  t.same(fe(out.frontends, '0.0.0.0:30080/TCP').sourceRanges, [], 'source ranges guard LoadBalancer addresses only, as kube-proxy');
  t.same(
    out.skipped.map((s) => [s.service, s.reason, s.detail]),
    [
      ['default/web', 'ignored-field', 'Service default/web: spec.externalIPs[1] fd00::10 is IPv6, a family the service does not have: not served'],
      ['default/web', 'ignored-field', 'Service default/web: status.loadBalancer.ingress[2] has only a hostname ("lb.example.com"): not served (kube-proxy serves IPs only)'],
    ],
    'each bad value named with the service; the rest served',
  );
  const clusterOnly = desiredState({ services: [svc(service('ext', ['10.96.0.11'], [{ name: 'http', port: 80 }], { externalIPs: ['192.0.2.11'] }))], slices: [] });
  t.same(keysOf(clusterOnly.frontends), ['10.96.0.11:80/TCP', '192.0.2.11:80/TCP'], 'a ClusterIP service with external IPs: those too, and no NodePort');
});

t.test('north-south: source ranges failing closed drop the LoadBalancer frontends only', async (t) => {
  const raw = {
    ...service('web', ['10.96.0.10'], [{ name: 'http', port: 80, nodePort: 30080 }], { type: 'LoadBalancer', externalIPs: ['192.0.2.10'], loadBalancerSourceRanges: ['nonsense'] }),
    status: { loadBalancer: { ingress: [{ ip: '198.51.100.7' }] } },
  };
  const out = desiredState({ services: [svc(raw)], slices: WEB_SLICES });
  t.same(keysOf(out.frontends), ['0.0.0.0:30080/TCP', '10.96.0.10:80/TCP', '192.0.2.10:80/TCP'], 'no 198.51.100.7: closed rather than open to all');
  t.match(out.skipped.map((s) => s.detail), [/loadBalancerSourceRanges\[0\] "nonsense" is not a CIDR/, /no valid spec.loadBalancerSourceRanges: its LoadBalancer addresses are not served/]);
  const open = desiredState({ services: [svc({ ...raw, spec: { ...raw.spec, loadBalancerSourceRanges: ['nonsense', '203.0.113.0/24'] } })], slices: WEB_SLICES });
  t.ok(open.frontends.has('198.51.100.7:80/TCP' as never), 'one valid range: served, with that range');
});

t.test('north-south: a nodePort outside --nodeport-range is reported and left out, the rest of the service served', async (t) => {
  const raw = service('web', ['10.96.0.10'], [{ name: 'http', port: 80, nodePort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP', nodePort: 30053 }], { type: 'NodePort' });
  const out = desiredState({ services: [svc(raw)], slices: WEB_SLICES });
  t.same(keysOf(out.frontends), ['0.0.0.0:30053/UDP', '10.96.0.10:53/UDP', '10.96.0.10:80/TCP']);
  t.same(out.skipped, [{ service: 'default/web', reason: 'ignored-field', detail: 'Service default/web: spec.ports[0].nodePort 8080 is outside --nodeport-range 30000-32767: not served' }]);
  const wide = desiredState({ services: [svc(raw)], slices: WEB_SLICES, nodePortRange: { first: 8000, last: 32767 } });
  t.same(keysOf(wide.frontends), ['0.0.0.0:30053/UDP', '0.0.0.0:8080/TCP', '10.96.0.10:53/UDP', '10.96.0.10:80/TCP'], 'another range (desiredState input)');
  t.same(wide.skipped, []);
  const m = new DesiredModel({ nodePortRange: { first: 8000, last: 9000 } });
  m.setService('default/web', svc(raw));
  const { newSkips } = m.flush();
  t.same(keysOf(m.frontends), ['0.0.0.0:8080/TCP', '10.96.0.10:53/UDP', '10.96.0.10:80/TCP'], 'DesiredModel option');
  t.match(newSkips, [{ reason: 'ignored-field', detail: /spec.ports\[1\].nodePort 30053 is outside --nodeport-range 8000-9000/ }]);
  t.same(svc(raw).northSouth.problems, [], 'the Service itself keeps every valid nodePort: the range is the model\'s');
});

t.test('north-south: two services on one nodePort: the first by namespace/name serves it, the other is named', async (t) => {
  const a = svc(service('a', ['10.96.0.1'], [{ name: 'http', port: 80, nodePort: 30080 }], { type: 'NodePort' }));
  const b = svc(service('b', ['10.96.0.2'], [{ name: 'http', port: 8080, nodePort: 30080 }, { name: 'udp', port: 8080, protocol: 'UDP', nodePort: 30080 }], { type: 'NodePort' }));
  for (const order of [[a, b], [b, a]]) {
    const out = desiredState({ services: order, slices: [] });
    t.equal(fe(out.frontends, '0.0.0.0:30080/TCP').service.name, 'a', `a holds 30080/TCP (order ${order.map((s) => s.name).join(',')})`);
    t.equal(fe(out.frontends, '0.0.0.0:30080/UDP').service.name, 'b', 'the same number over UDP is another port');
    t.ok(out.frontends.has('10.96.0.2:8080/TCP' as never), 'b keeps its ClusterIP frontends');
    t.same(out.skipped, [{ service: 'default/b', reason: 'conflict', detail: 'nodePort 30080/TCP (0.0.0.0:30080/TCP) is already served for default/a' }]);
  }
});

t.test('north-south: an internal-scope twin goes with its external frontend, never to a service that lost it', async (t) => {
  const ext = (name: string, etp: string): Service =>
    svc(service(name, [name === 'a' ? '10.96.0.1' : '10.96.0.2'], [{ name: 'http', port: 80 }], { externalIPs: ['192.0.2.10'], externalTrafficPolicy: etp }));
  const m = new DesiredModel();
  m.setService('default/b', ext('b', 'Cluster'));
  m.flush();
  // a (first by name) arrives with eTP Local: b holds 192.0.2.10:80 and keeps it; a's twin goes to nobody.
  m.setService('default/a', ext('a', 'Local'));
  const first = m.flush();
  t.equal(fe(m.frontends, '192.0.2.10:80/TCP').service.name, 'b');
  t.notOk(m.frontends.has('192.0.2.10:80/TCP/internal' as never), 'no twin without its external entry');
  t.same(first.newSkips.map((s) => [s.service, s.detail]), [['default/a', '192.0.2.10:80/TCP is already served for default/b']], 'one conflict, for the external key');
  // b goes: a takes the external key and, with it, the twin (which only the external key's change touches).
  m.setService('default/b', undefined);
  t.same([...m.flush().changed].sort(), ['10.96.0.2:80/TCP', '192.0.2.10:80/TCP', '192.0.2.10:80/TCP/internal']);
  t.equal(fe(m.frontends, '192.0.2.10:80/TCP').service.name, 'a');
  t.equal(fe(m.frontends, '192.0.2.10:80/TCP/internal').service.name, 'a');
  t.same(m.skipped(), [], 'nothing left in conflict');
  // b returns with Local: a holds both; b is named once.
  m.setService('default/b', ext('b', 'Local'));
  const back = m.flush();
  t.equal(fe(m.frontends, '192.0.2.10:80/TCP/internal').service.name, 'a');
  t.same(back.newSkips.map((s) => [s.service, s.detail]), [['default/b', '192.0.2.10:80/TCP is already served for default/a']]);
  // a switches to Cluster: its twin goes, and b's twin does not come with a's external key.
  m.setService('default/a', ext('a', 'Cluster'));
  t.same([...m.flush().changed].sort(), ['192.0.2.10:80/TCP', '192.0.2.10:80/TCP/internal']);
  t.equal(fe(m.frontends, '192.0.2.10:80/TCP').service.name, 'a');
  t.notOk(m.frontends.has('192.0.2.10:80/TCP/internal' as never));
});

t.test('north-south: a change of what lbctl programs for a frontend changes it; an equal recomputation keeps the object', async (t) => {
  const base = service('web', ['10.96.0.10'], [{ name: 'http', port: 80, nodePort: 30080 }], { type: 'LoadBalancer', loadBalancerSourceRanges: ['203.0.113.0/24'] });
  const withIngress = (spec: Partial<NonNullable<typeof base.spec>>) => svc({ ...base, spec: { ...base.spec, ...spec }, status: { loadBalancer: { ingress: [{ ip: '198.51.100.7' }] } } });
  const m = new DesiredModel();
  m.setService('default/web', withIngress({}));
  m.flush();
  const before = new Map(m.frontends);
  m.setService('default/web', withIngress({}));
  t.same([...m.flush().changed], [], 'equal: nothing changed');
  for (const [k, f] of m.frontends) t.equal(f, before.get(k), `${k}: same object`);
  m.setService('default/web', withIngress({ loadBalancerSourceRanges: ['203.0.114.0/24'] }));
  t.same([...m.flush().changed], ['198.51.100.7:80/TCP'], 'other source ranges: the LoadBalancer frontend');
  m.setService('default/web', withIngress({ loadBalancerSourceRanges: ['203.0.114.0/24'], externalTrafficPolicy: 'Local', healthCheckNodePort: 32000 }));
  t.same([...m.flush().changed].sort(), ['0.0.0.0:30080/TCP', '0.0.0.0:30080/TCP/internal', '198.51.100.7:80/TCP', '198.51.100.7:80/TCP/internal'], 'eTP Local: the external entries change and gain twins');
  t.equal(fe(m.frontends, '198.51.100.7:80/TCP').healthCheckNodePort, 32000);
  t.equal(fe(m.frontends, '10.96.0.10:80/TCP').healthCheckNodePort, undefined, 'not on the ClusterIP frontend');
});

t.test('north-south: an address the service already serves on that port keeps its first frontend (cluster IP, then external IP, then LoadBalancer)', async (t) => {
  const raw = {
    ...service('web', ['10.96.0.10'], [{ name: 'http', port: 80 }], { type: 'LoadBalancer', externalIPs: ['10.96.0.10', '192.0.2.10'] }),
    status: { loadBalancer: { ingress: [{ ip: '192.0.2.10' }, { ip: '198.51.100.7' }] } },
  };
  const out = desiredState({ services: [svc(raw)], slices: WEB_SLICES });
  t.same([...out.frontends.values()].map((f) => [f.key, f.type]).sort(), [
    ['10.96.0.10:80/TCP', 'ClusterIP'],
    ['192.0.2.10:80/TCP', 'ExternalIP'],
    ['198.51.100.7:80/TCP', 'LoadBalancer'],
  ]);
  t.same(out.skipped, [], 'not a conflict: one service');
});
