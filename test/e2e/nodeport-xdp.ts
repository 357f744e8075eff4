// XDP acceleration (issue 37, --nodeport-acceleration native|best-effort):
// the lab of nodeport-lab.ts, node 1's agent serving n1e (the client's
// wire) and n1b (node 2's) at tc and at XDP. A flow to the pod on node 2
// is SNATed and sent on by the XDP program, its replies translated back
// and sent to the client by it too, so tc never sees them: np_xdp_fwd
// counts both ways, and every packet translated is one XDP sent (but the
// first each way, before the neighbour is known). A flow to the pod on
// node 1 is translated at XDP and passed up the stack (np_xdp_fwd, and
// tc finds no service in it); the pod's replies are tc's at egress. Both
// families, TCP and UDP. A third device whose driver has no native XDP (a
// bridge) is a problem in native mode and served at tc; the agent is then
// restarted under a steady load (SIGTERM, then best-effort, where that
// device is served at tc quietly; SIGKILL, then native again) with not one
// failed connection; then started without acceleration, which removes the
// XDP programs; last, with node 2's pods behind a VXLAN (tunnels run no
// XDP), remote flows go on to tc and are SNATed to the tunnel's address.
//
// What a lab of veths needs that a NIC does not: frames XDP sends out of a
// veth reach its peer only when the peer has NAPI on (an XDP program
// there: bpf/tests/xdp_pass.c on ext0 and n2a), and a frame arriving at a
// veth's XDP program carries whatever checksum its sender's stack left for
// offload; a wire frame carries a whole one, as the senders here are told
// to (ethtool tx off on ext0 and on the pod's eth0): wireForXdp().
import path from 'node:path';
import t, { type Test } from 'tap';
import { addVxlan, checkNoFailedLoad, counterDelta, EXT, ip, type Lab, LAB_PORTS, makeLab, NODE1, NODE1_TO_N2, POD1, POD2, requestsAnsweredBy, tcAttachModes, webRemoteLocal, wireForXdp, xdpProgram } from '../helpers/nodeport-lab.js';
import { CLIENT_PY, createSandbox, SLOW } from '../helpers/sandbox.js';
import { sumCounters } from '../../src/datapath/counters.js';
import { mapsDir } from '../../src/datapath/loader.js';
import { openPinnedMap } from '../../src/native/bpf.js';

/** web: both pods; remote: the pod on node 2 only; local: the pod on node 1 only. */
const { web: WEB, remote: REMOTE, local: LOCAL, remoteUdp: REMOTE_UDP } = LAB_PORTS;
/** n1d: a bridge, up with an address, whose driver has no native XDP. */
const ARGS = ['--devices', 'n1e,n1b,n1d', '--node-name', 'node1'];
const RATE4 = Math.max(5, Math.round(40 / SLOW));
const RATE6 = Math.max(5, Math.round(20 / SLOW));

/** The datapath's counters, read from the pinned map in this process (an lbctl process a read costs seconds in a TCG guest). */
async function datapathMetrics(bpfRoot: string): Promise<Record<string, number>> {
  const map = openPinnedMap(path.join(mapsDir(bpfRoot), 'lb_metrics'));
  try {
    return Object.fromEntries(Object.entries(sumCounters(map)).map(([k, v]) => [k, Number(v)]));
  } finally {
    map.close();
  }
}

