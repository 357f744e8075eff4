// SNAT port reuse against the backend's TIME_WAIT (issue 14). A flow to a
// remote pod through a NodePort is SNATed to node 1's address and a port of
// --snat-port-range. When the pod closes first (an HTTP server answering
// "Connection: close", as backend.py does), the pod keeps that tuple in
// TIME_WAIT for 60 s. Linux clients give each connection its own random
// timestamp offset, so a new flow's SYN on that tuple carries an older
// timestamp about half the time and the pod refuses it (PAWS,
// TcpExtPAWSTimewait): it answers with an ACK of the old connection, the
// client resets and retries a second later, or gives up. The datapath
// used to free the port 10 s after the close (the CT entry's closing
// lifetime); since 04f418f it holds a closed TCP flow's port 60 s longer.
//
// A steady stream of such connections (4 a second, 25 s) through 160 SNAT
// ports: before that fix about 10 of them took a port back inside the pod's
// TIME_WAIT and about half of those were refused; now none may be, and no
// port runs out. In each tc attach mode, side by side.
import t, { type Test } from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import { endpoint, NODE1, northSouth, ourPrograms, perModeSideBySide, portOf, type Lab } from '../helpers/nodeport-lab.js';
import { SLOW, type Sandbox } from '../helpers/sandbox.js';
import type { AttachMode } from '../../src/datapath/nodeport.js';

const HTTP = 8080;
const NODE_PORT = 30082;
const SNAT_FIRST = 61000;
const SNAT_LAST = 61159;
const RATE = 4;
const SECONDS = 25;

/** TcpExt counters of a namespace (/proc/net/netstat as that namespace sees it). */
async function tcpExt(lab: Lab, ns: string): Promise<Record<string, number>> {
  const r = await lab.inNs(ns, ['cat', '/proc/net/netstat']);
  const lines = r.stdout.split('\n').filter((l) => l.startsWith('TcpExt:'));
  const names = lines[0]?.split(/\s+/).slice(1) ?? [];
  const values = lines[1]?.split(/\s+/).slice(1).map(Number) ?? [];
  return Object.fromEntries(names.map((n, i) => [n, values[i] ?? 0]));
}

t.test("a SNAT port is not reused while the remote pod may still hold its previous tuple in TIME_WAIT", (t) => perModeSideBySide(t, reuse));

async function reuse(t: Test, sb: Sandbox, lab: Lab, mode: AttachMode): Promise<void> {
  sb.writeManifest(
    'services.yaml',
    yamlDocs(northSouth({ name: 'remote', clusterIPs: ['10.96.0.12'], ports: [{ name: 'http', port: 80, targetPort: HTTP, nodePort: NODE_PORT }] }, { 4: [endpoint(2)] })),
  );
  await lab.agent.start(['--devices', 'n1e,n1b', '--node-name', 'node1', '--snat-port-range', `${SNAT_FIRST}-${SNAT_LAST}`, '--tc-attach', mode]);
  await ourPrograms(t, lab, ['n1e', 'n1b'], mode, 'the kernel');

  const podBefore = await tcpExt(lab, lab.p2);
  const clientBefore = await tcpExt(lab, lab.ext);
  const load = lab.startLoad({ tcp: [`${NODE1.v4}:${NODE_PORT}@${RATE}`], maxSeconds: 60 * SLOW });
  // The SNAT ports the flows hold, as the datapath lists them, and the flows closed on each.
  const seen = new Set<number>();
  const deadline = Date.now() + SECONDS * 1000;
  while (Date.now() < deadline) {
    const nat = JSON.parse((await sb.lbctl(['bpf', 'nat', 'list', '-o', 'json'])).stdout) as Array<{ xlate: string; to: string }>;
    for (const n of nat) if (n.xlate === 'XLATE_SRC') seen.add(portOf(n.to));
    await new Promise((r) => setTimeout(r, 1000));
  }
  const r = await load.stop();
  const pod = await tcpExt(lab, lab.p2);
  const client = await tcpExt(lab, lab.ext);
  const delta = (after: Record<string, number>, before: Record<string, number>, k: string): number => (after[k] ?? 0) - (before[k] ?? 0);
  const paws = delta(pod, podBefore, 'PAWSTimewait');
  const timeWaits = delta(pod, podBefore, 'TW');
  const synRetrans = delta(client, clientBefore, 'TCPSynRetrans');
  const exhausted = (await sb.metrics())['np_snat_exhausted'] ?? 0;
  t.comment(
    `${r.attempted} connections in ${r.seconds} s, ${seen.size} SNAT ports seen, ${r.failed} failed, max latency ${r.maxLatencyMs} ms; ` +
      `the pod: ${timeWaits} TIME_WAITs, ${paws} SYNs refused in TIME_WAIT (PAWS); the client: ${synRetrans} SYN retransmits; np_snat_exhausted ${exhausted}`,
  );
  t.ok(r.attempted >= 0.8 * RATE * SECONDS, `the load ran (${r.attempted} connections)`);
  t.ok([...seen].every((p) => p >= SNAT_FIRST && p <= SNAT_LAST), 'SNAT ports from the range only');
  t.ok(timeWaits >= r.ok - 2, `the pod closed first and kept each tuple in TIME_WAIT (${timeWaits})`);
  t.equal(paws, 0, `no SYN of a new flow met a TIME_WAIT socket of an old one at the pod (TcpExtPAWSTimewait +${paws})`);
  t.equal(synRetrans, 0, `no connection needed a SYN retransmit (TcpExtTCPSynRetrans +${synRetrans})`);
  t.equal(exhausted, 0, 'and no port ran out (np_snat_exhausted 0): the range holds the closed flows');
  t.same(r.failures, [], 'no connection failed');
  await lab.agent.stop(10_000);
}
