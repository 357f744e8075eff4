// Sustained new connections through a NodePort to one remote backend
// (issue 34, item 6): lbctl must take at least the rate kube-proxy takes in
// the same namespaces, for 60 s, without one failed connection.
//
// The lab (test/helpers/nodeport-lab.ts): the external client, node 1, and
// the pod on node 2, reached through node 1 with DNAT and SNAT to node 1's
// address. The pod runs bench/server.c -c: it answers and closes first (as
// an HTTP server answering "Connection: close" does), so it holds every
// tuple it saw, node 1's SNAT address and port, in TIME_WAIT for 60 s; the
// client (bench/np-load.c -m server) waits for that FIN. That is the hard
// case for a NAT: a port is reused while the pod may still hold it.
//
// 1. kube-proxy's iptables mode, emulated as bench/kube-proxy.ts writes it
//    (DNAT, then MASQUERADE --random-fully by conntrack), in node 1's
//    namespace only: closed loop for 10 s, CONCURRENCY in flight. Its
//    completed connections a second are R. On this kernel conntrack's random
//    ports land on tuples the pod holds in TIME_WAIT and the pod refuses
//    some of those SYNs (PAWS: TcpExtPAWSTimewait), so a slot waits for a
//    SYN retransmit and kube-proxy's rate is bounded by those waits, not by
//    the CPU: 3,400/s with 32 in flight, 6,000 with 256, 4,300 with 1,024
//    (2026-12, 2 vCPUs); 256 is where more concurrency stops helping.
// 2. The rules removed, the agent started: R new connections a second, open
//    loop (started on schedule whatever their latency), for 60 s. Every one
//    must complete; the rate achieved must be R within the generator's
//    slack (RATE_SLACK); the datapath must count no SNAT exhaustion and no
//    full CT map.
// 3. The client closing first (a FIN; the client holds TIME_WAIT and, with
//    tcp_tw_reuse, reuses its ports after a second, as a busy client does),
//    to a third port of the pod (a server that does not close first), clear
//    of the TIME_WAITs step 2 left there: R for 10 s, the same checks.
// 4. XDP in front (--nodeport-acceleration native): to a fourth port, the
//    server closing first, R for 20 s, the same checks, and XDP sent on
//    nearly every packet translated.
//
// A connection fails when it is not done within SUSTAINED_TIMEOUT_MS (2.5 s:
// a client that retries its SYN once, after the kernel's 1 s initial RTO,
// and then gives up), or is reset or refused. The pod listens on another
// port for lbctl's flows than for kube-proxy's, so that neither meets the
// other's TIME_WAITs: each mode starts from a clean tuple space at the same
// pod.
//
// kube-proxy itself fails a few connections at R (its line shows how many:
// the SYNs the pod refused twice). A NAT that lets a new flow reuse a tuple
// the pod holds in TIME_WAIT only when the client's own tuple is the same
// (one that keeps the client's source port, as the issue asks) meets no
// refusal: the client's timestamps on one tuple only grow. The routed pod,
// where that holds by construction, took 6,300 connections a second for
// 60 s this way with none failed, and the client-first run 10 s with none.
//
// How it fails, by cause. A datapath that holds each SNAT port 10 s after
// its flow closes (60 s more when the pod closed first), as 75b26dd did:
// after the first 4,536 connections every SYN is dropped and counted
// np_snat_exhausted, connect timeouts from the second second on. One that
// reuses the ports of closed flows, as 17a5526 does: no exhaustion, but with
// 4,536 ports at R every reuse meets a tuple the pod holds in TIME_WAIT;
// the pod refuses about 40% of the SYNs (PAWS, against 18% for conntrack's
// 64,512 random ports) and about 1% of the connections are refused twice,
// connect timeouts spread evenly over the seconds.
import { execFileSync } from 'node:child_process';
import t, { type Test } from 'tap';
import { iptablesRestoreFull } from '../../bench/kube-proxy.js';
import { npServices, serviceObject, sliceObject, type NpService } from '../../bench/np-services.js';
import { makeLab, NODE1, POD2, wireForXdp, type Lab } from '../helpers/nodeport-lab.js';
import { buildLoadTools, failureSummary, npLoad, perSecondLines, SUSTAINED_TIMEOUT_MS, type NpLoadResult } from '../helpers/np-load.js';
import { createSandbox, SLOW } from '../helpers/sandbox.js';

const KP_PORT = 8081;
const LBCTL_PORT = 8082;
const CLIENT_FIN_PORT = 8083;
const NODE_PORT = 30095;
const KP_SECONDS = 10;
const CONCURRENCY = 256;
const SUSTAIN_SECONDS = 60;
const CLIENT_FIN_SECONDS = 10;
const XDP_PORT = 8084;
const XDP_NODE_PORT = 30096;
const XDP_SECONDS = 20;
/**
 * np-load starts each connection at its scheduled time or, when it was busy,
 * as soon after as it can (it never skips one); the achieved rate is the
 * completed connections over the time to the last start. 1% allows a last
 * start 0.6 s late over 60 s, beyond which the generator was not keeping
 * the schedule.
 */
