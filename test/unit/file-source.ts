import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import t from 'tap';
import { FileSource } from '../../src/sources/file.js';
import type { EndpointSlice, Service } from '../../src/model/k8s.js';
import type { Problem, SourceEvent } from '../../src/sources/source.js';

const SVC = (name: string, ip: string, port = 80) => `apiVersion: v1
kind: Service
metadata: {name: ${name}, namespace: default}
spec:
  clusterIP: ${ip}
  ports: [{name: http, port: ${port}, protocol: TCP}]
`;
const SLICE = (name: string, svc: string, addr: string) => `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ${name}, namespace: default, labels: {kubernetes.io/service-name: ${svc}}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [${addr}]}]
`;

/** What the events sent so far add up to, as the agent's model sees it. */
class Collected {
  readonly services = new Map<string, Service>();
  readonly slices = new Map<string, EndpointSlice>();
  readonly events: SourceEvent[] = [];
  readonly on = (e?: SourceEvent): void => {
    if (!e) return;
    this.events.push(e);
    if (e.kind === 'Service') e.object ? this.services.set(e.id, e.object) : this.services.delete(e.id);
    else if (e.kind === 'EndpointSlice') e.object ? this.slices.set(e.id, e.object) : this.slices.delete(e.id);
  };
  names(): string[] {
    return [...this.services.values()].map((s) => s.name).sort();
  }
}

function setup(t: { teardown(fn: () => void): void }) {
  const dir = mkdtempSync(path.join(tmpdir(), 'lbctl-file-source-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const problems: Problem[] = [];
  const src = new FileSource({ dir, debounceMs: 10, onProblem: (p) => problems.push(p) });
  t.teardown(() => src.stop());
  const got = new Collected();
  return { dir, src, problems, got, write: (f: string, s: string) => writeFileSync(path.join(dir, f), s) };
}

t.test('several documents per file, several files, List objects, other kinds ignored', async (t) => {
  const { src, write, problems, got } = setup(t);
  write('a.yaml', `${SVC('web', '10.96.0.10')}---\n${SLICE('web-1', 'web', '10.0.0.2')}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n`);
  write('b.json', JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [{ apiVersion: 'v1', kind: 'Service', metadata: { name: 'dns' }, spec: { clusterIP: '10.96.0.53', ports: [{ port: 53, protocol: 'UDP' }] } }] }));
  write('notes.txt', 'ignored');
  await src.start(got.on);
  t.same(got.names(), ['dns', 'web']);
  t.same([...got.slices.keys()], ['default/web-1']);
  t.ok(src.status().complete);
  t.same(problems, []);
});

t.test('a malformed document is reported with file, index and reason; the rest is served', async (t) => {
  const { dir, src, write, problems, got } = setup(t);
  write('a.yaml', `${SVC('web', '10.96.0.10')}---\n${SVC('bad', '10.96.0.11', 70000)}---\nkind: Service\nmetadata: {name: x\n`);
  write('b.yaml', SVC('other', '10.96.0.12'));
  await src.start(got.on);
  t.same(got.names(), ['other', 'web']);
  t.match(problems, [
    { where: `${path.join(dir, 'a.yaml')}: document 1`, reason: /spec\.ports\[0\]\.port 70000 is not a port/ },
    { where: `${path.join(dir, 'a.yaml')}: document 2`, reason: /YAML error/ },
  ]);
  t.notOk(src.status().complete, 'a document that is not YAML makes the source incomplete');
});

t.test('a file that turns bad keeps its last good objects; an object that turns invalid keeps its last valid version', async (t) => {
  const { src, write, problems, got } = setup(t);
  write('a.yaml', SVC('web', '10.96.0.10'));
  write('b.yaml', SVC('dns', '10.96.0.53'));
  await src.start(got.on);
  const sent = got.events.length;
  write('a.yaml', 'kind: Service\nmetadata: [unclosed\n');
  write('b.yaml', SVC('dns', 'not-an-ip'));
  await src.reload();
  t.same([...got.services.values()].map((s) => `${s.name} ${s.clusterIPs[0]?.address}`).sort(), ['dns 10.96.0.53', 'web 10.96.0.10']);
  t.equal(got.events.length, sent, 'nothing was sent: every object kept its last good version');
  t.ok(src.status().complete, 'the bad file had a good read before');
  t.match(problems.map((p) => p.reason), [/YAML error/, /not an IP address \(keeping its last valid version\)/]);
});

t.test('changes are noticed and reported through onChange', async (t) => {
  const { src, write, got } = setup(t);
  write('a.yaml', SVC('web', '10.96.0.10'));
  let changed!: () => void;
  const seen = new Promise<void>((resolve) => (changed = resolve));
  let started = false;
  await src.start((e) => {
    got.on(e);
    if (started && !e) changed();
  });
  started = true;
  const sent = got.events.length;
  write('a.yaml', `${SVC('web', '10.96.0.10')}---\n${SVC('web2', '10.96.0.20')}`);
  await seen;
  t.same(got.names(), ['web', 'web2']);
  t.same(got.events.slice(sent).map((e) => `${e.type} ${e.kind} ${e.id}`), ['add Service default/web2'], 'one event: the unchanged web is not sent again');
});

t.test('a deleted file takes its objects with it', async (t) => {
  const { dir, src, write, got } = setup(t);
  write('a.yaml', SVC('web', '10.96.0.10'));
  write('b.yaml', SVC('dns', '10.96.0.53'));
  await src.start(got.on);
  rmSync(path.join(dir, 'b.yaml'));
  await src.reload();
  t.same(got.names(), ['web']);
  t.same(got.events.at(-1), { kind: 'Service', type: 'delete', id: 'default/dns' });
});

