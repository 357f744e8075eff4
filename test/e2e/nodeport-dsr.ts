// Direct server return at tc (issue 37, --nodeport-mode dsr|hybrid): two
// lbctl nodes, each in its own namespace with its own bpf root and cgroup.
// The lab of nodeport-lab.ts, and one more wire:
//
//   ext  ext1 10.250.1.2 fd00:250:1::2  --  n2e 10.250.1.1 fd00:250:1::1  n2
//        (the client's only way to node 1 is still ext0; node 2 routes the
//        client's addresses back through n2e, never through node 1)
//
// Node 1 (the client's frontend, node addresses 10.250.0.1, fd00:250::1)
// runs its agent with --devices n1e,n1b; node 2 (the remote pod's node)
// with --devices n2a,n2e. The client checks every reply comes from the
// frontend it dialled (a TCP connection or a connected UDP socket takes no
// other), the pod names the client's own address (DSR does not SNAT), and
// the packets' way proves the replies came from node 2: node 1's counters
// show it sent the flow with the DSR option (np_dsr_fwd) and translated no
// reply of it (np_rev), node 2's that it recorded the flow (np_dsr_flow) and
// restored the frontend on the replies (np_dsr_rev), and the client's ext1
// (from node 2) received them while node 1's n1e sent none. A local
// backend on node 1 is served as before. In hybrid mode TCP goes by DSR and
// UDP is SNATed (the pod sees node 1's address). Then both agents are
// restarted under a steady load (node 1's with SIGTERM, node 2's with
// SIGKILL): not one connection fails. Every test here would fail in SNAT
// mode: the pod would see node 1's address and no np_dsr_* would count.
import t, { type Test } from 'tap';
import { addNode2, checkNoFailedLoad, counterDelta, EXT, hostOf, type Lab, LAB_PORTS, makeLab, NODE1, NODE1_TO_N2, POD1, POD2, requestsAnsweredBy, webRemoteLocal } from '../helpers/nodeport-lab.js';
import { AgentSlot } from '../helpers/sandbox/agent.js';
import { CLIENT_PY, createSandbox, SLOW, type Sandbox } from '../helpers/sandbox.js';
import { datapathMetrics, lbctl } from '../helpers/sandbox/agent.js';

/** web: both pods; remote: the pod on node 2 only; local: the pod on node 1 only. */
const { web: WEB, remote: REMOTE, local: LOCAL, remoteUdp: REMOTE_UDP } = LAB_PORTS;
const NODE1_ARGS = ['--devices', 'n1e,n1b', '--node-name', 'node1'];
const NODE2_ARGS = ['--devices', 'n2a,n2e', '--node-name', 'node2'];
const RATE4 = Math.max(5, Math.round(40 / SLOW));
const RATE6 = Math.max(5, Math.round(20 / SLOW));

interface Dsr {
  lab: Lab;
  node2: AgentSlot;
}

async function packets(lab: Lab, ns: string, dev: string, dir: 'rx' | 'tx'): Promise<number> {
  const r = await lab.inNs(ns, ['cat', `/sys/class/net/${dev}/statistics/${dir}_packets`]);
  return Number(r.stdout.trim());
}

/** A connected UDP socket to the frontend: every answer came from it (the socket takes no other), and names how the pod saw the client. */
async function udpSeenAs(lab: Lab, sb: Sandbox, host: string, port: number): Promise<{ answered: number; peers: string[]; errors: string[] }> {
  const r = await lab.inExt([sb.python, CLIENT_PY, 'udp', host, String(port), '--mode', 'connected', '--count', '5']);
  const out = JSON.parse(r.stdout) as { results: Array<{ server?: string; echo?: string; error?: string }> };
  const ok = out.results.filter((x) => x.server);
  return {
    answered: ok.length,
    peers: [...new Set(ok.map((x) => hostOf((x.echo ?? '').split('|')[0]!)))],
    errors: out.results.filter((x) => x.error).map((x) => x.error!),
  };
}

