// The node health mesh between real agents: three "nodes" (network
// namespaces on one bridge), each running an agent in its namespace, Node
// manifests naming all three. Every agent sees every node reachable by ICMP
// and HTTP with RTTs; a node whose link goes down is reported unreachable by
// the others within one period plus the timeout while their results for
// the healthy nodes stay fresh and their /readyz stays 200; it recovers when
// the link returns. A peer that blackholes delays the probes of no other
// (measured); and one agent probes 1,000 simulated peers, half of them
// silent, within its period with bounded concurrency and memory.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import t from 'tap';
import type { MeshStatus } from '../../src/mesh/mesh.js';
import { AgentSlot } from '../helpers/sandbox/agent.js';
import { removeBpfRoot, removeCgroup, removeNetns, BPFFS } from '../helpers/sandbox/topology.js';
import { cgroup2Mount, createSandbox, LBCTL, run, SLOW, type Sandbox } from '../helpers/sandbox.js';
import { killPid, recordPid, sleep } from '../helpers/sandbox/run.js';
import { spawn } from 'node:child_process';
import { ip } from '../helpers/nodeport-lab.js';

const PERIOD_MS = 2000;
const TIMEOUT_MS = 500;

interface MeshNode {
  readonly name: string;
  readonly ns: string;
  readonly v4: string;
  readonly v6: string;
  readonly dev: string;
  readonly agent: AgentSlot;
}

function nodeManifest(name: string, ...addresses: string[]): string {
  return `apiVersion: v1\nkind: Node\nmetadata: {name: ${name}}\nstatus:\n  addresses:\n${addresses.map((a) => `    - {type: InternalIP, address: "${a}"}\n`).join('')}`;
}

/** A bridge in a namespace of its own, and `n` nodes wired to it: m1 10.253.0.1, fd00:253::1, … */
function makeNodes(sb: Sandbox, n: number): MeshNode[] {
  const fabric = `${sb.runId}-fab`;
  const nodes: MeshNode[] = [];
  sb.addCleanup(() => {
    for (const x of nodes) {
      x.agent.killNow();
      removeBpfRoot(x.agent.place.bpfRoot);
      removeCgroup(x.agent.place.cgroup);
    }
    for (const x of nodes) removeNetns(x.ns);
    removeNetns(fabric);
  });
  ip('netns', 'add', fabric);
  ip('-n', fabric, 'link', 'add', 'br0', 'type', 'bridge');
  ip('-n', fabric, 'link', 'set', 'br0', 'up');
  for (let i = 1; i <= n; i++) {
    const name = `m${i}`;
    const ns = `${sb.runId}-${name}`;
    const dev = `${name}e`;
    ip('netns', 'add', ns);
    ip('-n', ns, 'link', 'set', 'lo', 'up');
    ip('link', 'add', dev, 'netns', ns, 'type', 'veth', 'peer', 'name', `${name}b`, 'netns', fabric);
    ip('-n', fabric, 'link', 'set', `${name}b`, 'master', 'br0');
    ip('-n', fabric, 'link', 'set', `${name}b`, 'up');
    const v4 = `10.253.0.${i}`;
    const v6 = `fd00:253::${i}`;
    ip('-n', ns, 'addr', 'add', `${v4}/24`, 'dev', dev);
    ip('-n', ns, 'addr', 'add', `${v6}/64`, 'dev', dev, 'nodad');
    ip('-n', ns, 'link', 'set', dev, 'up');
    const place = `${sb.runId}-${name}`;
    const agent = new AgentSlot({
      runDir: sb.runDir,
      cgroup: path.join(cgroup2Mount(), place),
      bpfRoot: path.join(BPFFS, place),
      apiSocket: path.join(sb.runDir, `${name}.sock`),
      sourceArgs: ['--source', `file:${sb.manifestDir}`, '--node-name', name],
      netns: ns,
    });
    mkdirSync(agent.place.cgroup);
    nodes.push({ name, ns, v4, v6, dev, agent });
  }
  return nodes;
}

async function health(node: MeshNode, withText = false): Promise<{ status: MeshStatus; code: number | null; text: string }> {
  const json = await run(LBCTL, ['health', 'status', '-o', 'json', '--api-socket', node.agent.place.apiSocket], 10_000 * SLOW);
  if (!json.stdout.trim()) throw new Error(`lbctl health status -o json printed nothing (${json.code ?? json.signal}): ${json.stderr}`);
  const text = withText ? (await run(LBCTL, ['health', 'status', '--api-socket', node.agent.place.apiSocket], 10_000 * SLOW)).stdout : '';
  return { status: JSON.parse(json.stdout) as MeshStatus, code: json.code, text };
}