t.test('a problem is reported when it appears, not again on every re-read of the directory', async (t) => {
  const { dir, src, write, problems, got } = setup(t);
  write('a.yaml', SVC('web', '10.96.0.10'));
  write('b.yaml', SVC('web', '10.96.0.10'));
  write('c.yaml', SVC('bad', 'not-an-ip'));
  await src.start(got.on);
  const first = problems.map((p) => `${p.where}: ${p.category}`);
  t.same(first.sort(), [`${path.join(dir, 'a.yaml')}: duplicate`, `${path.join(dir, 'c.yaml')}: document 0: invalid`]);
  write('d.yaml', SVC('other', '10.96.0.20'));
  await src.reload();
  await src.reload();
  t.equal(problems.length, first.length, 'neither the duplicate nor the unchanged bad file is reported again');
  rmSync(path.join(dir, 'b.yaml'));
  await src.reload();
  t.equal(problems.length, first.length, 'a duplicate that went away is not reported');
  write('b.yaml', SVC('web', '10.96.0.10'));
  await src.reload();
  t.match(problems.slice(first.length), [{ where: path.join(dir, 'b.yaml'), category: 'duplicate', reason: /also defined in .*a\.yaml/ }], 'one that comes back is reported again, once');
  t.equal(problems.length, first.length + 1);
  t.same(got.names(), ['other', 'web']);
});

t.test('north-south Service fields pass through: NodePort, LoadBalancer with ingress, externalIPs, traffic policy, source ranges, health check port', async (t) => {
  const { src, write, problems, got } = setup(t);
  write('lb.yaml', `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}]
  externalIPs: [192.0.2.10]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  loadBalancerSourceRanges: [203.0.113.0/24]
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.7}, {ip: 198.51.100.8, ipMode: Proxy}]
---
apiVersion: v1
kind: Service
metadata: {name: np, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.11
  ports: [{port: 53, protocol: UDP, nodePort: 30053}]
`);
  write('web.json', JSON.stringify({
    apiVersion: 'v1', kind: 'Service', metadata: { name: 'json' },
    spec: { type: 'NodePort', clusterIP: '10.96.0.12', ports: [{ port: 443, nodePort: 30443 }] },
  }));
  await src.start(got.on);
  t.same(problems, []);
  t.same(got.names(), ['json', 'np', 'web']);
  const web = got.services.get('default/web')!;
  t.equal(web.type, 'LoadBalancer');
  t.same(web.northSouth.nodePorts, [{ port: 80, protocol: 'TCP', nodePort: 30080, index: 0 }]);
  t.same(web.northSouth.externalIPs, [{ address: '192.0.2.10', family: 4 }]);
  t.same(web.northSouth.loadBalancerIPs, [{ address: '198.51.100.7', family: 4, ipMode: 'VIP' }, { address: '198.51.100.8', family: 4, ipMode: 'Proxy' }]);
  t.equal(web.northSouth.externalTrafficPolicy, 'Local');
  t.equal(web.northSouth.healthCheckNodePort, 32000);
  t.same(web.northSouth.sourceRanges, [{ family: 4, address: '203.0.113.0', prefixLen: 24 }]);
  t.same(got.services.get('default/np')!.northSouth.nodePorts, [{ port: 53, protocol: 'UDP', nodePort: 30053, index: 0 }]);
  t.same(got.services.get('default/json')!.northSouth.nodePorts, [{ port: 443, protocol: 'TCP', nodePort: 30443, index: 0 }]);
});

t.test('Node manifests: sent by name with their IP addresses (the health mesh\'s peers); a bad one is reported', async (t) => {
  const { dir, src, write, problems } = setup(t);
  const nodes = new Map<string, unknown>();
  const on = (e?: SourceEvent): void => {
    if (e?.kind === 'Node') e.object ? nodes.set(e.id, e.object) : nodes.delete(e.id);
  };
  write('nodes.yaml', `apiVersion: v1
kind: Node
metadata: {name: n1, labels: {topology.kubernetes.io/zone: z1}}
status:
  addresses:
    - {type: Hostname, address: n1}
    - {type: InternalIP, address: 10.0.0.1}
    - {type: InternalIP, address: "fd00:0::1"}
    - {type: ExternalIP, address: 192.0.2.1}
    - {type: InternalIP, address: 10.0.0.1}
---
apiVersion: v1
kind: Node
metadata: {name: n2}
---
apiVersion: v1
kind: Node
metadata: {name: bad}
status: {addresses: [{type: InternalIP, address: not-an-ip}]}
`);
  await src.start(on);
  t.same(nodes.get('n1'), {
    name: 'n1', zone: 'z1', deleting: false,
    addresses: [{ type: 'InternalIP', address: '10.0.0.1' }, { type: 'InternalIP', address: 'fd00::1' }, { type: 'ExternalIP', address: '192.0.2.1' }],
  }, 'IPs only, canonical, without repeats; Hostname left out');
  t.same(nodes.get('n2'), { name: 'n2', zone: undefined, deleting: false }, 'a Node without addresses');
  t.notOk(nodes.has('bad'));
  t.match(problems, [{ where: `${path.join(dir, 'nodes.yaml')}: document 2`, reason: /Node bad: status\.addresses\[0\]\.address "not-an-ip" is not an IP address/, kind: 'Node' }]);
  write('nodes.yaml', 'apiVersion: v1\nkind: Node\nmetadata: {name: n2}\n');
  await src.reload();
  t.same([...nodes.keys()], ['n2'], 'a Node removed from the files is deleted');
});
