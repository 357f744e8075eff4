// A backend taken out of the EndpointSlice (removed, or marked not ready)
// gets no new connection once the agent has synced the change.
import t from 'tap';
import { createSandbox, HTTP_PORT, type Sandbox } from '../helpers/sandbox.js';
import { serviceWithBackends } from '../helpers/manifests.js';

const VIP = '10.96.0.10';
const REQUESTS = 30;

interface TcpResult {
  results: Array<{ peer?: string; body?: string; error?: string }>;
}

function manifest(sb: Sandbox, ready: readonly string[], notReady: readonly string[] = []): string {
  return serviceWithBackends({ name: 'web', clusterIPs: [VIP], ports: [{ name: 'http', port: 80 }] }, [
    { name: 'web-v4', family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: ready, notReady },
  ]);
}

async function spread(sb: Sandbox): Promise<{ counts: Record<string, number>; errors: string[] }> {
  const r = await sb.client<TcpResult>(['tcp', VIP, '80', '--count', String(REQUESTS)]);
  const counts: Record<string, number> = {};
  const errors: string[] = [];
  for (const x of r.results) {
    if (x.error) errors.push(x.error);
    else counts[x.body!] = (counts[x.body!] ?? 0) + 1;
  }
  return { counts, errors };
}

t.test('removed and not-ready backends get no new connections', async (t) => {
  const sb = await createSandbox(t, { backends: 3 });
  const [a, b, c] = sb.backends.map((x) => x.v4) as [string, string, string];
  const at = (ip: string): string => `${ip}:${HTTP_PORT}`;

  sb.writeManifest('web.yaml', manifest(sb, [a, b, c]));
  await sb.waitForSync();
  const before = await spread(sb);
  t.same(before.errors, [], 'all requests succeed with three backends');
  t.ok((before.counts[at(c)] ?? 0) > 0, `the backend to be removed (${c}) serves requests first: ${JSON.stringify(before.counts)}`);

  sb.writeManifest('web.yaml', manifest(sb, [a, b]));
  const sync = await sb.waitForSync();
  t.ok(sync.applied > 0, `the removal was applied (${sync.applied} writes)`);
  const fe = (await sb.lbList()).find((e) => e.frontend === `${VIP}:80/TCP`);
  t.same(fe?.backends.map((x) => x.address).sort(), [at(a), at(b)].sort(), 'the maps list the two remaining backends');
  const removed = await spread(sb);
  t.same(removed.errors, [], 'all requests succeed after the removal');
  t.equal(removed.counts[at(c)] ?? 0, 0, `the removed backend got none of ${REQUESTS} requests: ${JSON.stringify(removed.counts)}`);
  t.ok((removed.counts[at(a)] ?? 0) > 0 && (removed.counts[at(b)] ?? 0) > 0, 'both remaining backends got some');

  sb.writeManifest('web.yaml', manifest(sb, [a], [b]));
  await sb.waitForSync();
  const notReady = await spread(sb);
  t.same(notReady.errors, [], 'all requests succeed with one ready backend');
  t.same(notReady.counts, { [at(a)]: REQUESTS }, `only the ready backend serves once ${b} is not ready`);
});
