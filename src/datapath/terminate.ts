// Stale connected UDP sockets. A UDP socket connect()ed to a service is
// balanced once: cgroup/connect4/6 rewrote its destination, so it stays
// connected to that backend for its whole life. When the backend leaves the
// service, the socket keeps sending into the void (a DNS resolver's socket,
// say). After a sync removes UDP backends, the agent destroys (in the
// background, see below) exactly the sockets that are UDP, connected, connected to one of those backends, and
// were sent there by lbctl (their socket rev-NAT entry {cookie, backend}
// exists). The application's next recv()/send() fails with ECONNABORTED,
// and the socket it opens next is balanced afresh.
//
// Mechanisms, picked once when the agent starts (detect()):
//   bpf-sock-destroy  Linux 6.5+: the iter/udp program of sock_destroy.bpf.o
//                     filters in the kernel and calls the bpf_sock_destroy
//                     kfunc. Its own object: libbpf refuses a whole object
//                     whose kfunc the kernel lacks.
//   inet-diag         older kernels with CONFIG_INET_DIAG_DESTROY (Debian's
//                     6.1 has it): dump the connected UDP sockets over
//                     NETLINK_SOCK_DIAG, apply the same filter here, and
//                     SOCK_DESTROY each match by its exact id and cookie.
//   none              neither: nothing is destroyed, and the agent says so.
// LBCTL_UDP_DESTROY=auto|bpf-sock-destroy|inet-diag|none overrides the
// choice (tests use it to run the fallback on a kernel that has both).
//
// Network namespaces: a socket iterator (and a sock_diag socket) sees only
// the namespace it was created in, and clients live in many (pods). The ones
// searched are those of the processes in the attached cgroup and below, the
// only processes whose sockets lbctl balances, deduplicated by namespace
// inode. Each is entered by a short-lived native thread (setns is per
// thread), never by Node's own threads. The rev-NAT check keeps the filter
// exact whatever namespace is searched.
//
// Off the JavaScript thread, one step at a time: the cgroup walk reads
// /proc through fs/promises, and every iterator run, inet_diag dump and
// destroy is an addon Promise worker (libuv pool). Each step is awaited
// before the next, and terminations run one at a time in the background
// (TerminationQueue: backends removed meanwhile join the next run), so a
// termination holds at most one of libuv's pool threads (4 by default)
// and the agent's own fs work keeps the others. /livez, the API and
// further syncs run between the steps. Every run is bounded (processes
// read, namespaces searched, sockets examined, wall time); a bound that is
// hit leaves the rest undone, and the result's `limit` says which bound and
// what was left.
import { open, readdir, readFile, readlink, type FileHandle } from 'node:fs/promises';
import { constants } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ConfigError } from '../base/errors.js';
import { ipFromBytes, ipv4ToUint, ipv6Bytes } from '../lb/addr.js';
import { backendKey, type Family, type L3n4Addr } from '../lb/types.js';
import { BpfObject, inetDiagDestroy, inetDiagDump, iterRun, type BpfMap, type InetDiagSocket } from '../native/bpf.js';
import { lb4_backend, lb4_sock_key, lb6_backend, lb6_sock_key, MapType, u32 } from './abi.gen.js';
import { verifyMapLayout } from './maps.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const SOCK_DESTROY_OBJECT = path.join(ROOT, 'bpf/.output/sock_destroy.bpf.o');
const ITER_PROG = 'lb_udp_destroy';

export type UdpTerminationMechanism = 'bpf-sock-destroy' | 'inet-diag' | 'none';
export type UdpTerminationChoice = 'auto' | UdpTerminationMechanism;
export const UDP_DESTROY_ENV = 'LBCTL_UDP_DESTROY';

export interface UdpTerminationDetection {
  readonly mechanism: UdpTerminationMechanism;
  /** What was tried, and what the kernel said. */
  readonly reason: string;
}

export interface UdpTerminationResult {
  readonly mechanism: UdpTerminationMechanism;
  /** Removed UDP backends whose sockets were looked for. */
  readonly backends: number;
  /** Network namespaces searched: those of the processes in the attached cgroup. */
  readonly netns: number;
  /** Sockets the inet_diag dumps returned (0 for the iterator: the kernel filters there). */
  readonly examined: number;
  readonly destroyed: number;
  /** Socket cookies (SO_COOKIE) of the destroyed sockets, as decimal text. */
  readonly cookies: readonly string[];
  /** What failed, per namespace; the other namespaces were still searched. */
  readonly errors: readonly string[];
  /** The bound that stopped the run early, and what it left undone; absent when the run finished. */
  readonly limit?: string;
  readonly ms: number;
}