/** Polls `lbctl health status` on `node` until `pred` holds; the time it took. */
async function until(node: MeshNode, what: string, pred: (s: MeshStatus) => boolean, timeoutMs: number): Promise<{ status: MeshStatus; ms: number }> {
  const start = Date.now();
  for (;;) {
    const { status } = await health(node);
    if (pred(status)) return { status, ms: Date.now() - start };
    if (Date.now() - start > timeoutMs * SLOW) throw new Error(`${node.name}: ${what} not seen within ${timeoutMs * SLOW} ms: ${JSON.stringify(status.nodes.map((n) => [n.name, n.state]))}`);
    await sleep(100);
  }
}

const state = (s: MeshStatus, name: string): string | undefined => s.nodes.find((n) => n.name === name)?.state;

function readyz(node: MeshNode): Promise<number> {
  const port = node.agent.port('health');
  // The health server listens on 127.0.0.1 of the node's namespace: ask from inside it.
  return run('nsenter', [`--net=/run/netns/${node.ns}`, 'curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', `http://127.0.0.1:${port}/readyz`], 10_000 * SLOW).then((r) => Number(r.stdout));
}

/** Simulated peer i: 250 to a /24, 10.254.1.1 on; from 10.254.5.1 (i ≥ 500) held by nobody. */
const simAddress = (i: number): string => `10.254.${1 + Math.floor(i / 250)}.${(i % 250) + 1}`;

const meshArgs = ['--no-nodeport', '--health-mesh-period', `${PERIOD_MS}ms`, '--health-mesh-timeout', `${TIMEOUT_MS}ms`];

