// ICMP at the tc datapath (bpf/nodeport.c), end to end on the NodePort lab
// (test/helpers/nodeport-lab.ts: an external client, node 1 with the agent
// and a pod, node 2 with a pod and no route back to the client):
//
// - a service without endpoints refuses a client from outside as
//   kube-proxy's REJECT rule does: TCP connect() and a connected UDP
//   socket's recv() fail with ECONNREFUSED (an ICMP port unreachable the
//   datapath sends from the frontend);
// - a backend's own port unreachable (UDP to a port it does not serve)
//   reaches the client translated, from the frontend (the backend's address
//   stays hidden): from the remote pod (at node 1's ingress) and from the
//   local pod (at its egress);
// - path MTU discovery works through the NodePort: a 2 MB download from the
//   remote pod and from the local pod completes
//   (a) behind a router on the client's side whose link to the client has
//       MTU 1280: the backends learn it only from the router's
//       "fragmentation needed" / "packet too big", which reaches them only
//       translated by the datapath (it is about a reply sent from the
//       frontend); the backends' route caches show the MTU afterwards;
//   (b) with the link between the nodes at MTU 1280 (both ends);
//   (c) with the client's link at 1280 too;
// - and a 2 MB upload (HTTP POST) to the remote pod completes over (b)'s
//   links: the client's 1500-byte packets, which the datapath redirects out
//   of the 1280 node link, are answered from the frontend with
//   "fragmentation needed" / "packet too big" (the agent writes the device's
//   new MTU to lb_devices when the link changes), and the client's route
//   cache shows 1280 towards the frontend afterwards.
// Traffic stays in the lab's namespaces; the router's client namespace is
// removed at teardown like the lab's. In each tc attach mode, side by side
// (each in a lab of its own: the MTUs change as it goes).
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import t, { type Test } from 'tap';
import { stringify } from 'yaml';
import { SLOW, type Sandbox } from '../helpers/sandbox.js';
import type { AttachMode } from '../../src/datapath/nodeport.js';
import { removeNetns } from '../helpers/sandbox/topology.js';
import { EXT, NODE1, NODE1_TO_N2, ourPrograms, perModeSideBySide, POD1, POD2, type Lab } from '../helpers/nodeport-lab.js';

const HTTP = 8080;
const UDP = 9000;
const NP_REMOTE = 30180;
const NP_LOCAL = 30181;
const NP_NONE_TCP = 30182;
const NP_NONE_UDP = 30183;
const NP_CLOSED_REMOTE = 30184;
const NP_CLOSED_LOCAL = 30185;
const CLOSED = 9001; // no backend listens there
const DOWNLOAD = 2_000_000;
const UPLOAD = 2_000_000;

type Family = 'v4' | 'v6';
const FAMILIES: Family[] = ['v4', 'v6'];

/** The client behind the router (a namespace of its own): the router is the lab's external client namespace. */
const CLI = { v4: '10.250.7.2', v6: 'fd00:257::2' };
const RTR = { v4: '10.250.7.1', v6: 'fd00:257::1' };

