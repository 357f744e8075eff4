// What flows through a NodePort live through (issue 34, items 5, 7 and 8),
// from the external client of the NodePort lab (test/helpers/nodeport-lab.ts):
//
// - a UDP flow whose backend leaves the service: one connected socket (one
//   source port) keeps sending; its backend turns terminating and the flow
//   stays; the backend is removed and another added, and the same socket's
//   datagrams reach the new one within 5 s (kube-proxy flushes such UDP
//   conntrack entries; Cilium picks again), where they used to stay pinned
//   to the old pod for as long as they kept coming;
// - 4,000-byte UDP datagrams, fragmented both ways, over IPv4 and IPv6, to a
//   remote pod (SNAT) and a local one: each answer comes back whole;
// - flow maps too small (--ct-max, --nat-max): new flows evict dead ones and
//   are served, no answer reaches another client, the agent stays healthy,
//   says which flag to raise, and exports the maps' fill;
// - the node's own connection to a remote pod, from a port of
//   --snat-port-range (its ephemeral ports are there): a client connecting
//   from the same port through a NodePort does not get that tuple (SNAT
//   keeps a client's port only when it is free), and both work;
// - the conntrack timeouts of kube-proxy's flags reach the datapath.
// Each in every tc attach mode, side by side.
import t, { type Test } from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import { ECHO_PORT, eachMode, endpoint, makeLab, NODE1, NODE1_TO_N2, northSouth, ourPrograms, POD1, POD2, type Lab, type LabEndpoint } from '../helpers/nodeport-lab.js';
import type { AttachMode } from '../../src/datapath/nodeport.js';
import { CLIENT_PY, createSandbox, SLOW, type Sandbox } from '../helpers/sandbox.js';
import { run, sleep } from '../helpers/sandbox/run.js';

const UDP = 9000;
const NP_UDP = 30110;
const NP_UDP_LOCAL = 30111;
const NODE_ARGS = ['--devices', 'n1e,n1b', '--node-name', 'node1'];

const udpService = (name: string, nodePort: number, eps: Partial<Record<4 | 6, readonly LabEndpoint[]>>, clusterIPs = ['10.96.0.30', 'fd00:96::30']): object[] =>
  northSouth({ name, clusterIPs, ports: [{ name: 'udp', port: 90, targetPort: UDP, nodePort, protocol: 'UDP' }] }, eps);

async function lab(t: Test, mode: AttachMode, docs: object[], extra: readonly string[] = []): Promise<{ sb: Sandbox; lab: Lab }> {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const l = await makeLab(sb);
  sb.writeManifest('services.yaml', yamlDocs(docs));
  const sync = await l.agent.start([...NODE_ARGS, '--tc-attach', mode, ...extra]);
  t.ok(sync.frontends > 0, `the agent synced (${sync.frontends} frontends)`);
  await ourPrograms(t, l, ['n1e', 'n1b'], mode, 'the kernel');
  return { sb, lab: l };
}

t.test('a UDP flow whose backend is removed and replaced moves to the new one (same source port) within 5 s; a terminating one keeps it', (t) => eachMode(t, async (t, mode) => {
  const { sb, lab: l } = await lab(t, mode, udpService('dns', NP_UDP, { 4: [endpoint(2, 4)] }));
  const flow = l.startUdpLong(NODE1.v4, NP_UDP, { interval: 0.1, maxSeconds: 60 * SLOW });
  const waitFor = async (what: string, ok: (last: { server?: string } | null) => boolean, ms: number): Promise<number> => {
    const from = Date.now();
    while (Date.now() - from < ms * SLOW) {
      const p = flow.progress();
      if (p && ok(p.last)) return (Date.now() - from) / 1000;
      await sleep(50);
    }
    throw new Error(`udp-long: ${what} not seen within ${ms * SLOW} ms; progress ${JSON.stringify(flow.progress())}`);
  };
  await waitFor('an answer from pod 2', (last) => last?.server?.startsWith(POD2.v4) ?? false, 10_000);

  // pod 2 terminating, pod 1 ready beside it: the established flow stays on pod 2
  await l.apply('services.yaml', yamlDocs(udpService('dns', NP_UDP, { 4: [{ ...endpoint(2, 4), terminating: true }, endpoint(1, 4)] })));
  const kept = (await sb.metrics())['np_rebalance'] ?? 0;
  await sleep(1500); // the pace is the test: 15 datagrams of the flow while pod 2 terminates
  t.ok(flow.progress()?.last?.server?.startsWith(POD2.v4), `terminating: the flow still reaches pod 2 (${JSON.stringify(flow.progress()?.last)})`);

  // pod 2 gone (a deleted pod's endpoint leaves the slice); its process still answers: only the datapath decides
  const removedAt = Date.now();
  await l.apply('services.yaml', yamlDocs(udpService('dns', NP_UDP, { 4: [endpoint(1, 4)] })));
  await waitFor('an answer from pod 1', (last) => last?.server?.startsWith(POD1.v4) ?? false, 5_000);
  await sleep(500); // the pace is the test: a few more datagrams after the move
  const r = await flow.stop();
  t.equal(r.sockets.length, 1, `one socket throughout: the same source port (${r.sockets.map((s) => s.peer).join(', ')})`);
  t.same(r.events.filter((e) => e.foreign), [], 'no answer was another client\'s');
  const first = r.events.findIndex((e) => e.server?.startsWith(POD1.v4));
  const movedAfter = (r.events[first]!.at - removedAt) / 1000;
  t.ok(movedAfter <= 5 * SLOW, `the flow reached pod 1 ${movedAfter.toFixed(1)} s after the removal was written (sync included)`);
  t.ok(r.events.slice(first).every((e) => e.server?.startsWith(POD1.v4)), 'every later datagram went to pod 1');
  const m = await sb.metrics();
  t.ok((m['np_rebalance'] ?? 0) > kept, `np_rebalance counted it (${kept} → ${m['np_rebalance']})`);
  await l.agent.stop(10_000);
}));

