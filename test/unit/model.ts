import t from 'tap';
import { desiredState } from '../../src/model/from-k8s.js';
import { validateEndpointSlice, validateService, type EndpointSlice, type Service } from '../../src/model/k8s.js';
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
