// The DaemonSet's own probes restart the agent only when a restart helps
// (issue 34, item 12). The probe settings are read from
// deploy/base/daemonset.yaml, the agent runs with the ConfigMap's own
// agent.yaml, and test/helpers/kubelet.ts probes it as the kubelet would,
// at the manifest's periods divided by SCALE, with its thresholds and
// timeouts, over the longest window in which the kubelet could decide to
// restart it (the startup probe's whole budget, then one liveness window):
//   - an API server unreachable at boot: the agent is started and alive,
//     never restarted, and not ready; once the API server answers, ready;
//   - maps too small for the services (--max-services 4, six services):
//     started and alive, never restarted, not ready while frontends are left
//     out (a restart would not make room);
//   - the event loop blocked once for 6.5 s, as a cold sync of 100,000
//     services blocks it (docs/benchmarks.md: 3.3-5.3 s here, more on a
//     slower node): never restarted, the stall reported in /livez?verbose,
//     lbctl status, the metrics and the log. A restart would sync again and
//     block again: a crash loop;
//   - a loop blocked 6.5 s again and again: restarted by liveness.
// The stalls are the agent frozen by SIGSTOP and thawed by SIGCONT: its
// event loop runs no timer and answers no probe meanwhile, as under a long
// synchronous sync, and the late tick after it is what the eventloop check
// measures. They run in real time (the kubelet's periods unscaled), since
// a stall's length is real time to the agent.
// LBCTL_KUBELET_SCALE=1 runs the other windows in real time too (about 5
// minutes each).
import t, { type Test } from 'tap';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { FakeApiServer } from '../helpers/fake-apiserver.js';
import { daemonSetProbes, Kubelet, restartWindowSeconds, type ProbeKind } from '../helpers/kubelet.js';
import { serviceObject, serviceWithBackends, sliceObject, yamlDocs } from '../helpers/manifests.js';
import { createSandbox, HTTP_PORT, LBCTL, ROOT, run, SLOW, type AgentProcess, type Sandbox } from '../helpers/sandbox.js';
import { DEFAULT_EVENT_LOOP_STALLS, DEFAULT_EVENT_LOOP_THRESHOLD_MS, DEFAULT_EVENT_LOOP_WINDOW_MS } from '../../src/http/health.js';

const SCALE = Number(process.env.LBCTL_KUBELET_SCALE ?? 10) || 10;
const PROBES = daemonSetProbes();
const WINDOW_MS = (restartWindowSeconds(PROBES) * 1000) / SCALE;
/** A stall past the eventloop check's threshold whatever the phase of its 1 s tick (the tick comes 5.5-6.5 s late). */
const STALL_MS = DEFAULT_EVENT_LOOP_THRESHOLD_MS + 1500;
/** The liveness probe's window: this many failures in a row restart the agent. */
const LIVENESS_MS = PROBES.liveness.periodSeconds * PROBES.liveness.failureThreshold * 1000;
t.setTimeout((3 * WINDOW_MS + 240_000 + 2 * (DEFAULT_EVENT_LOOP_WINDOW_MS + 2 * LIVENESS_MS)) * SLOW);

/** The ConfigMap's agent.yaml, as the DaemonSet mounts it (its ports and paths are overridden by the sandbox's flags). */
function configMapFile(sb: Sandbox): string {
  const cm = parseAllDocuments(readFileSync(path.join(ROOT, 'deploy/base/configmap.yaml'), 'utf8')).map((d) => d.toJS()).find((o) => o?.kind === 'ConfigMap');
  const file = path.join(sb.runDir, 'agent.yaml');
  writeFileSync(file, (cm as { data: Record<string, string> }).data['agent.yaml']!);
  return file;
}

/** The health port the agent logged, once it has (the probes meanwhile find nothing listening, as the kubelet would). */
const healthPort = (agent: AgentProcess) => (): number | undefined => {
  const line = agent.logs.find((l) => l.msg === 'serving health, metrics and the local API');
  return line ? Number(line.health) : undefined;
};

