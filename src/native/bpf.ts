/**
 * Thin typed layer over the lb_native addon. Generic: moves bytes to and from
 * BPF objects, maps and links. Every failure is a BpfError whose `code` is the
 * errno name ('ENOENT', 'EEXIST', ...) and whose message names the operation
 * and the map/program/path involved.
 */
import { closeSync } from 'node:fs';
import { LbError } from '../base/errors.js';
import { loadBinding } from './binding.js';
import type { DeclaredMapLayout, FlatEntries, InetDiagSocket, MapLayout, NativeBinding, OpenOptions, RawBpfMap, RawBpfObject, RawHeldLink, RawHeldProgram } from './native.js';

export type { InetDiagSocket, OpenOptions } from './native.js';
export type { DeclaredMapLayout, FlatEntries, MapLayout, TypeLayout } from './native.js';

/** bpf_map_update_elem flags. */
export const BPF_ANY = 0;
export const BPF_NOEXIST = 1;
export const BPF_EXIST = 2;

export type ProgInfo = ReturnType<RawBpfObject['progInfo']>;
export type AttachResult = ReturnType<RawBpfObject['attachCgroup']>;
export type PinnedLinkInfo = ReturnType<NativeBinding['pinnedLinkInfo']>;
export type TestRunOptions = Parameters<NativeBinding['progTestRun']>[1];
export type TestRunResult = ReturnType<NativeBinding['progTestRun']>;

export interface BpfErrorFields {
  code: string;
  errno: number;
  op: string;
  map?: string;
  prog?: string;
  path?: string;
  /** libbpf log tail (verifier output) for load failures */
  log?: string;
  /** batchUpdate: how many elements were written before the failure */
  count?: number;
}

/** A failed libbpf/bpf(2) operation. */
export class BpfError extends LbError {
  readonly errno: number;
  readonly op: string;
  readonly map?: string;
  readonly prog?: string;
  readonly path?: string;
  readonly log?: string;
  readonly count?: number;

  constructor(message: string, fields: BpfErrorFields, options?: ErrorOptions) {
    super(message, fields.code, options);
    this.errno = fields.errno;
    this.op = fields.op;
    if (fields.map !== undefined) this.map = fields.map;
    if (fields.prog !== undefined) this.prog = fields.prog;
    if (fields.path !== undefined) this.path = fields.path;
    if (fields.log !== undefined) this.log = fields.log;
    if (fields.count !== undefined) this.count = fields.count;
  }
}

/** True when err carries errno name `code` (or any of `more`). */
export function isErrno(err: unknown, code: string, ...more: string[]): boolean {
  if (typeof err !== 'object' || err === null) return false;
  const c = (err as { code?: unknown }).code;
  return typeof c === 'string' && (c === code || more.includes(c));
}

interface RawError extends Error {
  code: string;
  errno: number;
  op: string;
  map?: unknown;
  prog?: unknown;
  path?: unknown;
  log?: unknown;
  count?: unknown;
}

function isRawError(e: unknown): e is RawError {
  if (!(e instanceof Error)) return false;
  const r = e as Partial<RawError>;
  return typeof r.code === 'string' && typeof r.errno === 'number' && typeof r.op === 'string';
}

const str = (v: unknown): string | undefined => (typeof v === 'string' ? v : undefined);

/**
 * Convert an addon error into a BpfError (other values pass through). The
 * stack is the caller's: `caller` for async calls (an Error made before the
 * call), otherwise captured here above `above`.
 */
export function toBpfError(err: unknown, caller?: Error, above?: (...args: never[]) => unknown): unknown {
  if (err instanceof BpfError || !isRawError(err)) return err;
  const fields: BpfErrorFields = { code: err.code, errno: err.errno, op: err.op };
  const map = str(err.map), prog = str(err.prog), path = str(err.path), log = str(err.log);
  if (map !== undefined) fields.map = map;
  if (prog !== undefined) fields.prog = prog;
  if (path !== undefined) fields.path = path;
  if (log !== undefined) fields.log = log;
  if (typeof err.count === 'number') fields.count = err.count;
  const be = new BpfError(err.message, fields);
  if (caller?.stack) {
    const frames = caller.stack.split('\n').slice(1).join('\n');
    be.stack = `${be.name}: ${be.message}\n${frames}`;
  } else if (above) {
    Error.captureStackTrace(be, above);
  }
  return be;
}

/** Run a synchronous addon call; raw errors become BpfError with the caller's stack. */
export function guard<T>(fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    throw toBpfError(err, undefined, guard);
  }
}

const native = (): NativeBinding => loadBinding();

/** A BPF map: the object's (borrowed fd) or one opened by pin path (owned fd). */
export class BpfMap {
  /** @internal use BpfObject.map() or openPinnedMap() */
  constructor(
    private readonly raw: RawBpfMap,
    /** The object this map belongs to; held so it is not collected while the map is in use. */
    readonly owner?: BpfObject,
  ) {}