async function serveBothWays(t: Test, sb: Sandbox, d: Dsr, mode: 'dsr' | 'hybrid'): Promise<void> {
  const { lab, node2 } = d;
  for (const fam of [4, 6] as const) {
    const front = fam === 4 ? NODE1.v4 : NODE1.v6;
    const client = fam === 4 ? EXT.v4 : EXT.v6;
    const pod2 = fam === 4 ? POD2.v4 : POD2.v6;
    const pod1 = fam === 4 ? POD1.v4 : POD1.v6;
    await t.test(`IPv${fam}, --nodeport-mode ${mode}`, async (t) => {
      // lbctl's counters and the devices' packet counts, before and after each part (each read a process: few reads, for slow guests)
      const m1 = await datapathMetrics(lab.agent.bpfRoot);
      const udp = await udpSeenAs(lab, sb, front, REMOTE_UDP);
      const u1 = await datapathMetrics(lab.agent.bpfRoot);
      t.same(udp.errors, [], 'UDP: no datagram lost');
      t.equal(udp.answered, 5, 'UDP: every datagram answered from the frontend (a connected socket)');
      if (mode === 'dsr') {
        t.same(udp.peers, [client], `UDP by DSR: the pod saw the client (${udp.peers.join(', ')})`);
        t.equal(counterDelta(m1, u1, 'np_dsr_fwd'), 5, 'UDP by DSR: np_dsr_fwd +5');
      } else {
        t.same(udp.peers, [fam === 4 ? NODE1_TO_N2.v4 : NODE1_TO_N2.v6], `UDP in hybrid mode is SNATed: the pod saw node 1 (${udp.peers.join(', ')})`);
        t.equal(counterDelta(m1, u1, 'np_dsr_fwd'), 0, 'UDP in hybrid mode: np_dsr_fwd +0');
        t.equal(counterDelta(m1, u1, 'np_rev'), 5, 'UDP in hybrid mode: node 1 translated the 5 replies (np_rev +5)');
      }

      const m2 = await datapathMetrics(node2.bpfRoot);
      const ext1 = await packets(lab, lab.ext, 'ext1', 'rx');
      const n1e = await packets(lab, lab.n1, 'n1e', 'tx');
      const N = 6;
      await requestsAnsweredBy(t, lab, front, REMOTE, pod2, client, N, 'remote backend, TCP by DSR');
      const ext1b = await packets(lab, lab.ext, 'ext1', 'rx');
      const n1eb = await packets(lab, lab.n1, 'n1e', 'tx');
      const m1b = await datapathMetrics(lab.agent.bpfRoot);
      const m2b = await datapathMetrics(node2.bpfRoot);
      t.ok(counterDelta(u1, m1b, 'np_dsr_fwd') >= 3 * N, `node 1 sent the flows' packets with the DSR option (np_dsr_fwd +${counterDelta(u1, m1b, 'np_dsr_fwd')})`);
      t.equal(counterDelta(u1, m1b, 'np_rev'), 0, 'node 1 translated no reply (np_rev +0): none came back through it');
      t.equal(counterDelta(m2, m2b, 'np_dsr_flow'), N, `node 2 recorded each flow from its option (np_dsr_flow +${counterDelta(m2, m2b, 'np_dsr_flow')})`);
      t.ok(counterDelta(m2, m2b, 'np_dsr_rev') >= 3 * N, `node 2 restored the frontend on the replies (np_dsr_rev +${counterDelta(m2, m2b, 'np_dsr_rev')})`);
      t.ok(ext1b - ext1 >= 3 * N, `the client received the replies on ext1, from node 2 (${ext1b - ext1} packets)`);
      t.ok(n1eb - n1e <= 4, `node 1 sent the client (almost) nothing on n1e (${n1eb - n1e} packets: neighbour discovery at most)`);
      const ct2 = JSON.parse((await lbctl(node2.bpfRoot, ['bpf', 'ct', 'list', '-o', 'json'])).stdout) as Array<{ direction: string; destination: string; translatedTo: string; flags: string[] }>;
      const recorded = ct2.filter((c) => c.direction === 'OUT' && hostOf(c.destination) === client && c.translatedTo === (fam === 4 ? `${front}:${REMOTE}` : `[${front}]:${REMOTE}`));
      t.ok(recorded.length >= N && recorded.every((c) => c.flags.includes('dsr') && c.flags.includes('local')), `lbctl bpf ct list on node 2: the flows' reply entries, flagged dsr, hold the frontend (${recorded.length})`);

      await requestsAnsweredBy(t, lab, front, LOCAL, pod1, client, 2, 'local backend on node 1');
      await requestsAnsweredBy(t, lab, front, WEB, fam === 4 ? '10.252.' : 'fd00:252:', client, 4, 'both pods');
    });
  }
}