const settings = (k: ProbeKind): string => {
  const p = PROBES[k];
  return `${p.path} every ${p.periodSeconds} s, ${p.failureThreshold} failures`;
};

t.comment(`probes from deploy/base/daemonset.yaml: startup ${settings('startup')}; liveness ${settings('liveness')}; readiness ${settings('readiness')}`);
t.comment(`the window: ${restartWindowSeconds(PROBES)} s, run in ${WINDOW_MS / 1000} s (time / ${SCALE})`);

function noRestart(t: Test, kubelet: Kubelet, what: string): void {
  t.same(kubelet.restarts.map((r) => r.kind), [], `${what}: no probe restarted the agent${kubelet.restarts.length > 0 ? `\n${kubelet.describeRestarts()}` : ''}`);
}

/** The startup probe passed, and the liveness probe then ran long enough to have restarted the agent had it failed. */
function startedAndLive(t: Test, kubelet: Kubelet): void {
  const startup = kubelet.results.filter((r) => r.kind === 'startup');
  t.ok(kubelet.started, `the startup probe passed, at its try ${startup.length}, ${startup.at(-1)?.at ?? '?'} ms after the agent was started`);
  const liveness = kubelet.results.filter((r) => r.kind === 'liveness');
  t.ok(liveness.length >= PROBES.liveness.failureThreshold, `the liveness probe ran ${liveness.length} times (${liveness.filter((r) => !r.ok).length} failed)`);
}

t.test('an API server unreachable at boot: started and alive, not ready; ready once it answers', async (t) => {
  const api = new FakeApiServer();
  await api.start();
  t.teardown(() => api.stop());
  const sb = await createSandbox(t, { backends: 1, agent: false });
  const NODE = 'node-a';
  api.apply(`apiVersion: v1\nkind: Node\nmetadata:\n  name: ${NODE}\n`);
  api.apply(serviceWithBackends({ name: 'web', clusterIPs: ['10.96.0.10'], ports: [{ name: 'http', port: 80 }] }, [
    { name: 'web-abcde', family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: [sb.backends[0]!.v4] },
  ]));
  await api.goAway();
  sb.sourceArgs = ['--kubeconfig', api.kubeconfig, '--node-name', NODE];

  const agent = sb.spawnAgent(['--config', configMapFile(sb)]);
  const kubelet = new Kubelet(PROBES, healthPort(agent), SCALE);
  t.teardown(() => kubelet.stop());
  await kubelet.until(() => kubelet.restarts.length > 0 || !agent.running, WINDOW_MS);
  t.ok(agent.running, 'the agent runs through the outage');
  noRestart(t, kubelet, `the API server away for ${restartWindowSeconds(PROBES)} s of probe time`);
  startedAndLive(t, kubelet);
  t.same(kubelet.readiness, [], 'readiness stayed "not ready" all along');
  const unready = kubelet.results.filter((r) => r.kind === 'readiness' && !r.ok).at(-1);
  t.match(unready?.body, /source-synced failed: the source has not delivered its initial state yet: Service list or watch failing/, `and says why: ${unready?.body?.slice(0, 120)}…`);
  t.notOk(agent.logs.some((l) => l.msg === 'sync done'), 'no sync while the API server is away');

  await api.comeBack();
  const answered = kubelet.now();
  t.ok(await kubelet.until(() => kubelet.ready, 60_000 * SLOW), 'ready once the API server answers');
  t.comment(`ready ${Math.round(kubelet.now() - answered)} ms after the API server came back`);
  noRestart(t, kubelet, 'and after');
  await kubelet.stop();
  t.equal(await sb.stopAgent(), 0, 'SIGTERM stops it');
});

