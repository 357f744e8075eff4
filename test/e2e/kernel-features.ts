// The agent's kernel feature probe on the real kernel (every kernel of the
// vmtest matrix): what it finds is what its log line, `lbctl status`, the
// local API and /metrics say; and an agent that may not load BPF programs
// (no capabilities: what a DaemonSet without CAP_BPF gets) refuses to start,
// naming why, and leaves nothing attached or pinned. test/unit/features.ts
// drives the refusal of each missing kernel feature through the probe layer.
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import t from 'tap';
import { apiGet, type AgentStatus } from '../../src/http/api.js';
import { missingRequired, probeFeatures } from '../../src/datapath/features.js';
import { createSandbox, LBCTL, SLOW, CLI_TIMEOUT_MS, run } from '../helpers/sandbox.js';

t.test('status, API and metrics show what the probe found', async (t) => {
  const sb = await createSandbox(t, { backends: 0 });
  // The same probe, from the test: the kernel answers it the same way twice.
  const probed = await probeFeatures({ cgroup: sb.cgroup, bpfRoot: sb.bpfRoot });
  t.same(missingRequired(probed), [], `this kernel (${probed.kernel}) has every required feature`);

  const line = sb.agent!.logs.find((l) => typeof l.msg === 'string' && l.msg.startsWith('datapath features: '));
  t.ok(line, 'the agent logged its features in one line');
  t.match(String(line?.msg), new RegExp(`^datapath features: kernel ${probed.kernel.replace(/[.+]/g, '\\$&')}: all 15 required features present; optional: set_retval=(yes|no) sock_destroy_kfunc=(yes|no) inet_diag_destroy=(yes|no) tcx=(yes|no)$`));

  const text = await run(LBCTL, ['status', '--api-socket', sb.apiSocket], CLI_TIMEOUT_MS);
  t.equal(text.code, 0, 'lbctl status exits 0');
  t.match(text.stdout, new RegExp(`^Kernel:\\s+${probed.kernel.replace(/[.+]/g, '\\$&')}: 15/15 required features; set_retval (yes|no), sock_destroy_kfunc (yes|no), inet_diag_destroy (yes|no), tcx (yes|no)$`, 'm'), 'status names the kernel and its features');
  const retval = probed.results.find((r) => r.name === 'set_retval')!.available;
  t.match(text.stdout, retval ? /^Datapath:\s+sock\.bpf\.o \(refused connects: ECONNREFUSED\)/m : /^Datapath:\s+sock_compat\.bpf\.o \(refused connects: EPERM\)/m, 'and the object that choice loaded');
  t.match(text.stdout, /stale UDP sockets: (bpf-sock-destroy|inet-diag|none)$/m);
  const api = await apiGet<AgentStatus>(sb.apiSocket, '/v1/status');
  t.same(api.kernel?.features.map((f) => [f.name, f.available]), probed.results.map((r) => [r.name, r.available]), 'the local API reports the same features');
  t.equal(api.kernel?.object, retval ? 'standard' : 'compat');

  const port = sb.agentPort('metrics');
  const body = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  for (const r of probed.results) {
    t.match(body, new RegExp(`^lbctl_datapath_feature\\{feature="${r.name}",required="${r.required}"\\} ${r.available ? 1 : 0}$`, 'm'), `metric: ${r.name} ${r.available ? 1 : 0}`);
  }
});

t.test('without the right to load BPF programs the agent refuses to start, says why, and leaves nothing behind', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  // Root without capabilities: the bounding set emptied before exec.
  const proc = spawn('setpriv', ['--inh-caps=-all', '--ambient-caps=-all', '--bounding-set=-all', '--', LBCTL, 'agent', ...sb.sourceArgs,
    '--cgroup', sb.cgroup, '--bpf-root', sb.bpfRoot, '--health-port', '0', '--health-bind-address', '127.0.0.1', '--metrics-port', '0', '--api-socket', sb.apiSocket, '--no-nodeport', '--health-mesh-port', '0'],
  { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout.on('data', (d: Buffer) => (out += d));
  proc.stderr.on('data', (d: Buffer) => (out += d));
  const code = await new Promise<number | string>((resolve) => {
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      resolve(`still running after ${30 * SLOW} s`);
    }, 30_000 * SLOW);
    proc.on('exit', (c) => (clearTimeout(timer), resolve(c ?? -1)));
  });
  t.equal(code, 1, 'it exits 1');
  t.match(out, /^lbctl: .*bpf\(2\) refused every probe with EPERM.*CAP_BPF/m, `it says why: ${out.split('\n').find((l) => l.startsWith('lbctl: '))?.slice(0, 300)}`);
  t.match(out, /"msg":"datapath features: kernel [^"]*: MISSING cgroup_connect4, /, 'its one log line names the missing features');
  const pinned = existsSync(sb.bpfRoot) ? readdirSync(sb.bpfRoot, { recursive: true }) : [];
  t.same(pinned, [], 'nothing is pinned');
  // Links carry their cgroup's id (bpftool 7.1's `cgroup show` fails before 6.3).
  const links = JSON.parse((await run('bpftool', ['link', 'show', '-j'], CLI_TIMEOUT_MS)).stdout || '[]') as Array<{ cgroup_id?: number }>;
  t.same(links.filter((l) => l.cgroup_id === statSync(sb.cgroup).ino), [], 'nothing is attached to the cgroup');
});