t.test('XDP acceleration: remote flows translated and sent on at XDP both ways, the rest at tc; fallback; restarts under load with no failed connection', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab = await makeLab(sb);
  wireForXdp(lab);
  ip('-n', lab.n1, 'link', 'add', 'n1d', 'type', 'bridge');
  ip('-n', lab.n1, 'addr', 'add', '10.253.0.1/24', 'dev', 'n1d');
  ip('-n', lab.n1, 'link', 'set', 'n1d', 'up');
  sb.writeManifest('services.yaml', webRemoteLocal());
  // the kernel's own mode (tcx on the host, clsact before 6.6): XDP goes in front of either the same way
  const mode = (await tcAttachModes())[0]!;
  const s = await lab.agent.start([...ARGS, '--tc-attach', mode, '--nodeport-acceleration', 'native']);
  t.ok(s.frontends > 0, `the agent synced (${s.frontends} frontends), tc in ${mode}`);
  for (const dev of ['n1e', 'n1b']) t.match(xdpProgram(lab.n1, dev), { mode: 1, name: 'lb_nodeport_xdp' }, `${dev}: lb_nodeport_xdp runs in the driver`);
  const problems = lab.agent.requireAgent().logs.filter((l) => l.msg === 'tc datapath: device not attached').map((l) => String(l.problem));
  t.match(problems, [/^device n1d \(ifindex \d+\): native XDP not attached \(.+EOPNOTSUPP.+\); served at tc$/], `native: the bridge, and only it, is a problem, named with the kernel's answer (${problems.join('; ')})`);
  t.equal(problems.length, 1, 'one problem');
  t.equal(xdpProgram(lab.n1, 'n1d'), undefined, 'the bridge runs no XDP program');

  for (const fam of [4, 6] as const) {
    const front = fam === 4 ? NODE1.v4 : NODE1.v6;
    const client = fam === 4 ? EXT.v4 : EXT.v6;
    await t.test(`IPv${fam}`, async (t) => {
      const m0 = await datapathMetrics(lab.agent.bpfRoot);
      const N = 4;
      await requestsAnsweredBy(t, lab, front, REMOTE, fam === 4 ? POD2.v4 : POD2.v6, fam === 4 ? NODE1_TO_N2.v4 : NODE1_TO_N2.v6, N, 'remote backend, SNAT');
      const m1 = await datapathMetrics(lab.agent.bpfRoot);
      // a connection is at least 3 packets each way (SYN, request, FIN; SYN-ACK, answer, FIN)
      t.ok(counterDelta(m0, m1, 'np_xdp_fwd') >= 6 * N, `XDP sent the flows' packets on, both ways (np_xdp_fwd +${counterDelta(m0, m1, 'np_xdp_fwd')})`);
      // the first packet each way may find no neighbour entry yet: tc's bpf_redirect_neigh resolves it
      const toTc = counterDelta(m0, m1, 'np_xdp_to_tc');
      t.ok(toTc <= 2, `and handed at most the first packet each way to tc (np_xdp_to_tc +${toTc})`);
      t.equal(counterDelta(m0, m1, 'np_fwd') + counterDelta(m0, m1, 'np_rev'), counterDelta(m0, m1, 'np_xdp_fwd') + toTc, 'every other packet translated was one XDP sent (np_fwd + np_rev = np_xdp_fwd + np_xdp_to_tc)');

      await requestsAnsweredBy(t, lab, front, LOCAL, fam === 4 ? POD1.v4 : POD1.v6, client, 1, 'local backend');
      const m2 = await datapathMetrics(lab.agent.bpfRoot);
      // the client's packets translated at XDP and passed up the stack to the pod; its replies are tc's at egress
      const local = counterDelta(m1, m2, 'np_xdp_fwd');
      t.ok(local >= 3, `the local backend's packets translated at XDP, passed up (np_xdp_fwd +${local})`);
      t.equal(counterDelta(m1, m2, 'np_xdp_to_tc'), 0, 'none of them handed to tc untranslated (np_xdp_to_tc +0)');
      t.equal(counterDelta(m1, m2, 'np_fwd'), local, 'each translated once (np_fwd = np_xdp_fwd: tc found no service in them)');

      const udp = await lab.inExt([sb.python, CLIENT_PY, 'udp', front, String(REMOTE_UDP), '--mode', 'connected', '--count', '5']);
      const out = JSON.parse(udp.stdout) as { results: Array<{ server?: string; error?: string }> };
      t.equal(out.results.filter((x) => x.server).length, 5, `UDP: 5 datagrams answered from the frontend (${out.results.filter((x) => x.error).map((x) => x.error).join('; ')})`);
      const m3 = await datapathMetrics(lab.agent.bpfRoot);
      t.ok(counterDelta(m2, m3, 'np_xdp_fwd') >= 10, `UDP both ways at XDP (np_xdp_fwd +${counterDelta(m2, m3, 'np_xdp_fwd')})`);
    });
  }

  await t.test('the agent restarted under load (SIGTERM, then best-effort; SIGKILL, then native): zero failed connections', async (t) => {
    const before = await datapathMetrics(lab.agent.bpfRoot);
    const load = lab.startLoad({
      tcp: [`${NODE1.v4}:${REMOTE}@${RATE4}`, `[${NODE1.v6}]:${REMOTE}@${RATE6}`, `${NODE1.v4}:${WEB}@${RATE4}`],
      maxSeconds: 60 * SLOW,
    });
    await load.waitFor((p) => p.ok >= RATE4, 'the load to run', 30_000);
    const more = async (what: string): Promise<void> => {
      const b = load.progress()!;
      const p = await load.waitFor((x) => x.ok >= b.ok + 2 * RATE4, `more connections ${what}`, 30_000);
      t.equal(p.failed, 0, `${what}: connections keep succeeding (${p.failed} failed so far)`);
    };
    t.equal(await lab.agent.stop(10_000), 0, 'SIGTERM');
    await more('with the agent stopped');
    await lab.agent.start([...ARGS, '--tc-attach', mode, '--nodeport-acceleration', 'best-effort']);
    const logs = lab.agent.requireAgent().logs;
    t.same(logs.filter((l) => l.msg === 'tc datapath: device not attached').map((l) => String(l.problem)), [], 'best-effort: no problem');
    t.ok(logs.some((l) => l.msg === '--nodeport-acceleration best-effort: devices served at tc only' && JSON.stringify(l.devices).includes('n1d')), 'best-effort: the log names the bridge, served at tc only');
    for (const dev of ['n1e', 'n1b']) t.match(xdpProgram(lab.n1, dev), { mode: 1, name: 'lb_nodeport_xdp' }, `best-effort: ${dev} still at XDP`);
    await more('after its start');
    t.same(await lab.agent.kill('SIGKILL'), { code: null, signal: 'SIGKILL' }, 'SIGKILL');
    await more('with the agent dead');
    await lab.agent.start([...ARGS, '--tc-attach', mode, '--nodeport-acceleration', 'native']);
    await more('after its start');
    const r = await load.stop();
    checkNoFailedLoad(t, r, 'the load');
    const after = await datapathMetrics(lab.agent.bpfRoot);
    t.ok(counterDelta(before, after, 'np_xdp_fwd') > 0, `XDP kept sending the remote flows on (np_xdp_fwd +${counterDelta(before, after, 'np_xdp_fwd')})`);
    const drops = ['np_bad_packet', 'np_fib_fail', 'np_ct_full', 'np_frag_needed', 'np_ttl'];
    t.same(Object.fromEntries(drops.map((k) => [k, counterDelta(before, after, k)]).filter(([, n]) => n !== 0)), {}, `no packet dropped (${drops.join(', ')})`);
  });

  await t.test('started without acceleration: the XDP programs go, tc serves', async (t) => {
    await lab.agent.stop(10_000);
    await lab.agent.start([...ARGS, '--tc-attach', mode]);
    for (const dev of ['n1e', 'n1b']) t.equal(xdpProgram(lab.n1, dev), undefined, `${dev}: no XDP program`);
    const m0 = await datapathMetrics(lab.agent.bpfRoot);
    await requestsAnsweredBy(t, lab, NODE1.v4, REMOTE, POD2.v4, NODE1_TO_N2.v4, 1, 'remote backend at tc');
    const m1 = await datapathMetrics(lab.agent.bpfRoot);
    t.equal(counterDelta(m0, m1, 'np_xdp_fwd'), 0, 'nothing at XDP');
  });

  // tunnels stay at tc (no native XDP in vxlan): a flow XDP would send into one goes on to tc
  await t.test('an overlay: remote flows routed into a VXLAN device are handed to tc, SNATed to the tunnel\'s address there', async (t) => {
    addVxlan(lab);
    await lab.agent.stop(10_000);
    await lab.agent.start([...ARGS, '--tc-attach', mode, '--nodeport-acceleration', 'native']);
    t.equal(xdpProgram(lab.n1, 'vx1'), undefined, 'the tunnel runs no XDP program');
    for (const dev of ['n1e', 'n1b']) t.match(xdpProgram(lab.n1, dev), { mode: 1, name: 'lb_nodeport_xdp' }, `${dev} at XDP`);
    const m0 = await datapathMetrics(lab.agent.bpfRoot);
    await requestsAnsweredBy(t, lab, NODE1.v4, REMOTE, POD2.v4, '10.253.0.1', 2, 'IPv4, remote backend through the tunnel');
    await requestsAnsweredBy(t, lab, NODE1.v6, REMOTE, POD2.v6, 'fd00:253::1', 2, 'IPv6, remote backend through the tunnel');
    const m1 = await datapathMetrics(lab.agent.bpfRoot);
    t.equal(counterDelta(m0, m1, 'np_xdp_fwd'), 0, 'XDP sent none of their packets');
    t.ok(counterDelta(m0, m1, 'np_xdp_to_tc') >= 12, `it handed the client's packets to tc (np_xdp_to_tc +${counterDelta(m0, m1, 'np_xdp_to_tc')})`);
    t.ok(counterDelta(m0, m1, 'np_rev') >= 12, `tc translated the replies coming back through the tunnel (np_rev +${counterDelta(m0, m1, 'np_rev')})`);
  });
});
