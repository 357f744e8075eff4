import t from 'tap';
import { EventLoopMonitor, Health, formatDuration, startHealthServer } from '../../src/http/health.js';
import { AgentMetrics } from '../../src/http/metrics.js';
import { FakeView } from '../fakes/fake-view.js';
import { FakeClock } from '../helpers/fake-clock.js';

type T = { teardown(fn: () => unknown): void };

async function serve(t: T, view: FakeView, extra: Parameters<typeof startHealthServer>[0] = {}) {
  const srv = await startHealthServer({ view, host: '127.0.0.1', port: 0, ...extra });
  t.teardown(() => srv.close());
  const get = async (path: string) => {
    const res = await fetch(`http://127.0.0.1:${srv.port}${path}`);
    return { status: res.status, type: res.headers.get('content-type'), body: await res.text() };
  };
  return { srv, get };
}

const busy = (ms: number): void => {
  const end = performance.now() + ms;
  while (performance.now() < end);
};

t.test('/livez: ok, and verbose lists every check', async (t) => {
  const { get } = await serve(t, new FakeView());
  t.same(await get('/livez'), { status: 200, type: 'text/plain; charset=utf-8', body: 'ok' });
  t.equal((await get('/livez?verbose')).body, '[+]ping ok\n[+]eventloop ok\n[+]datapath ok\n[+]canary ok\nlivez check passed\n');
  t.equal((await get('/livez/')).body, 'ok', 'a trailing slash is the root');
});

t.test('/livez: a failing check answers 500 with every line, like kube-apiserver', async (t) => {
  const view = new FakeView();
  view.attached = { ok: false, message: 'link sock4_connect is not pinned' };
  const { get } = await serve(t, view);
  const r = await get('/livez');
  t.equal(r.status, 500);
  t.equal(r.body, '[+]ping ok\n[+]eventloop ok\n[-]datapath failed: link sock4_connect is not pinned\n[+]canary ok\nlivez check failed\n');
});

t.test('per-check endpoints', async (t) => {
  const view = new FakeView();
  view.canary = { ok: false, message: 'update lb4_services: E2BIG' };
  const { get } = await serve(t, view);
  t.same(await get('/livez/ping'), { status: 200, type: 'text/plain; charset=utf-8', body: 'ok' });
  t.same(await get('/livez/datapath'), { status: 200, type: 'text/plain; charset=utf-8', body: 'ok' });
  const c = await get('/livez/canary');
  t.equal(c.status, 500);
  t.equal(c.body, 'internal server error: update lb4_services: E2BIG\n');
  t.equal((await get('/readyz/synced')).status, 200);
  t.equal((await get('/livez/synced')).status, 404, 'synced is a readiness check only');
  t.equal((await get('/livez/nope')).status, 404);
  t.equal((await get('/livez/ping/extra')).status, 404);
  t.equal((await get('/nope')).status, 404);
});

t.test('?exclude skips checks (repeatable, comma lists too) and warns about unknown names', async (t) => {
  const view = new FakeView();
  view.attached = { ok: false, message: 'detached' };
  view.canary = { ok: false, message: 'EPERM' };
  const { get } = await serve(t, view);
  t.equal((await get('/livez?exclude=datapath')).status, 500);
  t.same(await get('/livez?exclude=datapath&exclude=canary'), { status: 200, type: 'text/plain; charset=utf-8', body: 'ok' });
  t.equal((await get('/livez?exclude=datapath,canary')).status, 200);
  const v = await get('/livez?exclude=datapath&exclude=canary&exclude=bogus&verbose');
  t.equal(v.status, 200);
  t.equal(
    v.body,
    '[+]ping ok\n[+]eventloop ok\n[+]datapath excluded: ok\n[+]canary excluded: ok\nwarn: some health checks cannot be excluded: no matches for "bogus"\nlivez check passed\n',
  );
});

t.test('a view that throws fails the check, not the request', async (t) => {
  const view = new FakeView();
  const { get } = await serve(t, view);
  view.throws = new Error('bpf_obj_get(/sys/fs/bpf/lbctl/maps/lb4_services): ENOENT');
  const r = await get('/livez');
  t.equal(r.status, 500);
  t.match(r.body, '[-]datapath failed: bpf_obj_get(/sys/fs/bpf/lbctl/maps/lb4_services): ENOENT\n');
  t.match(r.body, '[-]canary failed:');
});