function manifests(): string {
  const svc = (name: string, clusterIPs: string[], ports: object[]) => ({
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: 'default' },
    spec: { type: 'NodePort', clusterIP: clusterIPs[0], clusterIPs, ipFamilies: ['IPv4', 'IPv6'], ipFamilyPolicy: 'RequireDualStack', ports },
  });
  const slice = (service: string, family: 4 | 6, pod: { v4: string; v6: string }, node: string,
    ports: object[] = [{ name: 'http', port: HTTP, protocol: 'TCP' }]) => ({
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name: `${service}-v${family}`, namespace: 'default', labels: { 'kubernetes.io/service-name': service } },
    addressType: family === 4 ? 'IPv4' : 'IPv6',
    ports,
    endpoints: [{ addresses: [family === 4 ? pod.v4 : pod.v6], conditions: { ready: true }, nodeName: node }],
  });
  const http = (nodePort: number) => [{ name: 'http', port: 80, targetPort: HTTP, nodePort, protocol: 'TCP' }];
  const closed = (nodePort: number) => [{ name: 'closed', port: 91, targetPort: CLOSED, nodePort, protocol: 'UDP' }];
  const closedPorts = [{ name: 'closed', port: CLOSED, protocol: 'UDP' }];
  const docs = [
    svc('remote', ['10.96.1.10', 'fd00:96::1:10'], http(NP_REMOTE)),
    slice('remote', 4, POD2, 'node2'),
    slice('remote', 6, POD2, 'node2'),
    svc('local', ['10.96.1.11', 'fd00:96::1:11'], http(NP_LOCAL)),
    slice('local', 4, POD1, 'node1'),
    slice('local', 6, POD1, 'node1'),
    svc('closed-remote', ['10.96.1.13', 'fd00:96::1:13'], closed(NP_CLOSED_REMOTE)),
    slice('closed-remote', 4, POD2, 'node2', closedPorts),
    slice('closed-remote', 6, POD2, 'node2', closedPorts),
    svc('closed-local', ['10.96.1.14', 'fd00:96::1:14'], closed(NP_CLOSED_LOCAL)),
    slice('closed-local', 4, POD1, 'node1', closedPorts),
    slice('closed-local', 6, POD1, 'node1', closedPorts),
    // no EndpointSlice at all
    svc('none', ['10.96.1.12', 'fd00:96::1:12'], [
      { name: 'http', port: 80, targetPort: HTTP, nodePort: NP_NONE_TCP, protocol: 'TCP' },
      { name: 'udp', port: 90, targetPort: UDP, nodePort: NP_NONE_UDP, protocol: 'UDP' },
    ]),
  ];
  return docs.map((d) => stringify(d)).join('---\n');
}

// A TCP connect() and a connected UDP socket's send() then recv(): what each saw (errno name), and how fast.
const REFUSED_PY = `
import errno, json, socket, sys, time
host, tport, uport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fam = socket.AF_INET6 if ":" in host else socket.AF_INET
def name(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__
out = {}
s = socket.socket(fam, socket.SOCK_STREAM)
s.settimeout(5)
t0 = time.monotonic()
try:
    s.connect((host, tport))
    out["tcp"] = "connected"
except OSError as e:
    out["tcp"] = name(e)
out["tcp_ms"] = round((time.monotonic() - t0) * 1000)
s.close()
u = socket.socket(fam, socket.SOCK_DGRAM)
u.settimeout(5)
u.connect((host, uport))
t0 = time.monotonic()
try:
    u.send(b"anyone?")
    u.recv(2048)
    out["udp"] = "answered"
except OSError as e:
    out["udp"] = name(e)
out["udp_ms"] = round((time.monotonic() - t0) * 1000)
print(json.dumps(out))
`;

// A connected UDP socket with IP_RECVERR / IPV6_RECVERR: what recv() saw, and the ICMP error the
// kernel queued (type, code, and its source: the "offender").
const UDP_ERROR_PY = `
import errno, json, socket, struct, sys
host, port = sys.argv[1], int(sys.argv[2])
v6 = ":" in host
u = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(41, 25, 1) if v6 else u.setsockopt(0, 11, 1)  # IPV6_RECVERR, IP_RECVERR
u.settimeout(5)
u.connect((host, port))
out = {}
try:
    u.send(b"anyone?")
    u.recv(2048)
    out["udp"] = "answered"
except OSError as e:
    out["udp"] = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__
try:
    _, anc, _, _ = u.recvmsg(2048, 512, 0x2000)  # MSG_ERRQUEUE
    for _level, _type, data in anc:
        _errno, _origin, out["type"], out["code"] = struct.unpack_from("=IBBB", data, 0)
        sa = data[16:]  # struct sock_extended_err, then the offender's sockaddr
        out["offender"] = socket.inet_ntop(socket.AF_INET6, sa[8:24]) if v6 else socket.inet_ntop(socket.AF_INET, sa[4:8])
except OSError as e:
    out["errqueue"] = str(e)
print(json.dumps(out))
`;

const url = (host: string, port: number, path: string): string => (host.includes(':') ? `http://[${host}]:${port}${path}` : `http://${host}:${port}${path}`);

