// NodePort, external IPs and LoadBalancer IPs at tc (issue 14), from a
// client outside the node: node 1 runs the agent in its own network
// namespace (nsenter), with one pod of its own and one on node 2, which has
// no route back to the client, so only SNAT brings a remote pod's replies
// home. See test/helpers/nodeport-lab.ts for the addresses. Once per tc
// attach mode (tcx, clsact), on one lab.
import t, { type Test } from 'tap';
import { stringify } from 'yaml';
import { CLI_TIMEOUT_MS, createSandbox, CLIENT_PY, LBCTL, run, SLOW, type Sandbox } from '../helpers/sandbox.js';
import { EXT, EXTERNAL_IP, extGet, LB_IP, makeLab, NODE1, NODE1_TO_N2, ourPrograms, perMode, POD1, POD2, type Lab } from '../helpers/nodeport-lab.js';
import type { AttachMode } from '../../src/datapath/nodeport.js';

const HTTP = 8080;
const UDP = 9000;
const REQUESTS = 24;

function manifests(): string {
  const slice = (family: 4 | 6, service: string) => ({
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name: `${service}-v${family}`, namespace: 'default', labels: { 'kubernetes.io/service-name': service } },
    addressType: family === 4 ? 'IPv4' : 'IPv6',
    ports: [{ name: 'http', port: HTTP, protocol: 'TCP' }, { name: 'udp', port: UDP, protocol: 'UDP' }],
    endpoints: [
      { addresses: [family === 4 ? POD1.v4 : POD1.v6], conditions: { ready: true }, nodeName: 'node1' },
      { addresses: [family === 4 ? POD2.v4 : POD2.v6], conditions: { ready: true }, nodeName: 'node2' },
    ],
  });
  const svc = (name: string, clusterIPs: string[], spec: object, status: object = {}) => ({
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: 'default' },
    spec: { clusterIP: clusterIPs[0], clusterIPs, ipFamilies: ['IPv4', 'IPv6'], ipFamilyPolicy: 'RequireDualStack', ...spec },
    status,
  });
  const docs = [
    svc('web', ['10.96.0.10', 'fd00:96::10'], {
      type: 'NodePort',
      ports: [
        { name: 'http', port: 80, targetPort: HTTP, nodePort: 30080, protocol: 'TCP' },
        { name: 'udp', port: 90, targetPort: UDP, nodePort: 30090, protocol: 'UDP' },
      ],
      externalIPs: [EXTERNAL_IP.v4, EXTERNAL_IP.v6],
    }),
    slice(4, 'web'),
    slice(6, 'web'),
    svc(
      'local',
      ['10.96.0.11', 'fd00:96::11'],
      {
        type: 'LoadBalancer',
        externalTrafficPolicy: 'Local',
        healthCheckNodePort: 32000,
        ports: [{ name: 'http', port: 80, targetPort: HTTP, nodePort: 30081, protocol: 'TCP' }],
      },
      { loadBalancer: { ingress: [{ ip: LB_IP.v4 }, { ip: LB_IP.v6 }] } },
    ),
    slice(4, 'local'),
    slice(6, 'local'),
  ];
  return docs.map((d) => stringify(d)).join('---\n');
}

async function many(lab: Lab, host: string, port: number, n = REQUESTS) {
  const out = [];
  for (let i = 0; i < n; i++) out.push(await extGet(lab, host, port));
  return out;
}

const addr = (hostport: string): string => hostport.replace(/^\[?([^\]]+?)\]?:\d+$/, '$1');
const port = (hostport: string): number => Number(/:(\d+)$/.exec(hostport)?.[1]);

t.test('NodePort, external IP and LoadBalancer from outside the node, IPv4 and IPv6, TCP and UDP', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab = await makeLab(sb);
  sb.writeManifest('services.yaml', manifests());
  await perMode(t, lab, (t, mode) => fromOutside(t, sb, lab, mode));
});