/** The bounds of one termination run. */
export interface UdpTerminationLimits {
  /** Processes of the cgroup whose network namespace is read. */
  readonly processes: number;
  /** Network namespaces searched. */
  readonly netns: number;
  /** Sockets the inet_diag dumps may return in all (each dump is cut there). */
  readonly sockets: number;
  /** Wall time, checked between steps; one step may add up to the netlink receive timeout (5 s). */
  readonly ms: number;
}

export const DEFAULT_TERMINATION_LIMITS: UdpTerminationLimits = { processes: 65_536, netns: 4096, sockets: 262_144, ms: 30_000 };

export interface UdpTerminatorOptions {
  /**
   * The loaded datapath's socket rev-NAT maps (lb4_sock_revnat,
   * lb6_sock_revnat): a socket is destroyed only if lbctl recorded it there.
   */
  readonly revNat: { readonly 4: BpfMap; readonly 6: BpfMap };
  /** The cgroup v2 directory the datapath is attached to. */
  readonly cgroup: string;
  /** Default: $LBCTL_UDP_DESTROY, else 'auto' (the best the kernel has). */
  readonly mechanism?: UdpTerminationChoice;
  /** Default: the build's bpf/.output/sock_destroy.bpf.o. */
  readonly object?: string;
  /** Default: /proc. */
  readonly procRoot?: string;
  /** Default: DEFAULT_TERMINATION_LIMITS. */
  readonly limits?: Partial<UdpTerminationLimits>;
}

const AF_INET = 2;
const AF_INET6 = 10;
const IPPROTO_UDP = 17;
/** sk_state of a connected UDP socket; inet_diag takes states as a bit mask. */
const TCP_ESTABLISHED = 1;
const { ENOENT, EOPNOTSUPP } = constants.errno;
const ERRNO_NAMES = new Map(Object.entries(constants.errno).map(([name, n]) => [n, name]));
const errnoName = (e: number): string => ERRNO_NAMES.get(e) ?? `errno ${e}`;

const CHOICES: readonly UdpTerminationChoice[] = ['auto', 'bpf-sock-destroy', 'inet-diag', 'none'];

function choiceFromEnv(env: NodeJS.ProcessEnv = process.env): UdpTerminationChoice | undefined {
  const v = env[UDP_DESTROY_ENV];
  if (v === undefined || v === '') return undefined;
  if (!(CHOICES as readonly string[]).includes(v)) {
    throw new ConfigError(`${UDP_DESTROY_ENV}=${v}: expected one of ${CHOICES.join(', ')}`);
  }
  return v as UdpTerminationChoice;
}

/** libbpf's words for a kernel whose BTF has no bpf_sock_destroy (before 6.5). */
export function lacksSockDestroy(err: unknown): boolean {
  const text = `${(err as { log?: unknown })?.log ?? ''} ${(err as Error)?.message ?? ''}`;
  return /'bpf_sock_destroy'[^\n]*not found in kernel/.test(text);
}

const firstLine = (err: unknown): string => ((err as Error)?.message ?? String(err)).split('\n')[0]!;

/** UDP backends in `before` that `after` no longer holds (by address, port and protocol). */
export function removedUdpBackends(before: Iterable<L3n4Addr>, after: Iterable<L3n4Addr>): L3n4Addr[] {
  const kept = new Set<string>();
  for (const b of after) kept.add(backendKey(b));
  const out = new Map<string, L3n4Addr>();
  for (const b of before) {
    const k = backendKey(b);
    if (b.protocol === 'UDP' && !kept.has(k)) out.set(k, b);
  }
  return [...out.values()];
}

/** The cookies an iterator run wrote: one little-endian u64 per destroyed socket. */
export function parseCookies(out: Buffer): bigint[] {
  const cookies: bigint[] = [];
  for (let o = 0; o + 8 <= out.length; o += 8) cookies.push(out.readBigUInt64LE(o));
  return cookies;
}

/**
 * The backend an inet_diag socket is connected to, if it is one of
 * `wanted` (keyed by backendKey): IPv4 sockets, and IPv4-mapped destinations
 * of IPv6 sockets (balanced through the IPv4 tables), match IPv4 backends.
 */