const RATE_SLACK = 0.01;

t.setTimeout(240_000 * SLOW);

/** TcpExt counters of a namespace, for what the pod and the client saw. */
function tcpExt(ns: string): Record<string, number> {
  const text = execFileSync('ip', ['netns', 'exec', ns, 'cat', '/proc/net/netstat'], { encoding: 'utf8' });
  const lines = text.split('\n').filter((l) => l.startsWith('TcpExt:'));
  const names = lines[0]?.split(/\s+/).slice(1) ?? [];
  const values = lines[1]?.split(/\s+/).slice(1).map(Number) ?? [];
  return Object.fromEntries(names.map((n, i) => [n, values[i] ?? 0]));
}

/** What the client and the pod saw over a run: SYN retransmits and SYNs the pod refused in TIME_WAIT. */
function tcpDelta(lab: Lab, run: () => Promise<NpLoadResult>): Promise<{ r: NpLoadResult; synRetrans: number; paws: number }> {
  const [ext0, pod0] = [tcpExt(lab.ext), tcpExt(lab.p2)];
  return run().then((r) => {
    const [ext1, pod1] = [tcpExt(lab.ext), tcpExt(lab.p2)];
    return { r, synRetrans: (ext1.TCPSynRetrans ?? 0) - (ext0.TCPSynRetrans ?? 0), paws: (pod1.PAWSTimewait ?? 0) - (pod0.PAWSTimewait ?? 0) };
  });
}

const describe = (r: NpLoadResult): string =>
  `${r.stopped ? `stopped after ${r.failed} failures: ` : ''}${r.completed} of ${r.started} completed in ${r.seconds.toFixed(1)} s (${r.rps.toFixed(0)}/s); failed: ${failureSummary(r)}; ` +
  `p50 ${(r.p50_us / 1000).toFixed(2)} ms, p99 ${(r.p99_us / 1000).toFixed(1)} ms, max ${(r.max_us / 1000).toFixed(0)} ms` +
  `${r.max_lag_ms !== undefined ? `; starts at most ${r.max_lag_ms.toFixed(0)} ms late, ${r.max_in_flight} in flight at most` : ''}`;