t.test('4,000-byte UDP datagrams, fragmented both ways, IPv4 and IPv6, to a remote and a local pod', (t) => eachMode(t, async (t, mode) => {
  const { sb, lab: l } = await lab(t, mode, [
    ...udpService('remote', NP_UDP, { 4: [endpoint(2, 4)], 6: [endpoint(2, 6)] }, ['10.96.0.31', 'fd00:96::31']),
    ...udpService('local', NP_UDP_LOCAL, { 4: [endpoint(1, 4)], 6: [endpoint(1, 6)] }, ['10.96.0.32', 'fd00:96::32']),
  ]);
  for (const [port, pod] of [[NP_UDP, POD2], [NP_UDP_LOCAL, POD1]] as const) {
    for (const f of ['v4', 'v6'] as const) {
      const r = await l.inExt([sb.python, CLIENT_PY, 'udp', NODE1[f], String(port), '--mode', 'connected', '--count', '5', '--size', '4000']);
      const res = (JSON.parse(r.stdout || '{}') as { results?: Array<{ server?: string; intact?: boolean; sent?: number; error?: string }> }).results ?? [];
      const what = `IPv${f[1]}, ${pod === POD2 ? 'remote' : 'local'} pod`;
      t.equal(res.length, 5, `${what}: five datagrams (${r.stderr.trim()})`);
      t.ok(res.every((x) => x.intact === true && x.sent === 4000), `${what}: every 4,000-byte datagram came back whole (${JSON.stringify(res.map((x) => x.error ?? x.intact))})`);
      t.ok(res.every((x) => x.server?.includes(pod[f])), `${what}: answered by the pod`);
    }
  }
  const m = await sb.metrics();
  t.equal(m['np_frag'] ?? 0, 0, 'no fragment dropped (np_frag)');
  await l.agent.stop(10_000);
}));

t.test('flow maps too small: dead flows are evicted for new ones, no answer reaches another client, the agent stays healthy and says what to raise', (t) => eachMode(t, async (t, mode) => {
  const CLIENTS = 12;
  const { sb, lab: l } = await lab(t, mode, udpService('small', NP_UDP, { 4: [endpoint(2, 4)] }), ['--ct-max', '16', '--nat-max', '8']);
  // More live UDP flows than lb4_nat has room for, each a socket of its own.
  const mark = l.agent.agent!.logs.length;
  const flows = Array.from({ length: CLIENTS }, () => l.startUdpLong(NODE1.v4, NP_UDP, { interval: 0.05, maxSeconds: 60 * SLOW }));
  // the flows contend for 8 entries until the agent's next look at the maps (every 10 s) says so
  const warned = await l.agent.agent!.waitForLog((x) => /raise --nat-max/.test(String(x.msg)), mark, 25_000).then(() => true, () => false);
  const results = await Promise.all(flows.map((f) => f.stop()));
  const answered = results.reduce((n, r) => n + r.events.filter((e) => e.server).length, 0);
  const foreign = results.flatMap((r) => r.events.filter((e) => e.foreign));
  t.ok(answered > 0, `${answered} datagrams answered across ${CLIENTS} flows`);
  t.same(foreign, [], 'no client got an answer meant for another');
  const m = await sb.metrics();
  t.comment(`np_nat_repair ${m['np_nat_repair'] ?? 0}, np_nat_stolen ${m['np_nat_stolen'] ?? 0}, np_snat_exhausted ${m['np_snat_exhausted'] ?? 0}`);
  t.ok((m['np_nat_repair'] ?? 0) + (m['np_nat_stolen'] ?? 0) > 0, 'the NAT map evicted live translations (repaired, or the flow ended): it is too small');
  // the agent: alive, serving its health endpoint, and the fill exported
  // the agent listens on 127.0.0.1 of the node's namespace: ask from inside it
  const inNode = async (port: number, p: string): Promise<{ code: number; body: string }> => {
    const r = await run('nsenter', [`--net=/run/netns/${l.n1}`, 'curl', '-sS', '--max-time', String(5 * SLOW), '-o', '-', '-w', '\n%{http_code}', `http://127.0.0.1:${port}${p}`], 10_000 * SLOW);
    const lines = r.stdout.trimEnd().split('\n');
    return { code: Number(lines.pop()), body: lines.join('\n') };
  };
  t.equal((await inNode(l.agent.port('health'), '/livez')).code, 200, 'the agent is alive (/livez 200)');
  const text = (await inNode(l.agent.port('metrics'), '/metrics')).body;
  const fill = Number(/lbctl_bpf_map_pressure\{map_name="lb4_nat"\} ([\d.]+)/.exec(text)?.[1] ?? -1);
  t.ok(fill > 0 && fill <= 1, `lbctl_bpf_map_pressure{map_name="lb4_nat"} is exported (${fill})`);
  t.match(text, /lbctl_bpf_map_pressure\{map_name="lb4_ct"\}/, 'and lb4_ct\'s');
  t.ok(warned, 'the agent logged which flag to raise');
  await l.agent.stop(10_000);
}));

