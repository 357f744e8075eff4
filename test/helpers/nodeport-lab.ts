// A small cluster of network namespaces for the tc datapath's end-to-end
// tests (issue 14), built beside a Sandbox (which owns the run id, cgroup,
// bpf root, run dir and teardown):
//
//   ext  (external client)  ext0 10.250.0.2/24 fd00:250::2/64; routes to the
//                            external and LB IPs via node 1 only, no default route
//   n1   (node 1: the agent) n1e 10.250.0.1 fd00:250::1  (to ext)
//                            n1b 10.251.0.1 fd00:251::1  (to node 2)
//                            n1p 10.252.1.1 fd00:252:1::1 (to pod 1)
//   p1   (pod on node 1)     eth0 10.252.1.2 fd00:252:1::2, default via n1
//   n2   (node 2, no agent)  n2a 10.251.0.2 fd00:251::2 (to node 1)
//                            n2p 10.252.2.1 fd00:252:2::1 (to pod 2)
//                            no route back to ext: only SNAT brings replies home
//   p2   (pod on node 2)     eth0 10.252.2.2 fd00:252:2::2, default via n2
//
// Every namespace is named `${runId}-<role>`, so a crashed run's sweep
// removes them, and the sandbox's teardown removes them in any case.
//
// Both pods also run a line echo on ECHO_PORT (backend.py --tcp-echo), for
// long-lived connections (client.py tcp-long, startLong()) kept open across
// restarts and changes. Every client run in the lab's namespaces is killed
// by its pid at teardown if it still runs.
//
// Every tc suite runs its scenarios once per attach mode (tcAttachModes():
// tcx and clsact where the kernel has tcx, clsact alone where it has not),
// as subtests named for the mode (perMode(), or perModeSideBySide() for
// suites that mostly wait on timers), the agent started with --tc-attach
// MODE; ourPrograms() checks, by the kernel's own answer, that exactly one
// program of ours runs on each hook, attached in that mode.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Test } from 'tap';
import { realKernel } from '../../src/datapath/features.js';
import { PROGRAMS, type AttachMode } from '../../src/datapath/nodeport.js';
import { isErrno, progInfoById } from '../../src/native/bpf.js';
import type { TcDirection } from '../../src/native/tc.js';
import { AgentSlot, type SyncReport } from './sandbox/agent.js';
import { startLoad, type LoadOptions, type LoadResult, type LoadRun } from './sandbox/load.js';
import { yamlDocs } from './manifests.js';
import { CLI_TIMEOUT_MS, CLIENT_PY, how, killPid, LBCTL, run, sleep, SLOW, type ExecResult } from './sandbox/run.js';
import { removeNetns } from './sandbox/topology.js';
import { createSandbox, type Sandbox } from './sandbox.js';

export const EXT = { v4: '10.250.0.2', v6: 'fd00:250::2' };
export const NODE1 = { v4: '10.250.0.1', v6: 'fd00:250::1' };
export const NODE1_TO_N2 = { v4: '10.251.0.1', v6: 'fd00:251::1' };
export const POD1 = { v4: '10.252.1.2', v6: 'fd00:252:1::2' };
export const POD2 = { v4: '10.252.2.2', v6: 'fd00:252:2::2' };
/** External and LoadBalancer IPs: routed by the client to node 1, held by nobody. */
export const EXTERNAL_IP = { v4: '10.250.9.1', v6: 'fd00:250:9::1' };
export const LB_IP = { v4: '10.250.9.2', v6: 'fd00:250:9::2' };
/** The pods' line echo (backend.py --tcp-echo), for long-lived connections. */
export const ECHO_PORT = 7000;

export interface Lab {
  readonly ext: string;
  readonly n1: string;
  readonly p1: string;
  readonly n2: string;
  readonly p2: string;
  /** The agent of node 1, in its namespace (nsenter), on its own cgroup and bpf root. */
  readonly agent: AgentSlot;
  /** A command in the external client's namespace. */
  inExt(cmd: readonly string[], timeoutMs?: number): Promise<ExecResult>;
  /** A command in a namespace of the lab. */
  inNs(ns: string, cmd: readonly string[], timeoutMs?: number): Promise<ExecResult>;
  /**
   * Writes a manifest into the watched directory (atomically) and waits for
   * the first sync node 1's agent finishes after it.
   */
  apply(name: string, text: string, timeoutMs?: number): Promise<SyncReport>;
  /** A steady load (client.py load) from the external client's namespace; stopped at teardown if the test does not. */
  startLoad(opts: LoadOptions): LoadRun;
  /** One long-lived TCP connection (client.py tcp-long) from a namespace of the lab (default: the external client). */
  startLong(host: string, port: number, opts?: LongOptions): LongRun;
  /** One connected UDP socket (client.py udp-long: a datagram every interval, one source port), from the external client. */
  startUdpLong(host: string, port: number, opts?: LongOptions): UdpLongRun;
  /** `lbctl cleanup` in node 1's namespace (where its tc attachments are), as an operator runs it. */
  cleanup(): Promise<ExecResult>;
  /**
   * Back to a node that never ran lbctl: the agent stopped (SIGTERM) if it
   * runs, then `lbctl cleanup`, which must succeed. Between the modes of a
   * suite, so each starts as a fresh install does.
   */
  reset(): Promise<void>;
}