t.test('maps too small for the services: started and alive, not ready while frontends are left out', async (t) => {
  const sb = await createSandbox(t, { backends: 1, agent: false });
  const objects: object[] = [];
  for (let i = 1; i <= 6; i++) {
    objects.push(serviceObject({ name: `svc-${i}`, clusterIPs: [`10.96.0.${i}`], ports: [{ name: 'http', port: 80 }] }));
    objects.push(sliceObject({ name: `svc-${i}-v4`, service: `svc-${i}`, family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: [sb.backends[0]!.v4] }));
  }
  sb.writeManifest('services.yaml', yamlDocs(objects));
  const agent = sb.spawnAgent(['--config', configMapFile(sb), '--max-services', '4']);
  const kubelet = new Kubelet(PROBES, healthPort(agent), SCALE);
  t.teardown(() => kubelet.stop());
  const first = await agent.waitForLog((l) => l.msg === 'sync done', 0, 30_000);
  t.equal(first.notProgrammed, 2, 'the first sync leaves 2 of 6 frontends out (4 rev-NAT ids)');
  await kubelet.until(() => kubelet.restarts.length > 0 || !agent.running, WINDOW_MS);
  t.ok(agent.running, 'the agent runs');
  noRestart(t, kubelet, `${restartWindowSeconds(PROBES)} s of probe time with frontends left out`);
  startedAndLive(t, kubelet);
  t.same(kubelet.readiness, [], 'readiness stayed "not ready" all along');
  const unready = kubelet.results.filter((r) => r.kind === 'readiness' && !r.ok).at(-1);
  t.match(unready?.body, /synced failed: 2 frontends not programmed for want of room/, `and says why: ${unready?.body}`);
  await kubelet.stop();
  t.equal(await sb.stopAgent(), 0, 'SIGTERM stops it');
});

/** The agent started with the ConfigMap's file, probed in real time from its start; resolves once the liveness probe has passed. */
async function startProbed(t: Test): Promise<{ sb: Sandbox; agent: AgentProcess; kubelet: Kubelet }> {
  const sb = await createSandbox(t, { backends: 1, agent: false });
  sb.writeManifest('web.yaml', serviceWithBackends({ name: 'web', clusterIPs: ['10.96.0.10'], ports: [{ name: 'http', port: 80 }] }, [
    { name: 'web-v4', family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: [sb.backends[0]!.v4] },
  ]));
  const agent = sb.spawnAgent(['--config', configMapFile(sb)]);
  // A frozen agent must not outlive a failed test: thawed, then stopped by the sandbox.
  t.teardown(() => {
    if (agent.running) process.kill(agent.pid, 'SIGCONT');
  });
  const kubelet = new Kubelet(PROBES, healthPort(agent), 1);
  t.teardown(() => kubelet.stop());
  await agent.waitForLog((l) => l.msg === 'sync done', 0, 30_000);
  const live = await kubelet.until(() => kubelet.results.some((r) => r.kind === 'liveness' && r.ok), 60_000 * SLOW);
  t.ok(live, 'started, and the liveness probe passes');
  return { sb, agent, kubelet };
}

/** Freezes the agent for `ms` (SIGSTOP), then thaws it: its event loop is blocked all that time. */
async function stall(agent: AgentProcess, ms: number): Promise<void> {
  process.kill(agent.pid, 'SIGSTOP');
  await new Promise((r) => setTimeout(r, ms));
  process.kill(agent.pid, 'SIGCONT');
}

const get = async (port: number, p: string): Promise<{ status: number; body: string }> => {
  const res = await fetch(`http://127.0.0.1:${port}${p}`);
  return { status: res.status, body: await res.text() };
};

