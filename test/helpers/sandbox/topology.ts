// Where things are: the names, addresses and kernel objects of one sandbox
// (child cgroup, bpffs root, network namespaces and the veth between them),
// what listens in the backend namespace, how each is removed again, and the
// sweep that removes what crashed runs left behind.
//
//   child cgroup  <cgroup2>/lbctl-test-<run>      the agent attaches here; only test clients join it
//   bpf root      /sys/fs/bpf/lbctl-test-<run>     pinned maps and links
//   client netns  lbctl-test-<run>-c  veth lbc0  10.244.0.1/16  fd00:244::1/64, no default route
//   backend netns lbctl-test-<run>-b  veth lbb0  backend i: 10.244.1.i, fd00:244::1:i
//                                                 dns j:     10.244.2.j
//
// Every name starts with the run's id, lbctl-test-<pid>-<random>: the sweep
// tells a crashed run's leftovers by the <pid> being dead, and anything new
// (a second node's netns and bpf root, an external client's netns) must be
// named `${runId}-<suffix>` to be swept the same way.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync, rmdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BACKEND_PY, CLI_TIMEOUT_MS, cmdline, killPid, LBCTL, pidAlive, recordedPids, run, sleep, sleepSync, SLOW, type Servers } from './run.js';

export const PREFIX = 'lbctl-test-';
export const BPFFS = '/sys/fs/bpf';
const NETNS_DIR = '/run/netns';

export const HTTP_PORT = 8080;
export const UDP_PORT = 9000;
export const DNS_PORT = 53;
export const DNS_NAME = 'svc.test';
export const DNS_ANSWER = '1.2.3.4';
export const CLIENT_V4 = '10.244.0.1';
export const CLIENT_V6 = 'fd00:244::1';

export interface BackendAddrs {
  readonly v4: string;
  readonly v6: string;
}

export const backendAddrs = (n: number): BackendAddrs[] =>
  Array.from({ length: n }, (_, i) => ({ v4: `10.244.1.${i + 1}`, v6: `fd00:244::1:${i + 1}` }));
export const dnsAddrs = (n: number): string[] => Array.from({ length: n }, (_, j) => `10.244.2.${j + 1}`);

function mounts(): string[][] {
  return readFileSync('/proc/mounts', 'utf8').trim().split('\n').map((l) => l.split(' '));
}

/** The cgroup v2 mount (/sys/fs/cgroup/unified on hybrid hosts, /sys/fs/cgroup elsewhere). */
export function cgroup2Mount(): string {
  const m = mounts().find((l) => l[2] === 'cgroup2');
  if (!m?.[1]) throw new Error('no cgroup2 mount in /proc/mounts');
  return m[1];
}

export function ensureBpffs(): void {
  if (mounts().some((l) => l[1] === BPFFS && l[2] === 'bpf')) return;
  execFileSync('mount', ['-t', 'bpf', 'bpf', BPFFS]);
}

