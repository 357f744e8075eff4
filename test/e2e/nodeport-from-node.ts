// NodePorts from the node itself (docs/socket-lb.md, "NodePort from the node
// and its pods"): node 1 of the lab (test/helpers/nodeport-lab.ts) runs the
// agent with its tc datapath, which writes the node's addresses; a client
// process of node 1 (its network namespace, and the agent's cgroup, where the
// socket programs are attached) dials the nodePort on a node address, on
// loopback and on 0.0.0.0/::, and is balanced at connect() to the pods: the
// NodePort surrogate answers there, replies and getpeername() say the address
// dialled, an externalTrafficPolicy Local frontend serves such clients from
// its internal twin (every pod), and bind() to a nodePort is refused.
import t, { type Test } from 'tap';
import { stringify } from 'yaml';
import { hasSetRetval } from '../../src/datapath/features.js';
import { CLIENT_PY, createSandbox, SLOW, type Sandbox } from '../helpers/sandbox.js';
import { EXT, extGet, LB_IP, makeLab, NODE1, ourPrograms, perMode, POD1, POD2, type Lab } from '../helpers/nodeport-lab.js';
import type { AttachMode } from '../../src/datapath/nodeport.js';
import { killPid, runInCgroupNetns, type ExecResult } from '../helpers/sandbox/run.js';

const HTTP = 8080;
const UDP = 9000;
const NODEPORT = 30080;
const NODEPORT_UDP = 30090;
const LOCAL_NODEPORT = 30081;
const REQUESTS = 20;

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
  return [
    svc('web', ['10.96.0.10', 'fd00:96::10'], {
      type: 'NodePort',
      ports: [
        { name: 'http', port: 80, targetPort: HTTP, nodePort: NODEPORT, protocol: 'TCP' },
        { name: 'udp', port: 90, targetPort: UDP, nodePort: NODEPORT_UDP, protocol: 'UDP' },
      ],
    }),
    slice(4, 'web'),
    slice(6, 'web'),
    // externalTrafficPolicy Local: clients from outside get the local pod only, the node's own sockets every pod.
    svc(
      'local',
      ['10.96.0.11', 'fd00:96::11'],
      {
        type: 'LoadBalancer',
        externalTrafficPolicy: 'Local',
        healthCheckNodePort: 32000,
        ports: [{ name: 'http', port: 80, targetPort: HTTP, nodePort: LOCAL_NODEPORT, protocol: 'TCP' }],
      },
      { loadBalancer: { ingress: [{ ip: LB_IP.v4 }, { ip: LB_IP.v6 }] } },
    ),
    slice(4, 'local'),
    slice(6, 'local'),
  ].map((d) => stringify(d)).join('---\n');
}