t.test('/readyz: before and after the source synced', async (t) => {
  const view = new FakeView();
  view.synced = false;
  view.applied = false;
  view.stats = { count: 0, inProgress: false };
  const { get } = await serve(t, view);
  let r = await get('/readyz');
  t.equal(r.status, 500);
  t.equal(
    r.body,
    '[+]ping ok\n[+]datapath ok\n[-]source-synced failed: the source has not delivered its initial state yet\n[-]synced failed: no sync has succeeded yet\nreadyz check failed\n',
  );
  view.synced = true;
  view.applied = true;
  view.stats = { count: 1, lastAttempt: Date.now(), lastSuccess: Date.now(), inProgress: false };
  r = await get('/readyz');
  t.same(r, { status: 200, type: 'text/plain; charset=utf-8', body: 'ok' });
  t.equal((await get('/readyz?verbose')).body, '[+]ping ok\n[+]datapath ok\n[+]source-synced ok\n[+]synced ok\nreadyz check passed\n');
});

t.test('/readyz synced: a fresh change in flight is fine, a late one or a failed sync is not', async (t) => {
  let now = 1_000_000;
  const view = new FakeView();
  const health = new Health({ view, healthTimeoutMs: 60_000, now: () => now });
  t.teardown(() => health.close());
  view.applied = false;
  view.stats = { count: 3, lastSuccess: now - 5000, oldestPending: now - 200, inProgress: true };
  t.same(health.runOne('readyz', 'synced'), { name: 'synced', ok: true, message: 'a change is being applied (200ms)' });
  now += 60_000;
  t.same(health.runOne('readyz', 'synced'), { name: 'synced', ok: false, message: 'a change has waited 1m0s for the maps (timeout 1m0s)' });
  view.stats = { count: 4, lastSuccess: now - 5000, oldestPending: now - 200, lastError: 'update lb4_backends: E2BIG', inProgress: false };
  t.same(health.runOne('readyz', 'synced'), { name: 'synced', ok: false, message: 'the last sync failed: update lb4_backends: E2BIG' });
});

t.test('/healthz: kube-proxy JSON, 200 while syncs keep up', async (t) => {
  const view = new FakeView();
  const { get } = await serve(t, view, { healthTimeoutMs: 60_000 });
  const r = await get('/healthz');
  t.equal(r.status, 200);
  t.equal(r.type, 'application/json');
  const j = JSON.parse(r.body) as Record<string, unknown>;
  t.same(Object.keys(j), ['lastUpdated', 'currentTime', 'nodeEligible']);
  t.equal(j.nodeEligible, true);
  t.match(j.currentTime, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/);
  t.equal(j.lastUpdated, j.currentTime, 'healthy: lastUpdated is now, as kube-proxy reports it');

  view.stats = { count: 2, lastSuccess: Date.now() - 10_000, oldestPending: Date.now() - 30_000, inProgress: false };
  t.equal((await get('/healthz')).status, 200, 'a change pending for less than the timeout is not a stall');
});

t.test('/healthz: 503 when a change has waited longer than the timeout', async (t) => {
  const view = new FakeView();
  const lastSuccess = Date.parse('2024-05-01T10:00:00.000Z');
  view.stats = { count: 9, lastSuccess, oldestPending: Date.now() - 61_000, lastError: 'E2BIG', inProgress: false };
  const metrics = new AgentMetrics({ defaultMetrics: false });
  const { get } = await serve(t, view, { healthTimeoutMs: 60_000, metrics });
  const r = await get('/healthz');
  t.equal(r.status, 503);
  const j = JSON.parse(r.body) as Record<string, unknown>;
  t.equal(j.lastUpdated, '2024-05-01T10:00:00.000Z', 'unhealthy: lastUpdated is the last successful sync');
  t.equal(j.nodeEligible, true);

  view.stats = { count: 0, oldestPending: Date.now() - 61_000, inProgress: false };
  t.equal(JSON.parse((await get('/healthz')).body).lastUpdated, '0001-01-01T00:00:00Z', 'never synced: Go zero time');
  await get('/livez');
  const text = await metrics.registry.metrics();
  t.match(text, 'kubeproxy_proxy_healthz_total{code="503"} 2');
  t.match(text, 'kubeproxy_proxy_livez_total{code="200"} 1');
});