t.test('three nodes: all reachable; one whose link goes down is reported by the others within a period plus the timeout, and recovers', async (t) => {
  const sb = await createSandbox(t, { backends: 1, agent: false });
  const nodes = makeNodes(sb, 3);
  sb.writeManifest('nodes.yaml', nodes.map((n) => nodeManifest(n.name, n.v4, n.v6)).join('---\n'));
  for (const n of nodes) await n.agent.start(meshArgs);
  const [m1, m2, m3] = nodes as [MeshNode, MeshNode, MeshNode];

  for (const n of nodes) {
    const everyAddress = (s: MeshStatus): boolean => s.total === 3 && s.nodes.every((x) => x.addresses.every((a) => a.icmp.status === 'ok' && a.http.status === 'ok'));
    const { status } = await until(n, 'every address of every node answering', everyAddress, 3 * PERIOD_MS + TIMEOUT_MS);
    t.equal(status.total, 3, `${n.name}: 3 nodes`);
    t.ok(status.nodes.find((x) => x.name === n.name)?.local, `${n.name}: itself marked local`);
    for (const x of status.nodes) {
      for (const a of x.addresses) {
        t.ok(a.icmp.status === 'ok' && (a.icmp.rttMs ?? -1) >= 0, `${n.name} → ${x.name} ${a.address}: ICMP ok, RTT ${a.icmp.rttMs} ms`);
        t.ok(a.http.status === 'ok' && (a.http.rttMs ?? -1) >= 0, `${n.name} → ${x.name} ${a.address}: HTTP ok, RTT ${a.http.rttMs} ms`);
      }
    }
  }
  const ok = await health(m1, true);
  t.equal(ok.code, 0, 'lbctl health status exits 0 when every node is reachable');
  t.match(ok.text, /m1 \(localhost\): reachable[\s\S]*Host connectivity to 10\.253\.0\.1:\n {6}ICMP to stack: +OK, RTT=[\s\S]*HTTP to agent: +OK, RTT=/, 'cilium-health status\'s shape');
  t.match(ok.text, /Cluster health: 3\/3 reachable/);

  // m3's link goes down, inside its own namespace.
  ip('-n', m3.ns, 'link', 'set', m3.dev, 'down');
  const down = Date.now();
  for (const n of [m1, m2]) {
    const { status } = await until(n, 'm3 unreachable', (s) => state(s, 'm3') === 'unreachable', PERIOD_MS * 1.1 + TIMEOUT_MS + 1500);
    const ms = Date.now() - down;
    t.ok(ms <= (PERIOD_MS * 1.1 + TIMEOUT_MS + 1500) * SLOW, `${n.name} reports m3 unreachable ${ms} ms after its link went down (period ${PERIOD_MS} ms + timeout ${TIMEOUT_MS} ms)`);
    t.equal(status.reachable, 2, `${n.name}: 2/3 reachable`);
    const now = Date.parse(status.probeTime);
    for (const x of status.nodes.filter((y) => y.name !== 'm3')) {
      for (const a of x.addresses) {
        t.ok(now - Date.parse(a.lastProbe!) <= PERIOD_MS * 1.1 + TIMEOUT_MS + 500, `${n.name} → ${x.name} ${a.address}: probed ${now - Date.parse(a.lastProbe!)} ms ago, still fresh`);
      }
    }
    t.equal(await readyz(n), 200, `${n.name}: /readyz stays 200 with a peer down`);
  }
  const bad = await health(m1);
  t.equal(bad.code, 1, 'lbctl health status exits 1 with a node unreachable');
  const brief = await run(LBCTL, ['health', 'status', '--brief', '--api-socket', m1.agent.place.apiSocket], 10_000 * SLOW);
  t.match(brief.stdout, /^Cluster health: 2\/3 reachable[^\n]*\n {2}m3: unreachable\n/, '--brief: the summary and the unreachable node');
  t.notMatch(brief.stdout, /m2/, '--brief leaves the reachable nodes out');
  t.match(bad.status.nodes.find((n) => n.name === 'm3')?.addresses[0], { icmp: { status: /timeout|unreachable/ }, http: { status: /timeout|unreachable/ } }, 'the errors are named');

  ip('-n', m3.ns, 'link', 'set', m3.dev, 'up');
  for (const n of [m1, m2]) await until(n, 'm3 reachable again', (s) => state(s, 'm3') === 'reachable', 2 * PERIOD_MS + TIMEOUT_MS + 3000);
  t.pass('m3 recovers when its link returns');

  // A peer that blackholes (an address on the bridge nobody holds: no ARP
  // answer) delays no other node's probes.
  sb.writeManifest('ghost.yaml', nodeManifest('ghost', '10.253.0.99'));
  await until(m1, 'the ghost unreachable', (s) => state(s, 'ghost') === 'unreachable', 2 * PERIOD_MS + TIMEOUT_MS + 3000);
  const samples: number[] = [];
  const seen = new Map<string, string>();
  const end = Date.now() + 4 * PERIOD_MS;
  while (Date.now() < end) {
    const { status } = await health(m1);
    for (const x of status.nodes.filter((y) => y.name !== 'ghost')) {
      for (const a of x.addresses) {
        const before = seen.get(a.address);
        if (before && a.lastProbe && a.lastProbe !== before) samples.push(Date.parse(a.lastProbe) - Date.parse(before));
        if (a.lastProbe) seen.set(a.address, a.lastProbe);
      }
    }
    await sleep(100);
  }
  const worst = Math.max(...samples);
  t.ok(samples.length >= 6, `${samples.length} probe intervals measured beside the ghost`);
  t.ok(worst <= PERIOD_MS * 1.1 + 100, `the healthy nodes are probed every ≤ ${worst} ms with a blackholed peer (period ${PERIOD_MS} ms, ±10% jitter)`);
  sb.writeManifest('nodes.yaml', nodes.slice(0, 2).map((n) => nodeManifest(n.name, n.v4, n.v6)).join('---\n'));
  await until(m1, 'm3 gone', (s) => !s.nodes.some((n) => n.name === 'm3'), 5000);
  t.pass('a Node removed from the manifests leaves the mesh, results and all');
});