export function ip(...args: string[]): string {
  return execFileSync('ip', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

function cgroupPids(cg: string): number[] {
  try {
    return readFileSync(path.join(cg, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/**
 * Kills what is left in a test cgroup (only our clients ever join one) and
 * removes it, retrying while the killed processes leave it (2.5 s, scaled).
 */
export function removeCgroup(cg: string): void {
  if (!existsSync(cg)) return;
  const tries = Math.ceil(50 * SLOW);
  for (let i = 0; i < tries; i++) {
    const pids = cgroupPids(cg);
    for (const pid of pids) killPid(pid);
    try {
      rmdirSync(cg);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
      if (i === tries - 1) throw err;
    }
    sleepSync(50);
  }
}

export function removeBpfRoot(dir: string): void {
  if (!existsSync(dir)) return;
  execFileSync(LBCTL, ['cleanup', '--bpf-root', dir], { stdio: ['ignore', 'ignore', 'pipe'], timeout: CLI_TIMEOUT_MS });
}

export function removeNetns(name: string): void {
  if (existsSync(path.join(NETNS_DIR, name))) ip('netns', 'del', name);
}

function runOwnerAlive(name: string): boolean {
  const m = /^lbctl-test-(\d+)-/.exec(name);
  return m ? pidAlive(Number(m[1])) : true;
}

/** Removes everything earlier runs left behind (their owning test process is dead). */
export function sweepLeftovers(): string[] {
  const removed: string[] = [];
  const stale = (names: string[]): string[] => names.filter((n) => n.startsWith(PREFIX) && !runOwnerAlive(n));
  const list = (dir: string): string[] => (existsSync(dir) ? readdirSync(dir) : []);
  for (const name of stale(list(os.tmpdir()))) {
    const runDir = path.join(os.tmpdir(), name);
    for (const pid of recordedPids(runDir)) if (cmdline(pid).includes(name)) killPid(pid);
    rmSync(runDir, { recursive: true, force: true });
    removed.push(runDir);
  }
  const cg = cgroup2Mount();
  for (const name of stale(list(cg))) {
    removeCgroup(path.join(cg, name));
    removed.push(path.join(cg, name));
  }
  for (const name of stale(list(BPFFS))) {
    removeBpfRoot(path.join(BPFFS, name));
    removed.push(path.join(BPFFS, name));
  }
  for (const name of stale(list(NETNS_DIR))) {
    removeNetns(name);
    removed.push(`netns ${name}`);
  }
  return removed;
}

/**
 * The client and backend namespaces and the veth pair between them. The
 * client side gets no default route, so a packet that escaped translation
 * dies there.
 */
export function makeNetworks(clientNs: string, backendNs: string, backends: readonly BackendAddrs[], dnsBackends: readonly string[]): void {
  const c = clientNs;
  const b = backendNs;
  ip('netns', 'add', c);
  ip('netns', 'add', b);
  ip('link', 'add', 'lbc0', 'netns', c, 'type', 'veth', 'peer', 'name', 'lbb0', 'netns', b);
  const inNs = (ns: string, ...args: string[]): string => ip('-n', ns, ...args);
  inNs(c, 'addr', 'add', `${CLIENT_V4}/16`, 'dev', 'lbc0');
  inNs(c, 'addr', 'add', `${CLIENT_V6}/64`, 'dev', 'lbc0', 'nodad');
  for (const be of backends) {
    inNs(b, 'addr', 'add', `${be.v4}/16`, 'dev', 'lbb0');
    inNs(b, 'addr', 'add', `${be.v6}/64`, 'dev', 'lbb0', 'nodad');
  }
  for (const a of dnsBackends) inNs(b, 'addr', 'add', `${a}/16`, 'dev', 'lbb0');
  for (const ns of [c, b]) {
    inNs(ns, 'link', 'set', 'lo', 'up');
    inNs(ns, 'link', 'set', ns === c ? 'lbc0' : 'lbb0', 'up');
  }
  steerFlows(c, 'lbc0');
  steerFlows(b, 'lbb0');
}

/** The online CPUs as an rps_cpus mask: hex, comma-separated in 32-bit groups ("0-2,4" -> "17"). */
export function onlineCpuMask(online = readFileSync('/sys/devices/system/cpu/online', 'utf8')): string {
  let mask = 0n;
  for (const part of online.trim().split(',')) {
    const [lo, hi = lo] = part.split('-').map(Number) as [number, number?];
    for (let cpu = lo; cpu <= hi!; cpu++) mask |= 1n << BigInt(cpu);
  }
  const hex = mask.toString(16);
  const groups: string[] = [];
  for (let end = hex.length; end > 0; end -= 8) groups.unshift(hex.slice(Math.max(0, end - 8), end));
  return groups.join(',');
}

/**
 * Receive packet steering on a veth's receive queues, so every packet of one
 * flow is processed on one CPU, in order, as a NIC's RSS does. A veth
 * otherwise hands each packet to the stack on the CPU that sent it: the
 * client's handshake ACK (sent from softirq, possibly deferred to ksoftirqd)
 * and its request (sent by the client thread on another CPU) are then
 * received concurrently, and kernels without "inet: Avoid ehash lookup race
 * in inet_ehash_insert()" (upstream 1532ed0d0753, 2025; the 5.10 guest
 * lacks it) can miss both the request socket and the new socket while one
 * replaces the other: the request reaches the listener, which answers with a
 * RST, and the client's recv() fails with ECONNRESET although lbctl
 * translated the connection correctly (a rare flake in the emulated guest,
 * restart-load.ts). The sockets, hooks and addresses are unchanged: only
 * which CPU processes a received packet.
 */
export function steerFlows(ns: string, dev: string): void {
  const mask = onlineCpuMask();
  execFileSync('ip', ['netns', 'exec', ns, 'sh', '-c', `for q in /sys/class/net/${dev}/queues/rx-*; do echo ${mask} > "$q/rps_cpus"; done`], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
}

/** The rps_cpus masks of a veth's receive queues in a namespace, as the kernel prints them ("0" or "00000000,00000000" where unset). */
export function rpsMasks(ns: string, dev: string): string[] {
  const out = execFileSync('ip', ['netns', 'exec', ns, 'sh', '-c', `cat /sys/class/net/${dev}/queues/rx-*/rps_cpus`], { encoding: 'utf8' });
  return out.trim().split('\n');
}

/** backend.py in the backend netns: HTTP (TCP 8080) and UDP echo (9000) on every backend address; resolves once it listens. */
export async function startBackendServers(servers: Servers, backendNs: string, python: string, tag: string, backends: readonly BackendAddrs[], extra: readonly string[] = []): Promise<void> {
  if (backends.length === 0) return;
  const args = [python, BACKEND_PY, '--tag', tag, ...extra];
  for (const be of backends) {
    args.push('--http', `${be.v4}:${HTTP_PORT}`, '--http', `[${be.v6}]:${HTTP_PORT}`);
    args.push('--udp', `${be.v4}:${UDP_PORT}`, '--udp', `[${be.v6}]:${UDP_PORT}`);
  }
  const proc = servers.spawn(backendNs, args);
  let stderr = '';
  proc.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`backend servers not ready in ${10 * SLOW} s: ${stderr}`)), 10_000 * SLOW);
    proc.stdout!.once('data', () => {
      clearTimeout(timer);
      resolve();
    });
    proc.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`backend servers exited (${code}): ${stderr}`));
    });
  });
}