t.test('DSR: replies from the remote backend\'s node, from the frontend; hybrid SNATs UDP; both agents restarted under load with no failed connection', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab = await makeLab(sb);
  const node2 = addNode2(sb, lab);
  sb.writeManifest('services.yaml', webRemoteLocal());
  const d: Dsr = { lab, node2 };

  for (const mode of ['dsr', 'hybrid'] as const) {
    await t.test(`--nodeport-mode ${mode}`, async (t) => {
      await lab.agent.stop(10_000);
      await node2.stop(10_000);
      const s1 = await lab.agent.start([...NODE1_ARGS, '--nodeport-mode', mode]);
      const s2 = await node2.start([...NODE2_ARGS, '--nodeport-mode', mode]);
      t.ok(s1.frontends > 0 && s2.frontends > 0, `both agents synced (${s1.frontends}, ${s2.frontends} frontends)`);
      await serveBothWays(t, sb, d, mode);
    });
  }

  await t.test('both agents restarted under load (dsr): zero failed connections', async (t) => {
    const load = lab.startLoad({
      tcp: [`${NODE1.v4}:${REMOTE}@${RATE4}`, `[${NODE1.v6}]:${REMOTE}@${RATE6}`, `${NODE1.v4}:${WEB}@${RATE4}`],
      maxSeconds: 60 * SLOW,
    });
    // the client's first answers can take a while on a loaded machine (its Python starts in the namespace first)
    await load.waitFor((p) => p.ok >= RATE4, 'the load to run', 30_000);
    const more = async (what: string): Promise<void> => {
      const before = load.progress()!;
      const p = await load.waitFor((x) => x.ok >= before.ok + 2 * RATE4, `more connections ${what}`, 30_000);
      t.equal(p.failed, 0, `${what}: connections keep succeeding (${p.failed} failed so far)`);
    };
    // the hybrid run left both agents in hybrid: a restart into dsr is a restart under load too
    t.equal(await lab.agent.stop(10_000), 0, 'node 1: SIGTERM');
    await more('with node 1\'s agent stopped');
    await lab.agent.start([...NODE1_ARGS, '--nodeport-mode', 'dsr']);
    await more('after node 1\'s start');
    t.same(await node2.kill('SIGKILL'), { code: null, signal: 'SIGKILL' }, 'node 2: SIGKILL');
    await more('with node 2\'s agent dead');
    await node2.start([...NODE2_ARGS, '--nodeport-mode', 'dsr']);
    await more('after node 2\'s start');
    const m2 = await datapathMetrics(node2.bpfRoot);
    const r = await load.stop();
    checkNoFailedLoad(t, r, 'the load');
    t.ok((m2['np_dsr_rev'] ?? 0) > 0, `node 2 kept restoring the frontend (np_dsr_rev ${m2['np_dsr_rev']})`);
    const drops = ['np_bad_packet', 'np_fib_fail', 'np_ct_full', 'np_frag_needed', 'np_ttl'];
    const m1 = await datapathMetrics(lab.agent.bpfRoot);
    t.same(Object.fromEntries(drops.map((k) => [k, (m1[k] ?? 0) + (m2[k] ?? 0)]).filter(([, n]) => n !== 0)), {}, `neither node dropped a packet (${drops.join(', ')})`);
  });
});
