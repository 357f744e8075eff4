// The real cluster of scripts/cluster/ (docs/cluster.md) from the tests: its
// settings, up and down, kubectl, commands on a node, and snapshots of what
// the host must keep as it was (sysctls, iptables and nftables, the root
// cgroups, the host's network and mounts).
import { type ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { ROOT } from './sandbox/run.js';

export const SCRIPTS = path.join(ROOT, 'scripts/cluster');

export interface ClusterSettings {
  readonly name: string;
  readonly state: string;
  readonly cache: string;
  readonly nodes: string[];
  readonly cpNetns: string;
  /** The client outside the nodes: its namespace (on the nodes' bridge) and address. */
  readonly extNetns: string;
  readonly extIp: string;
  readonly cgroupV2: string;
  readonly cgroupV1: string[];
  readonly pauseImage: string;
  readonly testImage: string;
  /** node name → [node IP, pod CIDR, netns]. */
  readonly node: Record<string, { ip: string; podCidr: string; netns: string }>;
}

/** The settings of scripts/cluster/lib.sh, environment overrides included. */
export function clusterSettings(): ClusterSettings {
  const out = execFileSync('bash', ['-c', `source ${SCRIPTS}/lib.sh
    echo "$CLUSTER_NAME"; echo "$CLUSTER_STATE"; echo "$CLUSTER_CACHE"; echo "$CLUSTER_CP_NETNS"
    echo "$(cgroup_v2_mount)"; echo $(cgroup_v1_mounts); echo "$CLUSTER_PAUSE_IMAGE"; echo "$CLUSTER_TEST_IMAGE"
    echo "$CLUSTER_EXT_NETNS"; echo "$CLUSTER_EXT_IP"; echo "\${CLUSTER_NODES[*]}"
    for n in "\${CLUSTER_NODES[@]}"; do echo "$n $(node_ip "$n") $(node_pod_cidr "$n") $(node_netns "$n")"; done`], { encoding: 'utf8' });
  const [name, state, cache, cpNetns, cgroupV2, v1, pauseImage, testImage, extNetns, extIp, nodes, ...rest] = out.trimEnd().split('\n');
  const node: ClusterSettings['node'] = {};
  for (const line of rest) {
    const [n, ip, podCidr, netns] = line.split(' ');
    node[n!] = { ip: ip!, podCidr: podCidr!, netns: netns! };
  }
  return { name: name!, state: state!, cache: cache!, cpNetns: cpNetns!, extNetns: extNetns!, extIp: extIp!, cgroupV2: cgroupV2!, cgroupV1: v1!.split(' ').filter(Boolean), pauseImage: pauseImage!, testImage: testImage!, nodes: nodes!.split(' '), node };
}

/** Runs a script of scripts/cluster/; its stderr goes to ours (the test's log). */
export function clusterScript(script: string, args: readonly string[] = [], timeoutMs = 600_000): string {
  return execFileSync('bash', [path.join(SCRIPTS, script), ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], timeout: timeoutMs });
}

/**
 * cluster-up (scripts/cluster/up.sh). An up that fails is taken down at
 * once: a test file's process dies of the error before its teardown runs,
 * and a cluster left half up fails every file after it ("a cluster is up").
 */
export function clusterUp(): void {
  try {
    clusterScript('up.sh');
  } catch (err) {
    try { clusterScript('down.sh'); } catch { /* the error that matters is up's */ }
    throw err;
  }
}

/**
 * A test file's own cluster: refuses to start over one that is up, takes
 * the host's snapshot first (for hostDiff at the end), brings the cluster
 * up (clusterUp: a failed up is taken down at once) and down at the file's
 * teardown.
 */
export function freshCluster(t: { teardown(fn: () => void): void }): { s: ClusterSettings; before: HostSnapshot } {
  const s = clusterSettings();
  if (existsSync(s.state)) throw new Error(`a cluster is up (${s.state}): make cluster-down first`);
  const before = hostSnapshot(s);
  t.teardown(() => { clusterScript('down.sh'); });
  clusterUp();
  return { s, before };
}

/**
 * The checks every proxy of the cluster must pass for the Service `svc()`
 * returns when they run (echoService, made by an earlier subtest),
 * as subtests of `t`: a node reaches both backends through the ClusterIP,
 * and the client outside the nodes reaches both through the NodePort of
 * each node (the local backend and the remote one).
 */