/** What client.py udp-long saw: its sockets (one unless destroyed) and an event per datagram. */
export interface UdpLongResult {
  sockets: Array<{ n: number; peer: string; cookie: string }>;
  /** `server`: the backend that answered; `foreign`: the answer was not to this client's datagram. */
  events: Array<{ socket: number; server?: string; foreign?: string; phase?: string; error?: string; at: number }>;
}

export interface UdpLongRun {
  progress(): { sockets: UdpLongResult['sockets']; events: number; last: UdpLongResult['events'][number] | null } | undefined;
  stop(): Promise<UdpLongResult>;
}

export interface LongOptions {
  /** Seconds between requests (default 0.2). */
  readonly interval?: number;
  /** The client stops by itself after this long (default 120). */
  readonly maxSeconds?: number;
  /** The namespace it runs in (default: the external client's). */
  readonly ns?: string;
  /** tcp-long: the source port it connects from (default: the kernel's choice). */
  readonly sport?: number;
}

export interface LongResult {
  connected: boolean;
  /** The client's own address and the one it dialled. */
  local: string | null;
  peer: string | null;
  sent: number;
  ok: number;
  failed: number;
  failures: Array<{ n: number; phase: string; error: string; at: number }>;
  /** Replies per server address (the pod that answered). */
  servers: Record<string, number>;
  /** Replies per client address as the pod saw it (the client, or node 1's SNAT address and port). */
  seenAs: Record<string, number>;
  maxLatencyMs: number;
  /** "closed" (a FIN at the end), "connection lost" or "connect failed". */
  end: string | null;
}

export interface LongRun {
  progress(): (Omit<LongResult, 'maxLatencyMs'> & { at: number }) | undefined;
  /** Until `ok` requests more than now have been answered (the deadline scales with SLOW). */
  answered(more: number, what: string, timeoutMs?: number): Promise<void>;
  /** Closes the connection (a FIN) and returns what the client saw. */
  stop(): Promise<LongResult>;
}

export function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

function sysctl(ns: string, key: string, value: string): void {
  execFileSync('ip', ['netns', 'exec', ns, 'sysctl', '-qw', `${key}=${value}`], { stdio: ['ignore', 'ignore', 'pipe'] });
}

/** A veth pair between two namespaces, up, with addresses. */
export function wire(a: { ns: string; dev: string; v4: string; v6: string }, b: { ns: string; dev: string; v4: string; v6: string }, prefix4 = 24, prefix6 = 64): void {
  ip('link', 'add', a.dev, 'netns', a.ns, 'type', 'veth', 'peer', 'name', b.dev, 'netns', b.ns);
  for (const end of [a, b]) {
    ip('-n', end.ns, 'addr', 'add', `${end.v4}/${prefix4}`, 'dev', end.dev);
    ip('-n', end.ns, 'addr', 'add', `${end.v6}/${prefix6}`, 'dev', end.dev, 'nodad');
    ip('-n', end.ns, 'link', 'set', end.dev, 'up');
  }
}

