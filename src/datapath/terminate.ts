// Stale connected UDP sockets. A UDP socket connect()ed to a service is
// balanced once: cgroup/connect4/6 rewrote its destination, so it stays
// connected to that backend for its whole life. When the backend leaves the
// service, the socket keeps sending into the void (a DNS resolver's socket,
// say). After a sync removes UDP backends, the agent destroys exactly the
// sockets that are UDP, connected, connected to one of those backends, and
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
import { closeSync, fstatSync, openSync, readdirSync, readFileSync, readlinkSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ConfigError } from '../errors.js';
import { ipFromBytes, ipv4ToUint, ipv6Bytes, parseIp } from '../lb/addr.js';
import { backendKey, type Family, type L3n4Addr } from '../lb/types.js';
import { BpfObject, inetDiagDestroy, inetDiagDump, isErrno, type BpfMap, type InetDiagSocket } from '../native/bpf.js';
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
  readonly destroyed: number;
  /** Socket cookies (SO_COOKIE) of the destroyed sockets, as decimal text. */
  readonly cookies: readonly string[];
  /** What failed, per namespace; the other namespaces were still searched. */
  readonly errors: readonly string[];
  readonly ms: number;
}

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
}

const AF_INET = 2;
const AF_INET6 = 10;
const IPPROTO_UDP = 17;
/** sk_state of a connected UDP socket; inet_diag takes states as a bit mask. */
const TCP_ESTABLISHED = 1;

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

