// The reproduction, as a new user would try it: the agent with
// --max-services 4 (4-entry rev-NAT maps), two services, then 38 more, then
// the 38 removed and one added. While over, what fits is served, what does
// not is named in the log, in readiness (lbctl status) and counted in
// /metrics; the new service is then programmed and reachable; /livez
// answers 200 throughout (a full map is no reason to restart the agent).
import t from 'tap';
import { yamlDocs, serviceObject, sliceObject } from '../helpers/manifests.js';
import { CLI_TIMEOUT_MS, createSandbox, HTTP_PORT, LBCTL, run, SLOW, type Sandbox } from '../helpers/sandbox.js';

const vip = (i: number): string => `10.96.0.${i}`;

function services(sb: Sandbox, from: number, to: number): string {
  const objects: object[] = [];
  for (let i = from; i <= to; i++) {
    objects.push(serviceObject({ name: `svc-${i}`, clusterIPs: [vip(i)], ports: [{ name: 'http', port: 80 }] }));
    objects.push(sliceObject({ name: `svc-${i}-v4`, service: `svc-${i}`, family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: [sb.backends[0]!.v4] }));
  }
  return yamlDocs(objects);
}

async function scrape(sb: Sandbox): Promise<string> {
  const r = await fetch(`http://127.0.0.1:${sb.agentPort('metrics')}/metrics`);
  if (r.status !== 200) throw new Error(`/metrics answered ${r.status}`);
  return r.text();
}