const url = (host: string, port: number): string => (host.includes(':') ? `http://[${host}]:${port}/` : `http://${host}:${port}/`);
const hostport = (host: string, port: number): string => (host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`);
const addr = (hp: string): string => hp.replace(/^\[?([^\]]+?)\]?:\d+$/, '$1');

/** Commands run as a process of node 1: in the agent's cgroup first, then in node 1's namespace; ended by pid at teardown. */
function nodeShell(sb: Sandbox, lab: Lab): (cmd: readonly string[], timeoutMs?: number) => Promise<ExecResult> {
  const track = new Set<number>();
  sb.addCleanup(() => track.forEach((pid) => killPid(pid)));
  return (cmd, timeoutMs = 20_000) => runInCgroupNetns(sb.cgroup, lab.n1, cmd, timeoutMs * SLOW, track);
}

/** A bind() per row, then close(): which succeeded (and the port taken), and the errno of the rest. */
const BIND_PY = `
import errno, json, socket, sys
out = []
for family, kind, host, port in json.loads(sys.argv[1]):
    s = socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    try:
        s.bind((host, port))
        if kind == "tcp":
            s.listen(1)
        out.append({"ok": True, "port": s.getsockname()[1]})
    except OSError as e:
        out.append({"ok": False, "error": errno.errorcode.get(e.errno, str(e.errno))})
    finally:
        s.close()
print(json.dumps(out))
`;

t.test('NodePort from the node: node addresses, loopback, the any address, two scopes, bind protection', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab = await makeLab(sb);
  sb.writeManifest('services.yaml', manifests());
  await perMode(t, lab, (t, mode) => fromTheNode(t, sb, lab, mode));
});

async function fromTheNode(t: Test, sb: Sandbox, lab: Lab, mode: AttachMode): Promise<void> {
  const onNode = nodeShell(sb, lab);
  const sync = await lab.agent.start(['--devices', 'n1e,n1b', '--node-name', 'node1', '--tc-attach', mode]);
  t.ok(sync.frontends > 0, `the agent synced (${sync.frontends} frontends)`);
  await ourPrograms(t, lab, ['n1e', 'n1b'], mode, 'the kernel');
  const np = lab.agent.agent!.logs.find((l) => l.msg === 'tc datapath: devices and node addresses') as { nodeAddresses?: string[] } | undefined;
  t.ok(np?.nodeAddresses?.includes(NODE1.v4) && np.nodeAddresses.includes(NODE1.v6), `the node addresses are written (${np?.nodeAddresses?.join(', ')})`);

  const curl = async (host: string, port: number): Promise<{ ok: boolean; server: string; error: string }> => {
    const r = await onNode(['curl', '-sS', '--max-time', String(3 * SLOW), url(host, port)]);
    return r.code === 0 ? { ok: true, server: r.stdout.trim(), error: '' } : { ok: false, server: '', error: r.stderr.trim() };
  };
  const servers = async (host: string, port: number, n = REQUESTS) => {
    const got = [];
    for (let i = 0; i < n; i++) got.push(await curl(host, port));
    return got;
  };

  await t.test('curl from the node reaches the pods on every address the nodePort answers on', async (t) => {
    for (const [host, family] of [[NODE1.v4, 'v4'], ['127.0.0.1', 'v4'], ['::1', 'v6'], [NODE1.v6, 'v6']] as const) {
      const got = await servers(host, NODEPORT);
      const failed = got.filter((r) => !r.ok);
      t.equal(failed.length, 0, `${hostport(host, NODEPORT)}: every request answered (${failed[0]?.error ?? 'ok'})`);
      const pods = new Set(got.map((r) => addr(r.server)));
      t.same([...pods].sort(), [POD1[family], POD2[family]].sort(), `${hostport(host, NODEPORT)}: answered by both pods, the local and the remote one`);
    }
  });

  await t.test('replies and getpeername() give the address dialled', async (t) => {
    const tcp = async (host: string) => {
      const r = await onNode([sb.python, CLIENT_PY, 'tcp', host, String(NODEPORT), '--count', '4']);
      return (JSON.parse(r.stdout || '{"results":[]}') as { results: Array<{ peer?: string; body?: string; error?: string }> }).results;
    };
    // [dialled, what getpeername says]: connect() to 0.0.0.0 or :: reaches the local host, and the kernel reports loopback.
    const cases: Array<[string, string]> = [
      [NODE1.v4, NODE1.v4], ['127.0.0.1', '127.0.0.1'], ['::1', '::1'], [NODE1.v6, NODE1.v6],
      [`::ffff:${NODE1.v4}`, `::ffff:${NODE1.v4}`], ['::ffff:127.0.0.1', '::ffff:127.0.0.1'],
      ['0.0.0.0', '127.0.0.1'], ['::', '::1'],
    ];
    for (const [host, peer] of cases) {
      const results = await tcp(host);
      t.ok(results.length === 4 && results.every((r) => r.peer === hostport(peer, NODEPORT)), `TCP to ${hostport(host, NODEPORT)}: getpeername() says ${hostport(peer, NODEPORT)} (${JSON.stringify(results[0])})`);
      t.ok(results.every((r) => [POD1.v4, POD2.v4, POD1.v6, POD2.v6].includes(addr(r.body ?? ''))), 'and a pod answered');
    }
    for (const [host, mode] of [['127.0.0.1', 'unconnected'], [NODE1.v4, 'unconnected'], ['::1', 'connected'], [NODE1.v6, 'unconnected']] as const) {
      const r = await onNode([sb.python, CLIENT_PY, 'udp', host, String(NODEPORT_UDP), '--mode', mode, '--count', '6']);
      const out = JSON.parse(r.stdout || '{"results":[]}') as { results: Array<{ server?: string; source?: string; error?: string }> };
      t.ok(
        out.results.length === 6 && out.results.every((x) => x.source === hostport(host, NODEPORT_UDP) && x.server),
        `UDP (${mode}) to ${hostport(host, NODEPORT_UDP)}: every datagram answered from the address dialled (${JSON.stringify(out.results[0])})`,
      );
    }
  });

  await t.test('an address that is not the node\'s is left alone', async (t) => {
    // The external client's address, on the nodePort: its own stack answers (nothing listens there).
    const r = await onNode([sb.python, CLIENT_PY, 'tcp', EXT.v4, String(NODEPORT)]);
    const [res] = (JSON.parse(r.stdout || '{"results":[{}]}') as { results: Array<{ error?: string; peer?: string }> }).results;
    t.equal(res?.error, 'ECONNREFUSED', `TCP to ${EXT.v4}:${NODEPORT} goes to that host and is refused there (${JSON.stringify(res)})`);
  });

  await t.test('externalTrafficPolicy Local: outside clients get the local pod, the node gets every pod (internal scope)', async (t) => {
    const outside = [];
    for (let i = 0; i < 10; i++) outside.push(await extGet(lab, NODE1.v4, LOCAL_NODEPORT));
    t.ok(outside.every((r) => r.ok && addr(r.server) === POD1.v4), `from outside, ${NODE1.v4}:${LOCAL_NODEPORT} is served by the local pod only`);
    for (const [host, port, family] of [[NODE1.v4, LOCAL_NODEPORT, 'v4'], ['127.0.0.1', LOCAL_NODEPORT, 'v4'], [LB_IP.v4, 80, 'v4'], [LB_IP.v6, 80, 'v6']] as const) {
      const got = await servers(host, port);
      t.ok(got.every((r) => r.ok), `${hostport(host, port)} from the node: every request answered (${got.find((r) => !r.ok)?.error ?? 'ok'})`);
      t.same([...new Set(got.map((r) => addr(r.server)))].sort(), [POD1[family], POD2[family]].sort(), `${hostport(host, port)} from the node: both pods serve`);
    }
  });

  await t.test('bind() to a nodePort is refused; other ports and port 0 are not', async (t) => {
    const errno = (await hasSetRetval()) ? 'EADDRINUSE' : 'EPERM';
    const rows: Array<[4 | 6, 'tcp' | 'udp', string, number, boolean]> = [
      [4, 'tcp', '0.0.0.0', NODEPORT, false],
      [4, 'tcp', '127.0.0.1', NODEPORT, false],
      [4, 'tcp', NODE1.v4, NODEPORT, false],
      [6, 'tcp', '::', NODEPORT, false],
      [6, 'tcp', '::1', NODEPORT, false],
      [4, 'udp', '0.0.0.0', NODEPORT_UDP, false],
      [6, 'udp', '::', NODEPORT_UDP, false],
      [4, 'tcp', '0.0.0.0', 30099, true], // in the nodePort range, no service's
      [4, 'udp', '0.0.0.0', NODEPORT, true], // 30080 is a TCP nodePort only
      [4, 'tcp', '0.0.0.0', 0, true],
      [6, 'udp', '::', 0, true],
    ];
    const before = (await sb.metrics())['bind_refused'] ?? 0;
    const r = await onNode([sb.python, '-c', BIND_PY, JSON.stringify(rows.map(([f, k, h, p]) => [f, k, h, p]))]);
    t.equal(r.code, 0, `the bind script ran (${r.stderr.trim()})`);
    const out = JSON.parse(r.stdout || '[]') as Array<{ ok: boolean; port?: number; error?: string }>;
    rows.forEach(([, kind, host, port, allowed], i) => {
      const what = `${kind.toUpperCase()} bind ${hostport(host, port)}`;
      if (allowed) t.ok(out[i]?.ok && (port !== 0 || (out[i]!.port ?? 0) > 0), `${what} works (${JSON.stringify(out[i])})`);
      else t.same(out[i], { ok: false, error: errno }, `${what} is refused with ${errno}`);
    });
    const m = await sb.lbctl(['bpf', 'metrics', 'list', '-o', 'json']);
    t.equal(m.code, 0, 'lbctl bpf metrics list -o json');
    const after = (JSON.parse(m.stdout) as Record<string, number>)['bind_refused'] ?? 0;
    const refused = rows.filter((row) => !row[4]).length;
    t.ok(after > 0, `bind_refused counts refusals (${after})`);
    t.equal(after - before, refused, `one count per refused bind (${refused})`);
  });

  await lab.agent.stop(10_000 * SLOW);
}