/** The pids of a cgroup v2 directory and every cgroup below it. */
export function cgroupPids(cgroup: string): number[] {
  const pids: number[] = [];
  const walk = (dir: string): void => {
    let procs = '';
    try {
      procs = readFileSync(path.join(dir, 'cgroup.procs'), 'utf8');
    } catch {
      return; // removed meanwhile
    }
    for (const line of procs.split('\n')) if (line) pids.push(Number(line));
    let children: string[] = [];
    try {
      children = readdirSync(dir, { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => e.name);
    } catch {
      return;
    }
    for (const c of children) walk(path.join(dir, c));
  };
  walk(cgroup);
  return pids;
}

/**
 * Opens the network namespace of every process in the cgroup (and below),
 * once per namespace. A process that exits meanwhile is skipped; so is a pid
 * reused between reading its namespace and opening it (the inode differs).
 */
export function openCgroupNetns(cgroup: string, procRoot = '/proc'): NetnsHandle[] {
  const byIno = new Map<number, NetnsHandle>();
  for (const pid of cgroupPids(cgroup)) {
    const file = path.join(procRoot, String(pid), 'ns', 'net');
    let ino: number;
    try {
      const m = /^net:\[(\d+)\]$/.exec(readlinkSync(file));
      if (!m) continue;
      ino = Number(m[1]);
    } catch {
      continue;
    }
    if (byIno.has(ino)) continue;
    let fd: number;
    try {
      fd = openSync(file, 'r');
    } catch {
      continue;
    }
    if (fstatSync(fd).ino !== ino) {
      closeSync(fd);
      continue;
    }
    byIno.set(ino, { ino, pid, fd });
  }
  return [...byIno.values()];
}

interface Probe {
  readonly detection: UdpTerminationDetection;
  readonly object?: BpfObject;
}

async function loadObject(file: string, reuse?: UdpTerminatorOptions['revNat']): Promise<BpfObject> {
  const opts = reuse ? { reuseMaps: { lb4_sock_revnat: reuse[4].fd, lb6_sock_revnat: reuse[6].fd } } : {};
  const object = BpfObject.open(file, opts);
  try {
    await object.load();
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
function inetDiagProblem(): string | undefined {
  try {
    inetDiagDump(AF_INET, IPPROTO_UDP, 1 << TCP_ESTABLISHED);
  } catch (err) {
    return `inet_diag cannot list UDP sockets (${firstLine(err)})`;
  }
  try {
    // A zero id with a zero cookie never names a socket (cookies start at 1,
    // and the kernel checks them), so this destroys nothing: ENOENT means
    // SOCK_DESTROY is there, EOPNOTSUPP that it is not.
    inetDiagDestroy(AF_INET, IPPROTO_UDP, Buffer.alloc(48));
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return undefined;
    if (isErrno(err, 'EOPNOTSUPP')) return 'the kernel lacks CONFIG_INET_DIAG_DESTROY (SOCK_DESTROY is EOPNOTSUPP)';
    return `SOCK_DESTROY over inet_diag failed (${firstLine(err)})`;
  }
  return undefined;
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
  const problem = inetDiagProblem();
  const why = choice === 'inet-diag' ? `forced by ${UDP_DESTROY_ENV}=inet-diag` : noBpf!;
  if (!problem) return { detection: { mechanism: 'inet-diag', reason: `${why}; SOCK_DESTROY over inet_diag netlink works` } };
  if (choice === 'inet-diag') throw new ConfigError(`${UDP_DESTROY_ENV}=inet-diag: ${problem}`);
  return { detection: { mechanism: 'none', reason: `${why}; ${problem}: stale connected UDP sockets are left to their applications` } };
}

export class UdpTerminator {
  private constructor(
    readonly detection: UdpTerminationDetection,
    private readonly object: BpfObject | undefined,
    private readonly opts: UdpTerminatorOptions,
  ) {}

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
   * After a sync: destroys the sockets of the UDP backends `before` had and
   * `after` has not. undefined when no UDP backend was removed.
   */
  destroyRemoved(before: Iterable<L3n4Addr>, after: Iterable<L3n4Addr>): UdpTerminationResult | undefined {
    const gone = removedUdpBackends(before, after);
    return gone.length === 0 ? undefined : this.destroyConnectedTo(gone);
  }

  /**
   * Destroys every connected UDP socket that lbctl sent to one of these
   * backends, in every network namespace of the attached cgroup's processes.
   * Never throws: failures are returned in `errors`.
   */
  destroyConnectedTo(backends: readonly L3n4Addr[]): UdpTerminationResult {
    const t0 = performance.now();
    const wanted = new Map<string, L3n4Addr>();
    for (const b of backends) if (b.protocol === 'UDP') wanted.set(backendKey(b), b);
    const cookies: bigint[] = [];
    const errors: string[] = [];
    let netns: NetnsHandle[] = [];
    try {
      if (wanted.size > 0 && this.mechanism !== 'none') {
        netns = openCgroupNetns(this.opts.cgroup, this.opts.procRoot);
        if (this.object) this.viaIterator(this.object, [...wanted.values()], netns, cookies, errors);
        else this.viaInetDiag(wanted, netns, cookies, errors);
      }
    } catch (err) {
      errors.push(firstLine(err));
    } finally {
      for (const ns of netns) closeSync(ns.fd);
    }
    return {
      mechanism: this.mechanism,
      backends: wanted.size,
      netns: netns.length,
      destroyed: cookies.length,
      cookies: cookies.map(String),
      errors,
      ms: Math.round((performance.now() - t0) * 100) / 100,
    };
  }

  /** Releases the iterator object (the datapath's maps stay). Idempotent. */
  close(): void {
    this.object?.close();
  }

  private viaIterator(object: BpfObject, backends: L3n4Addr[], netns: NetnsHandle[], cookies: bigint[], errors: string[]): void {
    const term = { 4: object.map('lb4_sock_term'), 6: object.map('lb6_sock_term') };
    const batch = Math.min(term[4].maxEntries, term[6].maxEntries);
    const one = u32.encode(1);
    for (let i = 0; i < backends.length; i += batch) {
      const keys = backends.slice(i, i + batch).map((b) => ({ family: b.family, key: termKey(b) }));
      try {
        for (const k of keys) term[k.family].update(k.key, one);
        for (const ns of netns) {
          try {
            cookies.push(...parseCookies(object.runIter(ITER_PROG, ns.fd)));
          } catch (err) {
            errors.push(`netns ${ns.ino} (pid ${ns.pid}): ${firstLine(err)}`);
          }
        }
      } finally {
        for (const k of keys) term[k.family].delete(k.key);
      }
    }
  }

  private viaInetDiag(wanted: ReadonlyMap<string, L3n4Addr>, netns: NetnsHandle[], cookies: bigint[], errors: string[]): void {
    const families = new Set<number>();
    for (const b of wanted.values()) {
      families.add(AF_INET6); // v6 backends, and IPv4-mapped destinations of v6 sockets
      if (b.family === 4) families.add(AF_INET);
    }
    for (const ns of netns) {
      for (const family of families) {
        try {
          for (const s of inetDiagDump(family, IPPROTO_UDP, 1 << TCP_ESTABLISHED, ns.fd)) {
            const b = diagMatch(s, wanted);
            if (!b) continue;
            const map = this.opts.revNat[b.family];
            const key = revNatKey(b, s.cookie);
            if (!map.lookup(key)) continue; // connected there, but not by lbctl
            try {
              inetDiagDestroy(s.family, IPPROTO_UDP, s.id, ns.fd);
            } catch (err) {
              if (isErrno(err, 'ENOENT')) continue; // closed meanwhile
              throw err;
            }
            map.delete(key);
            cookies.push(s.cookie);
          }
        } catch (err) {
          errors.push(`netns ${ns.ino} (pid ${ns.pid}), family ${family}: ${firstLine(err)}`);
        }
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