t.test('/healthz: 503 and nodeEligible false while the node is being deleted', async (t) => {
  const view = new FakeView();
  view.deleting = true;
  const { get } = await serve(t, view);
  const r = await get('/healthz');
  t.equal(r.status, 503);
  t.equal(JSON.parse(r.body).nodeEligible, false);
  t.equal((await get('/livez')).status, 200, 'a node being deleted is still alive');
});

t.test('healthz reasons for the local API', async (t) => {
  const now = 5_000_000;
  const view = new FakeView();
  view.deleting = true;
  view.stats = { count: 2, lastSuccess: now - 100_000, oldestPending: now - 90_000, inProgress: false };
  const health = new Health({ view, healthTimeoutMs: 60_000, now: () => now });
  t.teardown(() => health.close());
  t.same(health.healthz(), {
    healthy: false,
    lastUpdated: new Date(now - 100_000).toISOString(),
    currentTime: new Date(now).toISOString(),
    nodeEligible: false,
    reason: 'a change has waited 1m30s for the maps (timeout 1m0s); the node is being deleted',
  });
});

t.test('eventloop: one stall passes with a note, a loop that keeps stalling fails, then recovers', async (t) => {
  const view = new FakeView();
  const stalls: number[] = [];
  const { get } = await serve(t, view, { eventLoopThresholdMs: 50, eventLoopWindowMs: 1500, onEventLoopStall: (ms) => stalls.push(ms) });
  const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));
  t.equal((await get('/livez/eventloop')).status, 200);
  busy(200);
  await pause(50); // the late tick runs first: the stall is over, and counted
  t.equal(stalls.length, 1, `the stall is reported (${Math.round(stalls[0] ?? 0)} ms)`);
  t.equal((await get('/livez/eventloop')).status, 200, 'one stall: a restart would only repeat the work');
  t.match((await get('/livez?verbose')).body, /^\[\+\]eventloop ok \(event loop blocked once in the last 1\.5s, for \d+ms, \d+ms ago; fails at 3\)$/m, 'and /livez?verbose says so');
  busy(200);
  await pause(50);
  busy(200);
  await pause(50);
  // A loaded machine may add a stall of its own: at least three.
  t.ok(stalls.length >= 3, `${stalls.length} stalls reported`);
  const r = await get('/livez/eventloop');
  t.equal(r.status, 500, 'three stalls within the window: it keeps stalling');
  t.match(r.body, /^internal server error: event loop blocked \d+ times in the last 1\.5s, for up to \d+ms, the last \d+ms ago \(threshold 50ms\)/);
  const all = await get('/livez');
  t.equal(all.status, 500);
  t.match(all.body, '[-]eventloop failed: event loop blocked');
  t.equal((await get('/readyz')).status, 200, 'the event loop is a liveness matter only');
  // Passes again once the stalls have left the window (polled: a loaded machine may stall the loop again).
  let recovered = false;
  for (const end = Date.now() + 10_000; !recovered && Date.now() < end; ) {
    await pause(100);
    recovered = (await get('/livez/eventloop')).status === 200;
  }
  t.ok(recovered, 'passes again once the window has gone by');
});

t.test('EventLoopMonitor sees a stall still in progress', async (t) => {
  const m = new EventLoopMonitor({ thresholdMs: 30, intervalMs: 10 });
  t.teardown(() => m.stop());
  t.equal(m.check().ok, true);
  busy(100);
  // No timer has fired yet: the tick itself is overdue.
  const c = m.check();
  t.equal(c.ok, false);
  t.match(c.message, /^event loop blocked for/);
});

