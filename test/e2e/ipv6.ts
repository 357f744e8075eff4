// IPv6 and dual-stack: a dual-stack service (10.96.0.10 + fd00:96::10) with
// one slice per family. curl reaches it over IPv6; an AF_INET6 socket dialling
// the IPv4-mapped service address (::ffff:10.96.0.10) is balanced through the
// IPv4 tables and getpeername() shows the mapped service address; UDP works
// for both, including the mapped sendto() path (sendmsg4, then recvmsg6).
import t, { type Test } from 'tap';
import { createSandbox, HTTP_PORT, SLOW, UDP_PORT, type Sandbox } from '../helpers/sandbox.js';
import { serviceWithBackends } from '../helpers/manifests.js';

const VIP4 = '10.96.0.10';
const VIP6 = 'fd00:96::10';
const MAPPED = `::ffff:${VIP4}`;
const UDP_SVC_PORT = 53000;

interface TcpResult {
  results: Array<{ peer?: string; body?: string; error?: string }>;
}
interface UdpResult {
  peer: string | null;
  results: Array<{ server?: string; source?: string; error?: string }>;
}

async function dualStack(t: Test): Promise<Sandbox> {
  const sb = await createSandbox(t, { backends: 3 });
  const ports = [
    { name: 'http', port: HTTP_PORT },
    { name: 'echo', port: UDP_PORT, protocol: 'UDP' as const },
  ];
  sb.writeManifest(
    'web.yaml',
    serviceWithBackends(
      {
        name: 'web',
        clusterIPs: [VIP4, VIP6],
        ports: [
          { name: 'http', port: 80 },
          { name: 'echo', port: UDP_SVC_PORT, protocol: 'UDP' },
        ],
      },
      [
        { name: 'web-v4', family: 4, ports, addresses: sb.backends.map((b) => b.v4) },
        { name: 'web-v6', family: 6, ports, addresses: sb.backends.map((b) => b.v6) },
      ],
    ),
  );
  const sync = await sb.waitForSync();
  t.equal(sync.frontends, 4, 'two families x two ports programmed');
  return sb;
}

t.test('curl over IPv6 reaches the IPv6 backends', async (t) => {
  const sb = await dualStack(t);
  const list = await sb.lbList();
  const fe = list.find((e) => e.frontend === `[${VIP6}]:80/TCP`);
  t.same(
    fe?.backends.map((b) => b.address).sort(),
    sb.backends.map((b) => `[${b.v6}]:${HTTP_PORT}`).sort(),
    'lbctl bpf lb list shows the IPv6 frontend and backends',
  );

  const v6Backends = sb.backends.map((b) => `[${b.v6}]:${HTTP_PORT}`);
  const seen = new Set<string>();
  for (let i = 0; i < 30; i++) {
    const r = await sb.exec(['curl', '-g', '-sS', '--max-time', String(5 * SLOW), '-w', '\n%{remote_ip}', `http://[${VIP6}]:80/`]);
    t.equal(r.code, 0, `request ${i}: curl exits 0 ${r.stderr.trim()}`);
    const lines = r.stdout.trim().split('\n');
    t.equal(lines.at(-1), VIP6, `request ${i}: curl's remote_ip is the service`);
    t.ok(v6Backends.includes(lines[0]!), `request ${i}: answered by an IPv6 backend (${lines[0]})`);
    seen.add(lines[0]!);
  }
  t.equal(seen.size, sb.backends.length, 'every IPv6 backend answered some of 30 requests');
  t.same(await sb.mapEntries('lb6_sock_revnat'), [], 'no IPv6 rev-NAT entry is left once the TCP sockets are closed');
});

t.test('AF_INET6 socket to the IPv4-mapped service address', async (t) => {
  const sb = await dualStack(t);
  const r = await sb.client<TcpResult>(['tcp', MAPPED, '80', '--count', '20']);
  t.same(r.results.filter((x) => x.error), [], 'every connection succeeds');
  const peers = new Set(r.results.map((x) => x.peer));
  t.same([...peers], [`[${MAPPED}]:80`], 'getpeername() shows the mapped service address');
  const v4Backends = sb.backends.map((b) => `${b.v4}:${HTTP_PORT}`);
  const bodies = new Set(r.results.map((x) => x.body!));
  t.ok([...bodies].every((b) => v4Backends.includes(b)), `served by the IPv4 backends (${[...bodies].join(', ')})`);
  t.ok(bodies.size >= 2, `balanced: ${bodies.size} backends answered 20 connections`);
  t.same(await sb.mapEntries('lb4_sock_revnat'), [], 'no rev-NAT entry is left once the mapped TCP sockets are closed');
});

t.test('UDP over IPv6 and to the IPv4-mapped address', async (t) => {
  const sb = await dualStack(t);
  const v6 = await sb.client<UdpResult>(['udp', VIP6, String(UDP_SVC_PORT), '--mode', 'unconnected', '--count', '10']);
  t.same(v6.results.filter((x) => x.error), [], 'IPv6 unconnected: every datagram answered');
  t.same([...new Set(v6.results.map((x) => x.source))], [`[${VIP6}]:${UDP_SVC_PORT}`], 'IPv6 unconnected: replies come from the service');

  const v6c = await sb.client<UdpResult>(['udp', VIP6, String(UDP_SVC_PORT), '--mode', 'connected', '--count', '5']);
  t.same(v6c.results.filter((x) => x.error), [], 'IPv6 connected: every datagram answered');
  t.equal(v6c.peer, `[${VIP6}]:${UDP_SVC_PORT}`, 'IPv6 connected: getpeername() is the service');

  const mapped = await sb.client<UdpResult>(['udp', MAPPED, String(UDP_SVC_PORT), '--mode', 'unconnected', '--count', '10']);
  t.same(mapped.results.filter((x) => x.error), [], 'mapped unconnected: every datagram answered');
  t.same(
    [...new Set(mapped.results.map((x) => x.source))],
    [`[${MAPPED}]:${UDP_SVC_PORT}`],
    'mapped unconnected: replies come from the mapped service address',
  );

  const mappedc = await sb.client<UdpResult>(['udp', MAPPED, String(UDP_SVC_PORT), '--mode', 'connected', '--count', '5']);
  t.same(mappedc.results.filter((x) => x.error), [], 'mapped connected: every datagram answered');
  t.equal(mappedc.peer, `[${MAPPED}]:${UDP_SVC_PORT}`, 'mapped connected: getpeername() is the mapped service address');
});
