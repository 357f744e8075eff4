// The backend prober (src/probes/prober.ts) on a fake clock with scripted
// executors, no sleeps: kubelet's counting at the thresholds, timeouts,
// initial delay, start jitter, workers replaced on a probe change and
// stopped on removal, one worker for a backend that services share, the
// bounded pool, and the fail open / fail closed policy.
import t from 'tap';
import { FakeClock } from '../helpers/fake-clock.js';
import { Prober, selectBackends, type Executor, type Executors, type ProbeOutcome, type ProbeState } from '../../src/probes/prober.js';
import { PROBE_DEFAULTS, type ProbeSpec, type ProbeTarget } from '../../src/model/probe.js';


const spec = (over: Partial<ProbeSpec> = {}): ProbeSpec => ({ ...PROBE_DEFAULTS, handler: { kind: 'tcpSocket', port: 80 }, ...over });
const target = (address: string, s: ProbeSpec = spec(), port = 80): ProbeTarget => ({ address, port, spec: s });

interface Call {
  readonly at: number;
  readonly address: string;
  readonly signal: AbortSignal;
}

/**
 * An executor answering from a script per address: each call takes the
 * next entry (the last repeats): an outcome after a delay on the fake
 * clock; 'hang' never answers.
 */
function scripted(clock: FakeClock, script: Record<string, Array<{ ok: boolean; delayMs?: number } | 'hang'>>, calls: Call[]): Executor {
  const used = new Map<string, number>();
  return (tg, { signal }) => {
    calls.push({ at: clock.now() - clock.start, address: tg.address, signal });
    const list = script[tg.address] ?? [{ ok: true }];
    const i = used.get(tg.address) ?? 0;
    used.set(tg.address, i + 1);
    const step = list[Math.min(i, list.length - 1)]!;
    if (step === 'hang') return new Promise<ProbeOutcome>(() => {});
    return new Promise<ProbeOutcome>((resolve) => {
      clock.setTimeout(() => resolve(step.ok ? { ok: true } : { ok: false, reason: 'refused' }), step.delayMs ?? 1);
    });
  };
}
const all = (e: Executor): Executors => ({ httpGet: e, tcpSocket: e, grpc: e });

t.test("kubelet's counting: the state changes only at successThreshold or failureThreshold results in a row; another result starts a new run", async (t) => {
  const clock = new FakeClock();
  const calls: Call[] = [];
  const F = { ok: false };
  const S = { ok: true };
  const changes: string[] = [];
  const prober = new Prober({
    executors: all(scripted(clock, { '10.0.0.1': [F, F, S, F, F, F, S, F, S, S, F] }, calls)),
    clock,
    random: () => 0,
    onChange: (tg, state, prev) => changes.push(`${(clock.now() - clock.start) / 1000}s ${prev}→${state}`),
  });
  const [key] = prober.setTargets([target('10.0.0.1', spec({ periodSeconds: 1, successThreshold: 2, failureThreshold: 3 }))]);
  prober.start();
  const states: Array<[ProbeState, number]> = [];
  for (let i = 0; i < 11; i++) {
    await clock.advance(i === 0 ? 10 : 1000);
    const w = prober.worker(key!)!;
    states.push([w.state, w.consecutive]);
  }
  t.same(states, [
    ['unknown', 1], // F
    ['unknown', 2], // F F
    ['unknown', 1], // S: a new run; the two failures no longer count
    ['unknown', 1], // F
    ['unknown', 2], // F F
    ['quarantined', 3], // F F F: failureThreshold
    ['quarantined', 1], // S: below successThreshold, nothing changes
    ['quarantined', 1], // F: a new run of failures (already quarantined)
    ['quarantined', 1], // S
    ['healthy', 2], // S S: successThreshold
    ['healthy', 1], // F: one failure of three
  ]);
  t.same(changes, ['5.001s unknown→quarantined', '9.001s quarantined→healthy'], 'onChange only on a change of state');
  t.match(prober.worker(key!)!.last, { ok: false, reason: 'refused', latencyMs: 1 }, 'the last result is kept with its reason and latency');
  prober.stop();
  t.equal(clock.pending(), 0, 'stop leaves no timer');
});

