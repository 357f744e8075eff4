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
//     out (a restart would not make room).
// LBCTL_KUBELET_SCALE=1 runs the windows in real time (about 5 minutes each).
import t, { type Test } from 'tap';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { FakeApiServer } from '../helpers/fake-apiserver.js';
import { daemonSetProbes, Kubelet, restartWindowSeconds, type ProbeKind } from '../helpers/kubelet.js';
import { serviceObject, serviceWithBackends, sliceObject, yamlDocs } from '../helpers/manifests.js';
import { createSandbox, HTTP_PORT, ROOT, SLOW, type AgentProcess, type Sandbox } from '../helpers/sandbox.js';

const SCALE = Number(process.env.LBCTL_KUBELET_SCALE ?? 10) || 10;
const PROBES = daemonSetProbes();
const WINDOW_MS = (restartWindowSeconds(PROBES) * 1000) / SCALE;
t.setTimeout((3 * WINDOW_MS + 240_000) * SLOW);

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