export function serviceReachTests(t: { test(name: string, fn: (t: ReachTest) => Promise<void>): unknown }, s: ClusterSettings, service: () => EchoService): void {
  t.test('a node reaches both backends through the ClusterIP', async (t) => {
    const svc = service();
    const node = s.nodes[1]!;
    const seen = answers(() => hostnameVia((sh) => onNode(s, node, ['busybox', 'sh', '-c', sh]), svc.clusterIP, 80), 16);
    t.same([...seen].sort(), svc.backends, `answers to ${node} through ${svc.clusterIP}:80`);
  });
  t.test('the NodePort, from outside the nodes, through either node: the local and the remote backend', async (t) => {
    const svc = service();
    for (const node of s.nodes) {
      const ip = s.node[node]!.ip;
      const seen = answers(() => hostnameVia((sh) => inExt(s, ['busybox', 'sh', '-c', sh]), ip, svc.nodePort), 16);
      t.same([...seen].sort(), svc.backends, `answers to ${s.extIp} through ${ip}:${svc.nodePort}`);
    }
  });
}
interface ReachTest { same(found: unknown, wanted: unknown, message: string): unknown }

/** kubectl against the cluster (scripts/cluster/kubectl.sh); throws with its stderr on failure. */
export function kubectl(args: readonly string[], input?: string, timeoutMs = 60_000): string {
  const r = spawnSync('bash', [path.join(SCRIPTS, 'kubectl.sh'), ...args], { encoding: 'utf8', input, timeout: timeoutMs });
  if (r.status !== 0) throw new Error(`kubectl ${args.join(' ')}: exit ${r.status ?? r.signal}: ${r.stderr.trim()}`);
  return r.stdout;
}

/** The pid of a process cluster-up recorded ($CLUSTER_STATE/pids/NAME), if it still runs. */
export function recordedPid(s: ClusterSettings, name: string): number | undefined {
  const r = spawnSync('bash', ['-c', `source ${SCRIPTS}/lib.sh; recorded_pid "$1"`, '-', name], { encoding: 'utf8' });
  return r.status === 0 ? Number(r.stdout.trim()) : undefined;
}

/**
 * A command on NODE, as the node's own processes run: in its cgroups (where
 * lbctl's socket programs apply: a process outside them is not the node's
 * to lbctl, whatever its network namespace) and in its mount and network
 * namespaces (those of its containerd).
 */
export function onNode(s: ClusterSettings, node: string, cmd: readonly string[]): string {
  const pid = recordedPid(s, `${node}-containerd`);
  if (!pid) throw new Error(`${node}'s containerd is not running`);
  return execFileSync('bash', [path.join(SCRIPTS, 'enter.sh'), node, s.node[node]!.netns, 'nsenter', '-t', String(pid), '-m', '--', ...cmd], { encoding: 'utf8' });
}

/** A command in the external client's namespace and cgroup (enter.sh ext): cluster-down ends whatever of it is left. */
export function inExt(s: ClusterSettings, cmd: readonly string[], timeoutMs = 60_000): string {
  return execFileSync('bash', [path.join(SCRIPTS, 'enter.sh'), 'ext', s.extNetns, ...cmd], { encoding: 'utf8', timeout: timeoutMs });
}

/** The same, in the background: a load client, stopped by the test (or by cluster-down). */
export function spawnInExt(s: ClusterSettings, cmd: readonly string[]): ChildProcess {
  return spawn('bash', [path.join(SCRIPTS, 'enter.sh'), 'ext', s.extNetns, ...cmd], { stdio: ['ignore', 'pipe', 'pipe'] });
}

// ------------------------------------------------------------ services and clients

/** HTTP/1.0 GET of /hostname with busybox nc, run by `run` (in a pod, on a node, outside): the answer's body. */
export function hostnameVia(run: (script: string) => string, addr: string, port: number): string {
  const reply = run(`printf 'GET /hostname HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${addr} ${port}`);
  return reply.split('\r\n\r\n')[1] ?? `(no answer: ${JSON.stringify(reply)})`;
}

/** The distinct answers of `tries` asks. */
export function answers(ask: () => string, tries: number): Set<string> {
  const seen = new Set<string>();
  for (let i = 0; i < tries; i++) seen.add(ask());
  return seen;
}

export interface EchoService {
  readonly clusterIP: string;
  readonly nodePort: number;
  /** The backend pods' names, one per node, sorted: what /hostname answers. */
  readonly backends: string[];
}