function sample(text: string, name: string, labels: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{${labels}} `));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

async function reachable(sb: Sandbox, address: string): Promise<string[]> {
  const r = await sb.client<{ results: Array<{ error?: string; body?: string }> }>(['tcp', address, '80', '--count', '3']);
  return r.results.map((x) => x.error ?? x.body ?? '?');
}

t.test('--max-services 4: 2 services, 38 more, then the 38 removed and one added', async (t) => {
  const sb = await createSandbox(t, { backends: 1, agent: false });
  const backend = `${sb.backends[0]!.v4}:${HTTP_PORT}`;
  sb.writeManifest('first.yaml', services(sb, 1, 2));
  await sb.startAgent(['--max-services', '4']);
  t.same((await sb.mapSizes()).lb4_reverse_nat, 4, 'the rev-NAT map has 4 entries');
  t.same(await reachable(sb, vip(1)), [backend, backend, backend], 'svc-1 answers');

  // /livez polled throughout, as a kubelet would (every 100 ms here).
  const health = sb.agentPort('health');
  const livez: number[] = [];
  let polling = true;
  const poller = (async () => {
    while (polling) {
      try {
        livez.push((await fetch(`http://127.0.0.1:${health}/livez`)).status);
      } catch (err) {
        livez.push(0);
        t.comment(`/livez: ${(err as Error).message}`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  t.teardown(() => {
    polling = false;
  });

  // 38 more: 2 fit (rev-NAT ids 3 and 4), 36 do not.
  const agent = sb.agent!;
  const mark = agent.logs.length;
  sb.writeManifest('more.yaml', services(sb, 3, 40));
  const report = await sb.waitForSync();
  t.equal(report.notProgrammed, 36, 'the sync reports 36 frontends not programmed');
  const named = await agent.waitForLog((l) => l.msg === 'frontend not programmed: no room' && l.frontend === `${vip(5)}:80/TCP`, mark);
  t.match(named, { map: 'lb4_reverse_nat', reason: /no free IPv4 rev-NAT id: all 4 are in use/ }, 'the log names one, with the map and why');
  await agent.waitForLog((l) => typeof l.msg === 'string' && /16 more frontends not programmed for want of room in lb4_reverse_nat/.test(l.msg), mark);
  t.pass('the first 20 are named one by one, the other 16 summed up');
  await agent.waitForLog((l) => typeof l.msg === 'string' && /36 frontends not programmed: no room in lb4_reverse_nat; retrying/.test(l.msg), mark);
  t.pass('and the agent keeps retrying');
  t.same(await reachable(sb, vip(4)), [backend, backend, backend], 'what fits is served (svc-4)');
  t.same((await sb.lbList()).filter((e) => e.type !== 'Wildcard').map((e) => e.frontend).sort(), [1, 2, 3, 4].map((i) => `${vip(i)}:80/TCP`).sort(), 'the maps hold the 4 frontends that fit');

  const over = await scrape(sb);
  t.equal(sample(over, 'lbctl_frontends_not_programmed', 'map_name="lb4_reverse_nat"'), 36, 'lbctl_frontends_not_programmed counts them');
  t.equal(sample(over, 'lbctl_bpf_map_pressure', 'map_name="lb4_reverse_nat"'), 1, 'lbctl_bpf_map_pressure shows the rev-NAT map full');
  const status = await run(LBCTL, ['status', '--api-socket', sb.apiSocket], CLI_TIMEOUT_MS);
  t.equal(status.code, 1, 'lbctl status exits 1 while frontends are left out');
  t.match(status.stdout, /\[-\]synced failed: 36 frontends not programmed for want of room: 10\.96\.0\.5:80\/TCP \(lb4_reverse_nat\)/, 'readiness names them');
  t.match(status.stdout, /Liveness: +ok/, 'liveness is ok');
  t.match(status.stdout, /Maps: .*lb4_reverse_nat 4\/4 \(100%, FULL\)/, 'and the rev-NAT map is shown full');

  // The 38 removed, one added.
  sb.removeManifest('more.yaml');
  sb.writeManifest('new.yaml', services(sb, 41, 41));
  await sb.waitUntil(async () => (await sb.lbList()).some((e) => e.frontend === `${vip(41)}:80/TCP`), 'svc-41 in the maps', 20_000);
  const list = await sb.lbList();
  const fe41 = list.find((e) => e.frontend === `${vip(41)}:80/TCP`)!;
  t.ok(fe41.revNatId >= 1 && fe41.revNatId <= 4, `svc-41 got rev-NAT id ${fe41.revNatId}, within the map's 4 entries`);
  t.same(list.filter((e) => e.type !== 'Wildcard').map((e) => e.frontend).sort(), [1, 2, 41].map((i) => `${vip(i)}:80/TCP`).sort(), 'the removed services are gone');
  t.same(await reachable(sb, vip(41)), [backend, backend, backend], 'svc-41 answers');
  await agent.waitForLog((l) => l.msg === 'every frontend left out for want of room is programmed now', mark);
  t.pass('the agent says the shortage is over');
  const after = await scrape(sb);
  t.equal(sample(after, 'lbctl_frontends_not_programmed', 'map_name="lb4_reverse_nat"'), 0, 'the gauge is back to 0');
  t.equal(sample(after, 'lbctl_bpf_map_pressure', 'map_name="lb4_reverse_nat"'), 0.75, 'pressure 3/4');
  await sb.waitUntil(async () => (await run(LBCTL, ['status', '--brief', '--api-socket', sb.apiSocket], CLI_TIMEOUT_MS)).code === 0, 'lbctl status --brief OK');

  polling = false;
  await poller;
  t.ok(livez.length >= 5 * Math.min(1, 1 / SLOW), `/livez was probed ${livez.length} times`);
  t.same([...new Set(livez)], [200], '/livez answered 200 every time');
});

t.test('an agent that starts over the maps’ room serves what fits, and still stops at once on SIGTERM', async (t) => {
  const sb = await createSandbox(t, { backends: 1, agent: false });
  const backend = `${sb.backends[0]!.v4}:${HTTP_PORT}`;
  sb.writeManifest('all.yaml', services(sb, 1, 6));
  const first = await sb.startAgent(['--max-services', '4']);
  t.equal(first.notProgrammed, 2, 'the first sync leaves 2 of 6 out');
  t.same(await reachable(sb, vip(1)), [backend, backend, backend], 'what fits is served');
  await sb.agent!.waitForLog((l) => typeof l.msg === 'string' && /retrying/.test(l.msg));
  const t0 = Date.now();
  const code = await sb.stopAgent(10_000);
  t.equal(code, 0, `SIGTERM: the agent exited by itself (code ${code}) in ${Date.now() - t0} ms, while its retries were pending`);
  t.ok(Date.now() - t0 < 5000 * SLOW, 'and promptly');
});