  get name(): string { return this.raw.name; }
  get type(): number { return this.raw.type; }
  get keySize(): number { return this.raw.keySize; }
  get valueSize(): number { return this.raw.valueSize; }
  get maxEntries(): number { return this.raw.maxEntries; }
  get flags(): number { return this.raw.flags; }
  get id(): number { return this.raw.id; }
  get fd(): number { return this.raw.fd; }
  get perCpu(): boolean { return this.raw.perCpu; }
  /** Bytes of a value buffer: valueSize, or roundup(valueSize, 8) * possible CPUs for per-CPU maps. */
  get valueBufSize(): number { return this.raw.valueBufSize; }

  /** The value, or null when the key is absent. */
  lookup(key: Buffer): Buffer | null { return guard(() => this.raw.lookup(key)); }
  update(key: Buffer, value: Buffer, flags: number = BPF_ANY): void {
    guard(() => this.raw.update(key, value, flags));
  }
  /** False when the key was absent. */
  delete(key: Buffer): boolean { return guard(() => this.raw.delete(key)); }
  keys(): Buffer[] { return guard(() => this.raw.keys()); }
  entries(): Array<[Buffer, Buffer]> { return guard(() => this.raw.entries()); }
  /** Every entry packed into one key and one value buffer (no object per entry). */
  entriesFlat(): FlatEntries { return guard(() => this.raw.entriesFlat()); }
  /** Write `count` concatenated keys/values; returns how many were written (error.count on failure). */
  batchUpdate(keys: Buffer, values: Buffer, count: number, flags: number = BPF_ANY): number {
    return guard(() => this.raw.batchUpdate(keys, values, count, flags));
  }
  /** Closes the fd if this map owns it (opened by path); idempotent. */
  close(): void { guard(() => this.raw.close()); }
  /** Key and value layouts from the BTF the kernel keeps with the map; null when it was created without BTF. */
  layout(): MapLayout | null { return guard(() => this.raw.layout()); }
}

/** A BPF ELF object: open, load, then use its maps and programs. */
export class BpfObject {
  private constructor(private readonly raw: RawBpfObject) {}

  /** bpf_object__open_file; maxEntries overrides are applied before load. */
  static open(path: string, opts?: OpenOptions): BpfObject {
    return new BpfObject(guard(() => native().openObject(path, opts)));
  }

  /** Opens and loads; the object is closed again when the load fails. */
  static async openLoaded(path: string, opts?: OpenOptions): Promise<BpfObject> {
    const object = BpfObject.open(path, opts);
    try {
      await object.load();
      return object;
    } catch (err) {
      object.close();
      throw err;
    }
  }

  get path(): string { return this.raw.path; }

  /** Load into the kernel (verifier runs here); pinned maps are reused from pinRoot. */
  async load(): Promise<void> {
    const caller = new Error();
    try {
      await this.raw.load();
    } catch (err) {
      throw toBpfError(err, caller);
    }
  }

  mapNames(): string[] { return guard(() => this.raw.mapNames()); }
  programNames(): string[] { return guard(() => this.raw.programNames()); }
  map(name: string): BpfMap { return new BpfMap(guard(() => this.raw.map(name)), this); }
  progFd(name: string): number { return guard(() => this.raw.progFd(name)); }
  progInfo(name: string): ProgInfo { return guard(() => this.raw.progInfo(name)); }
  /** A map's key and value layouts (BTF), type and flags as this object declares them; works before load. */
  mapLayout(name: string): DeclaredMapLayout { return guard(() => this.raw.mapLayout(name)); }

  /**
   * Attach a cgroup program through a link pinned at linkPinPath, idempotently:
   * an existing pinned link is atomically switched to this program (updated=true).
   */
  attachCgroup(progName: string, cgroupPath: string, linkPinPath: string): AttachResult {
    return guard(() => this.raw.attachCgroup(progName, cgroupPath, linkPinPath));
  }

  /**
   * Run an iterator program once: attach it, create an iterator (inside the
   * network namespace `netnsFd` when given; socket iterators only walk the
   * namespace they were created in), read to EOF. Returns what it wrote.
   */
  runIter(progName: string, netnsFd?: number): Buffer {
    return guard(() => this.raw.runIter(progName, netnsFd));
  }

  /** Release the object (maps obtained from it stop working); idempotent. */
  close(): void { guard(() => this.raw.close()); }
}

export function libbpfVersion(): string { return guard(() => native().libbpfVersion()); }
export function numPossibleCpus(): number { return guard(() => native().numPossibleCpus()); }

/**
 * Every BPF program's run time and runs counted (run_time_ns, run_cnt in
 * its info) until close(), or until this process ends: BPF_ENABLE_STATS
 * (5.8+), which leaves the kernel.bpf_stats_enabled sysctl as it was.
 */
export function enableRunTimeStats(): { close(): void } {
  let fd: number | undefined = guard(() => native().enableRunTimeStats());
  return {
    close(): void {
      if (fd !== undefined) closeSync(fd);
      fd = undefined;
    },
  };
}