/** Builds the lab; everything is removed at the sandbox's teardown. Servers: backend.py on both pods (HTTP 8080, UDP 9000 with the peer named). */
export async function makeLab(sb: Sandbox): Promise<Lab> {
  const ns = (role: string): string => `${sb.runId}-${role}`;
  const lab = { ext: ns('ext'), n1: ns('n1'), p1: ns('p1'), n2: ns('n2'), p2: ns('p2') };
  const all = Object.values(lab);
  // Clients first (by pid), then the namespaces.
  const clients = new Set<number>();
  const clientCleanups = new Set<() => void>();
  sb.addCleanup(() => {
    clientCleanups.forEach((fn) => fn());
    clients.forEach((pid) => killPid(pid));
  });
  sb.addCleanup(() => all.forEach(removeNetns));
  for (const n of all) {
    ip('netns', 'add', n);
    ip('-n', n, 'link', 'set', 'lo', 'up');
  }
  wire({ ns: lab.ext, dev: 'ext0', ...EXT }, { ns: lab.n1, dev: 'n1e', ...NODE1 });
  wire({ ns: lab.n1, dev: 'n1b', ...NODE1_TO_N2 }, { ns: lab.n2, dev: 'n2a', v4: '10.251.0.2', v6: 'fd00:251::2' });
  wire({ ns: lab.n1, dev: 'n1p', v4: '10.252.1.1', v6: 'fd00:252:1::1' }, { ns: lab.p1, dev: 'eth0', ...POD1 });
  wire({ ns: lab.n2, dev: 'n2p', v4: '10.252.2.1', v6: 'fd00:252:2::1' }, { ns: lab.p2, dev: 'eth0', ...POD2 });
  for (const n of [lab.n1, lab.n2]) {
    sysctl(n, 'net.ipv4.ip_forward', '1');
    sysctl(n, 'net.ipv6.conf.all.forwarding', '1');
    // Replies of SNATed flows come back to the node's own address from a
    // pod subnet it routes elsewhere: no reverse-path filtering.
    sysctl(n, 'net.ipv4.conf.all.rp_filter', '0');
    sysctl(n, 'net.ipv4.conf.default.rp_filter', '0');
  }
  ip('-n', lab.p1, 'route', 'add', 'default', 'via', '10.252.1.1');
  ip('-n', lab.p1, '-6', 'route', 'add', 'default', 'via', 'fd00:252:1::1');
  ip('-n', lab.p2, 'route', 'add', 'default', 'via', '10.252.2.1');
  ip('-n', lab.p2, '-6', 'route', 'add', 'default', 'via', 'fd00:252:2::1');
  ip('-n', lab.n1, 'route', 'add', '10.252.2.0/24', 'via', '10.251.0.2');
  ip('-n', lab.n1, '-6', 'route', 'add', 'fd00:252:2::/64', 'via', 'fd00:251::2');
  // the client reaches node 1's external and LB IPs through node 1, nothing else
  for (const a of [EXTERNAL_IP, LB_IP]) {
    ip('-n', lab.ext, 'route', 'add', `${a.v4}/32`, 'via', NODE1.v4);
    ip('-n', lab.ext, '-6', 'route', 'add', `${a.v6}/128`, 'via', NODE1.v6);
  }
  const servers = (p: { v4: string; v6: string }) => [{ v4: p.v4, v6: p.v6 }];
  const echo = (p: { v4: string; v6: string }) => ['--tcp-echo', `${p.v4}:${ECHO_PORT}`, '--tcp-echo', `[${p.v6}]:${ECHO_PORT}`];
  await sb.startBackendsIn(lab.p1, servers(POD1), ['--udp-peer', ...echo(POD1)]);
  await sb.startBackendsIn(lab.p2, servers(POD2), ['--udp-peer', ...echo(POD2)]);

  const agent = new AgentSlot({
    runDir: sb.runDir,
    cgroup: sb.cgroup,
    bpfRoot: sb.bpfRoot,
    apiSocket: path.join(sb.runDir, 'n1.sock'),
    sourceArgs: ['--source', `file:${sb.manifestDir}`],
    netns: lab.n1,
  });
  sb.addCleanup(() => agent.killNow());
  const inNs = (n: string, cmd: readonly string[], timeoutMs = 20_000): Promise<ExecResult> => run('ip', ['netns', 'exec', n, ...cmd], timeoutMs * SLOW, clients);
  const loadFromExt = (opts: LoadOptions): LoadRun =>
    startLoad(
      {
        runDir: sb.runDir,
        python: sb.python,
        // The load sets its own deadline (its run time plus a scaled grace).
        exec: (cmd, o) => run('ip', ['netns', 'exec', lab.ext, ...cmd], o.timeoutMs ?? 30_000 * SLOW, clients),
        cleanups: clientCleanups,
      },
      opts,
    );
  /** client.py's long-running `kind` in a namespace of the lab, told to stop by a file, reporting progress in another. */
  const startClient = <P, R>(kind: 'tcp-long' | 'udp-long', host: string, port: number, opts: LongOptions, interval: number) => {
    const id = Math.random().toString(16).slice(2, 8);
    const stopFile = path.join(sb.runDir, `long-${id}.stop`);
    const progressFile = path.join(sb.runDir, `long-${id}.progress`);
    const maxSeconds = opts.maxSeconds ?? 120;
    const args = [sb.python, CLIENT_PY, kind, host, String(port), '--interval', String(opts.interval ?? interval), '--seconds', String(maxSeconds), '--stop-file', stopFile, '--progress', progressFile,
      ...(opts.sport ? ['--sport', String(opts.sport)] : [])];
    const done = run('ip', ['netns', 'exec', opts.ns ?? lab.ext, ...args], (maxSeconds + 30 * SLOW) * 1000, clients);
    const cleanup = (): void => {
      if (existsSync(sb.runDir)) writeFileSync(stopFile, '');
    };
    clientCleanups.add(cleanup);
    const progress = (): P | undefined => {
      try {
        return JSON.parse(readFileSync(progressFile, 'utf8')) as P;
      } catch {
        return undefined;
      }
    };
    const stop = async (): Promise<R> => {
      cleanup();
      const r = await done;
      clientCleanups.delete(cleanup);
      if (r.code !== 0) throw new Error(`client.py ${kind} failed (${r.code ?? r.signal}): ${r.stderr}`);
      return JSON.parse(r.stdout) as R;
    };
    return { progress, stop };
  };
  const startLong = (host: string, port: number, opts: LongOptions = {}): LongRun => {
    const { progress, stop } = startClient<NonNullable<ReturnType<LongRun['progress']>>, LongResult>('tcp-long', host, port, opts, 0.2);
    return {
      progress,
      answered: async (more, what, timeoutMs = 15_000) => {
        const from = progress()?.ok ?? 0;
        const deadline = Date.now() + timeoutMs * SLOW;
        for (;;) {
          const p = progress();
          if (p && p.ok >= from + more) return;
          if (p?.end) throw new Error(`long connection to ${host}:${port} ended (${p.end}) before ${what}: ${JSON.stringify(p)}`);
          if (Date.now() > deadline) throw new Error(`long connection to ${host}:${port}: timed out waiting for ${what}; progress ${JSON.stringify(p)}`);
          await sleep(50);
        }
      },
      stop,
    };
  };
  const startUdpLong = (host: string, port: number, opts: LongOptions = {}): UdpLongRun =>
    startClient<NonNullable<ReturnType<UdpLongRun['progress']>>, UdpLongResult>('udp-long', host, port, opts, 0.1);
  const apply = async (name: string, text: string, timeoutMs = 15_000): Promise<SyncReport> => {
    const proc = agent.requireAgent();
    const mark = proc.logs.length;
    sb.writeManifest(name, text);
    return (await proc.waitForLog((l) => l.msg === 'sync done', mark, timeoutMs)) as SyncReport;
  };
  const cleanup = (): Promise<ExecResult> => run('nsenter', [`--net=/run/netns/${lab.n1}`, LBCTL, 'cleanup', '--bpf-root', sb.bpfRoot], CLI_TIMEOUT_MS);
  const reset = async (): Promise<void> => {
    await agent.stop(10_000);
    const r = await cleanup();
    if (r.code !== 0) throw new Error(`lbctl cleanup in ${lab.n1} failed ${how(r)}: ${r.stderr}${r.stdout}`);
  };
  return { ...lab, agent, inNs, inExt: (cmd, timeoutMs) => inNs(lab.ext, cmd, timeoutMs), apply, startLoad: loadFromExt, startLong, startUdpLong, cleanup, reset };
}

