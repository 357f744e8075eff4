// What a Service asks of the tc datapath (src/model/north-south.ts), read
// as kube-proxy reads it, with issue 14's bad input: each bad value named
// by service and field while the rest is served; source ranges fail closed.
import t from 'tap';
import { checkDisjoint, parsePortRange } from '../../src/cli/flags.js';
import { nodePortConflicts, northSouth, parseCidr } from '../../src/model/north-south.js';

const ID = 'Service default/web';
const lb = (spec: Record<string, unknown>, ingress?: unknown[]) => ({ spec: { type: 'LoadBalancer', ...spec }, ...(ingress ? { status: { loadBalancer: { ingress } } } : {}) });

t.test('NodePorts: valid ones in the range, the rest named and left out', async (t) => {
  const ns = northSouth({ spec: { type: 'NodePort', ports: [
    { port: 80, protocol: 'TCP', nodePort: 30080 },
    { port: 53, protocol: 'UDP', nodePort: 30053 },
    { port: 81, nodePort: 80 },
    { port: 82, nodePort: 'x' },
    { port: 83 },
  ] } }, ID, [4]);
  t.same(ns.nodePorts, [{ port: 80, protocol: 'TCP', nodePort: 30080, index: 0 }, { port: 53, protocol: 'UDP', nodePort: 30053, index: 1 }]);
  t.same(ns.problems, [
    'Service default/web: spec.ports[2].nodePort 80 is outside --nodeport-range 30000-32767: not served',
    'Service default/web: spec.ports[3].nodePort "x" is not a port',
  ]);
  t.same(northSouth({ spec: { type: 'ClusterIP', ports: [{ port: 80, nodePort: 30080 }] } }, ID, [4]).nodePorts, [], 'a ClusterIP service has none');
  t.same(northSouth({ spec: { type: 'NodePort', ports: [{ port: 80, nodePort: 2000 }] } }, ID, [4], { first: 1000, last: 3000 }).nodePorts.length, 1, 'another --nodeport-range');
});

t.test('externalIPs and LoadBalancer ingress: IPs of the service\'s families; hostnames and other families named', async (t) => {
  const ns = northSouth(lb({ externalIPs: ['192.0.2.10', 'fd00::10', 'nope', '192.0.2.10'] }, [
    { ip: '198.51.100.7' },
    { hostname: 'lb.example.com' },
    { ip: '198.51.100.8', ipMode: 'Proxy' },
    { ip: 'bogus' },
  ]), ID, [4]);
  t.same(ns.externalIPs.map((e) => e.address), ['192.0.2.10']);
  t.same(ns.loadBalancerIPs, [{ address: '198.51.100.7', family: 4, ipMode: 'VIP' }, { address: '198.51.100.8', family: 4, ipMode: 'Proxy' }]);
  t.same(ns.problems, [
    'Service default/web: spec.externalIPs[1] fd00::10 is IPv6, a family the service does not have: not served',
    'Service default/web: spec.externalIPs[2] "nope" is not an IP address',
    'Service default/web: status.loadBalancer.ingress[1] has only a hostname ("lb.example.com"): not served (kube-proxy serves IPs only)',
    'Service default/web: status.loadBalancer.ingress[3].ip "bogus" is not an IP address',
  ]);
  t.same(northSouth({ spec: { type: 'NodePort' }, status: { loadBalancer: { ingress: [{ ip: '198.51.100.7' }] } } }, ID, [4]).loadBalancerIPs, [], 'ingress only for LoadBalancer services');
});

t.test('externalTrafficPolicy and healthCheckNodePort', async (t) => {
  const local = northSouth(lb({ externalTrafficPolicy: 'Local', healthCheckNodePort: 32000 }), ID, [4]);
  t.equal(local.externalTrafficPolicy, 'Local');
  t.equal(local.healthCheckNodePort, 32000);
  t.equal(northSouth(lb({ externalTrafficPolicy: 'Cluster', healthCheckNodePort: 32000 }), ID, [4]).healthCheckNodePort, undefined, 'only with Local');
  const bad = northSouth(lb({ externalTrafficPolicy: 'Sideways', healthCheckNodePort: 70000 }), ID, [4]);
  t.equal(bad.externalTrafficPolicy, 'Cluster');
  t.same(bad.problems, ['Service default/web: spec.externalTrafficPolicy "Sideways" is not Cluster or Local: Cluster used']);
  t.match(northSouth(lb({ externalTrafficPolicy: 'Local', healthCheckNodePort: 70000 }), ID, [4]).problems, [/healthCheckNodePort 70000 is not a port: no health check server/]);
});