/** Open a map pinned in bpffs; the returned map owns its fd (close() it). */
/** A map no object declares (bpf_map_create): the inner maps of a map-in-map. Close it when done (an outer map keeps its own reference). */
export function mapCreate(opts: { type: number; keySize: number; valueSize: number; maxEntries: number; flags?: number; name?: string }): BpfMap {
  return new BpfMap(guard(() => native().mapCreate(opts)));
}

/** A map by id (a map-in-map lookup gives the inner map's id); null when it is gone. */
export function mapById(id: number): BpfMap | null {
  const raw = guard(() => native().mapById(id));
  return raw ? new BpfMap(raw) : null;
}

export function openPinnedMap(path: string): BpfMap {
  return new BpfMap(guard(() => native().openPinnedMap(path)));
}

export function pinnedLinkInfo(path: string): PinnedLinkInfo {
  return guard(() => native().pinnedLinkInfo(path));
}

/**
 * A loaded program by id: its name (cut at 15 characters by the kernel), its
 * BTF function name (whole), tag and type; null when no program has that id.
 */
export function progInfoById(id: number): ProgInfo | null {
  return guard(() => native().progInfoById(id));
}

/** Atomically replace the program of a pinned link. */
export function pinnedLinkUpdate(path: string, progFd: number): void {
  guard(() => native().pinnedLinkUpdate(path, progFd));
}

/** A pinned link and the program it ran when held: restore() switches it back. close() it. */
export class HeldLink {
  /** @internal use holdPinnedLink() */
  constructor(private readonly raw: RawHeldLink, readonly path: string) {}
  get id(): number { return this.raw.id; }
  /** The program the link ran when it was held. */
  get progId(): number { return this.raw.progId; }
  restore(): void { guard(() => this.raw.restore()); }
  close(): void { guard(() => this.raw.close()); }
}

/** Holds the pinned link at `path` and (by fd) the program it runs now, so that program can be restored after a switch. */
export function holdPinnedLink(path: string): HeldLink {
  return new HeldLink(guard(() => native().holdPinnedLink(path)), path);
}

/** A loaded program held by fd: it stays loaded, to be attached again, after its attachments let go of it. close() it. */
export class HeldProgram {
  /** @internal use holdProgram() */
  constructor(private readonly raw: RawHeldProgram) {}
  get id(): number { return this.raw.id; }
  get fd(): number { return this.raw.fd; }
  close(): void { guard(() => this.raw.close()); }
}

/** Holds the program with this id (null when none has it). */
export function holdProgram(id: number): HeldProgram | null {
  const raw = guard(() => native().holdProgram(id));
  return raw ? new HeldProgram(raw) : null;
}

/** Remove a bpffs pin (a pinned link with no other holder detaches). Throws ENOENT if absent. */
export function unpin(path: string): void {
  guard(() => native().unpin(path));
}

// ---- Stale-socket termination: asynchronous, off the JavaScript thread (native/netns.cc, native/sock_diag.cc).

/** Run an asynchronous addon call; raw errors (thrown or rejected) become BpfError with the caller's stack. */
async function guardAsync<T>(fn: () => Promise<T>): Promise<T> {
  const caller = new Error();
  try {
    return await fn();
  } catch (err) {
    throw toBpfError(err, caller);
  }
}

/**
 * inet_diag: the sockets of one family and protocol in `states` (1 << TCP_* bits),
 * in netnsFd's namespace when given; at most `limit` (truncated when there were more).
 */
export function inetDiagDump(family: number, protocol: number, states: number, netnsFd?: number, limit?: number): Promise<{ sockets: InetDiagSocket[]; truncated: boolean }> {
  return guardAsync(() => native().inetDiagDump(family, protocol, states, netnsFd, limit));
}

/**
 * SOCK_DESTROY over inet_diag of exactly the sockets `ids` name, over one netlink socket:
 * one errno per id, 0 when destroyed (ENOENT when a socket is gone or its cookie differs).
 */
export function inetDiagDestroy(family: number, protocol: number, ids: Buffer[], netnsFd?: number): Promise<number[]> {
  return guardAsync(() => native().inetDiagDestroy(family, protocol, ids, netnsFd));
}

/**
 * One run of a loaded iterator program, given its fd (BpfObject.progFd): its
 * iterator is created inside the network namespace `netnsFd` when given
 * (socket iterators only walk the namespace they were created in) and read
 * to EOF on the libuv pool. Resolves with what the program wrote.
 */
export function iterRun(progFd: number, netnsFd?: number): Promise<Buffer> {
  return guardAsync(() => native().iterRun(progFd, netnsFd));
}

// ---- end of stale-socket termination

/** BPF_LINK_CREATE, closed again at once: throws the kernel's answer (BpfError) when it refuses the attachment. */
export function linkCreateProbe(progFd: number, target: number, attachType: number): void {
  guard(() => native().linkCreateProbe(progFd, target, attachType));
}

export function progTestRun(progFd: number, opts: TestRunOptions = {}): TestRunResult {
  return guard(() => native().progTestRun(progFd, opts));
}