/**
 * The accelerated modes' three services (nodeport-xdp.ts, nodeport-dsr.ts),
 * dual-stack: `web` on both pods, `remote` (TCP and UDP) on the pod on node
 * 2 only, `local` on the pod on node 1 only; the pods serve HTTP and UDP on
 * LAB_PORTS.http and .udp.
 */
export const LAB_PORTS = { http: 8080, udp: 9000, web: 30080, remote: 30081, local: 30082, remoteUdp: 30091 } as const;

export function webRemoteLocal(): string {
  const p = LAB_PORTS;
  const both = { 4: [endpoint(1, 4), endpoint(2, 4)], 6: [endpoint(1, 6), endpoint(2, 6)] };
  return yamlDocs([
    ...northSouth({ name: 'web', clusterIPs: ['10.96.0.10', 'fd00:96::10'], ports: [{ name: 'http', port: 80, targetPort: p.http, nodePort: p.web }] }, both),
    ...northSouth(
      {
        name: 'remote',
        clusterIPs: ['10.96.0.11', 'fd00:96::11'],
        ports: [
          { name: 'http', port: 80, targetPort: p.http, nodePort: p.remote },
          { name: 'udp', port: 53, targetPort: p.udp, nodePort: p.remoteUdp, protocol: 'UDP' },
        ],
      },
      { 4: [endpoint(2, 4)], 6: [endpoint(2, 6)] },
    ),
    ...northSouth({ name: 'local', clusterIPs: ['10.96.0.12', 'fd00:96::12'], ports: [{ name: 'http', port: 80, targetPort: p.http, nodePort: p.local }] }, { 4: [endpoint(1, 4)], 6: [endpoint(1, 6)] }),
  ]);
}

/** `n` requests to `host:port` from the client, each a new connection: every one answered by `pod`, which saw the client as `seenAs`. */
export async function requestsAnsweredBy(t: Test, lab: Lab, host: string, port: number, pod: string, seenAs: string, n: number, what: string): Promise<void> {
  const got: Array<{ server: string; client: string; error: string }> = [];
  for (let i = 0; i < n; i++) got.push(await extGet(lab, host, port));
  const wrong = got.filter((g) => g.error || !hostOf(g.server).startsWith(pod) || hostOf(g.client) !== seenAs);
  t.same(wrong, [], `${what}: ${n} requests to ${host}:${port} answered by ${pod}, which saw the client as ${seenAs}`);
}