t.test('a probe never outlives its timeout: the signal aborts, the probe counts as a failure, a late answer is dropped', async (t) => {
  const clock = new FakeClock();
  const calls: Call[] = [];
  let results = 0;
  // The executor ignores the signal and answers "ok" after 5 s: too late.
  const prober = new Prober({
    executors: all(scripted(clock, { '10.0.0.1': [{ ok: true, delayMs: 5000 }] }, calls)),
    clock,
    random: () => 0,
    onResult: () => results++,
  });
  const [key] = prober.setTargets([target('10.0.0.1', spec({ periodSeconds: 10, timeoutSeconds: 2, failureThreshold: 1 }))]);
  prober.start();
  await clock.advance(1999);
  t.equal(prober.worker(key!)!.last, undefined, 'no result before the timeout');
  t.equal(calls[0]!.signal.aborted, false);
  await clock.advance(1);
  t.equal(calls[0]!.signal.aborted, true, 'the executor is told at the timeout');
  t.match(prober.worker(key!), { state: 'quarantined', last: { ok: false, reason: 'timeout: no answer within 2s', latencyMs: 2000 } });
  await clock.advance(5000);
  t.equal(results, 1, 'the late answer is not a result');
  t.equal(prober.state(key!), 'quarantined');
  // A hanging executor frees its pool slot at the timeout too.
  t.equal(prober.status().inFlight, 0);
  prober.stop();
});

t.test('initialDelaySeconds: ticks before it do not probe; the first probe is the first tick at or after it', async (t) => {
  const clock = new FakeClock();
  const calls: Call[] = [];
  const prober = new Prober({ executors: all(scripted(clock, {}, calls)), clock, random: () => 0.3 });
  prober.setTargets([target('10.0.0.1', spec({ periodSeconds: 10, initialDelaySeconds: 25 }))]);
  prober.start();
  await clock.advance(60_000);
  // Jitter 3 s: ticks at 3, 13, 23 are within the delay; 33 s is the first probe.
  t.same(calls.map((c) => c.at), [33_000, 43_000, 53_000]);
  // A backend added long after the start probes at once (kubelet jitters only just after its own start)...
  calls.length = 0;
  prober.setTargets([target('10.0.0.1', spec({ periodSeconds: 10, initialDelaySeconds: 25 })), target('10.0.0.2', spec({ periodSeconds: 10 }))]);
  await clock.advance(25_000);
  t.same(calls.filter((c) => c.address === '10.0.0.2').map((c) => c.at), [60_000, 70_000, 80_000], 'a later backend: at once, then every period');
  // ...unless it has an initial delay: then at the first tick at or after it.
  calls.length = 0;
  prober.setTargets([target('10.0.0.3', spec({ periodSeconds: 10, initialDelaySeconds: 15 }))]);
  await clock.advance(29_000);
  t.same(calls.map((c) => c.at), [105_000], 'ticks at +0 and +10 s are within the delay; +20 s probes');
  prober.stop();
});

t.test('start jitter: after a restart every worker first probes at a random point of its period, never all at once', async (t) => {
  const clock = new FakeClock();
  const calls: Call[] = [];
  let seed = 1;
  const random = (): number => {
    seed = (seed * 48271) % 2147483647;
    return seed / 2147483647;
  };
  const prober = new Prober({ executors: all(scripted(clock, {}, calls)), clock, random, concurrency: 1000 });
  const targets = Array.from({ length: 200 }, (_, i) => target(`10.1.0.${i}`, spec({ periodSeconds: 5 })));
  prober.setTargets(targets);
  prober.start();
  await clock.advance(5000);
  const firsts = calls.map((c) => c.at);
  t.equal(firsts.length, 200, 'every worker probed within one period');
  t.ok(firsts.every((at) => at >= 0 && at < 5000), 'each within [0, period)');
  const perSecond = [0, 1, 2, 3, 4].map((s) => firsts.filter((at) => Math.floor(at / 1000) === s).length);
  t.ok(perSecond.every((n) => n >= 20 && n <= 70), `spread over the period (${perSecond.join(', ')} a second)`);
  await clock.advance(5000);
  t.equal(calls.length, 400, 'then once a period each');
  prober.stop();
});