t.test("sustained new connections to one remote backend: lbctl takes kube-proxy's rate for 60 s with no failed connection", async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab = await makeLab(sb);
  const tools = buildLoadTools(sb.runDir);
  for (const port of [KP_PORT, LBCTL_PORT]) await sb.startServerIn(lab.p2, [tools.server, '-p', String(port), '-a', '0.0.0.0', '-c']);
  await sb.startServerIn(lab.p2, [tools.server, '-p', String(CLIENT_FIN_PORT), '-a', '0.0.0.0']);
  const fromExt = (cmd: readonly string[], ms: number) => lab.inNs(lab.ext, cmd, ms);
  const service = (podPort: number, nodePort = NODE_PORT): NpService =>
    npServices(1, { type: 'NodePort', nodePorts: { first: nodePort, last: nodePort }, measured: [[{ ip: POD2.v4, port: podPort }]] })[0]!;

  // 1. kube-proxy's iptables mode in node 1's namespace.
  const iptables = (args: readonly string[], input?: string): string =>
    execFileSync('ip', ['netns', 'exec', lab.n1, ...args], { encoding: 'utf8', input, stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
  iptables(['iptables-legacy-restore', '-w', '--noflush', '--counters'], iptablesRestoreFull([service(KP_PORT)], { clusterCIDR: '10.252.0.0/16' }));
  const kp = await tcpDelta(lab, () =>
    npLoad(fromExt, tools.load, { addr: NODE1.v4, port: NODE_PORT, seconds: KP_SECONDS, concurrency: CONCURRENCY, timeoutMs: SUSTAINED_TIMEOUT_MS, close: 'server' }),
  );
  const rate = Math.floor(kp.r.rps);
  t.comment(`kube-proxy (iptables), closed loop, ${CONCURRENCY} in flight, server closes first: ${describe(kp.r)}; ${kp.synRetrans} SYN retransmits, ${kp.paws} SYNs refused by the pod in TIME_WAIT (PAWS)`);
  t.ok(kp.r.completed > 0 && rate >= 100, `kube-proxy's emulation carried the load (R = ${rate}/s)`);

  for (const table of ['nat', 'filter']) {
    iptables(['iptables-legacy', '-w', '-t', table, '-F']);
    iptables(['iptables-legacy', '-w', '-t', table, '-X']);
  }
  t.notMatch(iptables(['iptables-legacy-save']), /KUBE-/, "kube-proxy's rules are gone from node 1");

  // 2. lbctl at R, server closes first, 60 s.
  const manifest = (svc: NpService): string => JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [serviceObject(svc), sliceObject(svc, () => 'node2')] });
  sb.writeManifest('services.json', manifest(service(LBCTL_PORT)));
  await lab.agent.start(['--devices', 'n1e,n1b', '--node-name', 'node1']);
  const counters = async (): Promise<{ exhausted: number; ctFull: number }> => {
    const m = await sb.metrics();
    return { exhausted: m.np_snat_exhausted ?? 0, ctFull: m.np_ct_full ?? 0 };
  };

  const check = async (t: Test, what: string, seconds: number, close: 'server' | 'fin', port = NODE_PORT): Promise<void> => {
    const before = await counters();
    // A second's worth of failures ends the run early: the test has failed by then and the per-second counts show how.
    const run = await tcpDelta(lab, () => npLoad(fromExt, tools.load, { addr: NODE1.v4, port, seconds, rate, timeoutMs: SUSTAINED_TIMEOUT_MS, close, maxFailed: rate }));
    const after = await counters();
    const r = run.r;
    const exhausted = after.exhausted - before.exhausted;
    const ctFull = after.ctFull - before.ctFull;
    t.comment(
      `lbctl, open loop at R = ${rate}/s, ${what}: ${describe(r)}; ${run.synRetrans} SYN retransmits, ${run.paws} SYNs refused by the pod in TIME_WAIT (PAWS); ` +
        `np_snat_exhausted +${exhausted} (${after.exhausted}), np_ct_full +${ctFull} (${after.ctFull})`,
    );
    if (r.failed > 0 || exhausted > 0) t.comment(`each second of the run (by the second a connection started):\n${perSecondLines(r).join('\n')}`);
    t.equal(r.started, Math.floor(rate * seconds), `every scheduled connection was started (${r.started}${r.stopped ? `: the load stopped after ${r.failed} failures` : ''})`);
    t.equal(r.failed, 0, `no connection failed (${failureSummary(r)})`);
    t.ok(r.rps >= rate * (1 - RATE_SLACK), `the rate achieved, ${r.rps.toFixed(0)}/s, is kube-proxy's ${rate}/s (within ${RATE_SLACK * 100}%)`);
    t.equal(exhausted, 0, 'no SNAT port ran out (np_snat_exhausted)');
    t.equal(ctFull, 0, 'no CT entry failed to be written (np_ct_full)');
  };

  await t.test(`${SUSTAIN_SECONDS} s at kube-proxy's rate, the server closing first`, (t) => check(t, `${SUSTAIN_SECONDS} s, the server closes first`, SUSTAIN_SECONDS, 'server'));

  // 3. The client closes first: it reuses its TIME_WAIT ports after a second
  //    (tcp_tw_reuse), from the whole port range, so it does not run out of
  //    its own ports at R (28,232 ports / 60 s of TIME_WAIT is 470/s).
  execFileSync('ip', ['netns', 'exec', lab.ext, 'sysctl', '-qw', 'net.ipv4.tcp_tw_reuse=1', 'net.ipv4.ip_local_port_range=1024 65535']);
  await lab.apply('services.json', manifest(service(CLIENT_FIN_PORT)));
  await t.test(`${CLIENT_FIN_SECONDS} s at kube-proxy's rate, the client closing first`, (t) => check(t, `${CLIENT_FIN_SECONDS} s, the client closes first`, CLIENT_FIN_SECONDS, 'fin'));

  // 4. With XDP in front (--nodeport-acceleration native, the lab wired for it): to a fresh
  //    port of the pod, the server closing first, R for XDP_SECONDS; XDP sends the flows on.
  //    Another nodePort (none of step 3's client TIME_WAITs towards it) and the client's own
  //    port range and TIME_WAIT reuse back as in step 2, so that SNAT keeps its ports again.
  await lab.agent.stop(10_000);
  wireForXdp(lab);
  execFileSync('ip', ['netns', 'exec', lab.ext, 'sysctl', '-qw', 'net.ipv4.tcp_tw_reuse=2', 'net.ipv4.ip_local_port_range=32768 60999']);
  await sb.startServerIn(lab.p2, [tools.server, '-p', String(XDP_PORT), '-a', '0.0.0.0', '-c']);
  sb.writeManifest('services.json', manifest(service(XDP_PORT, XDP_NODE_PORT)));
  await lab.agent.start(['--devices', 'n1e,n1b', '--node-name', 'node1', '--nodeport-acceleration', 'native']);
  const x0 = await sb.metrics();
  await t.test(`${XDP_SECONDS} s at kube-proxy's rate with XDP acceleration, the server closing first`, (t) => check(t, `${XDP_SECONDS} s at XDP, the server closes first`, XDP_SECONDS, 'server', XDP_NODE_PORT));
  const x1 = await sb.metrics();
  const atXdp = (x1.np_xdp_fwd ?? 0) - (x0.np_xdp_fwd ?? 0);
  const translated = (x1.np_fwd ?? 0) + (x1.np_rev ?? 0) - (x0.np_fwd ?? 0) - (x0.np_rev ?? 0);
  t.ok(atXdp >= 0.9 * translated, `XDP sent on most of the packets translated (np_xdp_fwd +${atXdp} of ${translated}; the rest, each flow's first packets before the neighbour is known, at tc)`);
  await lab.agent.stop(10_000);
});