/** A steady load's result: not one connection failed, every attempt completed, every target served. */
export function checkNoFailedLoad(t: Test, r: LoadResult, what: string): void {
  t.comment(`${what}: ${r.attempted} connections over ${r.seconds} s, ${r.failed} failed; max latency ${r.maxLatencyMs} ms`);
  t.same(r.failures, [], `${what}: no connection failed`);
  t.equal(r.failed, 0, `${what}: zero failed out of ${r.attempted}`);
  t.equal(r.attempted, r.issued, `${what}: every attempt completed`);
  for (const [target, s] of Object.entries(r.targets)) t.ok(s.ok > 0 && Object.keys(s.backends).length > 0, `${target}: served (${JSON.stringify(s.backends)})`);
}

/** How much counter `k` grew from `a` to `b`. */
export const counterDelta = (a: Record<string, number>, b: Record<string, number>, k: string): number => (b[k] ?? 0) - (a[k] ?? 0);

/**
 * What a lab of veths needs for XDP that a NIC does not: frames XDP sends
 * out of a veth reach its peer only with NAPI on there (an XDP program:
 * bpf/tests/xdp_pass.c on ext0 and n2a), and a frame reaches XDP with the
 * whole checksum a wire frame has only if its sender does not leave it to
 * offload (ethtool tx off on ext0 and on the remote pod's eth0).
 */
export function wireForXdp(lab: Lab): void {
  const xdpPass = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../bpf/.output/tests/xdp_pass.bpf.o');
  for (const [ns, dev] of [[lab.ext, 'ext0'], [lab.n2, 'n2a']] as const) ip('-n', ns, 'link', 'set', 'dev', dev, 'xdpdrv', 'obj', xdpPass, 'sec', 'xdp');
  for (const [ns, dev] of [[lab.ext, 'ext0'], [lab.p2, 'eth0']] as const) execFileSync('ip', ['netns', 'exec', ns, 'ethtool', '-K', dev, 'tx', 'off'], { stdio: 'ignore' });
}

/** The XDP program on a device, as the kernel reports it (ip -j link: xdp.mode 1 is in the driver). */
export function xdpProgram(ns: string, dev: string): { mode: number; id: number; name: string } | undefined {
  const out = JSON.parse(execFileSync('ip', ['-j', '-d', '-n', ns, 'link', 'show', 'dev', dev], { encoding: 'utf8' })) as Array<{ xdp?: { mode: number; prog?: { id?: number; name?: string } } }>;
  const x = out[0]?.xdp;
  return x ? { mode: x.mode, id: x.prog?.id ?? 0, name: x.prog?.name ?? '' } : undefined;
}

/**
 * An overlay: a VXLAN between the nodes over their link (vx1 on node 1,
 * 10.253.0.1 fd00:253::1; vx2 on node 2, .2 and ::2), and node 1's routes to
 * node 2's pods through it only. Its MTU is 1450 (the link's less 50 bytes).
 */
export function addVxlan(lab: Lab): void {
  for (const [ns, me, peer, dev, self6] of [[lab.n1, '10.251.0.1', '10.251.0.2', 'vx1', 'fd00:253::1'], [lab.n2, '10.251.0.2', '10.251.0.1', 'vx2', 'fd00:253::2']] as const) {
    ip('-n', ns, 'link', 'add', dev, 'type', 'vxlan', 'id', '42', 'local', me, 'remote', peer, 'dstport', '4789', 'dev', ns === lab.n1 ? 'n1b' : 'n2a');
    ip('-n', ns, 'addr', 'add', `10.253.0.${ns === lab.n1 ? 1 : 2}/24`, 'dev', dev);
    ip('-n', ns, '-6', 'addr', 'add', `${self6}/64`, 'dev', dev, 'nodad');
    ip('-n', ns, 'link', 'set', dev, 'up');
  }
  ip('-n', lab.n1, 'route', 'replace', '10.252.2.0/24', 'via', '10.253.0.2', 'dev', 'vx1');
  ip('-n', lab.n1, '-6', 'route', 'replace', 'fd00:252:2::/64', 'via', 'fd00:253::2', 'dev', 'vx1');
}

/** A 2 MB upload (HTTP POST) from the external client: curl's exit code and what the pod says it received. */
export async function extUpload(sb: Sandbox, lab: Lab, host: string, port: number): Promise<{ code: number; received: number; error: string }> {
  const file = path.join(sb.runDir, 'upload.bin');
  writeFileSync(file, Buffer.alloc(2 << 20, 0x61));
  const url = host.includes(':') ? `http://[${host}]:${port}/upload` : `http://${host}:${port}/upload`;
  const r = await lab.inExt(['curl', '-sS', '-H', 'Expect:', '--data-binary', `@${file}`, '--max-time', String(20 * SLOW), url], 30_000);
  return { code: r.code ?? -1, received: Number(r.stdout.trim().split(/\s+/)[0] ?? 0), error: r.stderr.trim() };
}

