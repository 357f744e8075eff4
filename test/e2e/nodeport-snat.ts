// SNAT port exhaustion at tc (issue 14): node 1's agent runs with
// --snat-port-range 61000-61001, two ports. Two long-lived connections from
// the external client through a NodePort whose only endpoint is the pod on
// node 2 take both; a third connection gets no answer (the datapath drops
// its SYNs and counts np_snat_exhausted), and `lbctl bpf nat list` shows the
// two reservations. Once the client closes the two, a new connection gets
// a port again at once: a closed flow's port is taken over when no port is
// free (np_snat_reuse), rather than held until its CT entries expire; the
// pod, which did not close first, holds no TIME_WAIT on it
// (nodeport-snat-reuse.ts covers a pod that does). In each tc attach mode,
// side by side.
import t, { type Test } from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import { ECHO_PORT, endpoint, hostOf, NODE1, NODE1_TO_N2, northSouth, ourPrograms, perModeSideBySide, POD2, portOf, type Lab } from '../helpers/nodeport-lab.js';
import { CLIENT_PY, SLOW, type Sandbox } from '../helpers/sandbox.js';
import type { AttachMode } from '../../src/datapath/nodeport.js';

const NODE_PORT = 30072;
const FRONTEND = `${NODE1.v4}:${NODE_PORT}`;
const SNAT_RANGE = '61000-61001';
const NODE_ARGS_ANY_MODE = ['--devices', 'n1e,n1b', '--node-name', 'node1'];

const manifests = (): string =>
  yamlDocs(northSouth({ name: 'remote', clusterIPs: ['10.96.0.12'], ports: [{ name: 'echo', port: 7000, targetPort: ECHO_PORT, nodePort: NODE_PORT }] }, { 4: [endpoint(2, 4)] }));

interface Nat {
  direction: string;
  source: string;
  destination: string;
  xlate: string;
  to: string;
  expiresIn: number;
}

t.test('SNAT ports run out: a third connection is dropped and counted; a closed flow\'s port is taken over at once', (t) =>
  perModeSideBySide(t, exhaustion));

