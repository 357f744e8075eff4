// The health mesh's prober on a fake clock with fake probes: the period
// rule, per-address timers with jitter, a slow peer that delays no other,
// the bounded pool, results and node states, nodes added and removed.
import t from 'tap';
import { FakeClock } from '../helpers/fake-clock.js';
import { HealthMesh, periodFor, type Outcome, type Probers } from '../../src/mesh/mesh.js';
import type { Node } from '../../src/model/k8s.js';


const node = (name: string, ...addresses: string[]): Node => ({ name, deleting: false, addresses: addresses.map((address) => ({ type: 'InternalIP' as const, address })) });

/** Probes answered by a table: per address, an outcome after a delay (on the fake clock). */
function fakeProbers(clock: FakeClock, table: Record<string, { delayMs: number; outcome: Outcome }>, log: string[]): Probers {
  const answer = (kind: string, address: string, timeoutMs: number): Promise<Outcome> => {
    log.push(`${clock.now()} ${kind} ${address}`);
    const row = table[address] ?? { delayMs: 1, outcome: { ok: true, rttMs: 1 } };
    return new Promise((resolve) => {
      if (row.delayMs >= timeoutMs) clock.setTimeout(() => resolve({ ok: false, error: 'timeout' }), timeoutMs);
      else clock.setTimeout(() => resolve(row.outcome), row.delayMs);
    });
  };
  return { icmp: (a, t) => answer('icmp', a, t), http: (a, _p, t) => answer('http', a, t) };
}

t.test('the period grows with the cluster: at most 10 s for a handful, about a minute at 5,000', async (t) => {
  t.equal(periodFor(2 * 3), 10_000);
  t.equal(periodFor(2 * 830), 10_000);
  t.equal(periodFor(2 * 1000), 12_049);
  const p5000 = periodFor(2 * 5000);
  t.ok(p5000 >= 55_000 && p5000 <= 65_000, `5,000 nodes: ${p5000} ms`);
});

t.test('every address is probed by both paths once per period, first at a random point of it', async (t) => {
  const clock = new FakeClock();
  const log: string[] = [];
  let r = 0;
  const mesh = new HealthMesh({ self: 'a', port: 4240, periodMs: 10_000, probers: fakeProbers(clock, {}, log), clock, random: () => [0.1, 0.5, 0.9][r++ % 3]! });
  mesh.setNode('a', node('a', '10.0.0.1'));
  mesh.setNode('b', node('b', '10.0.0.2', 'fd00::2'));
  t.equal(mesh.status().nodes.every((n) => n.state === 'pending'), true, 'pending before the first probe');
  mesh.start();
  await clock.advance(10_000);
  t.equal(log.length, 6, 'three addresses, two paths each, in the first period');
  const firsts = [...new Set(log.map((l) => Number(l.split(' ')[0])))].sort();
  t.equal(firsts.length, 3, 'at three different times (jitter)');
  await clock.advance(30_000);
  t.ok(log.length >= 6 * 3 && log.length <= 6 * 4 + 2, `about one round a period (${log.length} probes in 40 s)`);
  const st = mesh.status();
  t.equal(st.reachable, 2);
  t.equal(st.total, 2);
  t.ok(st.nodes.find((n) => n.name === 'a')?.local, 'this node is marked local');
  t.match(st.nodes.find((n) => n.name === 'b')?.addresses[0], { address: '10.0.0.2', icmp: { status: 'ok', rttMs: 1 }, http: { status: 'ok', rttMs: 1 } });
  mesh.stop();
  t.equal(clock.pending(), 0, 'stop leaves no timer');
});

t.test('a silent peer and a slow one delay nobody: the others stay fresh, the silent one is reported within a period plus the timeout', async (t) => {
  const clock = new FakeClock();
  const log: string[] = [];
  const table = {
    '10.0.0.9': { delayMs: 60_000, outcome: { ok: true as const, rttMs: 1 } }, // blackholed: only timeouts
    '10.0.0.8': { delayMs: 900, outcome: { ok: true as const, rttMs: 900 } }, // slow but within the timeout
  };
  const mesh = new HealthMesh({ self: 'a', port: 4240, periodMs: 10_000, timeoutMs: 1000, concurrency: 4, probers: fakeProbers(clock, table, log), clock });
  for (let i = 1; i <= 7; i++) mesh.setNode(`n${i}`, node(`n${i}`, `10.0.0.${i}`));
  mesh.setNode('slow', node('slow', '10.0.0.8'));
  mesh.setNode('dead', node('dead', '10.0.0.9'));
  mesh.start();
  await clock.advance(10_000 + 1000);
  const st = mesh.status();
  t.equal(st.nodes.find((n) => n.name === 'dead')?.state, 'unreachable', 'the dead node is unreachable within one period plus the timeout');
  t.match(st.nodes.find((n) => n.name === 'dead')?.addresses[0], { icmp: { status: 'timeout' }, http: { status: 'timeout' } });
  t.equal(st.nodes.find((n) => n.name === 'slow')?.state, 'reachable', 'the slow one answers in time');
  t.equal(st.reachable, 8, 'every other node is reachable');
  // Every healthy address was probed in every period despite the pool of 4 and a peer holding slots for a second.
  await clock.advance(50_000);
  for (let i = 1; i <= 7; i++) {
    const n = log.filter((l) => l.endsWith(` 10.0.0.${i}`)).length;
    t.ok(n >= 2 * 5, `10.0.0.${i}: probed ${n / 2} times in 61 s`);
  }
  mesh.stop();
});