/** The path MTU the client's route cache learned towards `dst`, or 0. */
export async function extLearnedMtu(lab: Lab, dst: string): Promise<number> {
  const r = await lab.inExt(['ip', ...(dst.includes(':') ? ['-6'] : []), 'route', 'get', dst]);
  return Number(/\bmtu (\d+)/.exec(r.stdout)?.[1] ?? 0);
}

/** The client's second wire, straight to node 2 (DSR: node 2 answers the client itself). */
export const EXT1 = { v4: '10.250.1.2', v6: 'fd00:250:1::2' };
export const N2E = { v4: '10.250.1.1', v6: 'fd00:250:1::1' };

/** Node 2's agent (its own cgroup and bpf root, removed at teardown), and the client's direct wire to node 2. */
export function addNode2(sb: Sandbox, lab: Lab): AgentSlot {
  // Its cleanup (kill, bpf root, cgroup) joins the sandbox's, in the order the old inline one had.
  const node2 = sb.extraAgent('n2', lab.n2).slot;
  ip('link', 'add', 'ext1', 'netns', lab.ext, 'type', 'veth', 'peer', 'name', 'n2e', 'netns', lab.n2);
  for (const [ns, dev, a] of [[lab.ext, 'ext1', EXT1], [lab.n2, 'n2e', N2E]] as const) {
    ip('-n', ns, 'addr', 'add', `${a.v4}/24`, 'dev', dev);
    ip('-n', ns, 'addr', 'add', `${a.v6}/64`, 'dev', dev, 'nodad');
    ip('-n', ns, 'link', 'set', dev, 'up');
  }
  // Node 2 answers the client directly; the client takes a reply from node 1's address on ext1.
  ip('-n', lab.n2, 'route', 'add', `${EXT.v4}/32`, 'via', EXT1.v4);
  ip('-n', lab.n2, '-6', 'route', 'add', `${EXT.v6}/128`, 'via', EXT1.v6);
  for (const [ns, devs] of [[lab.ext, ['all', 'default', 'ext0', 'ext1']], [lab.n2, ['all', 'default', 'n2a', 'n2e']]] as const) {
    for (const d of devs) ip('netns', 'exec', ns, 'sysctl', '-qw', `net.ipv4.conf.${d}.rp_filter=0`);
  }
  return node2;
}

let modes: Promise<AttachMode[]> | undefined;

/**
 * The tc attach modes every tc suite runs in, in this order: tcx and clsact
 * where the kernel has tcx (the host), clsact alone where it has not (the
 * 5.10 and 6.1 guests). Asked of the kernel as the agent's probe asks it: a
 * tcx link to a device that does not exist, ENODEV where tcx is known.
 */
export function tcAttachModes(): Promise<AttachMode[]> {
  modes ??= realKernel().tcxLink().then(
    () => ['clsact'],
    (err: unknown) => (isErrno(err, 'ENODEV') ? ['tcx', 'clsact'] : ['clsact']),
  );
  return modes;
}

/**
 * `scenario` once per attach mode, as subtests named for it, on one lab:
 * between modes lab.reset() stops the agent and cleans up, so each mode
 * starts from nothing. The scenario starts the agent with --tc-attach MODE.
 */
export async function perMode(t: Test, lab: Lab, scenario: (t: Test, mode: AttachMode) => Promise<void>): Promise<void> {
  for (const [i, mode] of (await tcAttachModes()).entries()) {
    if (i > 0) await lab.reset();
    await t.test(`--tc-attach ${mode}`, (t) => scenario(t, mode));
  }
}

/**
 * `body` once per attach mode, as subtests named for it, side by side: for
 * tests that build a lab of their own (body starts the agent with
 * --tc-attach MODE) and spend their time waiting for timers or flows, where
 * running the modes one after the other would double the wait and running
 * them at once costs little.
 */
export async function eachMode(t: Test, body: (t: Test, mode: AttachMode) => Promise<void>): Promise<void> {
  const all = await tcAttachModes();
  await t.test('every attach mode, side by side', { jobs: all.length }, async (t) => {
    for (const mode of all) void t.test(`--tc-attach ${mode}`, (t) => body(t, mode));
  });
}

/** `scenario` once per attach mode (eachMode), each in a sandbox and lab of its own. */
export function perModeSideBySide(t: Test, scenario: (t: Test, sb: Sandbox, lab: Lab, mode: AttachMode) => Promise<void>): Promise<void> {
  return eachMode(t, async (t, mode) => {
    const sb = await createSandbox(t, { backends: 0, agent: false });
    await scenario(t, sb, await makeLab(sb), mode);
  });
}

/** A tc program on a hook: how it is attached, and the program by the kernel's id, BTF function name and tag. */
export interface HookProgram {
  readonly mode: AttachMode;
  readonly id: number;
  /** The BTF function name (whole), or the kernel's 15 characters for a program without BTF. */
  readonly name: string;
  readonly tag: string;
}

