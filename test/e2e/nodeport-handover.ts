// A handover from kube-proxy (docs/deploy.md, "Existing connections"):
// kube-proxy's rules and conntrack entries outlive it, so a NodePort TCP
// connection it translated is still open when lbctl's tc programs attach.
// Node 1 runs kube-proxy's translation of a NodePort with two endpoints, a
// local and a remote pod (iptables DNAT to either at random, as kube-proxy's
// statistic rules pick, and MASQUERADE, in node 1's namespace); a client
// outside opens connections through it and keeps asking; lbctl then starts
// with the same Service. Each connection must go on answering (lbctl leaves
// a TCP segment of a flow it never saw begin to the kernel, `np_midflow`),
// where before lbctl balanced it as a new flow and, whenever it picked
// another pod than kube-proxy had (half the time), that pod reset it. New
// connections are lbctl's. IPv4 and IPv6, in every tc attach mode, side by
// side.
import t, { type Test } from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import { ECHO_PORT, eachMode, endpoint, makeLab, NODE1, northSouth, ourPrograms, POD1, POD2 } from '../helpers/nodeport-lab.js';
import type { AttachMode } from '../../src/datapath/nodeport.js';
import { createSandbox } from '../helpers/sandbox.js';

const NP = 30120;
/** Connections per family: each keeps kube-proxy's pod with lbctl's old behaviour half the time. */
const CONNS = 4;

async function handover(t: Test, mode: AttachMode): Promise<void> {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const l = await makeLab(sb);
  // kube-proxy's translation of NodePort NP to its two endpoints, as its iptables mode writes it
  for (const [cmd, local, remote, node] of [['iptables', POD1.v4, POD2.v4, NODE1.v4], ['ip6tables', `[${POD1.v6}]`, `[${POD2.v6}]`, NODE1.v6]] as const) {
    for (const rule of [
      ['-t', 'nat', '-A', 'PREROUTING', '-d', node, '-p', 'tcp', '--dport', String(NP), '-m', 'statistic', '--mode', 'random', '--probability', '0.5',
        '-j', 'DNAT', '--to-destination', `${local}:${ECHO_PORT}`],
      ['-t', 'nat', '-A', 'PREROUTING', '-d', node, '-p', 'tcp', '--dport', String(NP), '-j', 'DNAT', '--to-destination', `${remote}:${ECHO_PORT}`],
      ['-t', 'nat', '-A', 'POSTROUTING', '-p', 'tcp', '--dport', String(ECHO_PORT), '-j', 'MASQUERADE'],
    ]) {
      const r = await l.inNs(l.n1, [cmd, ...rule]);
      t.equal(r.code, 0, `${cmd} ${rule.join(' ')}: ${r.stderr.trim()}`);
    }
  }
  const fam = (i: number): string => `IPv${i % 2 ? 6 : 4}`;
  const before = Array.from({ length: 2 * CONNS }, (_, i) => l.startLong(i % 2 ? NODE1.v6 : NODE1.v4, NP));
  for (const [i, c] of before.entries()) await c.answered(3, `${fam(i)}: kube-proxy's translation to answer`);

  sb.writeManifest('services.yaml', yamlDocs(northSouth({ name: 'echo', clusterIPs: ['10.96.0.40', 'fd00:96::40'], ports: [{ name: 'echo', port: 7000, targetPort: ECHO_PORT, nodePort: NP }] },
    { 4: [endpoint(1, 4), endpoint(2, 4)], 6: [endpoint(1, 6), endpoint(2, 6)] })));
  const sync = await l.agent.start(['--devices', 'n1e,n1b', '--node-name', 'node1', '--tc-attach', mode]);
  t.ok(sync.frontends > 0, `lbctl synced (${sync.frontends} frontends)`);
  await ourPrograms(t, l, ['n1e', 'n1b'], mode, 'the kernel');
  for (const [i, c] of before.entries()) await c.answered(5, `${fam(i)}: kube-proxy's connection to keep answering with lbctl attached`, 10_000).catch(() => undefined);
  const after = [l.startLong(NODE1.v4, NP), l.startLong(NODE1.v6, NP)];
  for (const [i, c] of after.entries()) await c.answered(3, `${fam(i)}: a new connection to answer`);
  const m = await sb.metrics();
  const servers = new Set<string>();
  for (const [i, c] of [...before, ...after].entries()) {
    const r = await c.stop();
    for (const srv of Object.keys(r.servers)) servers.add(srv);
    const what = `${i < before.length ? 'a connection from before lbctl' : 'a connection made after'}, ${fam(i)}`;
    t.same([r.failed, r.end], [0, 'closed'], `${what}: no request failed, closed by the client`, { failures: r.failures });
  }
  t.ok(servers.size >= 2, `the connections reached both pods (${[...servers].join(', ')})`);
  t.ok((m['np_midflow'] ?? 0) > 0, `np_midflow counts the segments left to the kernel (${m['np_midflow'] ?? 0})`);
  t.ok((m['np_new'] ?? 0) >= 2, `the new connections are lbctl's (np_new ${m['np_new'] ?? 0})`);
  await l.agent.stop(10_000);
}

t.test("kube-proxy's NodePort connections in flight when lbctl attaches go on answering; new ones are lbctl's", (t) => eachMode(t, handover));