t.test('a changed probe replaces the worker (unknown again); a removed backend stops its worker and drops its probe in flight', async (t) => {
  const clock = new FakeClock();
  const calls: Call[] = [];
  const changes: string[] = [];
  const results: string[] = [];
  const prober = new Prober({
    executors: all(scripted(clock, { '10.0.0.2': [{ ok: true }, 'hang'] }, calls)),
    clock,
    random: () => 0,
    onChange: (tg, s) => changes.push(`${tg.address} ${s}`),
    onResult: (tg) => results.push(tg.address),
  });
  const a = spec({ periodSeconds: 1, handler: { kind: 'httpGet', path: '/a', port: 80, scheme: 'HTTP', httpHeaders: [] } });
  const b = spec({ periodSeconds: 1, handler: { kind: 'httpGet', path: '/b', port: 80, scheme: 'HTTP', httpHeaders: [] } });
  const [k1, k2] = prober.setTargets([target('10.0.0.1', a), target('10.0.0.2', a)]);
  prober.start();
  await clock.advance(500);
  t.equal(prober.state(k1!), 'healthy');
  const [k1b, k2same] = prober.setTargets([target('10.0.0.1', b), target('10.0.0.2', a)]);
  t.not(k1b, k1, 'another probe, another worker');
  t.equal(k2same, k2, 'the unchanged one keeps its worker');
  t.equal(prober.state(k1!), undefined, 'the old worker is gone');
  t.equal(prober.state(k1b!), 'unknown', 'the new one starts unknown');
  t.equal(prober.state(k2!), 'healthy', 'and the unchanged one keeps its state');
  await clock.advance(999);
  t.equal(prober.state(k1b!), 'healthy');
  t.equal(calls.filter((c) => c.address === '10.0.0.1').length, 2, 'one probe by the old worker, one by the new: none by the old since');
  // 10.0.0.2's second probe hangs: remove the backend meanwhile.
  const inFlight = calls.filter((c) => c.address === '10.0.0.2').at(-1)!;
  t.equal(inFlight.signal.aborted, false);
  const resultsBefore = results.length;
  prober.setTargets([target('10.0.0.1', b)]);
  t.equal(inFlight.signal.aborted, true, 'its probe in flight is aborted');
  await clock.advance(10_000);
  t.equal(calls.filter((c) => c.address === '10.0.0.2').length, 2, 'and it is probed no more');
  t.equal(results.slice(resultsBefore).filter((a) => a === '10.0.0.2').length, 0, 'nor is any result of it reported');
  prober.setTargets([]);
  t.equal(clock.pending(), 0, 'no worker, no timer');
  t.same(prober.status().workers, []);
  prober.stop();
});

t.test('a backend shared by several services, with the same probe however spelled, is probed once', async (t) => {
  const clock = new FakeClock();
  const calls: Call[] = [];
  const prober = new Prober({ executors: all(scripted(clock, {}, calls)), clock, random: () => 0 });
  const keys = prober.setTargets([target('10.0.0.1'), target('10.0.0.1'), target('10.0.0.1', spec({ periodSeconds: 10 }))]);
  t.equal(new Set(keys).size, 1);
  prober.start();
  await clock.advance(9_999);
  t.equal(calls.length, 1, 'one worker, one probe a period');
  prober.stop();
});

t.test('a tick during a probe waits for it (one kept, as Go\'s ticker keeps one); probes of a worker never overlap', async (t) => {
  const clock = new FakeClock();
  const calls: Call[] = [];
  // kubelet allows a timeout longer than the period: 1 s period, 5 s timeout, 2.5 s answers.
  const prober = new Prober({ executors: all(scripted(clock, { '10.0.0.1': [{ ok: true, delayMs: 2500 }] }, calls)), clock, random: () => 0 });
  prober.setTargets([target('10.0.0.1', spec({ periodSeconds: 1, timeoutSeconds: 5 }))]);
  prober.start();
  await clock.advance(10_000);
  t.same(calls.map((c) => c.at), [0, 2500, 5000, 7500, 10_000], 'back to back, each after the last ended');
  prober.stop();
});

t.test('the pool bounds the probes in flight across all workers, and every worker still gets its turn', async (t) => {
  const clock = new FakeClock();
  let inFlight = 0;
  let max = 0;
  const seen = new Set<string>();
  const exec: Executor = (tg) => {
    inFlight++;
    max = Math.max(max, inFlight);
    seen.add(tg.address);
    return new Promise((resolve) => clock.setTimeout(() => (inFlight--, resolve({ ok: true })), 200));
  };
  const prober = new Prober({ executors: all(exec), clock, random: () => 0, concurrency: 8 });
  prober.setTargets(Array.from({ length: 100 }, (_, i) => target(`10.2.0.${i}`, spec({ periodSeconds: 10 }))));
  prober.start();
  await clock.advance(1);
  t.equal(prober.status().inFlight, 8, '8 in flight');
  t.equal(prober.status().queued, 92, 'the rest queued');
  await clock.advance(5000);
  t.equal(max, 8, 'never more than the pool');
  t.equal(seen.size, 100, 'and every backend was probed');
  t.ok(prober.status().workers.every((w) => w.state === 'healthy'));
  prober.stop();
  t.equal(prober.status().queued, 0);
});