/**
 * A NodePort Service `name` (port 80) with an agnhost netexec backend on
 * each node (`name`-NODE, answering /hostname with its name), and a client
 * pod `client` on the first node unless it exists; waits until the pods are
 * Ready and the EndpointSlice controller has every backend ready.
 */
export async function echoService(s: ClusterSettings, name = 'echo'): Promise<EchoService> {
  const backends = s.nodes.map((n) => `${name}-${n}`);
  const items = [
    ...s.nodes.map((node) => ({
      apiVersion: 'v1', kind: 'Pod',
      metadata: { name: `${name}-${node}`, labels: { app: name } },
      spec: {
        nodeSelector: { 'kubernetes.io/hostname': node }, terminationGracePeriodSeconds: 1,
        containers: [{ name: 'echo', image: s.testImage, imagePullPolicy: 'Never', args: ['netexec', '--http-port=8080'], readinessProbe: { httpGet: { path: '/healthz', port: 8080 }, periodSeconds: 1 } }],
      },
    })),
    {
      apiVersion: 'v1', kind: 'Pod',
      metadata: { name: 'client' },
      spec: {
        nodeSelector: { 'kubernetes.io/hostname': s.nodes[0] }, terminationGracePeriodSeconds: 1,
        containers: [{ name: 'client', image: s.testImage, imagePullPolicy: 'Never', args: ['pause'] }],
      },
    },
    {
      apiVersion: 'v1', kind: 'Service',
      metadata: { name },
      spec: { type: 'NodePort', selector: { app: name }, ports: [{ name: 'http', port: 80, targetPort: 8080 }] },
    },
  ];
  kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
  kubectl(['wait', '--for=condition=Ready', 'pod/client', ...backends.map((b) => `pod/${b}`), '--timeout=120s'], undefined, 130_000);
  const svc = JSON.parse(kubectl(['get', 'svc', name, '-o', 'json'])) as { spec: { clusterIP: string; ports: Array<{ nodePort: number }> } };
  await readyEndpoints(name, backends.length);
  return { clusterIP: svc.spec.clusterIP, nodePort: svc.spec.ports[0]!.nodePort, backends: backends.sort() };
}

/** Waits (up to `secs`) until Service `name`'s EndpointSlices have `n` ready endpoints; false if they never do. */
export async function readyEndpoints(name: string, n: number, secs = 30, namespace = 'default'): Promise<boolean> {
  for (let i = 0; i < secs * 5; i++) {
    const slices = JSON.parse(kubectl(['-n', namespace, 'get', 'endpointslices', '-l', `kubernetes.io/service-name=${name}`, '-o', 'json'])) as { items: Array<{ endpoints?: Array<{ conditions: { ready?: boolean } }> }> };
    if (slices.items.flatMap((sl) => sl.endpoints ?? []).filter((e) => e.conditions.ready).length === n) return true;
    await new Promise((r) => setTimeout(r, 200));
  }
  return false;
}

// ------------------------------------------------------------ steady load

export interface LoadResult {
  readonly ok: number;
  readonly failed: number;
  /** The first failures, each with its time (epoch ms) and what the client saw. */
  readonly failures: Array<{ at: number; what: string }>;
}

/**
 * A pod on `node` that asks addr:port for /hostname over and over, a fresh
 * connection each time (busybox nc, one request every 50 ms or so), counting
 * what succeeds (an answer naming a pod whose name starts with `expect`)
 * and logging every failure, until stopPodLoad().
 */
export function startPodLoad(s: ClusterSettings, name: string, node: string, addr: string, port: number, expect = 'echo-'): void {
  const script = `ok=0; fail=0
while [ ! -e /tmp/stop ]; do
  r=$(printf 'GET /hostname HTTP/1.0\\r\\n\\r\\n' | nc -w 2 ${addr} ${port} 2>&1 | tail -n 1)
  case "$r" in ${expect}*) ok=$((ok+1)) ;; *) fail=$((fail+1)); echo "fail $(date +%s)000 $r" ;; esac
  usleep 50000
done
echo "done ok=$ok fail=$fail"
exec sleep 3600`;
  kubectl(['apply', '-f', '-'], JSON.stringify({
    apiVersion: 'v1', kind: 'Pod', metadata: { name, labels: { role: 'load' } },
    spec: {
      nodeSelector: { 'kubernetes.io/hostname': node }, terminationGracePeriodSeconds: 1,
      containers: [{ name: 'load', image: s.testImage, imagePullPolicy: 'Never', command: ['sh', '-c', script] }],
    },
  }));
}