export type HookPrograms = Record<string, Record<TcDirection, HookProgram[]>>;

/**
 * Every tc program on the ingress and egress hooks of `devices` in namespace
 * `ns`, by the kernel's answer: tcx programs (BPF_PROG_QUERY) and cls_bpf
 * filters at any handle (`tc -j filter show`).
 */
export async function hookPrograms(lab: Lab, ns: string, devices: readonly string[]): Promise<HookPrograms> {
  const tcx = await tcxPrograms(lab, ns, devices);
  const describe = (mode: AttachMode, id: number): HookProgram => {
    const info = progInfoById(id);
    return { mode, id, name: info?.funcName ?? info?.name ?? `#${id}?`, tag: info?.tag ?? '' };
  };
  const out: HookPrograms = {};
  for (const dev of devices) {
    out[dev] = { ingress: [], egress: [] };
    for (const dir of ['ingress', 'egress'] as const) {
      const ids = tcx[dev]?.[dir];
      if (Array.isArray(ids)) out[dev][dir].push(...ids.map((id) => describe('tcx', id)));
      const r = await lab.inNs(ns, ['tc', '-j', 'filter', 'show', 'dev', dev, dir]);
      // No clsact qdisc on the device: no filter.
      const filters = r.code === 0 && r.stdout.trim() ? (JSON.parse(r.stdout) as Array<{ kind?: string; options?: { prog?: { id: number } } }>) : [];
      for (const f of filters) if (f.kind === 'bpf' && f.options?.prog) out[dev][dir].push(describe('clsact', f.options.prog.id));
    }
  }
  return out;
}

const OURS: ReadonlySet<string> = new Set(Object.values(PROGRAMS));

/**
 * Checks that each hook of `devices` in node 1 runs exactly one program of
 * ours (by BTF function name), the direction's, attached in `mode`, and
 * returns them by "device/direction".
 */
export async function ourPrograms(t: Test, lab: Lab, devices: readonly string[], mode: AttachMode, what: string): Promise<Record<string, HookProgram>> {
  const hooks = await hookPrograms(lab, lab.n1, devices);
  const found: Record<string, HookProgram> = {};
  const wrong: string[] = [];
  for (const dev of devices) {
    for (const dir of ['ingress', 'egress'] as const) {
      const ours = hooks[dev]![dir].filter((p) => OURS.has(p.name));
      if (ours.length === 1 && ours[0]!.mode === mode && ours[0]!.name === PROGRAMS[dir]) found[`${dev}/${dir}`] = ours[0]!;
      else wrong.push(`${dev}/${dir}: ${JSON.stringify(ours)}`);
    }
  }
  t.same(wrong, [], `${what}: one program of ours on each hook of ${devices.join(', ')}, attached with ${mode}`);
  return found;
}

/** curl from the external client: the body (the backend's own address) and the X-Client header (the address it saw). */
export async function extGet(lab: Lab, host: string, port: number, timeoutS = 3): Promise<{ ok: boolean; server: string; client: string; error: string }> {
  const url = host.includes(':') ? `http://[${host}]:${port}/` : `http://${host}:${port}/`;
  const r = await lab.inExt(['curl', '-sS', '-D', '-', '--max-time', String(timeoutS * SLOW), url], (timeoutS + 5) * 1000);
  if (r.code !== 0) return { ok: false, server: '', client: '', error: r.stderr.trim() };
  const client = /^x-client:\s*(\S+)/im.exec(r.stdout)?.[1] ?? '';
  const server = r.stdout.split(/\r?\n\r?\n/)[1]?.trim() ?? '';
  return { ok: true, server, client, error: '' };
}

/** A pod of the lab as an endpoint: its address of one family and its node. */
export interface LabEndpoint {
  readonly address: string;
  readonly node: 'node1' | 'node2';
  readonly ready?: boolean;
  /** Terminating (its pod is being deleted) but still serving: not ready, kept for established flows. */
  readonly terminating?: boolean;
}

export const endpoint = (pod: 1 | 2, family: 4 | 6 = 4): LabEndpoint => {
  const p = pod === 1 ? POD1 : POD2;
  return { address: family === 4 ? p.v4 : p.v6, node: pod === 1 ? 'node1' : 'node2' };
};

export interface NorthSouthSpec {
  readonly name: string;
  readonly type?: 'NodePort' | 'LoadBalancer';
  /** One address per family (the first is spec.clusterIP). */
  readonly clusterIPs: readonly string[];
  /** name, service port, target port, nodePort (TCP unless said). */
  readonly ports: ReadonlyArray<{ name: string; port: number; targetPort: number; nodePort: number; protocol?: 'TCP' | 'UDP' | 'SCTP' }>;
  readonly externalTrafficPolicy?: 'Cluster' | 'Local';
  readonly healthCheckNodePort?: number;
  readonly loadBalancerSourceRanges?: readonly string[];
  /** status.loadBalancer.ingress IPs. */
  readonly ingress?: readonly string[];
}