t.test('scale: 1,000 simulated peers, half of them silent, probed within the period from a bounded pool', async (t) => {
  const sb = await createSandbox(t, { backends: 1, agent: false });
  const [m1] = makeNodes(sb, 1) as [MeshNode];
  // The simulated peers: 500 addresses held by a namespace wired to m1,
  // which answers ICMP (its stack) and GET /hello (one server on every
  // address); 500 more routed there too but held by nobody, so dropped.
  const sim = `${sb.runId}-sim`;
  sb.addCleanup(() => removeNetns(sim));
  ip('netns', 'add', sim);
  ip('-n', sim, 'link', 'set', 'lo', 'up');
  ip('link', 'add', 'simp', 'netns', m1.ns, 'type', 'veth', 'peer', 'name', 'sim0', 'netns', sim);
  ip('-n', m1.ns, 'addr', 'add', '10.254.255.1/30', 'dev', 'simp');
  ip('-n', sim, 'addr', 'add', '10.254.255.2/30', 'dev', 'sim0');
  ip('-n', m1.ns, 'link', 'set', 'simp', 'up');
  ip('-n', sim, 'link', 'set', 'sim0', 'up');
  ip('-n', m1.ns, 'route', 'add', '10.254.0.0/17', 'via', '10.254.255.2');
  ip('-n', sim, 'route', 'add', '10.253.0.0/24', 'via', '10.254.255.1');
  const batch = path.join(sb.runDir, 'sim-addresses');
  writeFileSync(batch, Array.from({ length: 500 }, (_, i) => `address add ${simAddress(i)}/32 dev lo\n`).join(''));
  ip('-n', sim, '-batch', batch);
  // GET /hello on every address: one small node server (a thread per
  // request in Python would be the bottleneck at 1,000 peers, not the prober).
  const server = spawn('nsenter', [`--net=/run/netns/${sim}`, process.execPath, '-e',
    "require('http').createServer((q, r) => r.end('ok')).listen(4240, '0.0.0.0', () => console.log('ready'))"], { stdio: ['ignore', 'pipe', 'inherit'] });
  recordPid(sb.runDir, server.pid);
  sb.addCleanup(() => killPid(server.pid));
  await new Promise((resolve, reject) => {
    server.stdout!.once('data', resolve);
    server.once('exit', (code) => reject(new Error(`the simulated peers' server exited (${code})`)));
  });
  const peers = Array.from({ length: 1000 }, (_, i) => simAddress(i));
  sb.writeManifest('nodes.yaml', [nodeManifest('m1', m1.v4), ...peers.map((a, i) => nodeManifest(`sim-${i}`, a))].join('---\n'));
  // The baseline, in the same run: the same agent and manifests without the mesh.
  await m1.agent.start(['--no-nodeport', '--health-mesh-port', '0']);
  await sleep(3000);
  const rssOf = (pid: number): number => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]) / 1024;
  const baseRss = rssOf(m1.agent.requireAgent().pid);
  await m1.agent.stop();
  // The default period for 1,001 addresses: max(10 s, 2,002 probes / 166 per second) = 12.1 s.
  await m1.agent.start(['--no-nodeport', '--health-mesh-timeout', '1s']);
  const first = await until(m1, 'a full round', (s) => s.nodes.every((n) => n.state !== 'pending'), 2 * 12_100 + 2000);
  t.ok(first.status.periodMs >= 12_000 && first.status.periodMs <= 12_200, `the period follows the rule: ${first.status.periodMs} ms for 1,001 addresses`);
  // A second round: every address probed again within one period (+ timeout, jitter).
  const { status } = await until(m1, 'a second round', () => true, 1);
  const pid = m1.agent.requireAgent().pid;
  const cpu = (): number => {
    const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return (Number(f[11]) + Number(f[12])) / 100; // utime + stime, in clock ticks of 10 ms
  };
  const cpu0 = cpu();
  const t0 = Date.now();
  await sleep(status.periodMs * 1.1 + 1000);
  const cpuShare = (cpu() - cpu0) / ((Date.now() - t0) / 1000);
  const later = (await health(m1)).status;
  const now = Date.parse(later.probeTime);
  const ages = later.nodes.flatMap((n) => n.addresses.map((a) => now - Date.parse(a.lastProbe!)));
  const oldest = Math.max(...ages);
  t.ok(oldest <= later.periodMs * 1.1 + 1000 + 500, `every address probed within the last period: the oldest ${oldest} ms ago (period ${later.periodMs} ms)`);
  const wrong = later.nodes.filter((n, i) => (n.name === 'm1' || Number(n.name.slice(4)) < 500 ? n.state !== 'reachable' : n.state !== 'unreachable')).slice(0, 5);
  t.same(wrong.map((n) => [n.name, n.state, n.addresses[0]]), [], 'every node in the state its address gives it');
  t.equal(later.reachable, 501, '500 answering peers and m1 itself reachable');
  t.equal(later.unreachable, 500, '500 silent peers unreachable');
  t.ok(later.inFlight <= 512, `bounded concurrency: ${later.inFlight} probes in flight`);
  const rss = rssOf(m1.agent.requireAgent().pid);
  t.ok(rss < baseRss + 120, `agent RSS ${rss.toFixed(0)} MiB probing 1,001 peers, ${baseRss.toFixed(0)} MiB without the mesh`);
  t.ok(cpuShare < 0.5, `the agent's CPU while probing 1,001 addresses: ${(cpuShare * 100).toFixed(1)}% of a core`);
  t.comment(`scale: period ${later.periodMs} ms, oldest probe ${oldest} ms, in flight ${later.inFlight}, queued ${later.queued}, RSS ${rss.toFixed(0)} MiB (${baseRss.toFixed(0)} MiB without the mesh), CPU ${(cpuShare * 100).toFixed(1)}% of a core`);
  // /readyz stays 200 with 500 peers down.
  t.equal(await readyz(m1), 200, '/readyz stays 200 with 500 peers down');
});
