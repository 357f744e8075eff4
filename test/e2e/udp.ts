// UDP through a ClusterIP service to echo backends: connected sockets
// (connect4 + getpeername4) and unconnected ones (sendmsg4 per datagram,
// recvmsg4 translating each reply's source back to the service).
import t, { type Test } from 'tap';
import { createSandbox, SLOW, UDP_PORT, type Sandbox } from '../helpers/sandbox.js';
import { serviceWithBackends } from '../helpers/manifests.js';

const VIP = '10.96.0.20';
const PORT = 53000;
const COUNT = 20;

interface UdpResult {
  peer: string | null;
  results: Array<{ server?: string; echo?: string; source?: string; error?: string }>;
}

async function echoSandbox(t: Test): Promise<Sandbox> {
  const sb = await createSandbox(t, { backends: 3 });
  sb.writeManifest(
    'echo.yaml',
    serviceWithBackends({ name: 'echo', clusterIPs: [VIP], ports: [{ name: 'echo', port: PORT, protocol: 'UDP' }] }, [
      { name: 'echo-v4', family: 4, ports: [{ name: 'echo', port: UDP_PORT, protocol: 'UDP' }], addresses: sb.backends.map((b) => b.v4) },
    ]),
  );
  await sb.waitForSync();
  return sb;
}

const backendAddrs = (sb: Sandbox): string[] => sb.backends.map((b) => `${b.v4}:${UDP_PORT}`);

t.test('connected UDP: connect(), send/recv, getpeername', async (t) => {
  const sb = await echoSandbox(t);
  const r = await sb.client<UdpResult>(['udp', VIP, String(PORT), '--mode', 'connected', '--count', String(COUNT)]);
  t.equal(r.peer, `${VIP}:${PORT}`, 'getpeername() on the connected socket reports the service');
  t.same(r.results.filter((x) => x.error), [], 'every datagram is answered');
  t.equal(r.results.length, COUNT);
  const servers = new Set(r.results.map((x) => x.server));
  t.equal(servers.size, 1, 'a connected socket stays on one backend');
  t.ok(backendAddrs(sb).includes([...servers][0]!), `that backend is one of the service's (${[...servers][0]})`);
  t.ok(r.results.every((x, i) => x.echo === `ping-${i}`), 'each reply echoes its request');
});

t.test('connected UDP with socat', async (t) => {
  const sb = await echoSandbox(t);
  // -T: socat ends after that long without traffic, so it is both how long
  // the echo may take (scaled) and how socat ends once it has come.
  const r = await sb.exec(['sh', '-c', `printf hello | socat -T ${3 * SLOW} - UDP:${VIP}:${PORT}`], { timeoutMs: 10_000 });
  t.equal(r.code, 0, `socat exits 0 (${r.stderr.trim()})`);
  const [server, echoed] = r.stdout.split('|');
  t.ok(backendAddrs(sb).includes(server!), `a backend answered (${server})`);
  t.equal(echoed, 'hello', 'with the payload');
});

t.test('unconnected UDP: sendto/recvfrom, replies come from the service address', async (t) => {
  const sb = await echoSandbox(t);
  const r = await sb.client<UdpResult>(['udp', VIP, String(PORT), '--mode', 'unconnected', '--count', String(COUNT)]);
  t.same(r.results.filter((x) => x.error), [], 'every datagram is answered');
  t.equal(r.results.length, COUNT);
  const sources = [...new Set(r.results.map((x) => x.source))];
  t.same(sources, [`${VIP}:${PORT}`], 'recvfrom() reports the service address as the source of every reply');
  const servers = new Set(r.results.map((x) => x.server!));
  t.ok([...servers].every((s) => backendAddrs(sb).includes(s)), `only the service's backends answered (${[...servers].join(', ')})`);
  t.comment(`backends reached by ${COUNT} unconnected datagrams: ${servers.size}`);

  const m = await sb.metrics();
  t.ok(m.xlate_rev! >= COUNT, `xlate_rev counted the translated replies (${m.xlate_rev})`);
});
