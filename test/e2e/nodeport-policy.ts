// What the tc datapath lets through, from the external client (issue 14):
// (a) loadBalancerSourceRanges: a LoadBalancer IP open to the client's
//     range, then closed to it (dropped, counted np_src_range), then given
//     only an invalid range (fails closed: the IP is not programmed at all,
//     while the service's NodePort still answers);
// (b) externalTrafficPolicy Local with its endpoints on node 2 only: node 1
//     drops its NodePort traffic (np_local_none) and its healthCheckNodePort
//     answers 503 with localEndpoints 0; with a local endpoint back, 200 and
//     the NodePort answers from that pod;
// (c) a backend removed from the EndpointSlice while a long connection to
//     the other one stays up: that connection keeps working, and new ones
//     go only to the backend left.
// Once per tc attach mode, on one lab.
import t, { type Test } from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import { ECHO_PORT, endpoint, extGet, hostOf, LB_IP, makeLab, NODE1, northSouth, ourPrograms, perMode, POD1, POD2, type Lab, type LongRun } from '../helpers/nodeport-lab.js';
import type { AttachMode } from '../../src/datapath/nodeport.js';
import { createSandbox, SLOW, type Sandbox } from '../helpers/sandbox.js';

const HTTP = 8080;
const NODE_ARGS = ['--devices', 'n1e,n1b', '--node-name', 'node1'];

/** A timed-out curl (no answer at all: the SYN was dropped), as opposed to a refusal or a route error. */
const TIMED_OUT = /timed out|Timeout was reached/i;

async function healthCheck(lab: Lab, port: number): Promise<{ status: number; body: { localEndpoints?: number; service?: { name: string } }; raw: string }> {
  const r = await lab.inExt(['curl', '-sS', '-D', '-', '--max-time', String(3 * SLOW), `http://${NODE1.v4}:${port}/`]);
  const status = Number(/^HTTP\/1\.1 (\d+)/.exec(r.stdout)?.[1] ?? 0);
  let body = {};
  try {
    body = JSON.parse(r.stdout.split(/\r?\n\r?\n/)[1] ?? '{}') as object;
  } catch {
    /* not JSON: the status says enough */
  }
  return { status, body, raw: r.stdout + r.stderr };
}