/** A NodePort or LoadBalancer Service and one EndpointSlice per family, as manifest objects. */
export function northSouth(spec: NorthSouthSpec, endpoints: Readonly<Partial<Record<4 | 6, readonly LabEndpoint[]>>>): object[] {
  const families = spec.clusterIPs.map((a) => (a.includes(':') ? 'IPv6' : 'IPv4'));
  const svc = {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: spec.name, namespace: 'default' },
    spec: {
      type: spec.type ?? 'NodePort',
      clusterIP: spec.clusterIPs[0],
      clusterIPs: [...spec.clusterIPs],
      ipFamilies: families,
      ipFamilyPolicy: families.length > 1 ? 'RequireDualStack' : 'SingleStack',
      ports: spec.ports.map((p) => ({ name: p.name, port: p.port, targetPort: p.targetPort, nodePort: p.nodePort, protocol: p.protocol ?? 'TCP' })),
      ...(spec.externalTrafficPolicy ? { externalTrafficPolicy: spec.externalTrafficPolicy } : {}),
      ...(spec.healthCheckNodePort !== undefined ? { healthCheckNodePort: spec.healthCheckNodePort } : {}),
      ...(spec.loadBalancerSourceRanges ? { loadBalancerSourceRanges: [...spec.loadBalancerSourceRanges] } : {}),
    },
    ...(spec.ingress ? { status: { loadBalancer: { ingress: spec.ingress.map((ip) => ({ ip })) } } } : {}),
  };
  const slices = ([4, 6] as const)
    .filter((f) => endpoints[f] !== undefined)
    .map((f) => ({
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: { name: `${spec.name}-v${f}`, namespace: 'default', labels: { 'kubernetes.io/service-name': spec.name } },
      addressType: f === 4 ? 'IPv4' : 'IPv6',
      ports: spec.ports.map((p) => ({ name: p.name, port: p.targetPort, protocol: p.protocol ?? 'TCP' })),
      endpoints: endpoints[f]!.map((e) => ({
        addresses: [e.address],
        conditions: e.terminating ? { ready: false, serving: true, terminating: true } : { ready: e.ready ?? true },
        nodeName: e.node,
      })),
    }));
  return [svc, ...slices];
}

/** The address part of "ADDR:PORT" or "[ADDR]:PORT". */
export const hostOf = (hostport: string): string => hostport.replace(/^\[?([^\]]+?)\]?:\d+$/, '$1');
/** The port part of "ADDR:PORT" or "[ADDR]:PORT". */
export const portOf = (hostport: string): number => Number(/:(\d+)$/.exec(hostport)?.[1]);

// BPF_PROG_QUERY on a device's tcx hooks (BPF_TCX_INGRESS 46, BPF_TCX_EGRESS
// 47): the programs attached there, by id. bpftool before 7.3 (Debian
// bookworm's 7.1) does not list tcx attachments in `bpftool net show`, so
// this asks the kernel directly; run inside the device's namespace.
const TCX_QUERY_PY = `
import ctypes, errno, json, platform, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
SYS_BPF = {"x86_64": 321, "aarch64": 280}[platform.machine()]
out = {}
for dev in sys.argv[1:]:
    try:
        idx = socket.if_nametoindex(dev)
    except OSError:
        out[dev] = {"error": "ENODEV"}
        continue
    res = {"ifindex": idx}
    for name, attach_type in (("ingress", 46), ("egress", 47)):
        ids = (ctypes.c_uint32 * 64)()
        attr = (ctypes.c_uint8 * 64)()
        struct.pack_into("<IIIIQI", attr, 0, idx, attach_type, 0, 0, ctypes.addressof(ids), 64)
        if libc.syscall(ctypes.c_long(SYS_BPF), ctypes.c_int(16), attr, ctypes.c_uint(64)) != 0:
            res[name] = errno.errorcode.get(ctypes.get_errno(), "?")
            continue
        res[name] = list(ids[: struct.unpack_from("<I", attr, 24)[0]])
    out[dev] = res
print(json.dumps(out))
`;

export interface TcxHooks {
  ifindex?: number;
  /** Program ids at the hook, or the errno name of a failed query (EINVAL: a kernel without tcx). */
  ingress?: number[] | string;
  egress?: number[] | string;
  error?: string;
}

/** The programs on the tcx hooks of `devices` in namespace `ns`, by the kernel's own answer. */
export async function tcxPrograms(lab: Lab, ns: string, devices: readonly string[]): Promise<Record<string, TcxHooks>> {
  const r = await lab.inNs(ns, ['python3', '-c', TCX_QUERY_PY, ...devices]);
  if (r.code !== 0) throw new Error(`tcx query in ${ns} failed (${r.code ?? r.signal}): ${r.stderr}`);
  return JSON.parse(r.stdout) as Record<string, TcxHooks>;
}