t.test('the event loop blocked once (a cold sync at 100,000 services): not restarted, and the stall reported', async (t) => {
  const { sb, agent, kubelet } = await startProbed(t);
  const before = kubelet.results.length;
  await stall(agent, STALL_MS);
  const thawed = kubelet.now();

  // Reported everywhere, while it counts.
  const stalled = await agent.waitForLog((l) => l.msg === 'event loop stalled', 0, 5_000).catch(() => undefined);
  t.ok(Number(stalled?.stalledMs) > DEFAULT_EVENT_LOOP_THRESHOLD_MS, `logged: stalled ${stalled?.stalledMs} ms, ${stalled?.stallsInWindow} in the window`);
  const verbose = await get(healthPort(agent)()!, '/livez?verbose');
  t.equal(verbose.status, 200, '/livez passes');
  t.match(verbose.body, /^\[\+\]eventloop ok \(event loop blocked once in the last 1m0s, for [\d.]+s, [\d.]+m?s ago; fails at 3\)$/m, `/livez?verbose says so: ${verbose.body.split('\n')[1]}`);
  const status = await run(LBCTL, ['status', '--api-socket', sb.apiSocket], 30_000 * SLOW);
  t.match(status.stdout, /\[\+\]eventloop ok \(event loop blocked once/, 'so does lbctl status');
  const metricsPort = Number(agent.logs.find((l) => l.msg === 'serving health, metrics and the local API')?.metrics);
  const metrics = (await get(metricsPort, '/metrics')).body;
  t.match(metrics, /^lbctl_event_loop_stalls_total 1$/m, 'and the metrics count it');
  const last = Number(/^lbctl_event_loop_last_stall_seconds (\S+)$/m.exec(metrics)?.[1]);
  t.ok(last * 1000 > DEFAULT_EVENT_LOOP_THRESHOLD_MS && last * 1000 <= STALL_MS + 1000, `with its length (${last} s)`);

  // The kubelet probes on for as long as the stall counts, and a liveness window after.
  const watch = DEFAULT_EVENT_LOOP_WINDOW_MS + LIVENESS_MS;
  await kubelet.until(() => kubelet.restarts.length > 0 || !agent.running || kubelet.now() - thawed > watch, watch + 10_000);
  noRestart(t, kubelet, `a ${STALL_MS / 1000} s stall, then ${watch / 1000} s of probes`);
  const liveness = kubelet.results.slice(before).filter((r) => r.kind === 'liveness');
  const failed = liveness.filter((r) => !r.ok);
  t.ok(liveness.length >= (watch / 1000 / PROBES.liveness.periodSeconds) - 1, `the liveness probe ran ${liveness.length} times since the stall`);
  t.ok(failed.every((r) => r.at < thawed + 1000), `only probes sent during the stall failed (${failed.map((r) => `${r.detail} at ${r.at} ms`).join(', ') || 'none'}; thawed at ${Math.round(thawed)} ms)`);
  t.equal((await get(healthPort(agent)()!, '/livez?verbose')).body.split('\n')[1], '[+]eventloop ok', 'and once the window is over, nothing to say');
  await kubelet.stop();
  t.equal(await sb.stopAgent(), 0, 'SIGTERM stops it');
});

t.test('an event loop that keeps stalling: restarted by liveness', async (t) => {
  const { sb, agent, kubelet } = await startProbed(t);
  // 6.5 s stalls 4 s apart: probes time out at most twice in a row (one
  // always lands in the gap), so only the eventloop check can restart it.
  const GAP_MS = 4_000;
  let stalls = 0;
  for (; stalls < 2 * DEFAULT_EVENT_LOOP_STALLS && kubelet.restarts.length === 0; stalls++) {
    await stall(agent, STALL_MS);
    await kubelet.until(() => kubelet.restarts.length > 0, GAP_MS);
  }
  await kubelet.until(() => kubelet.restarts.length > 0, LIVENESS_MS + 5_000);
  t.same(kubelet.restarts.map((r) => r.kind), ['liveness'], `restarted by liveness, after ${stalls} stalls\n${kubelet.describeRestarts()}`);
  const bodies = kubelet.restarts[0]?.failures.map((f) => f.body ?? f.detail) ?? [];
  t.ok(bodies.some((b) => /eventloop failed: event loop blocked [3-9] times in the last 1m0s/.test(b)), `for the stalls: ${bodies.join(' | ')}`);
  t.ok(stalls >= DEFAULT_EVENT_LOOP_STALLS, `not before the ${DEFAULT_EVENT_LOOP_STALLS}rd stall`);
  await kubelet.stop();
  t.equal(await sb.stopAgent(), 0, 'SIGTERM stops it');
});