/** Stops a startPodLoad() pod's loop and reads its counts. */
export async function stopPodLoad(name: string): Promise<LoadResult> {
  kubectl(['exec', name, '--', 'touch', '/tmp/stop']);
  for (let i = 0; i < 100; i++) {
    const log = kubectl(['logs', name]);
    const done = /^done ok=(\d+) fail=(\d+)$/m.exec(log);
    if (done) {
      const failures = log.split('\n').filter((l) => l.startsWith('fail ')).slice(0, 50).map((l) => ({ at: Number(l.split(' ')[1]), what: l.split(' ').slice(2).join(' ') }));
      return { ok: Number(done[1]), failed: Number(done[2]), failures };
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`${name}: its loop did not stop`);
}

/**
 * client.py load from the external client's namespace: `rate` fresh TCP
 * connections a second to each target, GET /hostname. stop() ends it and
 * gives its counts.
 */
export function startExtLoad(s: ClusterSettings, targets: readonly string[], rate: number): { stop(): Promise<LoadResult & { raw: unknown }> } {
  const dir = mkdtempSync(path.join(tmpdir(), 'lbctl-cluster-load-'));
  const stopFile = path.join(dir, 'stop');
  const proc = spawnInExt(s, ['python3', path.join(ROOT, 'test/helpers/client.py'), 'load', ...targets.flatMap((x) => ['--tcp', x]), '--rate', String(rate),
    '--seconds', '3600', '--stop-file', stopFile, '--timeout', '3', '--path', '/hostname']);
  let out = '';
  proc.stdout!.on('data', (d: Buffer) => (out += d));
  proc.stderr!.on('data', (d: Buffer) => (out += d));
  const exited = new Promise<void>((resolve) => proc.on('exit', () => resolve()));
  return {
    async stop() {
      writeFileSync(stopFile, '');
      await exited;
      rmSync(dir, { recursive: true, force: true });
      const line = out.split('\n').find((l) => l.startsWith('{'));
      if (!line) throw new Error(`client.py load printed no result: ${out.slice(0, 2000)}`);
      const r = JSON.parse(line) as { ok: number; failed: number; failures: Array<{ at: number; target: string; phase: string; error: string }> };
      return { ok: r.ok, failed: r.failed, failures: r.failures.slice(0, 50).map((f) => ({ at: f.at, what: `${f.target} ${f.phase} ${f.error}` })), raw: r };
    },
  };
}

// ------------------------------------------------------------ the host's state

/**
 * Sysctls that change by themselves (counters, random values), and
 * kernel.bpf_stats_enabled, which a profiler may turn on beside the tests
 * on a shared machine (`make bench` holds BPF_ENABLE_STATS instead, which
 * leaves it as it is); lbctl never writes it.
 */
const VOLATILE_SYSCTL = /^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr)|fs\.quota\.|kernel\.(ns_last_pid|random\.|pty\.nr|bpf_stats_enabled)|net\.netfilter\.nf_conntrack_count)/;

/** The root cgroups' settings: what kubelet, runc or a BPF loader would change there. */
const ROOT_CGROUP_KNOBS = [
  'cpu.shares', 'cpu.cfs_quota_us', 'cpu.cfs_period_us', 'cpu.rt_runtime_us', 'cpuset.cpus', 'cpuset.mems',
  'cpuset.cpu_exclusive', 'memory.limit_in_bytes', 'memory.soft_limit_in_bytes', 'memory.swappiness',
  'memory.use_hierarchy', 'memory.move_charge_at_immigrate', 'memory.memsw.limit_in_bytes', 'devices.list', 'pids.max',
  'blkio.weight', 'cgroup.clone_children', 'notify_on_release', 'release_agent',
  // cgroup2
  'cgroup.subtree_control', 'cgroup.max.depth', 'cgroup.max.descendants', 'memory.max', 'cpu.max', 'pids.max',
];

export interface HostSnapshot {
  readonly sysctls: Map<string, string>;
  /** iptables-legacy, iptables-nft, ip6tables of both, nft: rules without counters or dates. */
  readonly firewall: Map<string, string>;
  /** "<mount>/<knob>" → value, and "<mount>/bpf" → the programs attached at the cgroup2 root. */
  readonly rootCgroups: Map<string, string>;
  /** Top-level cgroup directories, per mount. */
  readonly cgroupDirs: Map<string, string[]>;
  /** The host's network namespace: links (names and flags), addresses, routes, rules. */
  readonly network: Map<string, string>;
  /** The host mount namespace's mount points. */
  readonly mounts: string[];
}

