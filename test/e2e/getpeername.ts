// getpeername() on a TCP socket connected to a service reports the service
// address, never the backend the socket was translated to.
import t from 'tap';
import { createSandbox, HTTP_PORT } from '../helpers/sandbox.js';
import { serviceWithBackends } from '../helpers/manifests.js';

const VIP = '10.96.0.30';
const PORT = 8443;

interface TcpResult {
  results: Array<{ peer?: string; body?: string; error?: string }>;
}

t.test('getpeername() reports the service address', async (t) => {
  const sb = await createSandbox(t, { backends: 2 });
  sb.writeManifest(
    'peer.yaml',
    serviceWithBackends({ name: 'peer', clusterIPs: [VIP], ports: [{ name: 'web', port: PORT }] }, [
      { name: 'peer-v4', family: 4, ports: [{ name: 'web', port: HTTP_PORT }], addresses: sb.backends.map((b) => b.v4) },
    ]),
  );
  await sb.waitForSync();

  const r = await sb.client<TcpResult>(['tcp', VIP, String(PORT), '--count', '10']);
  t.same(r.results.filter((x) => x.error), [], 'every connection succeeds');
  const backends = sb.backends.map((b) => `${b.v4}:${HTTP_PORT}`);
  for (const [i, x] of r.results.entries()) {
    t.equal(x.peer, `${VIP}:${PORT}`, `connection ${i}: getpeername() = service`);
    t.ok(backends.includes(x.body!), `connection ${i}: served by backend ${x.body}`);
  }

  const before = await sb.metrics();
  await sb.client<TcpResult>(['tcp', VIP, String(PORT)]);
  const after = await sb.metrics();
  t.ok(after.xlate_rev! > before.xlate_rev!, `xlate_rev counted the getpeername() translation (${before.xlate_rev} -> ${after.xlate_rev})`);
  t.equal(after.sock_release! - before.sock_release!, 1, 'sock_release removed the closed socket\'s rev-NAT entry');
  t.same(await sb.mapEntries('lb4_sock_revnat'), [], 'no rev-NAT entry is left once every TCP socket is closed');
});
