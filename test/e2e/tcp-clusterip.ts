// TCP through a ClusterIP service with three backends, driven by curl from
// the client netns inside the attached cgroup.
import t from 'tap';
import { createSandbox, HTTP_PORT, SLOW } from '../helpers/sandbox.js';
import { serviceWithBackends } from '../helpers/manifests.js';

const VIP = '10.96.0.10';
const REQUESTS = 30;

t.test('curl through a ClusterIP service reaches every backend', async (t) => {
  const sb = await createSandbox(t, { backends: 3 });
  sb.writeManifest(
    'web.yaml',
    serviceWithBackends({ name: 'web', clusterIPs: [VIP], ports: [{ name: 'http', port: 80 }] }, [
      { name: 'web-v4', family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: sb.backends.map((b) => b.v4) },
    ]),
  );
  const sync = await sb.waitForSync();
  t.equal(sync.frontends, 1, 'one frontend programmed');

  const list = await sb.lbList();
  const fe = list.find((e) => e.frontend === `${VIP}:80/TCP`);
  t.ok(fe, 'lbctl bpf lb list shows the service');
  t.same(
    fe?.backends.map((b) => b.address).sort(),
    sb.backends.map((b) => `${b.v4}:${HTTP_PORT}`).sort(),
    'with its three backends',
  );

  const counts = new Map<string, number>();
  const remotes = new Set<string>();
  const failures: string[] = [];
  for (let i = 0; i < REQUESTS; i++) {
    const r = await sb.exec(['curl', '-sS', '--max-time', String(5 * SLOW), '-w', '\n%{remote_ip}:%{remote_port}', `http://${VIP}/`]);
    if (r.code !== 0) {
      failures.push(`request ${i}: curl exit ${r.code}: ${r.stderr.trim()}`);
      continue;
    }
    const lines = r.stdout.trim().split('\n');
    const body = lines[0];
    const remote = lines.at(-1);
    remotes.add(remote!);
    counts.set(body!, (counts.get(body!) ?? 0) + 1);
  }
  t.same(failures, [], `all ${REQUESTS} requests succeed`);
  t.same([...remotes], [`${VIP}:80`], "curl's remote address (getpeername) is always the service");
  t.comment(`spread: ${JSON.stringify(Object.fromEntries(counts))}`);
  for (const b of sb.backends) {
    t.ok((counts.get(`${b.v4}:${HTTP_PORT}`) ?? 0) > 0, `backend ${b.v4} served some of the ${REQUESTS} requests`);
  }
  t.same([...counts.keys()].filter((k) => !sb.backends.some((b) => k === `${b.v4}:${HTTP_PORT}`)), [], 'no answer from anything but the backends');

  const m = await sb.metrics();
  t.ok(m.xlate_fwd! >= REQUESTS, `xlate_fwd counted the connects (${m.xlate_fwd})`);
});

t.test('without the agent programming it, the service address is unreachable', async (t) => {
  // Control: proves the client netns has no route to the service range, so
  // the success above is the datapath's doing.
  const sb = await createSandbox(t, { backends: 1 });
  const r = await sb.exec(['curl', '-sS', '--max-time', String(3 * SLOW), `http://${VIP}/`]);
  t.not(r.code, 0, `curl fails (exit ${r.code}: ${r.stderr.trim()})`);
});