async function fromOutside(t: Test, sb: Sandbox, lab: Lab, mode: AttachMode): Promise<void> {
  const sync = await lab.agent.start(['--devices', 'n1e,n1b', '--node-name', 'node1', '--tc-attach', mode]);
  t.ok(sync.frontends > 0, `the agent synced (${sync.frontends} frontends)`);
  await ourPrograms(t, lab, ['n1e', 'n1b'], mode, 'the kernel');
  const np = lab.agent.agent!.logs.find((l) => l.msg === 'tc datapath: devices and node addresses') as { devices?: string[]; nodeAddresses?: string[] } | undefined;
  t.same(np?.devices?.sort(), ['n1b', 'n1e'], 'the tc programs run on the two named devices');
  t.ok(np?.nodeAddresses?.includes(NODE1.v4) && np.nodeAddresses.includes(NODE1.v6), 'NodePorts answer on the node addresses of both families');

  for (const family of ['v4', 'v6'] as const) {
    const got = await many(lab, NODE1[family], 30080);
    const failed = got.filter((r) => !r.ok);
    t.equal(failed.length, 0, `IPv${family[1]} NodePort ${NODE1[family]}:30080: every request answered (${failed[0]?.error ?? ''})`);
    const local = got.filter((r) => addr(r.server) === POD1[family]);
    const remote = got.filter((r) => addr(r.server) === POD2[family]);
    t.ok(local.length > 0 && remote.length > 0, `both pods served (${local.length} local, ${remote.length} remote)`);
    t.ok(local.every((r) => addr(r.client) === EXT[family]), 'the local pod sees the client address (no SNAT)');
    t.ok(
      remote.every((r) => addr(r.client) === NODE1_TO_N2[family] && port(r.client) >= 32768 && port(r.client) <= 65535),
      `the remote pod sees node 1's address and a port of the SNAT range 32768-65535 (${remote[0]?.client})`,
    );

    const ext = await many(lab, EXTERNAL_IP[family], 80, 8);
    t.ok(ext.every((r) => r.ok), `external IP ${EXTERNAL_IP[family]}:80 answered every request`);

    const lb = await many(lab, LB_IP[family], 80, 10);
    t.ok(lb.every((r) => r.ok && addr(r.server) === POD1[family]), 'externalTrafficPolicy Local: only the local pod serves the LoadBalancer IP');
    t.ok(lb.every((r) => addr(r.client) === EXT[family]), 'and it sees the client address');

    const udp = await lab.inExt(['python3', CLIENT_PY, 'udp', NODE1[family], '30090', '--mode', 'connected', '--count', '12']);
    t.equal(udp.code, 0, `UDP client ran: ${udp.stderr}`);
    const results = (JSON.parse(udp.stdout || '{"results":[]}') as { results: Array<{ server?: string; echo?: string; error?: string }> }).results;
    t.ok(results.length === 12 && results.every((r) => r.server), `UDP NodePort: every datagram answered, from the dialled address (${results.find((r) => r.error)?.error ?? 'ok'})`);
    const servers = new Set(results.map((r) => addr(r.server ?? '')));
    t.ok(servers.size >= 1, `UDP served by ${[...servers].join(', ')}`);
  }

  // Not a service: the node's own stack answers (a refusal), the programs stay out of the way.
  const none = await extGet(lab, NODE1.v4, 30999, 2);
  t.notOk(none.ok, 'a port no service uses is refused by the node itself');
  t.match(none.error, /refused|Couldn't connect/i, `curl: ${none.error}`);

  const list = await (async () => {
    const r = await sb.lbctl(['bpf', 'lb', 'list', '-o', 'json']);
    return JSON.parse(r.stdout) as Array<{ frontend: string; type: string }>;
  })();
  t.ok(list.some((e) => e.type === 'NodePort' && e.frontend.startsWith('0.0.0.0:30080/TCP')), 'lbctl bpf lb list shows the NodePort surrogate');
  t.ok(list.some((e) => e.type === 'ExternalIP' && e.frontend.startsWith(`${EXTERNAL_IP.v4}:80/TCP`)), 'and the external IP');
  t.ok(list.some((e) => e.type === 'LoadBalancer' && e.frontend.startsWith(`${LB_IP.v4}:80/TCP`)), 'and the LoadBalancer IP');

  const text = await sb.lbctl(['bpf', 'lb', 'list']);
  t.match(text.stdout, new RegExp(`${NODE1.v4.replace(/\./g, '\\.')}:30080/TCP\\s.*\\[NodePort`), 'the text listing shows the NodePort at each node address, as Cilium does');
  const maglev = JSON.parse((await sb.lbctl(['bpf', 'lb', 'list', '--maglev', '-o', 'json'])).stdout) as Array<{ frontend: string; type: string; maglev?: Array<{ slots: number; share: number }> }>;
  const surrogate = maglev.find((e) => e.frontend === '0.0.0.0:30080/TCP');
  t.equal(surrogate?.maglev?.length, 2, `--maglev: the NodePort's table names its two backends (${JSON.stringify(surrogate?.maglev)})`);
  t.ok(surrogate?.maglev?.every((m) => m.share > 45 && m.share < 55), 'in even shares');
  const lbLocal = maglev.find((e) => e.frontend === `${LB_IP.v4}:80/TCP`);
  t.equal(lbLocal?.maglev?.length, 1, 'the eTP=Local LoadBalancer IP\'s table names only the local pod');

  const ct = JSON.parse((await sb.lbctl(['bpf', 'ct', 'list', '-o', 'json'])).stdout) as Array<{ direction: string; destination: string; flags: string[]; snat?: string; translatedTo: string }>;
  t.ok(ct.some((c) => c.direction === 'IN' && c.destination === `${NODE1.v4}:30080` && c.flags.includes('snat') && c.snat?.startsWith(NODE1_TO_N2.v4)), 'bpf ct list: a SNATed flow to the NodePort');
  t.ok(ct.some((c) => c.direction === 'IN' && c.flags.includes('local') && c.translatedTo === `${POD1.v4}:${HTTP}`), 'and a local one');
  const nat = await sb.lbctl(['bpf', 'nat', 'list']);
  const xlated = [...nat.stdout.matchAll(new RegExp(`XLATE_SRC ${NODE1_TO_N2.v4.replace(/\./g, '\\.')}:(\\d+)`, 'g'))].map((m) => Number(m[1]));
  t.ok(xlated.length > 0 && xlated.every((p) => p >= 32768 && p <= 65535), `bpf nat list: the SNAT translations, in Cilium's line format, in the SNAT range (${xlated.slice(0, 4).join(', ')})`);
  const status = await run(LBCTL, ['status', '--api-socket', lab.agent.place.apiSocket], CLI_TIMEOUT_MS);
  t.match(status.stdout, new RegExp(`NodePort:\\s+nodeport\\.bpf\\.o at tc \\(${mode}; --tc-attach ${mode}\\) on n1\\w .*n1\\w .*Maglev: \\d+ tables of 16381 slots`), `lbctl status shows the tc datapath and its attach mode (${status.stdout.split('\n').find((l) => l.startsWith('NodePort')) ?? status.stderr})`);

  // healthCheckNodePort of the eTP=Local LoadBalancer service: kube-proxy's answer, from the agent.
  const hc = await lab.inExt(['curl', '-sS', '-D', '-', '--max-time', String(5 * SLOW), `http://${NODE1.v4}:32000/`]);
  t.equal(hc.code, 0, `healthCheckNodePort answers (${hc.stderr.trim()})`);
  t.match(hc.stdout, /^HTTP\/1\.1 200/, '200: a ready local endpoint and a healthy agent');
  t.match(hc.stdout, /content-type: application\/json/i, 'JSON');
  t.match(hc.stdout, /x-load-balancing-endpoint-weight: 1/i, 'the endpoint weight header: one local endpoint');
  const body = JSON.parse(hc.stdout.split(/\r?\n\r?\n/)[1] ?? '{}') as { service?: { namespace: string; name: string }; localEndpoints?: number; serviceProxyHealthy?: boolean };
  t.same(body, { service: { namespace: 'default', name: 'local' }, localEndpoints: 1, serviceProxyHealthy: true }, "kube-proxy's body");

  const metrics = await sb.metrics();
  t.ok((metrics['np_new'] ?? 0) > 0 && (metrics['np_rev'] ?? 0) > 0, `the tc counters count new flows and replies (np_new ${metrics['np_new']}, np_rev ${metrics['np_rev']})`);
  await lab.agent.stop(10_000 * SLOW);
}