/** A download of DOWNLOAD bytes from `ns`: curl's exit code, the bytes received and the HTTP status. */
async function download(lab: Lab, ns: string, host: string, port: number): Promise<{ code: number; size: number; status: string; error: string }> {
  const r = await lab.inNs(ns, ['curl', '-sS', '-o', '/dev/null', '-w', '%{size_download} %{http_code}', '--max-time', String(20 * SLOW), url(host, port, `/bytes/${DOWNLOAD}`)],
    30_000);
  const [size, status] = r.stdout.trim().split(' ');
  return { code: r.code ?? -1, size: Number(size ?? 0), status: status ?? '', error: r.stderr.trim() };
}

/** An upload of `file` (UPLOAD bytes) from `ns` by HTTP POST: curl's exit code, the bytes the backend says it received, the HTTP status. */
async function upload(lab: Lab, ns: string, host: string, port: number, file: string): Promise<{ code: number; received: number; status: string; error: string }> {
  // no "Expect: 100-continue" (backend.py speaks HTTP/1.0 and would not answer it: curl would wait a second)
  const r = await lab.inNs(ns, ['curl', '-sS', '-H', 'Expect:', '--data-binary', `@${file}`, '-w', ' %{http_code}', '--max-time', String(20 * SLOW),
    url(host, port, '/upload')], 30_000);
  const [received, status] = r.stdout.trim().split(/\s+/);
  return { code: r.code ?? -1, received: Number(received ?? 0), status: status ?? '', error: r.stderr.trim() };
}

function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

function sysctl(ns: string, key: string, value: string): void {
  execFileSync('ip', ['netns', 'exec', ns, 'sysctl', '-qw', `${key}=${value}`], { stdio: ['ignore', 'ignore', 'pipe'] });
}

/** Forgets what the pods learned of path MTUs (route cache exceptions), so each case learns afresh. */
async function flushCaches(lab: Lab): Promise<void> {
  for (const ns of [lab.p1, lab.p2]) {
    for (const fam of ['-4', '-6']) {
      const r = await lab.inNs(ns, ['ip', fam, 'route', 'flush', 'cache']);
      if (r.code !== 0) throw new Error(`ip ${fam} route flush cache in ${ns}: ${r.stderr}`);
    }
  }
}

/** Downloads through both NodePorts (the remote pod's, the local pod's), both families, from `ns` to `addr`. */
async function downloads(t: Test, lab: Lab, ns: string, addr: { v4: string; v6: string }, what: string): Promise<void> {
  for (const family of FAMILIES) {
    for (const [port, pod] of [[NP_REMOTE, 'remote pod'], [NP_LOCAL, 'local pod']] as const) {
      const d = await download(lab, ns, addr[family], port);
      t.ok(d.code === 0 && d.size === DOWNLOAD && d.status === '200',
        `${what}, IPv${family[1]}, ${pod}: ${DOWNLOAD} bytes downloaded (curl ${d.code}, ${d.size} bytes, HTTP ${d.status}${d.error ? `, ${d.error}` : ''})`);
    }
  }
}

/** The MTU a namespace's route cache holds for `dst` (a learned path MTU), or 0. */
async function cachedMtu(lab: Lab, ns: string, dst: string): Promise<number> {
  const r = await lab.inNs(ns, ['ip', ...(dst.includes(':') ? ['-6'] : []), 'route', 'get', dst]);
  return Number(/\bmtu (\d+)/.exec(r.stdout)?.[1] ?? 0);
}

t.test('ICMP through the NodePort datapath: refusals without endpoints, path MTU discovery both ways', (t) => perModeSideBySide(t, icmp));

