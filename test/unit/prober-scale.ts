// Many backends probed at periodSeconds 1 (issue 17): real servers on
// loopback addresses, the agent's own Prober and executors and its pool
// (PROBE_CONCURRENCY), through every handler, and with half the backends
// hanging to the 1 s timeout. The pool keeps up when every worker probes
// once a period, none fails and every backend ends as it should.
//
// 200 backends here: the claim is the pool's behaviour, on a machine that
// also runs the rest of the suite. What 1,000 backends cost (probes a
// second, latency, CPU and memory) is a benchmark, `make bench`'s
// bench/probes.ts, which docs/standalone.md quotes; LBCTL_PROBE_SCALE runs
// this test at another scale.
import t, { type Test } from 'tap';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { PROBE_CONCURRENCY } from '../../src/base/defaults.js';
import type { ProbeHandler } from '../../src/model/probe.js';
import { measureProbes, PROBE_HANDLERS, probeAddr, startProbeServers } from '../helpers/probe-scale.js';

const N = Number(process.env.LBCTL_PROBE_SCALE ?? 200);
const WINDOW = Number(process.env.LBCTL_PROBE_WINDOW ?? 10);

t.test(`${N} backends at periodSeconds 1: the pool keeps up`, async (t) => {
  const control = mkdtempSync(path.join(tmpdir(), 'lbctl-probe-scale-'));
  t.teardown(() => rmSync(control, { recursive: true, force: true }));
  const ports = { http: 18081, tcp: 18082, grpc: 18083 };
  const child = await startProbeServers(N, control, ports);
  t.teardown(() => void child.kill('SIGKILL'));
  const handlers = PROBE_HANDLERS(ports);
  const check = async (t: Test, handler: ProbeHandler, down?: ReadonlySet<string>): Promise<void> => {
    const s = await measureProbes(child, N, WINDOW, handler, { concurrency: PROBE_CONCURRENCY, ...(down ? { down } : {}) });
    t.comment(JSON.stringify(s));
    t.equal(s.failures, 0, `${s.kind}: no probe failed (${s.firstFailure})`);
    t.equal(s.workersProbed, N, `${s.kind}: every worker probed`);
    t.ok(s.minProbesPerWorker >= WINDOW - 1, `${s.kind}: every worker probed about once a second (at least ${s.minProbesPerWorker} in ${WINDOW} s)`);
    t.ok(s.probesPerSecond >= N * 0.95, `${s.kind}: ${s.probesPerSecond} probes a second`);
    t.ok(s.allHealthy, `${s.kind}: every backend healthy${down?.size ? ', every hanging one quarantined' : ''}`);
  };
  await check(t, handlers.http);
  await check(t, handlers.tcp);
  await check(t, handlers.grpc);
  // Half the backends hang for the whole 1 s timeout: the pool still probes everyone once a second.
  const down = new Set(Array.from({ length: N / 2 }, (_, i) => probeAddr(2 * i)));
  for (const a of down) writeFileSync(path.join(control, a), '');
  await check(t, handlers.http, down);
});