t.test('the pool bounds the probes in flight', async (t) => {
  const clock = new FakeClock();
  let inFlight = 0;
  let max = 0;
  const probe = (): Promise<Outcome> => {
    inFlight++;
    max = Math.max(max, inFlight);
    return new Promise((resolve) => clock.setTimeout(() => (inFlight--, resolve({ ok: false, error: 'timeout' })), 1000));
  };
  // Every address probed at once (random 0): 200 targets, 400 probes, a pool of 16.
  const mesh = new HealthMesh({ self: 'x', port: 4240, periodMs: 10_000, concurrency: 16, probers: { icmp: probe, http: probe }, clock, random: () => 0 });
  for (let i = 0; i < 200; i++) mesh.setNode(`n${i}`, node(`n${i}`, `10.1.${i >> 8}.${i & 255}`));
  mesh.start();
  await clock.advance(1);
  t.equal(mesh.status().inFlight, 16, '16 in flight');
  t.equal(mesh.status().queued, 400 - 16, 'the rest wait for a slot');
  await clock.advance(26_000);
  t.equal(max, 16, 'never more than the pool');
  t.equal(mesh.status().unreachable, 200, 'and every probe ran');
  mesh.stop();
});

t.test('nodes come and go: a removed node\'s results disappear; a node losing an address stops probing it', async (t) => {
  const clock = new FakeClock();
  const log: string[] = [];
  // Probes at fixed points (2.5 s into each period): none is in flight when
  // the timers are counted below. With Math.random's jitter one could be,
  // its fake answer a timer the mesh does not own (CI saw 2 pending).
  const mesh = new HealthMesh({ self: 'a', port: 4240, periodMs: 5000, probers: fakeProbers(clock, {}, log), clock, random: () => 0.5 });
  mesh.start();
  mesh.setNode('b', node('b', '10.0.0.2', '10.0.1.2'));
  await clock.advance(5000);
  t.equal(mesh.status().total, 1);
  mesh.setNode('b', node('b', '10.0.0.2'));
  log.length = 0;
  await clock.advance(20_000);
  t.notOk(log.some((l) => l.endsWith('10.0.1.2')), 'the address taken away is no longer probed');
  t.same(mesh.status().nodes[0]?.addresses.map((a) => a.address), ['10.0.0.2']);
  mesh.setNode('b', { ...node('b', '10.0.0.2'), deleting: true });
  t.equal(mesh.status().total, 0, 'a node being deleted leaves the mesh');
  mesh.setNode('c', node('c', '10.0.0.3'));
  mesh.setNode('c', undefined);
  t.equal(mesh.status().total, 0, 'a deleted node disappears');
  t.equal(clock.pending(), 0, 'and its timers with it');
  mesh.stop();
});

t.test('errors are kept per path with their times; recovery is seen at the next probe', async (t) => {
  const clock = new FakeClock();
  const table: Record<string, { delayMs: number; outcome: Outcome }> = { '10.0.0.2': { delayMs: 1, outcome: { ok: false, error: 'refused', detail: 'connect ECONNREFUSED' } } };
  const mesh = new HealthMesh({ self: 'a', port: 4240, periodMs: 5000, probers: fakeProbers(clock, table, []), clock });
  mesh.setNode('b', node('b', '10.0.0.2'));
  mesh.start();
  await clock.advance(5000);
  const down = mesh.status().nodes[0]!;
  t.equal(down.state, 'unreachable');
  t.match(down.addresses[0], { icmp: { status: 'refused', detail: 'connect ECONNREFUSED' } });
  t.ok(down.addresses[0]!.icmp.lastFailure, 'the failure time is kept');
  table['10.0.0.2'] = { delayMs: 2, outcome: { ok: true, rttMs: 2 } };
  await clock.advance(6000);
  const up = mesh.status().nodes[0]!;
  t.equal(up.state, 'reachable', 'reachable again');
  t.ok(up.addresses[0]!.icmp.lastFailure && up.addresses[0]!.icmp.lastSuccess, 'both times kept');
  mesh.stop();
});