async function exhaustion(t: Test, sb: Sandbox, lab: Lab, mode: AttachMode): Promise<void> {
  const NODE_ARGS = [...NODE_ARGS_ANY_MODE, '--tc-attach', mode];
  sb.writeManifest('services.yaml', manifests());
  // The flag's validation: two ports are a range; one that overlaps the NodePort range is not.
  const refused = await lab.agent.start([...NODE_ARGS, '--snat-port-range', '32000-61001']).then(
    () => undefined,
    (e: unknown) => e as Error,
  );
  t.ok(refused, 'an agent with --snat-port-range 32000-61001 does not start');
  t.ok(
    lab.agent.agent!.logs.some((l) => /--snat-port-range 32000-61001 overlaps --nodeport-range 30000-32767/.test(String(l.line ?? l.msg))),
    `it names the flag and the NodePort range it overlaps (${lab.agent.agent!.tail(2)})`,
  );
  t.equal(await lab.agent.agent!.exited, 1, 'and exits 1');

  const sync = await lab.agent.start([...NODE_ARGS, '--snat-port-range', SNAT_RANGE]);
  t.ok(sync.frontends > 0, `--snat-port-range ${SNAT_RANGE} (two ports) is accepted: the agent synced ${sync.frontends} frontends`);
  await ourPrograms(t, lab, ['n1e', 'n1b'], mode, 'the kernel');

  const a = lab.startLong(NODE1.v4, NODE_PORT);
  const b = lab.startLong(NODE1.v4, NODE_PORT);
  await Promise.all([a.answered(3, 'the first connection to answer'), b.answered(3, 'the second connection to answer')]);

  const nat = JSON.parse((await sb.lbctl(['bpf', 'nat', 'list', '-o', 'json'])).stdout) as Nat[];
  const out = nat.filter((n) => n.direction === 'OUT' && n.xlate === 'XLATE_SRC');
  t.equal(out.length, 2, `bpf nat list: two SNATed flows (${JSON.stringify(out)})`);
  t.same(out.map((n) => n.to).sort(), [`${NODE1_TO_N2.v4}:61000`, `${NODE1_TO_N2.v4}:61001`], 'they hold both ports of the range, at node 1\'s address towards node 2');
  t.same(out.map((n) => n.source).sort(), [a.progress()!.local, b.progress()!.local].sort(), 'one per long connection');
  t.ok(out.every((n) => n.destination === `${POD2.v4}:${ECHO_PORT}`), 'both to the remote pod');
  t.equal(nat.filter((n) => n.direction === 'IN' && n.xlate === 'XLATE_DST').length, 2, 'and the two ways back to the client');
  const seen = [a, b].map((l) => Object.keys(l.progress()!.seenAs)[0] ?? '').sort();
  t.same(seen, [`${NODE1_TO_N2.v4}:61000`, `${NODE1_TO_N2.v4}:61001`], 'the pod sees the two SNAT ports');

  const before = (await sb.metrics())['np_snat_exhausted'] ?? 0;
  const third = await lab.inExt([sb.python, CLIENT_PY, 'refused', NODE1.v4, String(NODE_PORT), '--proto', 'tcp']);
  const thirdResult = JSON.parse(third.stdout || '{}') as { error?: string | null; ms?: number };
  t.equal(thirdResult.error, 'TimeoutError', `a third connection gets no answer: its SYNs are dropped (${third.stdout.trim()})`);
  const exhausted = (await sb.metrics())['np_snat_exhausted'] ?? 0;
  t.ok(exhausted > before, `np_snat_exhausted counted the drops (${before} → ${exhausted})`);
  await a.answered(3, 'the first connection to keep answering');
  await b.answered(3, 'the second connection to keep answering');

  // Closed (FINs both ways): the CT entries turn to the closed lifetime (10 s).
  const [ra, rb] = [await a.stop(), await b.stop()];
  t.same([ra.failed, rb.failed, ra.end, rb.end], [0, 0, 'closed', 'closed'], 'the two long connections never failed and closed with a FIN');
  const closedAt = Date.now();
  type Ct = { destination: string; direction: string; flags: string[]; expiresIn: number };
  const ours = async (): Promise<Ct[]> =>
    (JSON.parse((await sb.lbctl(['bpf', 'ct', 'list', '-o', 'json'])).stdout) as Ct[]).filter((c) => c.direction === 'IN' && c.destination === FRONTEND);
  const closing = await ours();
  t.ok(closing.length === 2 && closing.every((c) => c.flags.includes('closed') && c.expiresIn <= 10), `their CT entries are closed, 10 s at most to live (${JSON.stringify(closing.map((c) => [c.flags, c.expiresIn]))})`);
  const reuseBefore = (await sb.metrics())['np_snat_reuse'] ?? 0;

  const attempt = async (): Promise<{ ok: boolean; seenAs: string; error: string }> => {
    const r = await lab.inExt([sb.python, CLIENT_PY, 'tcp-long', NODE1.v4, String(NODE_PORT), '--seconds', '0.3', '--interval', '0.2']);
    const res = JSON.parse(r.stdout || '{}') as { ok?: number; failures?: Array<{ error: string }>; seenAs?: Record<string, number> };
    return { ok: (res.ok ?? 0) > 0, seenAs: Object.keys(res.seenAs ?? {})[0] ?? '', error: res.failures?.[0]?.error ?? r.stderr.trim() };
  };
  // The client closed first: the pod holds no TIME_WAIT (the active closer
  // does), and a closed flow's port is taken over by a new one when none is
  // free, its CT entries alive or not. (A flow the pod closes first is taken
  // over last: test/e2e/nodeport-snat-reuse.ts.)
  let fresh = { ok: false, at: 0, seenAs: '', error: '' };
  const deadline = closedAt + 40_000 * SLOW;
  while (Date.now() < deadline) {
    const got = await attempt();
    if (got.ok) {
      fresh = { ...got, at: Date.now(), error: fresh.error };
      break;
    }
    fresh.error = got.error;
    await new Promise((r) => setTimeout(r, 1000));
  }
  const after = (fresh.at - closedAt) / 1000;
  t.ok(fresh.ok, `a new connection works again ${after.toFixed(1)} s after the two closed (until then: ${fresh.error})`);
  t.ok(after < 5 * SLOW, 'at once, long before their CT entries expire (10 s): the closed flows\' ports are taken over');
  t.ok(((await sb.metrics())['np_snat_reuse'] ?? 0) > reuseBefore, 'np_snat_reuse counted the take-over');
  const heldAfter = (await sb.metrics())['np_snat_exhausted'] ?? 0;
  t.equal(hostOf(fresh.seenAs), NODE1_TO_N2.v4, `SNATed again (the pod sees ${fresh.seenAs})`);
  t.ok([61000, 61001].includes(portOf(fresh.seenAs)), 'to a port of the range');
  t.comment(`np_snat_exhausted ${heldAfter}; a port came back ${after.toFixed(1)} s after the close`);
  await lab.agent.stop(10_000);
}