t.test("the node's own connection from a port of the SNAT range keeps its tuple; a client from the same port is SNATed to another", (t) => eachMode(t, async (t, mode) => {
  const NP_ECHO = 30112;
  const { sb, lab: l } = await lab(t, mode, northSouth({ name: 'echo', clusterIPs: ['10.96.0.33'], ports: [{ name: 'echo', port: 7000, targetPort: ECHO_PORT, nodePort: NP_ECHO }] }, { 4: [endpoint(2, 4)] }));
  const PORT = 45678;
  const node = l.startLong(POD2.v4, ECHO_PORT, { ns: l.n1, sport: PORT });
  await node.answered(3, "the node's own connection to answer");
  const client = l.startLong(NODE1.v4, NP_ECHO, { sport: PORT });
  await client.answered(3, 'the client to answer through the NodePort');
  await node.answered(3, "the node's connection to keep answering");
  const [n, c] = [await node.stop(), await client.stop()];
  t.same([n.failed, c.failed], [0, 0], 'neither connection failed');
  t.equal(Object.keys(n.seenAs)[0], `${NODE1_TO_N2.v4}:${PORT}`, "the pod sees the node's own connection on its port");
  const seen = Object.keys(c.seenAs)[0] ?? '';
  t.ok(seen.startsWith(`${NODE1_TO_N2.v4}:`) && seen !== `${NODE1_TO_N2.v4}:${PORT}`, `and the client's, SNATed, on another port (${seen})`);
  const ct = JSON.parse((await sb.lbctl(['bpf', 'ct', 'list', '-o', 'json'])).stdout) as Array<{ flags: string[]; destination: string }>;
  t.ok(ct.some((e) => e.flags.includes('host') && e.destination === `${NODE1_TO_N2.v4}:${PORT}`), "lbctl bpf ct list shows the node's tuple reserved");
  await l.agent.stop(10_000);
}));

t.test("kube-proxy's conntrack timeouts reach the datapath", (t) => eachMode(t, async (t, mode) => {
  // 12 s, far from the 60 s default and long enough that a slow guest (TCG) still lists the flow alive;
  // the lower bound allows for the time the client and the listing took.
  const { sb, lab: l } = await lab(t, mode, udpService('timeouts', NP_UDP, { 4: [endpoint(1, 4)] }), ['--conntrack-udp-timeout', '12s', '--conntrack-tcp-timeout-established', '20m']);
  const sent = Date.now();
  const r = await l.inExt([sb.python, CLIENT_PY, 'udp', NODE1.v4, String(NP_UDP), '--mode', 'connected', '--count', '1']);
  t.equal(r.code, 0, r.stderr);
  const ct = JSON.parse((await sb.lbctl(['bpf', 'ct', 'list', '-o', 'json'])).stdout) as Array<{ protocol: string; direction: string; expiresIn: number }>;
  const elapsed = (Date.now() - sent) / 1000;
  const udp = ct.filter((c) => c.protocol === 'UDP' && c.direction === 'IN');
  t.ok(udp.length === 1 && udp[0]!.expiresIn <= 12 && udp[0]!.expiresIn >= Math.floor(12 - elapsed) - 1,
    `the UDP flow lives --conntrack-udp-timeout, 12 s (${elapsed.toFixed(1)} s after the datagram: ${JSON.stringify(udp)})`);
  await l.agent.stop(10_000);
}));