t.test("EventLoopMonitor's decision, on a fake clock (the agent's defaults: 5 s, 60 s, 3 stalls)", async (t) => {
  const clock = new FakeClock();
  const seen: Array<[number, number]> = [];
  const m = new EventLoopMonitor({ thresholdMs: 5000, clock, onStall: (lag, recent) => seen.push([Math.round(lag), recent]) });
  t.teardown(() => m.stop());
  // The tick is due 1 s (threshold / 5) after the last: a block of 1 s + N makes it N late. Every advance is whole seconds, so a tick has just run.
  const stall = async (lateMs: number): Promise<void> => {
    clock.block(1000 + lateMs);
    await clock.advance(0); // the late tick
  };
  await clock.advance(10_000);
  t.same(m.check(), { ok: true }, 'an idle loop passes with nothing to say');

  clock.block(1000 + 5500);
  t.same(m.check(), { ok: false, message: 'event loop blocked for 5.5s (threshold 5s)' }, 'blocked right now (the tick 5.5 s overdue): fails');
  await clock.advance(0);
  t.same(seen, [[5500, 1]], 'the stall is reported once it ends, the only one in the window');
  t.same(m.check(), { ok: true, message: 'event loop blocked once in the last 1m0s, for 5.5s, 0ms ago; fails at 3' }, 'one stall (a cold sync at 100,000 services): passes, and says so');
  await clock.advance(59_000);
  t.equal(m.check().ok, true, 'and it passes all the while it counts');
  t.match(m.check().message, /blocked once .* 59s ago/);
  await clock.advance(2000);
  t.same(m.check(), { ok: true }, 'until it leaves the window');

  await stall(4900);
  t.same(m.check(), { ok: true }, 'a tick 4.9 s late is no stall');
  t.equal(seen.length, 1);

  // Stalls far apart never add up: a periodic big sync is work, not a wedge.
  for (let i = 0; i < 4; i++) {
    await stall(7000);
    t.equal(m.check().ok, true, `stall ${i + 1}, 61 s after the last one: passes`);
    await clock.advance(61_000);
  }

  // A loop that keeps stalling: 6 s blocks 2 s apart.
  await stall(6000);
  await clock.advance(2000);
  await stall(6000);
  t.same(m.check(), { ok: true, message: 'event loop blocked 2 times in the last 1m0s, for 6s at most, 0ms ago; fails at 3' }, 'two stalls: passes');
  await clock.advance(2000);
  await stall(8000);
  t.same(m.check(), { ok: false, message: 'event loop blocked 3 times in the last 1m0s, for up to 8s, the last 0ms ago (threshold 5s)' }, 'the third within 60 s: fails');
  t.same(seen.slice(-3).map(([, n]) => n), [1, 2, 3], 'each reported with the stalls in the window');
  await clock.advance(40_000);
  t.equal(m.check().ok, false, 'fails while three are in the window (40 s later)');
  await clock.advance(9000);
  t.same(m.check(), { ok: true, message: 'event loop blocked 2 times in the last 1m0s, for 8s at most, 49s ago; fails at 3' }, 'passes once the first has left it');
});

t.test('unsupported methods', async (t) => {
  const { srv } = await serve(t, new FakeView());
  const res = await fetch(`http://127.0.0.1:${srv.port}/livez`, { method: 'POST' });
  t.equal(res.status, 405);
  t.equal(res.headers.get('allow'), 'GET, HEAD');
  await res.text();
  const head = await fetch(`http://127.0.0.1:${srv.port}/healthz`, { method: 'HEAD' });
  t.equal(head.status, 200);
});

t.test('a port in use is an error, not a hang', async (t) => {
  const { srv } = await serve(t, new FakeView());
  await t.rejects(startHealthServer({ view: new FakeView(), host: '127.0.0.1', port: srv.port }), { code: 'EADDRINUSE' });
});

t.test('formatDuration', async (t) => {
  t.equal(formatDuration(0), '0ms');
  t.equal(formatDuration(250), '250ms');
  t.equal(formatDuration(1500), '1.5s');
  t.equal(formatDuration(65_000), '1m5s');
  t.equal(formatDuration(2 * 3600_000 + 3 * 60_000), '2h3m');
  t.equal(formatDuration(26 * 3600_000), '1d2h');
});

t.test('/readyz synced: frontends left out for want of room fail readiness by name; /livez stays ok', async (t) => {
  const view = new FakeView();
  view.applied = false;
  view.stats = {
    count: 3,
    lastSuccess: Date.now(),
    inProgress: false,
    notProgrammed: {
      count: 36,
      first: [
        { frontend: '10.96.0.5:80/TCP', map: 'lb4_reverse_nat', reason: 'no free IPv4 rev-NAT id: all 4 are in use' },
        { frontend: '10.96.0.6:80/TCP', map: 'lb4_reverse_nat', reason: 'no free IPv4 rev-NAT id: all 4 are in use' },
      ],
    },
  };
  const health = new Health({ view });
  t.teardown(() => health.close());
  t.same(health.runOne('readyz', 'synced'), {
    name: 'synced',
    ok: false,
    message: '36 frontends not programmed for want of room: 10.96.0.5:80/TCP (lb4_reverse_nat), 10.96.0.6:80/TCP (lb4_reverse_nat), …',
  });
  t.equal(health.run('livez').ok, true, 'liveness does not look at room');
});