/** One dnsmasq per address in the backend netns; resolves once each answers. */
export async function startDnsServers(servers: Servers, backendNs: string, runDir: string, dnsBackends: readonly string[]): Promise<void> {
  for (const [j, addr] of dnsBackends.entries()) {
    const proc = servers.spawn(backendNs, [
      'dnsmasq', '--keep-in-foreground', '--conf-file=/dev/null', '--no-resolv', '--no-hosts',
      '--bind-interfaces', `--listen-address=${addr}`, `--port=${DNS_PORT}`, '--user=root', '--group=root',
      `--address=/${DNS_NAME}/${DNS_ANSWER}`, `--address=/whoami.${DNS_NAME}/${addr}`,
      `--pid-file=${path.join(runDir, `dnsmasq-${j}.pid`)}`,
    ]);
    proc.stdout!.resume();
    proc.stderr!.resume();
  }
  for (const addr of dnsBackends) {
    const deadline = Date.now() + 15_000 * SLOW;
    for (;;) {
      const r = await run('ip', ['netns', 'exec', backendNs, 'dig', `@${addr}`, DNS_NAME, '+short', `+time=${Math.ceil(SLOW)}`, '+tries=1'], 5_000 * SLOW);
      if (r.stdout.trim() === DNS_ANSWER) break;
      if (Date.now() > deadline) throw new Error(`dnsmasq on ${addr} does not answer within ${15 * SLOW} s: ${r.stdout} ${r.stderr}`);
      await sleep(100);
    }
  }
}
