// 1,000 backends probed at periodSeconds 1 (issue 17): real servers on
// loopback addresses (test/helpers/probe-backend.mjs in a child process, one
// address per backend), the agent's own Prober and executors in this one.
// The pool keeps up when every worker probes once a period and nothing
// queues up; the CPU and memory it costs are printed (docs/standalone.md
// quotes them). Each handler runs for WINDOW seconds after a warm-up.
import t, { type Test } from 'tap';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { GrpcJsHealthClient } from '../../src/agent/grpc-health.js';
import { defaultExecutors } from '../../src/agent/probe-exec.js';
import { Prober } from '../../src/agent/prober.js';
import { PROBE_CONCURRENCY } from '../../src/defaults.js';
import { PROBE_DEFAULTS, type ProbeHandler, type ProbeTarget } from '../../src/model/probe.js';

const N = Number(process.env.LBCTL_PROBE_SCALE ?? 1000);
const WINDOW = Number(process.env.LBCTL_PROBE_WINDOW ?? 10);
const WARMUP = 3;
const HELPER = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../helpers/probe-backend.mjs');
const addr = (i: number): string => `127.1.${(i + 1) >> 8}.${(i + 1) & 255}`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const CLK_TCK = 100;

function cpuOf(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[11]) + Number(f[12])) / CLK_TCK; // utime + stime, seconds
}

const control = mkdtempSync(path.join(tmpdir(), 'lbctl-probe-scale-'));

async function servers(t: { teardown(fn: () => void): void }, ports: { http: number; tcp: number; grpc: number }): Promise<ChildProcess> {
  t.teardown(() => rmSync(control, { recursive: true, force: true }));
  const args = [HELPER, '--control', control, '--echo', '0', '--http', String(ports.http), '--tcp', String(ports.tcp), '--grpc', String(ports.grpc)];
  for (let i = 0; i < N; i++) args.push('--addr', addr(i));
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  t.teardown(() => void child.kill('SIGKILL'));
  await new Promise<void>((resolve, reject) => {
    child.stdout!.once('data', () => resolve());
    child.once('exit', (code) => reject(new Error(`probe-backend.mjs exited ${code}`)));
  });
  return child;
}

async function measure(t: Test, child: ChildProcess, handler: ProbeHandler, opts: { concurrency?: number; down?: ReadonlySet<string> } = {}) {
  const down = opts.down ?? new Set<string>();
  const kind = `${handler.kind}${down.size ? ` (${down.size} hanging)` : ''}`;
  const targets: ProbeTarget[] = Array.from({ length: N }, (_, i) => ({ address: addr(i), port: (handler as { port: number }).port, spec: { ...PROBE_DEFAULTS, periodSeconds: 1, timeoutSeconds: 1, handler } }));
  const perKey = new Map<string, number>();
  const latencies: number[] = [];
  let failures = 0;
  let firstFailure = '';
  let counting = false;
  global.gc?.();
  const rss0 = process.memoryUsage().rss;
  const heap0 = process.memoryUsage().heapUsed;
  const prober = new Prober({
    executors: defaultExecutors(new GrpcJsHealthClient()),
    ...(opts.concurrency !== undefined ? { concurrency: opts.concurrency } : {}),
    onResult: (target, r) => {
      if (!counting) return;
      perKey.set(target.key, (perKey.get(target.key) ?? 0) + 1);
      latencies.push(r.latencyMs);
      if (!r.ok && !down.has(target.address)) {
        failures++;
        firstFailure ||= r.reason ?? '';
      }
    },
  });
  prober.setTargets(targets);
  prober.start();
  await sleep(WARMUP * 1000);
  counting = true;
  const cpu0 = process.cpuUsage();
  const child0 = cpuOf(child.pid!);
  const t0 = performance.now();
  let maxQueued = 0;
  let maxInFlight = 0;
  const sampler = setInterval(() => {
    const st = prober.status();
    maxQueued = Math.max(maxQueued, st.queued);
    maxInFlight = Math.max(maxInFlight, st.inFlight);
  }, 50);
  await sleep(WINDOW * 1000);
  counting = false;
  clearInterval(sampler);
  const secs = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const childCpu = cpuOf(child.pid!) - child0;
  const rss1 = process.memoryUsage().rss;
  const heap1 = process.memoryUsage().heapUsed;
  const states = prober.status().workers.map((w) => (down.has(w.address) ? (w.state === 'quarantined' ? 'healthy' : w.state) : w.state));
  prober.stop();
  latencies.sort((a, b) => a - b);
  const counts = [...perKey.values()];
  const min = counts.length === N ? Math.min(...counts) : 0;
  const total = latencies.length;
  const stats = {
    kind,
    backends: N,
    probesPerSecond: Math.round(total / secs),
    minProbesPerWorker: min,
    maxProbesPerWorker: counts.length ? Math.max(...counts) : 0,
    failures,
    maxQueued,
    maxInFlight,
    p50ms: latencies[Math.floor(total * 0.5)],
    p99ms: latencies[Math.floor(total * 0.99)],
    proberCpuPercent: Math.round(((cpu.user + cpu.system) / 1e6 / secs) * 1000) / 10,
    serversCpuPercent: Math.round((childCpu / secs) * 1000) / 10,
    rssMiB: Math.round(rss1 / 2 ** 20),
    rssGrowthMiB: Math.round((rss1 - rss0) / 2 ** 20),
    heapGrowthMiB: Math.round((heap1 - heap0) / 2 ** 20),
  };
  t.comment(JSON.stringify(stats));
  t.equal(failures, 0, `${kind}: no probe failed (${firstFailure})`);
  t.equal(counts.length, N, `${kind}: every worker probed`);
  t.ok(min >= WINDOW - 1, `${kind}: every worker probed about once a second (at least ${min} in ${WINDOW} s)`);
  t.ok(stats.probesPerSecond >= N * 0.95, `${kind}: ${stats.probesPerSecond} probes a second`);
  t.ok(states.every((s) => s === 'healthy'), `${kind}: every backend healthy${down.size ? ', every hanging one quarantined' : ''}`);
}



t.test(`${N} backends at periodSeconds 1: the pool keeps up`, async (t) => {
  const child = await servers(t, { http: 18081, tcp: 18082, grpc: 18083 });
  // The agent's pool (PROBE_CONCURRENCY), as the agent runs its prober: a
  // grpc probe takes tens of ms on a busy machine, and the Prober's default
  // of 64 in flight would then be what limits the rate, not the agent.
  const agentPool = { concurrency: PROBE_CONCURRENCY };
  await measure(t, child, { kind: 'httpGet', path: '/healthz', port: 18081, scheme: 'HTTP', httpHeaders: [] }, agentPool);
  await measure(t, child, { kind: 'tcpSocket', port: 18082 }, agentPool);
  await measure(t, child, { kind: 'grpc', port: 18083, service: '' }, agentPool);
  // Half the backends hang for the whole 1 s timeout: the agent's pool (512) still probes everyone once a second.
  const down = new Set(Array.from({ length: N / 2 }, (_, i) => addr(2 * i)));
  for (const a of down) writeFileSync(path.join(control, a), '');
  await measure(t, child, { kind: 'httpGet', path: '/healthz', port: 18081, scheme: 'HTTP', httpHeaders: [] }, { concurrency: PROBE_CONCURRENCY, down });
});