function tryRun(cmd: string, args: readonly string[]): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.error) return `(${cmd}: ${r.error.message})`;
  return `${r.stdout}${r.status === 0 ? '' : `(exit ${r.status}: ${r.stderr.trim()})`}`;
}

export function hostSnapshot(s: ClusterSettings): HostSnapshot {
  const sysctls = new Map<string, string>();
  for (const line of tryRun('sysctl', ['-a']).split('\n')) {
    const m = /^(\S+) = (.*)$/.exec(line);
    if (m && !VOLATILE_SYSCTL.test(m[1]!)) sysctls.set(m[1]!, m[2]!);
  }
  const firewall = new Map<string, string>();
  for (const cmd of ['iptables-legacy-save', 'iptables-nft-save', 'ip6tables-legacy-save', 'ip6tables-nft-save']) {
    firewall.set(cmd, tryRun(cmd, []).split('\n').filter((l) => !l.startsWith('#')).map((l) => l.replace(/\[\d+:\d+\]/g, '')).join('\n'));
  }
  firewall.set('nft', tryRun('nft', ['-s', 'list', 'ruleset']));

  const rootCgroups = new Map<string, string>();
  const cgroupDirs = new Map<string, string[]>();
  for (const mount of [...s.cgroupV1, s.cgroupV2]) {
    for (const knob of ROOT_CGROUP_KNOBS) {
      const f = path.join(mount, knob);
      if (existsSync(f)) rootCgroups.set(f, readFileSync(f, 'utf8'));
    }
    cgroupDirs.set(mount, readdirSync(mount, { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => d.name).sort());
  }
  rootCgroups.set(`${s.cgroupV2}/bpf`, tryRun('bpftool', ['cgroup', 'show', s.cgroupV2]));

  const network = new Map<string, string>([
    ['links', tryRun('ip', ['-o', 'link', 'show']).replace(/ link\/.*$/gm, '')],
    ['addresses', tryRun('ip', ['-o', 'addr', 'show']).replace(/valid_lft.*$/gm, '')],
    ['routes', tryRun('ip', ['route', 'show', 'table', 'all'])],
    ['rules', tryRun('ip', ['rule', 'show'])],
  ]);
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8').trimEnd().split('\n').map((l) => l.split(' ')[4]!);
  return { sysctls, firewall, rootCgroups, cgroupDirs, network, mounts };
}

/**
 * What differs between two snapshots, one line each. Top-level cgroups and
 * mounts named lbctl-* other than the cluster's are other suites' sandboxes
 * (tests run beside each other): only the cluster's own and others count.
 */
export function hostDiff(s: ClusterSettings, before: HostSnapshot, after: HostSnapshot): string[] {
  const out: string[] = [];
  const maps = (what: string, a: Map<string, string>, b: Map<string, string>): void => {
    for (const [k, v] of a) if (b.get(k) !== v) out.push(`${what} ${k}: ${JSON.stringify(v).slice(0, 200)} -> ${JSON.stringify(b.get(k))?.slice(0, 200)}`);
    for (const [k, v] of b) if (!a.has(k)) out.push(`${what} ${k}: new, ${JSON.stringify(v).slice(0, 200)}`);
  };
  maps('sysctl', before.sysctls, after.sysctls);
  maps('firewall', before.firewall, after.firewall);
  maps('root cgroup', before.rootCgroups, after.rootCgroups);
  maps('host network', before.network, after.network);
  const others = (name: string): boolean => name !== s.name && name.startsWith('lbctl-');
  for (const [mount, dirs] of after.cgroupDirs) {
    const was = new Set(before.cgroupDirs.get(mount));
    for (const d of dirs) if (!was.has(d) && d !== s.name && !others(d)) out.push(`cgroup ${mount}/${d}: new`);
  }
  const was = new Set(before.mounts);
  for (const m of after.mounts) {
    // Other suites' sandboxes, and image builds (make image's mmdebstrap mounts /proc, /sys and /dev in its chroot) beside the tests.
    if (was.has(m) || /\/lbctl-(test|demo|bench|verify)-/.test(m) || m.startsWith('/tmp/mmdebstrap.')) continue;
    if (m.startsWith('/run/netns/') && path.basename(m).startsWith(s.name)) continue; // the cluster's own namespaces, checked apart
    out.push(`host mount ${m}: new`);
  }
  return out;
}
