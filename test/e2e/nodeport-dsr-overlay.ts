// Direct server return through an overlay (issue 37): node 1 reaches node
// 2's pods only through a VXLAN device over the nodes' link (addVxlan(), as
// in nodeport-networks.ts), both agents in --nodeport-mode dsr, node 2 with
// its own wire to the client (addNode2(), as in nodeport-dsr.ts). Node 1
// puts the DSR option on a remote flow's packets and sends them into the
// tunnel; node 2's agent, which attaches its VXLAN device as a tunnel,
// records the frontend from the decapsulated packets there and restores it
// on the pod's replies, which leave by node 2's wire to the client. The
// client checks every reply comes from the frontend it dialled and the pod
// saw the client itself; node 1 translated no reply. A 2 MB upload through
// the tunnel completes, the client having learned the tunnel's MTU less the
// option (1450 - 8 for IPv4, - 24 for IPv6) from node 1's error.
import t from 'tap';
import { addNode2, addVxlan, counterDelta, EXT, extLearnedMtu, extUpload, LAB_PORTS, makeLab, NODE1, POD2, requestsAnsweredBy, webRemoteLocal } from '../helpers/nodeport-lab.js';
import { createSandbox } from '../helpers/sandbox.js';
import { datapathMetrics } from '../helpers/sandbox/agent.js';

const NODE1_ARGS = ['--devices', 'n1e,n1b', '--node-name', 'node1', '--nodeport-mode', 'dsr'];
const NODE2_ARGS = ['--devices', 'n2a,n2e', '--node-name', 'node2', '--nodeport-mode', 'dsr'];
/** The tunnel's MTU (1450) less the option: what a client told "too big" sends. */
const MTU = { 4: 1450 - 8, 6: 1450 - 24 } as const;

t.test('DSR through a VXLAN overlay: the option crosses the tunnel, node 2 answers the client from the frontend, the client learns the tunnel\'s MTU less the option', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab = await makeLab(sb);
  const node2 = addNode2(sb, lab);
  addVxlan(lab);
  sb.writeManifest('services.yaml', webRemoteLocal());
  const s1 = await lab.agent.start(NODE1_ARGS);
  const s2 = await node2.start(NODE2_ARGS);
  t.ok(s1.frontends > 0 && s2.frontends > 0, `both agents synced (${s1.frontends}, ${s2.frontends} frontends)`);
  const tunnels = (logs: ReadonlyArray<Record<string, unknown>>): unknown => logs.filter((l) => l.msg === 'tc datapath: devices and node addresses').at(-1)?.['tunnels'];
  t.same(tunnels(lab.agent.agent!.logs), ['vx1'], 'node 1 attached its VXLAN device as a tunnel');
  t.same(tunnels(node2.agent!.logs), ['vx2'], 'node 2 attached its VXLAN device as a tunnel');

  for (const fam of [4, 6] as const) {
    await t.test(`IPv${fam}`, async (t) => {
      const front = fam === 4 ? NODE1.v4 : NODE1.v6;
      const client = fam === 4 ? EXT.v4 : EXT.v6;
      const m1 = await datapathMetrics(lab.agent.bpfRoot);
      const m2 = await datapathMetrics(node2.bpfRoot);
      const N = 4;
      await requestsAnsweredBy(t, lab, front, LAB_PORTS.remote, fam === 4 ? POD2.v4 : POD2.v6, client, N, 'remote backend through the tunnel, by DSR');
      const m1b = await datapathMetrics(lab.agent.bpfRoot);
      const m2b = await datapathMetrics(node2.bpfRoot);
      t.ok(counterDelta(m1, m1b, 'np_dsr_fwd') >= 3 * N, `node 1 sent the flows' packets into the tunnel with the option (np_dsr_fwd +${counterDelta(m1, m1b, 'np_dsr_fwd')})`);
      t.equal(counterDelta(m1, m1b, 'np_rev'), 0, 'node 1 translated no reply (np_rev +0)');
      t.equal(counterDelta(m2, m2b, 'np_dsr_flow'), N, `node 2 recorded each flow from the option, past the tunnel (np_dsr_flow +${counterDelta(m2, m2b, 'np_dsr_flow')})`);
      t.ok(counterDelta(m2, m2b, 'np_dsr_rev') >= 3 * N, `node 2 restored the frontend on the replies (np_dsr_rev +${counterDelta(m2, m2b, 'np_dsr_rev')})`);

      const u = await extUpload(sb, lab, front, LAB_PORTS.remote);
      t.ok(u.code === 0 && u.received === 2 << 20, `a 2 MB upload through the tunnel by DSR completes (curl ${u.code}, ${u.received} bytes${u.error ? `, ${u.error}` : ''})`);
      t.equal(await extLearnedMtu(lab, front), MTU[fam], `the client learned the tunnel's MTU less the option, ${MTU[fam]}, from node 1's error`);
    });
  }
  const m = await datapathMetrics(lab.agent.bpfRoot);
  t.ok((m['np_frag_needed'] ?? 0) > 0, `node 1 counted the too-big packets (np_frag_needed ${m['np_frag_needed']})`);
  await lab.agent.stop(10_000);
  await node2.stop(10_000);
});