async function until<T>(get: () => Promise<T>, ok: (v: T) => boolean, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs * SLOW;
  for (;;) {
    const v = await get();
    if (ok(v) || Date.now() > deadline) return v;
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function counter(sb: Sandbox, name: string): Promise<number> {
  return (await sb.metrics())[name] ?? 0;
}

t.test('loadBalancerSourceRanges, externalTrafficPolicy Local and a removed backend, from outside node 1', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab = await makeLab(sb);
  await perMode(t, lab, (t, mode) => policies(t, sb, lab, mode));
});

async function policies(t: Test, sb: Sandbox, lab: Lab, mode: AttachMode): Promise<void> {
  await lab.agent.start([...NODE_ARGS, '--tc-attach', mode]);
  await ourPrograms(t, lab, ['n1e', 'n1b'], mode, 'the kernel');

  await t.test('(a) loadBalancerSourceRanges: open, closed, and failing closed on an invalid range', async (t) => {
    const lb = (ranges: string[]): string =>
      yamlDocs(
        northSouth(
          {
            name: 'ranged',
            type: 'LoadBalancer',
            clusterIPs: ['10.96.0.20'],
            ports: [{ name: 'http', port: 80, targetPort: HTTP, nodePort: 30090 }],
            loadBalancerSourceRanges: ranges,
            ingress: [LB_IP.v4],
          },
          { 4: [endpoint(1), endpoint(2)] },
        ),
      );
    await lab.apply('ranged.yaml', lb(['10.250.0.0/30']));
    const open = [await extGet(lab, LB_IP.v4, 80), await extGet(lab, LB_IP.v4, 80), await extGet(lab, LB_IP.v4, 80)];
    t.ok(open.every((r) => r.ok), `[10.250.0.0/30]: the client (10.250.0.2) reaches the LoadBalancer IP ${LB_IP.v4}:80 (${open.map((r) => r.server || r.error).join(', ')})`);

    const before = await counter(sb, 'np_src_range');
    await lab.apply('ranged.yaml', lb(['192.0.2.0/24']));
    const closed = await extGet(lab, LB_IP.v4, 80, 2);
    t.notOk(closed.ok, 'changed to [192.0.2.0/24]: the client is not answered');
    t.match(closed.error, TIMED_OUT, `a timeout: the SYNs are dropped, not refused (${closed.error})`);
    const after = await counter(sb, 'np_src_range');
    t.ok(after > before, `np_src_range counted the drops (${before} → ${after})`);
    const np = await extGet(lab, NODE1.v4, 30090);
    t.ok(np.ok, `the service's NodePort is not subject to the ranges (kube-proxy's rule): ${np.server || np.error}`);

    const mark = lab.agent.agent!.logs.length;
    await lab.apply('ranged.yaml', lb(['garbage']));
    const list = await sb.lbList();
    t.notOk(list.some((e) => e.frontend.startsWith(`${LB_IP.v4}:`)), `["garbage"] only: the LoadBalancer IP is not programmed (fail closed): ${list.map((e) => e.frontend).join(', ')}`);
    t.ok(list.some((e) => e.type === 'NodePort' && e.frontend.startsWith('0.0.0.0:30090/')), 'while its NodePort stays programmed');
    const skipped = lab.agent.agent!.logs.slice(mark).find((l) => /no valid spec\.loadBalancerSourceRanges/.test(JSON.stringify(l)));
    t.ok(skipped, `the agent says why (${JSON.stringify(skipped)})`);
    const none = await extGet(lab, LB_IP.v4, 80, 2);
    t.notOk(none.ok, `the client gets nothing from the LoadBalancer IP (${none.error})`);
    const still = await extGet(lab, NODE1.v4, 30090);
    t.ok(still.ok, `and the NodePort still answers (${still.server || still.error})`);
    t.same(await sb.mapEntries('lb4_src_range'), [], 'no source range is left in lb4_src_range');

    await lab.apply('ranged.yaml', lb(['10.250.0.0/30']));
    const reopened = await extGet(lab, LB_IP.v4, 80);
    t.ok(reopened.ok, `a valid range again: the LoadBalancer IP is programmed and answers (${reopened.server || reopened.error})`);
    t.equal((await sb.mapEntries('lb4_src_range')).length, 1, 'with its one range');
    sb.removeManifest('ranged.yaml');
  });

  await t.test('(b) externalTrafficPolicy Local with endpoints only on node 2: dropped on node 1, health check 503; a local endpoint back: 200', async (t) => {
    const local = (pods: Array<1 | 2>): string =>
      yamlDocs(
        northSouth(
          {
            name: 'etp-local',
            type: 'LoadBalancer',
            clusterIPs: ['10.96.0.21'],
            ports: [{ name: 'http', port: 80, targetPort: HTTP, nodePort: 30091 }],
            externalTrafficPolicy: 'Local',
            healthCheckNodePort: 32001,
          },
          { 4: pods.map((p) => endpoint(p)) },
        ),
      );
    await lab.apply('etp-local.yaml', local([2]));
    const before = await counter(sb, 'np_local_none');
    const dropped = await extGet(lab, NODE1.v4, 30091, 2);
    t.notOk(dropped.ok, 'node 1 has no local endpoint: its NodePort does not answer');
    t.match(dropped.error, TIMED_OUT, `the SYNs are dropped (${dropped.error})`);
    const after = await counter(sb, 'np_local_none');
    t.ok(after > before, `np_local_none counted them (${before} → ${after})`);
    const hc503 = await until(() => healthCheck(lab, 32001), (h) => h.status === 503);
    t.equal(hc503.status, 503, `healthCheckNodePort 32001 answers 503 (${hc503.raw.split('\n')[0]?.trim()})`);
    t.equal(hc503.body.localEndpoints, 0, `with localEndpoints 0 (${JSON.stringify(hc503.body)})`);

    await lab.apply('etp-local.yaml', local([1, 2]));
    const hc200 = await until(() => healthCheck(lab, 32001), (h) => h.status === 200);
    t.equal(hc200.status, 200, 'the local endpoint back: 200');
    t.equal(hc200.body.localEndpoints, 1, `with localEndpoints 1 (${JSON.stringify(hc200.body)})`);
    const served = [];
    for (let i = 0; i < 6; i++) served.push(await extGet(lab, NODE1.v4, 30091));
    t.ok(served.every((r) => r.ok), `the NodePort answers (${served.map((r) => r.server || r.error).join(', ')})`);
    t.ok(served.every((r) => hostOf(r.server) === POD1.v4), 'only from the local pod');
    t.ok(served.every((r) => hostOf(r.client) === '10.250.0.2'), 'which sees the client address (no SNAT)');
    const mark = lab.agent.agent!.logs.length;
    sb.removeManifest('etp-local.yaml');
    await lab.agent.agent!.waitForLog((l) => l.msg === 'sync done', mark);
    const closed = await until(() => healthCheck(lab, 32001), (h) => h.status === 0);
    t.equal(closed.status, 0, `the service deleted: its healthCheckNodePort closes (${closed.raw.trim().split('\n')[0]})`);
  });

  await t.test('(c) a backend removed while a long connection to the other stays up', async (t) => {
    const both = (pods: Array<1 | 2>): string =>
      yamlDocs(
        northSouth(
          {
            name: 'pair',
            clusterIPs: ['10.96.0.22'],
            ports: [
              { name: 'echo', port: 7000, targetPort: ECHO_PORT, nodePort: 30092 },
              { name: 'http', port: 80, targetPort: HTTP, nodePort: 30093 },
            ],
          },
          { 4: pods.map((p) => endpoint(p)) },
        ),
      );
    await lab.apply('pair.yaml', both([1, 2]));
    // Maglev picks by the client's port: open connections until each pod has one.
    const byPod = new Map<string, LongRun>();
    const spare: LongRun[] = [];
    for (let i = 0; i < 12 && byPod.size < 2; i++) {
      const l = lab.startLong(NODE1.v4, 30092);
      await l.answered(1, 'a first answer');
      const pod = hostOf(Object.keys(l.progress()!.servers)[0] ?? '');
      if (byPod.has(pod)) spare.push(l);
      else byPod.set(pod, l);
    }
    for (const l of spare) await l.stop();
    t.same([...byPod.keys()].sort(), [POD1.v4, POD2.v4].sort(), 'a long connection to each pod');
    const toLocal = byPod.get(POD1.v4)!;
    const toRemote = byPod.get(POD2.v4)!;
    await toLocal.answered(3, 'the local one to answer');
    await toRemote.answered(3, 'the remote one to answer');

    const sync = await lab.apply('pair.yaml', both([1]));
    t.ok(sync.planned > 0, `the remote endpoint removed from the EndpointSlice (${sync.planned} writes)`);
    const list = await sb.lbList();
    const fe = list.find((e) => e.frontend.startsWith('0.0.0.0:30093/'));
    t.same(fe?.backends.map((b) => b.address), [`${POD1.v4}:${HTTP}`], 'the NodePort lists only the local pod');
    await toLocal.answered(10, 'ten more answers after the removal');
    const p = toLocal.progress()!;
    t.equal(p.failed, 0, `the long connection to the local pod keeps working (${p.ok} answers, none failed)`);
    t.same(Object.keys(p.servers), [`${POD1.v4}:${ECHO_PORT}`], 'on the same pod');
    const fresh = [];
    for (let i = 0; i < 16; i++) fresh.push(await extGet(lab, NODE1.v4, 30093));
    t.ok(fresh.every((r) => r.ok), `new connections are answered (${fresh.filter((r) => !r.ok).map((r) => r.error).join(', ') || 'all'})`);
    t.ok(fresh.every((r) => hostOf(r.server) === POD1.v4), `only by the local pod (${[...new Set(fresh.map((r) => r.server))].join(', ')})`);
    const echo = lab.startLong(NODE1.v4, 30092);
    await echo.answered(2, 'a new long connection');
    t.same(Object.keys(echo.progress()!.servers), [`${POD1.v4}:${ECHO_PORT}`], 'a new echo connection goes to the local pod too');
    await echo.stop();
    const local = await toLocal.stop();
    t.same([local.failed, local.end], [0, 'closed'], `the local long connection: ${local.ok}/${local.sent} answered, closed by the test`);
    const remote = await toRemote.stop();
    // Not asserted: a flow to a removed backend follows its CT entry (kube-proxy leaves TCP flows to removed endpoints alone too).
    t.comment(`the long connection to the removed remote pod: ${remote.ok}/${remote.sent} answered after its removal too, end: ${remote.end}`);
  });

  await lab.agent.stop(10_000);
  // The next mode starts with no service, as this one did.
  sb.removeManifest('pair.yaml');
}