t.test('stop and start again: queued probes do not wedge their workers', async (t) => {
  const clock = new FakeClock();
  const calls: Call[] = [];
  const prober = new Prober({ executors: all(scripted(clock, {}, calls)), clock, random: () => 0, concurrency: 1 });
  prober.setTargets([target('10.0.0.1', spec({ periodSeconds: 1 })), target('10.0.0.2', spec({ periodSeconds: 1 }))]);
  prober.start();
  prober.stop(); // 10.0.0.2 was queued behind 10.0.0.1
  await clock.advance(100);
  prober.start();
  await clock.advance(3000);
  t.ok(calls.filter((c) => c.address === '10.0.0.2').length >= 3, 'the once-queued worker probes again');
  prober.stop();
});

t.test('an executor that throws counts as a failure with its message', async (t) => {
  const clock = new FakeClock();
  const exec: Executor = () => {
    throw new Error('boom');
  };
  const prober = new Prober({ executors: all(exec), clock, random: () => 0 });
  const [key] = prober.setTargets([target('10.0.0.1', spec({ failureThreshold: 1 }))]);
  prober.start();
  await clock.advance(1);
  t.match(prober.worker(key!), { state: 'quarantined', last: { ok: false, reason: 'boom' } });
  prober.stop();
});

t.test('a prober error is thrown away, as kubelet does: shown as the last result, neither counted nor reported', async (t) => {
  const clock = new FakeClock();
  let n = 0;
  let reported = 0;
  const exec: Executor = async () => (n++ % 2 === 0 ? { ok: false, reason: 'refused' } : { ok: false, reason: 'body broke off', error: true });
  const prober = new Prober({ executors: all(exec), clock, random: () => 0, onResult: () => reported++ });
  const [key] = prober.setTargets([target('10.0.0.1', spec({ periodSeconds: 1, failureThreshold: 2 }))]);
  prober.start();
  await clock.advance(1);
  await clock.advance(1000);
  t.match(prober.worker(key!), { state: 'unknown', consecutive: 1, last: { ok: false, error: true, reason: 'body broke off' } }, 'the error neither extends nor breaks the run');
  await clock.advance(1000);
  t.match(prober.worker(key!), { state: 'quarantined', consecutive: 2 });
  t.equal(reported, 2);
  prober.stop();
});

t.test('every backend failing: fail open serves them all, fail closed none; otherwise only the quarantined are left out', async (t) => {
  const b = (name: string, state: ProbeState): { name: string; state: ProbeState } => ({ name, state });
  const mixed = [b('a', 'healthy'), b('b', 'quarantined'), b('c', 'unknown')];
  for (const policy of ['failOpen', 'failClosed'] as const) {
    const r = selectBackends(mixed, policy);
    t.same(r.selected.map((x) => x.name), ['a', 'c'], `${policy}: unknown is served as its endpoint says, quarantined is not`);
    t.equal(r.allQuarantined, false);
  }
  const down = [b('a', 'quarantined'), b('b', 'quarantined')];
  t.same(selectBackends(down, 'failOpen'), { selected: down, allQuarantined: true });
  t.same(selectBackends(down, 'failClosed'), { selected: [], allQuarantined: true });
  t.same(selectBackends([], 'failClosed'), { selected: [], allQuarantined: false }, 'no backends is not "all failing"');
});

t.test("a loop blocked past several ticks probes once when it resumes, then on the grid again: missed ticks are dropped, as Go's Ticker drops them", async (t) => {
  const clock = new FakeClock();
  const calls: Call[] = [];
  const p = new Prober({ executors: all(scripted(clock, {}, calls)), clock, random: () => 0 });
  p.start();
  await clock.advance(11_000); // the prober's first period is over: later workers probe at once
  p.setTargets([target('10.0.0.1', spec({ periodSeconds: 1 }))]);
  await clock.advance(2_500);
  t.same(calls.map((c) => c.at), [11_000, 12_000, 13_000]);
  clock.block(3_700); // at 17,200: the ticks of 14, 15, 16 and 17 s were missed
  await clock.advance(0);
  await clock.advance(2_000);
  t.same(calls.map((c) => c.at), [11_000, 12_000, 13_000, 17_200, 18_000, 19_000], 'one probe for the missed ticks, then the grid');
  p.stop();
});