t.test('loadBalancerSourceRanges: valid ones kept canonical; none valid fails closed', async (t) => {
  const ns = northSouth(lb({ loadBalancerSourceRanges: ['10.1.2.3/8', ' 192.168.0.0/16 ', 'fd00::1/64', 'x/33'] }), ID, [4, 6]);
  t.same(ns.sourceRanges, [{ family: 4, address: '10.0.0.0', prefixLen: 8 }, { family: 4, address: '192.168.0.0', prefixLen: 16 }, { family: 6, address: 'fd00::', prefixLen: 64 }]);
  t.notOk(ns.sourceRangesFailClosed);
  t.same(ns.problems, ['Service default/web: spec.loadBalancerSourceRanges[3] "x/33" is not a CIDR']);
  const closed = northSouth(lb({ loadBalancerSourceRanges: ['10.0.0.0/33'] }), ID, [4]);
  t.ok(closed.sourceRangesFailClosed, 'given but none valid: closed');
  t.match(closed.problems.at(-1), /no valid spec.loadBalancerSourceRanges: its LoadBalancer addresses are not served/);
  t.notOk(northSouth(lb({}), ID, [4]).sourceRangesFailClosed, 'none given: open to all, as kube-proxy');
  t.equal(parseCidr('10.0.0.0'), undefined, 'a bare address is not a CIDR');
});

t.test('two services on one nodePort: the first by name keeps it, the other is named', async (t) => {
  const problems = nodePortConflicts([
    { id: 'Service b/two', nodePorts: [{ port: 80, protocol: 'TCP', nodePort: 30080 }] },
    { id: 'Service a/one', nodePorts: [{ port: 80, protocol: 'TCP', nodePort: 30080 }, { port: 53, protocol: 'UDP', nodePort: 30080 }] },
  ]);
  t.same([...problems], [['Service b/two', ["Service b/two: nodePort 30080/TCP is already Service a/one's: not served"]]], 'the same number over UDP is another port');
});

t.test('port range flags: parsed, and refused when malformed or overlapping, naming the flags', async (t) => {
  t.same(parsePortRange('--nodeport-range', '30000-32767'), { first: 30000, last: 32767 });
  t.throws(() => parsePortRange('--nodeport-range', '32767-30000'), { code: 'ECONFIG', message: /--nodeport-range "32767-30000": expected FIRST-LAST/ });
  t.throws(() => parsePortRange('--snat-port-range', '0-10'), { code: 'ECONFIG' });
  t.doesNotThrow(() => checkDisjoint({ flag: '--nodeport-range', range: { first: 30000, last: 32767 } }, { flag: '--snat-port-range', range: { first: 61000, last: 65535 } }));
  t.throws(() => checkDisjoint({ flag: '--nodeport-range', range: { first: 30000, last: 32767 } }, { flag: '--snat-port-range', range: { first: 32000, last: 33000 } }), {
    code: 'ECONFIG',
    message: '--nodeport-range 30000-32767 overlaps --snat-port-range 32000-33000: they must not share a port',
  });
});

t.test('a list of a million entries costs what 1,024 do, and says so once', async (t) => {
  const many = Array.from({ length: 1_000_000 }, (_, i) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`);
  const ns = northSouth(lb({ externalIPs: many, loadBalancerSourceRanges: many.map((a) => `${a}/32`) }), ID, [4]);
  t.equal(ns.externalIPs.length, 1024);
  t.equal(ns.sourceRanges.length, 1024);
  t.same(ns.problems, [
    'Service default/web: spec.externalIPs has 1000000 entries; the first 1024 are read',
    'Service default/web: spec.loadBalancerSourceRanges has 1000000 entries; the first 1024 are read',
  ]);
});

t.test('SCTP NodePorts are served as TCP and UDP ones (kube-proxy proxies them)', async (t) => {
  const ns = northSouth({ spec: { type: 'NodePort', ports: [{ port: 3868, protocol: 'SCTP', nodePort: 30868 }, { port: 3868, protocol: 'TCP', nodePort: 30869 }] } }, ID, [4]);
  t.same(ns.nodePorts, [{ port: 3868, protocol: 'SCTP', nodePort: 30868, index: 0 }, { port: 3868, protocol: 'TCP', nodePort: 30869, index: 1 }]);
  t.same(ns.problems, []);
  t.same(nodePortConflicts([{ id: 'a', nodePorts: [{ port: 1, protocol: 'SCTP', nodePort: 30001 }] }, { id: 'b', nodePorts: [{ port: 1, protocol: 'TCP', nodePort: 30001 }] }]).size, 0,
    'one nodePort number for SCTP and TCP is no conflict: the protocol is part of the key');
});
