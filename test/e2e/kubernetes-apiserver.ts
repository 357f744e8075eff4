// What the agent costs the API server, with the real agent against the
// test API server (test/helpers/fake-apiserver.ts), which serves each
// request as a kube-apiserver of a given version would: from its watch
// cache or read through to etcd, and counts them. A start, a restart, a
// relist after 410 and an API server restart are all served from the cache,
// even by servers older than consistent reads from the cache (1.31); the
// watch-list is used where the server streams lists; and a deletion made
// during an API server outage reaches the maps within seconds of the
// server's first answer, by the same agent process (docs/kubernetes.md,
// "What the agents cost the API server").
import t, { type Test } from 'tap';
import { FakeApiServer, type ServerVersion } from '../helpers/fake-apiserver.js';
import { createSandbox, HTTP_PORT, SLOW, type Sandbox } from '../helpers/sandbox.js';
import { UNREACHABLE_BACKOFF_MAX_MS } from '../../src/sources/kubernetes.js';
import { serviceWithBackends } from '../helpers/manifests.js';

// Six agents started one after another; each wait has its own deadline.
t.setTimeout(300_000 * SLOW);

const NODE = 'node-a';
const SERVICES = '/api/v1/services?';

/** A ClusterIP service on port 80 with one backend, as the test API server stores it. */
const serviceYaml = (name: string, ip: string, backend: string): string =>
  serviceWithBackends({ name, clusterIPs: [ip], ports: [{ name: 'http', port: 80 }] }, [{ name: `${name}-abcde`, family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: [backend] }]);

const nodeYaml = `apiVersion: v1
kind: Node
metadata:
  name: ${NODE}
`;

async function setup(t: Test, version: ServerVersion): Promise<{ sb: Sandbox; api: FakeApiServer }> {
  const api = new FakeApiServer({ version });
  await api.start();
  t.teardown(() => api.stop());
  const sb = await createSandbox(t, { backends: 1, agent: false });
  sb.sourceArgs = ['--kubeconfig', api.kubeconfig, '--node-name', NODE, '--sync-period', '600000'];
  const backend = sb.backends[0]!.v4;
  api.apply(nodeYaml);
  api.apply(serviceYaml('web', '10.96.0.10', backend));
  api.apply(serviceYaml('db', '10.96.0.11', backend));
  return { sb, api };
}

const frontends = async (sb: Sandbox): Promise<string[]> => (await sb.lbList()).map((e) => e.frontend).sort();

t.test('on a 1.30 server (no consistent reads from the cache): a start, a relist after 410 and a restart are all served from the watch cache', async (t) => {
  const { sb, api } = await setup(t, '1.30');
  await sb.startAgent();
  await sb.waitUntil(() => api.openWatches >= 3, 'watching');
  t.same(api.requestKinds(), { 'list-cache': 3, watch: 3 }, 'the start: a list per kind at resourceVersion 0, from the cache, and a watch');

  // The watches break, a deletion is missed, history is compacted: 410.
  let mark = api.requests.length;
  api.dropWatches();
  api.silently(() => api.delete('Service', 'db'));
  api.compact();
  await sb.waitUntil(async () => !(await frontends(sb)).includes('10.96.0.11:80/TCP'), 'the relist finds the deletion');
  await sb.waitUntil(() => api.openWatches >= 3, 'watching again');
  const relist = api.requests.slice(mark).filter((r) => r.url.startsWith(SERVICES) && r.kind?.startsWith('list'));
  t.same(relist.map((r) => r.kind), ['list-cache'], 'the relist: from the cache');
  t.match(relist[0]!.url, /[?&]resourceVersion=\d+/, 'at the last version seen');
  t.notMatch(relist[0]!.url, /[?&]limit=/, 'with no limit (a limit with a version would be an exact read from etcd)');
  t.notOk(api.requestKinds({ since: mark })['list-storage'], 'nothing read through to etcd');
  t.ok(sb.agent!.logs.some((l) => l.msg === 'list or watch failed; retrying after backoff' && /410/.test(String(l.err))), 'the 410 is logged');

  // A restart (a DaemonSet rollout): the new agent lists at resourceVersion 0 again.
  await sb.stopAgent();
  mark = api.requests.length;
  const restarted = await sb.startAgent();
  t.equal(restarted.frontends, 1, 'the restarted agent has web');
  await sb.waitUntil(() => api.openWatches >= 3, 'watching');
  t.same(api.requestKinds({ since: mark }), { 'list-cache': 3, watch: 3 }, 'the restart: from the cache, as the start');
  t.ok(api.requests.slice(mark).filter((r) => r.kind === 'list-cache').every((r) => /[?&]resourceVersion=0(&|$)/.test(r.url)), 'at resourceVersion 0');
});

t.test('an API server that lags (504 Too large resource version): a consistent list at once, in pages', async (t) => {
  const { sb, api } = await setup(t, '1.31');
  await sb.startAgent();
  await sb.waitUntil(() => api.openWatches >= 3, 'watching');
  const mark = api.requests.length;
  api.cacheBehind = 1_000_000;
  api.dropWatches();
  api.silently(() => api.delete('Service', 'db'));
  api.compact();
  await sb.waitUntil(async () => !(await frontends(sb)).includes('10.96.0.11:80/TCP'), 'the consistent list finds the deletion');
  const lists = api.requests.slice(mark).filter((r) => r.url.startsWith(SERVICES) && r.kind?.startsWith('list'));
  t.same(
    lists.map((r) => [r.kind, r.status]),
    [
      ['list-cache', 504],
      ['list-storage', 200],
    ],
    "the version refused by the lagging cache; a consistent list (etcd: the cache cannot catch up, delegator.go's fallback)",
  );
  t.notMatch(lists[1]!.url, /resourceVersion=/, 'at resourceVersion ""');
  t.match(lists[1]!.url, /[?&]limit=500/, 'in pages of 500');
  t.same(await frontends(sb), ['10.96.0.10:80/TCP']);
});