export function diagMatch(s: Pick<InetDiagSocket, 'family' | 'dst' | 'dport'>, wanted: ReadonlyMap<string, L3n4Addr>): L3n4Addr | undefined {
  let address: string;
  let family: Family;
  if (s.family === AF_INET) {
    address = ipFromBytes(s.dst.subarray(0, 4));
    family = 4;
  } else if (s.family === AF_INET6) {
    const mapped = s.dst.subarray(0, 10).every((x) => x === 0) && s.dst[10] === 0xff && s.dst[11] === 0xff;
    address = ipFromBytes(mapped ? s.dst.subarray(12, 16) : s.dst.subarray(0, 16));
    family = mapped ? 4 : 6;
  } else {
    return undefined;
  }
  return wanted.get(backendKey({ address, family, port: s.dport, protocol: 'UDP' }));
}

export interface NetnsHandle {
  /** The namespace's inode (ls -l /proc/PID/ns/net). */
  readonly ino: number;
  /** A process of the cgroup that lives in it. */
  readonly pid: number;
  /** An open fd of the namespace (for setns). */
  readonly fd: number;
}

/** The bounds of one run: what it may still do, and the first bound it hit. */
class Budget {
  /** The first bound hit, and what it left undone. */
  limit: string | undefined;
  sockets = 0;
  private stopped = false;
  private readonly deadline: number;

  constructor(
    readonly limits: UdpTerminationLimits,
    private readonly aborted: () => boolean = () => false,
  ) {
    this.deadline = performance.now() + limits.ms;
  }

  /** False (and the run stops) once stopped, the wall time is over or the terminator closes. */
  ok(what: string): boolean {
    if (this.stopped) return false;
    if (this.aborted()) this.stop(`the terminator closed: ${what}`);
    else if (performance.now() > this.deadline) this.stop(`wall time ${this.limits.ms} ms: ${what}`);
    return !this.stopped;
  }

  get done(): boolean {
    return this.stopped;
  }

  /** A bound that leaves something out, while the run goes on with what it has. */
  note(limit: string): void {
    this.limit ??= limit;
  }

  /** A bound that ends the run. */
  stop(limit: string): void {
    this.note(limit);
    this.stopped = true;
  }
}

