// Restart: the datapath outlives the agent (pinned links and maps). With the
// agent stopped, services keep working and `lbctl bpf lb list` still reads
// the maps; a restarted agent adopts ids and state from the pinned maps and
// its first sync plans no write at all.
import t, { type Test } from 'tap';
import { createSandbox, HTTP_PORT, UDP_PORT, type Sandbox } from '../helpers/sandbox.js';
import { serviceWithBackends, yamlDocs, serviceObject, sliceObject } from '../helpers/manifests.js';

const WEB = '10.96.0.10';
const ECHO = '10.96.0.20';

interface TcpResult {
  results: Array<{ peer?: string; body?: string; error?: string }>;
}
interface UdpResult {
  results: Array<{ server?: string; source?: string; error?: string }>;
}

function manifests(sb: Sandbox): Record<string, string> {
  const addresses = sb.backends.map((b) => b.v4);
  return {
    'web.yaml': serviceWithBackends({ name: 'web', clusterIPs: [WEB, 'fd00:96::10'], ports: [{ name: 'http', port: 80 }] }, [
      { name: 'web-v4', family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses },
      { name: 'web-v6', family: 6, ports: [{ name: 'http', port: HTTP_PORT }], addresses: sb.backends.map((b) => b.v6) },
    ]),
    'echo.yaml': yamlDocs([
      serviceObject({ name: 'echo', clusterIPs: [ECHO], ports: [{ name: 'echo', port: 53000, protocol: 'UDP' }] }),
      sliceObject({ name: 'echo-v4', service: 'echo', family: 4, ports: [{ name: 'echo', port: UDP_PORT, protocol: 'UDP' }], addresses }),
    ]),
  };
}

async function servicesWork(t: Test, sb: Sandbox, when: string): Promise<void> {
  const tcp = await sb.client<TcpResult>(['tcp', WEB, '80', '--count', '15']);
  t.same(tcp.results.filter((x) => x.error), [], `${when}: TCP connections succeed`);
  t.same([...new Set(tcp.results.map((x) => x.peer))], [`${WEB}:80`], `${when}: getpeername() is the service`);
  t.ok(new Set(tcp.results.map((x) => x.body)).size >= 2, `${when}: balanced over several backends`);
  const udp = await sb.client<UdpResult>(['udp', ECHO, '53000', '--mode', 'unconnected', '--count', '5']);
  t.same(udp.results.filter((x) => x.error), [], `${when}: UDP datagrams are answered`);
  t.same([...new Set(udp.results.map((x) => x.source))], [`${ECHO}:53000`], `${when}: UDP replies come from the service`);
}


t.test('services survive an agent restart, which writes nothing', async (t) => {
  const sb = await createSandbox(t, { backends: 3, agent: false });
  for (const [name, text] of Object.entries(manifests(sb))) sb.writeManifest(name, text);
  const first = await sb.startAgent();
  t.ok(first.planned > 0, `the first agent programs the maps (${first.planned} writes)`);
  await servicesWork(t, sb, 'agent running');
  const listBefore = await sb.lbList();

  const code = await sb.stopAgent();
  t.equal(code, 0, 'the agent exits 0 on SIGTERM');
  t.ok(sb.agent!.logs.some((l) => l.msg?.startsWith('agent stopped')), 'and says it stopped');

  await servicesWork(t, sb, 'agent stopped');
  t.same(await sb.lbList(), listBefore, 'lbctl bpf lb list works with the agent down and shows the same maps');
  const m = await sb.metrics();
  t.ok(m.xlate_fwd! > 0, 'lbctl bpf metrics list works with the agent down');

  const second = await sb.startAgent();
  t.equal(second.planned, 0, 'the restarted agent plans 0 writes');
  t.equal(second.applied, 0, 'and applies none');
  t.equal(second.frontends, first.frontends, 'for the same frontends');
  const programs = sb.agent!.logs.filter((l) => l.msg === 'program replaced on pinned link' || l.msg === 'program attached');
  t.ok(programs.length > 0 && programs.every((l) => l.msg === 'program replaced on pinned link'), `every program replaced on its pinned link (${programs.length})`);
  t.same(await sb.lbList(), listBefore, 'ids, slots and rev-NAT ids are the adopted ones');
  await servicesWork(t, sb, 'agent restarted');

  // The restarted agent still applies changes.
  sb.writeManifest('web.yaml', serviceWithBackends({ name: 'web', clusterIPs: [WEB], ports: [{ name: 'http', port: 80 }] }, [
    { name: 'web-v4', family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: [sb.backends[0]!.v4] },
  ]));
  const change = await sb.waitForSync();
  t.ok(change.applied > 0, `a later change is applied (${change.applied} writes)`);
  const tcp = await sb.client<TcpResult>(['tcp', WEB, '80', '--count', '10']);
  t.same([...new Set(tcp.results.map((x) => x.body))], [`${sb.backends[0]!.v4}:${HTTP_PORT}`], 'and takes effect');
});

t.test('changes made while the agent is down are applied when it returns', async (t) => {
  const sb = await createSandbox(t, { backends: 2, agent: false });
  for (const [name, text] of Object.entries(manifests(sb))) sb.writeManifest(name, text);
  await sb.startAgent();
  await sb.stopAgent();
  sb.removeManifest('echo.yaml');
  const second = await sb.startAgent();
  t.ok(second.planned > 0, `the restart sync removes the echo service (${second.planned} writes)`);
  t.notOk((await sb.lbList()).some((e) => e.frontend.startsWith(ECHO)), 'echo is gone from the maps');
  const udp = await sb.client<{ error: string | null }>(['refused', ECHO, '53000', '--proto', 'udp']);
  t.equal(udp.error, 'ENETUNREACH', 'and its address is no service any more');
});