t.test('--watch-list auto: a watch-list per kind where the server streams lists; where it refuses, lists, said once', async (t) => {
  {
    const { sb, api } = await setup(t, '1.34');
    const first = await sb.startAgent(['--watch-list', 'auto']);
    t.equal(first.frontends, 2);
    await sb.waitUntil(() => api.openWatches >= 3, 'watching');
    t.same(api.requestKinds(), { 'watch-list': 3 }, '1.34: one watch-list per kind, and nothing else');
    api.delete('Service', 'db');
    await sb.waitUntil(async () => (await frontends(sb)).length === 1, 'a change on the same stream');
    t.same(api.requestKinds(), { 'watch-list': 3 }, 'no other request');
    await sb.stopAgent();
  }
  {
    const { sb, api } = await setup(t, '1.33');
    const first = await sb.startAgent(['--watch-list', 'auto']);
    t.equal(first.frontends, 2);
    await sb.waitUntil(() => api.openWatches >= 3, 'watching');
    const said = sb.agent!.logs.filter((l) => /does not stream lists/.test(String(l.msg)));
    t.equal(said.length, 1, '1.33: the refusal is logged once');
    t.match(said[0], { level: 30, reason: /HTTP 422: .*sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled/ });
    const kinds = api.requestKinds();
    t.same([kinds['list-cache'], kinds.watch], [3, 3], 'then lists from the cache, and watches');
    t.ok(kinds.invalid! <= 3, 'after at most one refused watch-list per kind');
    await sb.stopAgent();
  }
});

t.test('an API server outage: a deletion made during it reaches the maps within seconds of the server\'s first answer; the agent is not restarted', async (t) => {
  const { sb, api } = await setup(t, '1.34');
  await sb.startAgent();
  await sb.waitUntil(() => api.openWatches >= 3, 'watching');
  const agent = sb.agent!;
  const pid = agent.pid;
  t.same(await frontends(sb), ['10.96.0.10:80/TCP', '10.96.0.11:80/TCP']);

  // The API server goes away (connections refused); a deletion meanwhile;
  // back as a new process, whose watch cache starts after the deletion: the
  // watches resumed from before get 410, and only a relist finds it.
  const outage = agent.logs.length;
  await api.goAway();
  api.delete('Service', 'db');
  const retries = (): number[] =>
    agent.logs.slice(outage).filter((l) => l.msg === 'list or watch failed; retrying after backoff' && l.kind === 'Service').map((l) => Number(l.retryInMs));
  // The backoff grows (500 ms doubling, equal jitter) up to its cap for an
  // unreachable server, 5 s: by the sixth Service retry the step has reached
  // the cap (its delay 2.5 to 5 s), where uncapped it would be 16 s, and
  // growing to 30 s. At most 0.5 + 1 + 2 + 4 + 5 + 5 s to get there.
  await sb.waitUntil(() => retries().length >= 6, 'six Service retries', 40_000 * SLOW);
  t.ok(retries().every((ms) => ms <= UNREACHABLE_BACKOFF_MAX_MS), `no retry waits more than ${UNREACHABLE_BACKOFF_MAX_MS} ms while the server is unreachable (${retries().join(', ')})`);
  t.ok(retries().some((ms) => ms >= UNREACHABLE_BACKOFF_MAX_MS / 2), 'the backoff grew to the cap meanwhile');
  t.same(await frontends(sb), ['10.96.0.10:80/TCP', '10.96.0.11:80/TCP'], 'during the outage the maps keep what they had');

  const mark = api.requests.length;
  const back = Date.now();
  await api.comeBack();
  await sb.waitUntil(async () => !(await frontends(sb)).includes('10.96.0.11:80/TCP'), 'the deletion in the maps', 30_000);
  // The request's arrival (this process's performance.now()) as the epoch ms of the agent's log.
  const firstAnswer = performance.timeOrigin + api.requests.slice(mark).find((r) => r.status === 200)!.at;
  const sync = agent.logs.find((l, i) => i >= outage && l.msg === 'sync done' && l.frontends === 1);
  const tookMs = Math.round(Number(sync?.time) - firstAnswer);
  t.ok(tookMs >= 0 && tookMs < 2000 * SLOW, `the deletion was programmed ${tookMs} ms after the server's first answer, not after a backoff step of 2.5 s or more`);
  const sinceBack = Math.round(Number(sync?.time) - back);
  t.ok(sinceBack < UNREACHABLE_BACKOFF_MAX_MS + 3000 * SLOW, `and ${sinceBack} ms after the server came back: within one capped step (${UNREACHABLE_BACKOFF_MAX_MS} ms) and the relist`);
  t.equal(sb.agent!.pid, pid, 'the same agent process');
  t.ok(agent.running, 'still running');
  t.notOk(api.requestKinds({ since: mark })['list-storage'], 'the relists came from the cache');
});