/** The pids of a cgroup v2 directory and every cgroup below it (at most `max`). */
export async function cgroupPids(cgroup: string, max = Infinity): Promise<{ pids: number[]; more: boolean }> {
  const pids: number[] = [];
  let more = false;
  const walk = async (dir: string): Promise<void> => {
    let procs = '';
    try {
      procs = await readFile(path.join(dir, 'cgroup.procs'), 'utf8');
    } catch {
      return; // removed meanwhile
    }
    for (const line of procs.split('\n')) {
      if (!line) continue;
      if (pids.length >= max) {
        more = true;
        return;
      }
      pids.push(Number(line));
    }
    let children: string[] = [];
    try {
      children = (await readdir(dir, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => e.name);
    } catch {
      return;
    }
    for (const c of children) {
      if (more) return;
      await walk(path.join(dir, c));
    }
  };
  await walk(cgroup);
  return { pids, more };
}

interface OpenNetns extends NetnsHandle {
  readonly handle: FileHandle;
}

/**
 * Opens the network namespace of every process in the cgroup (and below),
 * once per namespace, within the budget. A process that exits meanwhile is
 * skipped; so is a pid reused between reading its namespace and opening it
 * (the inode differs). The caller closes the handles.
 */
async function openCgroupNetns(cgroup: string, procRoot: string, budget: Budget): Promise<OpenNetns[]> {
  const { limits } = budget;
  const byIno = new Map<number, OpenNetns>();
  const { pids, more } = await cgroupPids(cgroup, limits.processes);
  if (more) budget.note(`${limits.processes} processes: the namespaces of the cgroup's other processes were not searched`);
  for (const [i, pid] of pids.entries()) {
    if (!budget.ok(`${pids.length - i} of the cgroup's processes not read`)) break;
    const file = path.join(procRoot, String(pid), 'ns', 'net');
    let ino: number;
    try {
      const m = /^net:\[(\d+)\]$/.exec(await readlink(file));
      if (!m) continue;
      ino = Number(m[1]);
    } catch {
      continue;
    }
    if (byIno.has(ino)) continue;
    if (byIno.size >= limits.netns) {
      budget.note(`${limits.netns} network namespaces: those of ${pids.length - i} more processes were not searched`);
      break;
    }
    let handle: FileHandle;
    try {
      handle = await open(file, 'r');
    } catch {
      continue;
    }
    const st = await handle.stat().catch(() => undefined);
    if (st?.ino !== ino) {
      await handle.close();
      continue;
    }
    byIno.set(ino, { ino, pid, fd: handle.fd, handle });
  }
  return [...byIno.values()];
}

interface Probe {
  readonly detection: UdpTerminationDetection;
  readonly object?: BpfObject;
}

async function loadObject(file: string, reuse?: UdpTerminatorOptions['revNat']): Promise<BpfObject> {
  const opts = reuse ? { reuseMaps: { lb4_sock_revnat: reuse[4].fd, lb6_sock_revnat: reuse[6].fd } } : {};
  const object = await BpfObject.openLoaded(file, opts);
  try {
    const term4 = object.map('lb4_sock_term');
    const term6 = object.map('lb6_sock_term');
    const spec = { type: MapType.HASH, flags: 0, value: u32, object: path.basename(file) };
    verifyMapLayout(term4, { ...spec, name: 'lb4_sock_term', maxEntries: term4.maxEntries, key: lb4_backend });
    verifyMapLayout(term6, { ...spec, name: 'lb6_sock_term', maxEntries: term6.maxEntries, key: lb6_backend });
    return object;
  } catch (err) {
    object.close();
    throw err;
  }
}

/** undefined when inet_diag can list and destroy UDP sockets here; else why not. */
async function inetDiagProblem(): Promise<string | undefined> {
  try {
    await inetDiagDump(AF_INET, IPPROTO_UDP, 1 << TCP_ESTABLISHED, undefined, 0);
  } catch (err) {
    return `inet_diag cannot list UDP sockets (${firstLine(err)})`;
  }
  try {
    // A zero id with a zero cookie never names a socket (cookies start at 1,
    // and the kernel checks them), so this destroys nothing: ENOENT means
    // SOCK_DESTROY is there, EOPNOTSUPP that it is not.
    const [e] = await inetDiagDestroy(AF_INET, IPPROTO_UDP, [Buffer.alloc(48)]);
    if (e === ENOENT) return undefined;
    if (e === EOPNOTSUPP) return 'the kernel lacks CONFIG_INET_DIAG_DESTROY (SOCK_DESTROY is EOPNOTSUPP)';
    return `SOCK_DESTROY over inet_diag failed (${errnoName(e!)})`;
  } catch (err) {
    return `SOCK_DESTROY over inet_diag failed (${firstLine(err)})`;
  }
}

/**
 * Both mechanisms' availability, for the agent's feature report (not a
 * choice): undefined where it works, else why not. Loads the kfunc object
 * (with maps of its own) and releases it.
 */
export async function udpTerminationSupport(file = SOCK_DESTROY_OBJECT): Promise<{ kfunc?: string; inetDiag?: string }> {
  let kfunc: string | undefined;
  try {
    (await loadObject(file)).close();
  } catch (err) {
    kfunc = lacksSockDestroy(err) ? 'the kernel has no bpf_sock_destroy kfunc' : `${path.basename(file)} did not load (${firstLine(err)})`;
  }
  const inetDiag = await inetDiagProblem();
  return { ...(kfunc ? { kfunc } : {}), ...(inetDiag ? { inetDiag } : {}) };
}

async function probe(choice: UdpTerminationChoice, file: string, reuse?: UdpTerminatorOptions['revNat']): Promise<Probe> {
  if (choice === 'none') return { detection: { mechanism: 'none', reason: `disabled (${UDP_DESTROY_ENV}=none)` } };
  let noBpf: string | undefined;
  if (choice !== 'inet-diag') {
    try {
      const object = await loadObject(file, reuse);
      return { detection: { mechanism: 'bpf-sock-destroy', reason: 'the kernel has the bpf_sock_destroy kfunc (6.5+): iter/udp program loaded' }, object };
    } catch (err) {
      noBpf = lacksSockDestroy(err)
        ? 'the kernel has no bpf_sock_destroy kfunc (before 6.5)'
        : `${path.basename(file)} did not load (${firstLine(err)})`;
      if (choice === 'bpf-sock-destroy') throw new ConfigError(`${UDP_DESTROY_ENV}=bpf-sock-destroy: ${noBpf}`, { cause: err });
    }
  }
  const problem = await inetDiagProblem();
  const why = choice === 'inet-diag' ? `forced by ${UDP_DESTROY_ENV}=inet-diag` : noBpf!;
  if (!problem) return { detection: { mechanism: 'inet-diag', reason: `${why}; SOCK_DESTROY over inet_diag netlink works` } };
  if (choice === 'inet-diag') throw new ConfigError(`${UDP_DESTROY_ENV}=inet-diag: ${problem}`);
  return { detection: { mechanism: 'none', reason: `${why}; ${problem}: stale connected UDP sockets are left to their applications` } };
}

/**
 * Terminations one at a time, in the background. Backends removed while a
 * run is in progress wait for the next run, all together; a waiting or
 * running backend that a later sync has again (it came back) is dropped,
 * since sockets lbctl sends to it now are as good as new ones.
 */
export class TerminationQueue<R> {
  /** Removed backends waiting for the next run. */
  private pending = new Map<string, L3n4Addr>();
  /** Settles with the run that takes `pending`. */
  private announced: { promise: Promise<R | undefined>; resolve: (r: R | undefined) => void } | undefined;
  /** The backends of the run in progress; backends that come back are deleted from it as it runs. */
  private running: Map<string, L3n4Addr> | undefined;
  private drained: Promise<void> = Promise.resolve();
  private stopped = false;

  constructor(private readonly run: (wanted: Map<string, L3n4Addr>) => Promise<R>) {}

  /**
   * After a sync: `removed` (the backends it deleted; UDP ones count) are
   * terminated in the background, and backends in `current` (what the maps
   * hold now; read only when something is removed, waits or runs) are taken
   * off any termination that waits or runs. The
   * promise settles with the run that covers the removed backends, and only
   * the call that first queued them gets it (undefined otherwise), so each
   * run is reported once. It never rejects.
   */
  add(removed: Iterable<L3n4Addr>, current: Iterable<L3n4Addr>): Promise<R | undefined> | undefined {
    const gone = new Map<string, L3n4Addr>();
    for (const b of removed) if (b.protocol === 'UDP') gone.set(backendKey(b), b);
    if (gone.size === 0 && this.pending.size === 0 && !this.running?.size) return undefined;
    for (const b of current) {
      const k = backendKey(b);
      gone.delete(k);
      this.pending.delete(k);
      this.running?.delete(k);
    }
    if (gone.size === 0 || this.stopped) return undefined;
    for (const [k, b] of gone) this.pending.set(k, b);
    if (this.announced) return undefined; // joins the run already queued
    let resolve!: (r: R | undefined) => void;
    const promise = new Promise<R | undefined>((r) => (resolve = r));
    this.announced = { promise, resolve };
    if (!this.running) this.drained = this.drain();
    return promise;
  }

  /** Settles when no run is in progress or queued. */
  idle(): Promise<void> {
    return this.drained;
  }

  /** No new runs; the one in progress finishes (its run function sees the stop through its own means). */
  stop(): void {
    this.stopped = true;
  }

  get busy(): boolean {
    return this.running !== undefined;
  }

  private async drain(): Promise<void> {
    while (this.announced) {
      const { resolve } = this.announced;
      this.announced = undefined;
      const wanted = this.pending;
      this.pending = new Map();
      if (this.stopped || wanted.size === 0) {
        resolve(undefined);
        continue;
      }
      this.running = wanted;
      try {
        resolve(await this.run(wanted));
      } catch {
        resolve(undefined); // run() reports its failures in its result; this is a safety net
      } finally {
        this.running = undefined;
      }
    }
  }
}

export class UdpTerminator {
  private readonly queue = new TerminationQueue<UdpTerminationResult>((wanted) => this.terminate(wanted));
  private readonly limits: UdpTerminationLimits;
  /** Runs in progress (queued ones and direct destroyConnectedTo calls). */
  private readonly active = new Set<Promise<UdpTerminationResult>>();
  private closing = false;

  private constructor(
    readonly detection: UdpTerminationDetection,
    private readonly object: BpfObject | undefined,
    private readonly opts: UdpTerminatorOptions,
  ) {
    this.limits = { ...DEFAULT_TERMINATION_LIMITS, ...opts.limits };
  }

  get mechanism(): UdpTerminationMechanism {
    return this.detection.mechanism;
  }

  /**
   * Which mechanism this kernel supports, and why. Loads the real object
   * (with maps of its own) and releases it again: feature detection by
   * loading, as shared/KERNEL-FEATURES.md asks.
   */
  static async detect(opts: { mechanism?: UdpTerminationChoice; object?: string } = {}): Promise<UdpTerminationDetection> {
    const p = await probe(opts.mechanism ?? choiceFromEnv() ?? 'auto', opts.object ?? SOCK_DESTROY_OBJECT);
    p.object?.close();
    return p.detection;
  }

  /** Detects, and keeps the iterator object loaded on the datapath's rev-NAT maps. */
  static async open(opts: UdpTerminatorOptions): Promise<UdpTerminator> {
    const p = await probe(opts.mechanism ?? choiceFromEnv() ?? 'auto', opts.object ?? SOCK_DESTROY_OBJECT, opts.revNat);
    return new UdpTerminator(p.detection, p.object, opts);
  }

  /**
   * After a sync: destroys, in the background, the sockets of the UDP
   * backends in `removed` (the backends the sync deleted from the maps).
   * `current` is what the maps hold after it: a backend that is back there
   * is taken off a termination that waits or runs. Returns at once; the
   * promise settles with the run's result (see TerminationQueue.add).
   */
  destroyRemoved(removed: Iterable<L3n4Addr>, current: Iterable<L3n4Addr>): Promise<UdpTerminationResult | undefined> | undefined {
    if (this.mechanism === 'none') return undefined;
    return this.queue.add(removed, current);
  }

  /** Settles when no termination runs or waits. */
  idle(): Promise<void> {
    return Promise.all([this.queue.idle(), ...this.active]).then(() => undefined);
  }

  /**
   * Destroys every connected UDP socket that lbctl sent to one of these
   * backends, in every network namespace of the attached cgroup's
   * processes, now (not queued). Never rejects: failures are returned in
   * `errors`, and a bound that stopped the run in `limit`.
   */
  destroyConnectedTo(backends: readonly L3n4Addr[]): Promise<UdpTerminationResult> {
    const wanted = new Map<string, L3n4Addr>();
    for (const b of backends) if (b.protocol === 'UDP') wanted.set(backendKey(b), b);
    return this.terminate(wanted);
  }

  /**
   * Releases the iterator object (the datapath's maps stay), once a run in
   * progress has stopped at its next step. Idempotent.
   */
  close(): void {
    if (this.closing) return;
    this.closing = true;
    this.queue.stop();
    void Promise.all([this.queue.idle(), ...this.active]).then(() => this.object?.close());
  }

  /** One run, queued or not; close() waits for it before releasing the object. */
  private terminate(wanted: Map<string, L3n4Addr>): Promise<UdpTerminationResult> {
    const run = this.run(wanted);
    this.active.add(run);
    void run.finally(() => this.active.delete(run));
    return run;
  }

  /** `wanted` may shrink while it runs (backends that came back). */
  private async run(wanted: Map<string, L3n4Addr>): Promise<UdpTerminationResult> {
    const t0 = performance.now();
    const backends = wanted.size;
    const budget = new Budget(this.limits, () => this.closing);
    const cookies: bigint[] = [];
    const errors: string[] = [];
    let netns: OpenNetns[] = [];
    try {
      if (wanted.size > 0 && this.mechanism !== 'none') {
        netns = await openCgroupNetns(this.opts.cgroup, this.opts.procRoot ?? '/proc', budget);
        if (this.object) await this.viaIterator(this.object, wanted, netns, budget, cookies, errors);
        else await this.viaInetDiag(wanted, netns, budget, cookies, errors);
      }
    } catch (err) {
      errors.push(firstLine(err));
    } finally {
      for (const ns of netns) await ns.handle.close().catch(() => undefined);
    }
    return {
      mechanism: this.mechanism,
      backends,
      netns: netns.length,
      examined: budget.sockets,
      destroyed: cookies.length,
      cookies: cookies.map(String),
      errors,
      ...(budget.limit !== undefined ? { limit: budget.limit } : {}),
      ms: Math.round((performance.now() - t0) * 100) / 100,
    };
  }

  private async viaIterator(object: BpfObject, wanted: Map<string, L3n4Addr>, netns: OpenNetns[], budget: Budget, cookies: bigint[], errors: string[]): Promise<void> {
    const term = { 4: object.map('lb4_sock_term'), 6: object.map('lb6_sock_term') };
    const batchSize = Math.min(term[4].maxEntries, term[6].maxEntries);
    const progFd = object.progFd(ITER_PROG);
    const all = [...wanted.entries()];
    const one = u32.encode(1);
    for (let i = 0; i < all.length; i += batchSize) {
      // Only backends still wanted: one may have come back during an earlier batch.
      const batch = new Map(all.slice(i, i + batchSize).filter(([k]) => wanted.has(k)).map(([k, b]) => [k, { family: b.family, key: termKey(b) }]));
      let seen = wanted.size;
      try {
        for (const k of batch.values()) term[k.family].update(k.key, one);
        for (const [j, ns] of netns.entries()) {
          if (!budget.ok(`${netns.length - j} of ${netns.length} network namespaces not searched`)) return;
          if (wanted.size !== seen) {
            // Backends came back meanwhile: their sockets are no longer stale.
            seen = wanted.size;
            for (const [k, e] of batch) if (!wanted.has(k)) term[e.family].delete(e.key);
          }
          try {
            cookies.push(...parseCookies(await iterRun(progFd, ns.fd)));
          } catch (err) {
            errors.push(`netns ${ns.ino} (pid ${ns.pid}): ${firstLine(err)}`);
          }
        }
      } finally {
        for (const k of batch.values()) term[k.family].delete(k.key);
      }
    }
  }

  private async viaInetDiag(wanted: Map<string, L3n4Addr>, netns: OpenNetns[], budget: Budget, cookies: bigint[], errors: string[]): Promise<void> {
    const families = new Set<number>();
    for (const b of wanted.values()) {
      families.add(AF_INET6); // v6 backends, and IPv4-mapped destinations of v6 sockets
      if (b.family === 4) families.add(AF_INET);
    }
    for (const [j, ns] of netns.entries()) {
      for (const family of families) {
        if (!budget.ok(`${netns.length - j} of ${netns.length} network namespaces not fully searched`)) return;
        const left = budget.limits.sockets - budget.sockets;
        try {
          const dump = await inetDiagDump(family, IPPROTO_UDP, 1 << TCP_ESTABLISHED, ns.fd, left);
          budget.sockets += dump.sockets.length;
          if (dump.truncated) budget.stop(`${budget.limits.sockets} sockets examined: netns ${ns.ino} (pid ${ns.pid}) had more, and ${netns.length - j - 1} network namespaces were not searched`);
          const matches: Array<{ s: InetDiagSocket; map: BpfMap; key: Buffer }> = [];
          for (const s of dump.sockets) {
            const b = diagMatch(s, wanted);
            if (!b) continue;
            const map = this.opts.revNat[b.family];
            const key = revNatKey(b, s.cookie);
            if (map.lookup(key)) matches.push({ s, map, key }); // else connected there, but not by lbctl
          }
          if (matches.length > 0) {
            const errs = await inetDiagDestroy(family, IPPROTO_UDP, matches.map((m) => m.s.id), ns.fd);
            for (const [i, m] of matches.entries()) {
              const e = errs[i];
              if (e === 0) {
                m.map.delete(m.key);
                cookies.push(m.s.cookie);
              } else if (e !== ENOENT) {
                // ENOENT: closed meanwhile
                errors.push(`netns ${ns.ino} (pid ${ns.pid}), family ${family}: SOCK_DESTROY of cookie ${m.s.cookie}: ${errnoName(e ?? -1)}`);
              }
            }
          }
        } catch (err) {
          errors.push(`netns ${ns.ino} (pid ${ns.pid}), family ${family}: ${firstLine(err)}`);
        }
        if (budget.done) return;
      }
    }
  }
}

function termKey(b: L3n4Addr): Buffer {
  return b.family === 4
    ? lb4_backend.encode({ address: ipv4ToUint(b.address), port: b.port, proto: IPPROTO_UDP, state: 0 })
    : lb6_backend.encode({ address: ipv6Bytes(b.address), port: b.port, proto: IPPROTO_UDP, state: 0 });
}

function revNatKey(b: L3n4Addr, cookie: bigint): Buffer {
  return b.family === 4
    ? lb4_sock_key.encode({ cookie, address: ipv4ToUint(b.address), port: b.port })
    : lb6_sock_key.encode({ cookie, address: ipv6Bytes(b.address), port: b.port });
}
