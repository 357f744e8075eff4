// SNAT port reuse against the backend's TIME_WAIT (issue 14). A flow to a
// remote pod through a NodePort is SNATed to node 1's address and a port of
// --snat-port-range. When the pod closes first (an HTTP server answering
// "Connection: close", as backend.py does), the pod keeps that tuple in
// TIME_WAIT for 60 s; node 1's datapath frees the port 10 s after the close
// (CT_LIFETIME_CLOSE). A new flow that gets the port inside those 60 s
// reaches the pod's TIME_WAIT socket with the same tuple, and since Linux
// clients give each connection its own random timestamp offset, its SYN
// carries an older timestamp about half the time: the pod rejects it (PAWS,
// TcpExtPAWSTimewait) and answers with an ACK of the old connection, the
// client resets, and connects only with a SYN retransmitted a second later
// (or not at all, within a 3 s deadline, when that collides again).
//
// With 16 SNAT ports and a connection a second, about 10 ports are held
// (closing) at a time and come back 10-16 s after their flow: every reuse
// falls in the pod's TIME_WAIT. The assertions on the
// outcome are TODO (a datapath bug, reported): they run and are reported,
// and fail the suite only once someone removes the TODO.
import t from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import { endpoint, makeLab, NODE1, northSouth, portOf, type Lab } from '../helpers/nodeport-lab.js';
import { createSandbox, SLOW } from '../helpers/sandbox.js';

const HTTP = 8080;
const NODE_PORT = 30082;
const SNAT_FIRST = 61000;
const SNAT_LAST = 61015;
const RATE = 1;
const SECONDS = 28;
const BUG =
  'BUG: bpf/nodeport.c np4_snat_reserve (and np6_) takes a SNAT port whose reply CT entry expired, 10 s after a close ' +
  "(CT_LIFETIME_CLOSE), while the backend holds the old tuple in TIME_WAIT for 60 s: the reused tuple's SYN is rejected " +
  'by PAWS about half the time (per-connection timestamp offsets), costing a 1 s SYN retransmit or the connection';

/** TcpExt counters of a namespace (/proc/net/netstat as that namespace sees it). */
async function tcpExt(lab: Lab, ns: string): Promise<Record<string, number>> {
  const r = await lab.inNs(ns, ['cat', '/proc/net/netstat']);
  const lines = r.stdout.split('\n').filter((l) => l.startsWith('TcpExt:'));
  const names = lines[0]?.split(/\s+/).slice(1) ?? [];
  const values = lines[1]?.split(/\s+/).slice(1).map(Number) ?? [];
  return Object.fromEntries(names.map((n, i) => [n, values[i] ?? 0]));
}

t.test('a SNAT port is not reused while the remote pod may still hold its previous tuple in TIME_WAIT', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab = await makeLab(sb);
  sb.writeManifest(
    'services.yaml',
    yamlDocs(northSouth({ name: 'remote', clusterIPs: ['10.96.0.12'], ports: [{ name: 'http', port: 80, targetPort: HTTP, nodePort: NODE_PORT }] }, { 4: [endpoint(2)] })),
  );
  await lab.agent.start(['--devices', 'n1e,n1b', '--node-name', 'node1', '--snat-port-range', `${SNAT_FIRST}-${SNAT_LAST}`]);

  const podBefore = await tcpExt(lab, lab.p2);
  const clientBefore = await tcpExt(lab, lab.ext);
  const load = lab.startLoad({ tcp: [`${NODE1.v4}:${NODE_PORT}@${RATE}`], maxSeconds: 60 * SLOW, attemptTimeout: 3 });
  const seen = new Set<number>();
  const deadline = Date.now() + SECONDS * 1000;
  while (Date.now() < deadline) {
    // The SNAT ports the flows hold, as the datapath lists them.
    const nat = JSON.parse((await sb.lbctl(['bpf', 'nat', 'list', '-o', 'json'])).stdout) as Array<{ xlate: string; to: string }>;
    for (const n of nat) if (n.xlate === 'XLATE_SRC') seen.add(portOf(n.to));
    await new Promise((r) => setTimeout(r, 1000));
  }
  const r = await load.stop();
  const pod = await tcpExt(lab, lab.p2);
  const client = await tcpExt(lab, lab.ext);
  const paws = (pod['PAWSTimewait'] ?? 0) - (podBefore['PAWSTimewait'] ?? 0);
  const timeWaits = (pod['TW'] ?? 0) - (podBefore['TW'] ?? 0);
  const synRetrans = (client['TCPSynRetrans'] ?? 0) - (clientBefore['TCPSynRetrans'] ?? 0);
  const exhausted = (await sb.metrics())['np_snat_exhausted'] ?? 0;
  t.comment(
    `${r.attempted} connections in ${r.seconds} s over ${seen.size} SNAT ports, ${r.failed} failed, max latency ${r.maxLatencyMs} ms; ` +
      `the pod: ${timeWaits} TIME_WAITs, ${paws} SYNs rejected in TIME_WAIT (PAWS); the client: ${synRetrans} SYN retransmits; np_snat_exhausted ${exhausted}`,
  );
  t.ok(r.attempted >= 0.8 * RATE * SECONDS, `the load ran (${r.attempted} connections)`);
  t.ok([...seen].every((p) => p >= SNAT_FIRST && p <= SNAT_LAST), `SNAT ports from the range only (${[...seen].sort().join(', ')})`);
  t.ok(r.attempted > seen.size, `ports were reused within the pod's 60 s TIME_WAIT (${r.attempted} connections, ${seen.size} ports)`);
  t.ok(timeWaits >= r.ok - 2, `the pod closed first and kept each tuple in TIME_WAIT (${timeWaits})`);

  t.equal(paws, 0, `no SYN of a new flow met a TIME_WAIT socket of an old one at the pod (TcpExtPAWSTimewait +${paws})`, { todo: BUG });
  t.equal(synRetrans, 0, `no connection needed a SYN retransmit (TcpExtTCPSynRetrans +${synRetrans})`, { todo: BUG });
  t.equal(r.failed, 0, `no connection failed (${JSON.stringify(r.failures.slice(0, 3))})`, { todo: BUG });
  await lab.agent.stop(10_000);
});