async function icmp(t: Test, sb: Sandbox, lab: Lab, mode: AttachMode): Promise<void> {
  sb.writeManifest('services.yaml', manifests());
  const sync = await lab.agent.start(['--devices', 'n1e,n1b', '--node-name', 'node1', '--tc-attach', mode]);
  t.ok(sync.frontends > 0, `the agent synced (${sync.frontends} frontends)`);
  await ourPrograms(t, lab, ['n1e', 'n1b'], mode, 'the kernel');

  await t.test('a service without endpoints: TCP and UDP clients from outside get ECONNREFUSED', async (t) => {
    const before = await sb.metrics();
    for (const family of FAMILIES) {
      const r = await lab.inExt(['python3', '-c', REFUSED_PY, NODE1[family], String(NP_NONE_TCP), String(NP_NONE_UDP)]);
      t.equal(r.code, 0, `the client ran: ${r.stderr}`);
      const got = JSON.parse(r.stdout || '{}') as { tcp?: string; udp?: string; tcp_ms?: number; udp_ms?: number };
      t.equal(got.tcp, 'ECONNREFUSED', `IPv${family[1]} TCP connect() to ${NODE1[family]}:${NP_NONE_TCP}: ECONNREFUSED (${got.tcp_ms} ms)`);
      t.equal(got.udp, 'ECONNREFUSED', `IPv${family[1]} UDP to ${NODE1[family]}:${NP_NONE_UDP}: recv() says ECONNREFUSED (${got.udp_ms} ms)`);
    }
    const after = await sb.metrics();
    const sent = (after['np_reject'] ?? 0) - (before['np_reject'] ?? 0);
    t.ok(sent >= 4, `np_reject counted the port unreachables sent (${sent})`);
  });

  await t.test('a backend\'s own port unreachable reaches the client from the frontend, remote and local', async (t) => {
    const before = await sb.metrics();
    for (const family of FAMILIES) {
      for (const [port, pod] of [[NP_CLOSED_REMOTE, 'remote pod (translated at ingress)'], [NP_CLOSED_LOCAL, 'local pod (translated at egress)']] as const) {
        const r = await lab.inExt(['python3', '-c', UDP_ERROR_PY, NODE1[family], String(port)]);
        t.equal(r.code, 0, `the client ran: ${r.stderr}`);
        const got = JSON.parse(r.stdout || '{}') as { udp?: string; offender?: string; type?: number; code?: number; errqueue?: string };
        t.equal(got.udp, 'ECONNREFUSED', `IPv${family[1]}, ${pod}: recv() says ECONNREFUSED`);
        t.match(got, { offender: NODE1[family], type: family === 'v4' ? 3 : 1, code: family === 'v4' ? 3 : 4 },
          `IPv${family[1]}, ${pod}: a port unreachable from the frontend ${NODE1[family]}, not the pod (${got.offender ?? got.errqueue})`);
      }
    }
    const after = await sb.metrics();
    const xlated = (after['np_icmp_xlate'] ?? 0) - (before['np_icmp_xlate'] ?? 0);
    t.ok(xlated >= 4, `np_icmp_xlate counted them (${xlated})`);
  });

  // (a) first: nothing is in any route cache yet.
  await t.test('behind a router whose link to the client has MTU 1280: the backends learn it from the translated errors', async (t) => {
    // cli (the client, MTU 1500, so it asks for 1460-byte segments) -- ext (now a router: its side of
    // that link has MTU 1280, so it answers the backends' full-size replies with "fragmentation
    // needed" / "packet too big", sent to the frontend they came from) -- n1e (node 1)
    const cli = `${sb.runId}-cli`;
    sb.addCleanup(() => removeNetns(cli));
    ip('netns', 'add', cli);
    ip('-n', cli, 'link', 'set', 'lo', 'up');
    ip('link', 'add', 'cli0', 'netns', cli, 'type', 'veth', 'peer', 'name', 'extc', 'netns', lab.ext);
    for (const [ns, dev, a] of [[cli, 'cli0', CLI], [lab.ext, 'extc', RTR]] as const) {
      ip('-n', ns, 'addr', 'add', `${a.v4}/24`, 'dev', dev);
      ip('-n', ns, 'addr', 'add', `${a.v6}/64`, 'dev', dev, 'nodad');
      ip('-n', ns, 'link', 'set', dev, 'up');
    }
    ip('-n', lab.ext, 'link', 'set', 'extc', 'mtu', '1280');
    sysctl(lab.ext, 'net.ipv4.ip_forward', '1');
    sysctl(lab.ext, 'net.ipv6.conf.all.forwarding', '1');
    ip('-n', cli, 'route', 'add', 'default', 'via', RTR.v4);
    ip('-n', cli, '-6', 'route', 'add', 'default', 'via', RTR.v6);
    ip('-n', lab.n1, 'route', 'add', '10.250.7.0/24', 'via', EXT.v4);
    ip('-n', lab.n1, '-6', 'route', 'add', 'fd00:257::/64', 'via', EXT.v6);
    await flushCaches(lab);

    const before = await sb.metrics();
    await downloads(t, lab, cli, NODE1, 'behind the router');
    const after = await sb.metrics();
    const xlated = (after['np_icmp_xlate'] ?? 0) - (before['np_icmp_xlate'] ?? 0);
    t.ok(xlated >= 4, `np_icmp_xlate counted the router's errors translated for the backends (${xlated})`);
    for (const family of FAMILIES) {
      // The remote pod talks to node 1's SNAT address, the local one to the client itself.
      const remote = await cachedMtu(lab, lab.p2, NODE1_TO_N2[family]);
      const local = await cachedMtu(lab, lab.p1, CLI[family]);
      t.equal(remote, 1280, `IPv${family[1]}: the remote pod learned MTU 1280 towards node 1's SNAT address ${NODE1_TO_N2[family]}`);
      t.equal(local, 1280, `IPv${family[1]}: the local pod learned MTU 1280 towards the client ${CLI[family]}`);
    }
  });

  await t.test('the link between the nodes at MTU 1280 (both ends)', async (t) => {
    await flushCaches(lab);
    for (const family of FAMILIES) t.equal(await cachedMtu(lab, lab.p2, NODE1_TO_N2[family]), 0, `IPv${family[1]}: the remote pod's route cache starts empty`);
    ip('-n', lab.n1, 'link', 'set', 'n1b', 'mtu', '1280');
    ip('-n', lab.n2, 'link', 'set', 'n2a', 'mtu', '1280');
    await downloads(t, lab, lab.ext, NODE1, 'node link 1280');
  });

  // Still (b)'s links: the client's at 1500, so it sends 1500-byte packets; the datapath redirects them out of n1b (1280).
  await t.test('an upload to the remote pod over the 1280 node link: the client learns 1280 from the datapath', async (t) => {
    await flushCaches(lab);
    for (const fam of ['-4', '-6']) await lab.inNs(lab.ext, ['ip', fam, 'route', 'flush', 'cache']);
    for (const family of FAMILIES) t.equal(await cachedMtu(lab, lab.ext, NODE1[family]), 0, `IPv${family[1]}: the client's route cache starts empty`);
    const file = path.join(sb.runDir, 'upload.bin');
    writeFileSync(file, Buffer.alloc(UPLOAD, 0x75));
    const before = await sb.metrics();
    for (const family of FAMILIES) {
      const u = await upload(lab, lab.ext, NODE1[family], NP_REMOTE, file);
      t.ok(u.code === 0 && u.received === UPLOAD && u.status === '200',
        `IPv${family[1]}: ${UPLOAD} bytes uploaded to the remote pod (curl ${u.code}, the pod received ${u.received}, HTTP ${u.status}${u.error ? `, ${u.error}` : ''})`);
    }
    const after = await sb.metrics();
    const tooBig = (after['np_frag_needed'] ?? 0) - (before['np_frag_needed'] ?? 0);
    t.ok(tooBig >= 2, `np_frag_needed counted the client's packets too big for n1b, answered (${tooBig})`);
    for (const family of FAMILIES) {
      t.equal(await cachedMtu(lab, lab.ext, NODE1[family]), 1280, `IPv${family[1]}: the client learned MTU 1280 towards the frontend ${NODE1[family]}`);
    }
  });

  await t.test('and the client\'s link at MTU 1280 too (both ends)', async (t) => {
    await flushCaches(lab);
    ip('-n', lab.ext, 'link', 'set', 'ext0', 'mtu', '1280');
    ip('-n', lab.n1, 'link', 'set', 'n1e', 'mtu', '1280');
    await downloads(t, lab, lab.ext, NODE1, 'node and client links 1280');
  });

  await lab.agent.stop(10_000 * SLOW);
}
