// The standalone source: a directory of Kubernetes manifests (Service and
// EndpointSlice, several YAML documents per file, List objects, or JSON),
// watched and re-read on change. A file that cannot be parsed keeps the
// objects it last yielded; an invalid object keeps its last valid version.
// Every problem names the file, the document index, the object when known,
// and the reason. Nothing a file holds can stop the source: each file and
// each object is read inside a boundary that turns any exception into a
// reported problem, and the limits in limits.ts bound what a file can cost.
import { watch, type FSWatcher } from 'node:fs';
import { constants as fsc } from 'node:fs';
import { open, readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { show, validateEndpointSlice, validateNode, validateService, type EndpointSlice, type Node, type Service } from '../model/k8s.js';
import { MAX_DIR_BYTES, MAX_FILE_BYTES, MAX_FILES, MAX_PROBLEMS_LISTED_PER_FILE } from './limits.js';
import { parseManifests } from './manifest.js';
import type { Problem, Source, SourceEvent, SourceStatus } from './source.js';

const MANIFEST = /\.(ya?ml|json)$/;

type Obj = { kind: 'Service'; value: Service } | { kind: 'EndpointSlice'; value: EndpointSlice } | { kind: 'Node'; value: Node };

/** The id a source event carries: namespace/name, a Node's name alone (Nodes are cluster-scoped). */
function eventId(o: Obj): string {
  return o.kind === 'Node' ? o.value.name : `${o.value.namespace}/${o.value.name}`;
}

interface FileState {
  /** Objects of the last read, by "Kind ns/name". */
  objects: Map<string, Obj>;
  /** False when the last read failed as a whole and there was no earlier good read. */
  readable: boolean;
  /** Identity and change times of what was read; unchanged files are not read again. Unset: read it next time. */
  stamp?: string;
  /** Bytes it counts against the directory's budget. */
  bytes: number;
}

/**
 * The problems of one read of one file: the first few reported one by one,
 * the rest summed up by category when the read ends.
 */
class FileProblems {
  private listed = 0;
  private readonly more = new Map<Problem['category'], number>();

  constructor(
    private readonly file: string,
    private readonly report: (p: Problem) => void,
  ) {}

  add(p: Problem): void {
    if (this.listed++ < MAX_PROBLEMS_LISTED_PER_FILE) this.report(p);
    else this.more.set(p.category, (this.more.get(p.category) ?? 0) + 1);
  }

  summarize(): void {
    for (const [category, count] of this.more) {
      const reason = `${count} more problems of this kind in this file (the first ${MAX_PROBLEMS_LISTED_PER_FILE} of the file are listed one by one)`;
      this.report({ where: this.file, reason, category, count });
    }
  }
}

export interface FileSourceOptions {
  readonly dir: string;
  /** Quiet time before re-reading after a change (editors write in bursts). */
  readonly debounceMs?: number;
  readonly onProblem?: (p: Problem) => void;
}

function identity(kind: string, ns: string, name: string): string {
  return `${kind} ${ns}/${name}`;
}

/** "Kind namespace/name" of an object that may be anything at all, when it names itself plausibly. */
function rawIdentity(kind: string, doc: unknown): string | undefined {
  const meta = typeof doc === 'object' && doc !== null ? (doc as { metadata?: unknown }).metadata : undefined;
  if (typeof meta !== 'object' || meta === null) return undefined;
  const { name, namespace } = meta as { name?: unknown; namespace?: unknown };
  if (typeof name !== 'string' || name.length === 0 || name.length > 253) return undefined;
  const ns = kind === 'Node' ? '' : typeof namespace === 'string' && namespace.length <= 63 ? namespace : 'default';
  return identity(kind, ns, name);
}

/**
 * A regular file's bytes, refused before reading when larger than `max`
 * (a FIFO or a device named *.yaml would block or never end: refused too).
 */
async function readBounded(file: string, max: number): Promise<{ text: string } | { refused: string; category: 'read' | 'limit' }> {
  const fh = await open(file, fsc.O_RDONLY | fsc.O_NONBLOCK | fsc.O_NOCTTY);
  try {
    const st = await fh.stat();
    if (!st.isFile()) return { refused: 'not a regular file', category: 'read' };
    if (st.size > max) return { refused: `${st.size} bytes, larger than the ${max} lbctl reads from one file`, category: 'limit' };
    // One byte more than allowed tells a file that grew since stat().
    const buf = Buffer.allocUnsafe(Math.min(st.size, max) + 1);
    let n = 0;
    for (;;) {
      const { bytesRead } = await fh.read(buf, n, buf.length - n, n);
      if (bytesRead === 0) break;
      n += bytesRead;
      // It grew while being read: the watcher reads it again once it settles.
      if (n === buf.length) return { refused: 'it changed while lbctl read it', category: 'read' };
    }
    return { text: buf.toString('utf8', 0, n) };
  } finally {
    await fh.close();
  }
}

export class FileSource implements Source {
  readonly name: string;
  private readonly files = new Map<string, FileState>();
  /** The duplicates across files as of the last read ("where|reason"): each is reported when it appears, not on every read. */
  private duplicates = new Set<string>();
  private dirReadable = true;
  private watcher: FSWatcher | undefined;
  private timer: NodeJS.Timeout | undefined;
  private reading: Promise<void> = Promise.resolve();
  private onChange: (e?: SourceEvent) => void = () => {};
  /** The objects last sent to onChange, by "Kind ns/name". */
  private sent = new Map<string, Obj>();
  /**
   * The file whose version of each object is in force. For an object defined
   * in more than one file, the file already in force keeps it while it still
   * defines it (a new file cannot take over a served object); otherwise the
   * last file by name.
   */
  private fileOf = new Map<string, string>();
  private published = false;

  constructor(private readonly opts: FileSourceOptions) {
    this.name = `file:${opts.dir}`;
  }

  async start(onChange: (e?: SourceEvent) => void): Promise<void> {
    this.onChange = onChange;
    await this.readAll();
    this.publish();
    this.watcher = watch(this.opts.dir, { persistent: true }, () => this.schedule());
    this.watcher.on('error', (err) => this.report({ where: this.opts.dir, reason: `watch failed: ${err.message}`, category: 'read' }));
  }

  async stop(): Promise<void> {
    this.watcher?.close();
    if (this.timer) clearTimeout(this.timer);
    await this.reading;
  }

  status(): SourceStatus {
    let complete = this.dirReadable;
    for (const st of this.files.values()) if (!st.readable) complete = false;
    return { synced: this.published, complete };
  }

  /** The objects in force: every file's, a duplicate's from the file that owns it. */
  private objects(): Map<string, Obj> {
    const out = new Map<string, Obj>();
    for (const file of [...this.files.keys()].sort()) {
      for (const [id, o] of this.files.get(file)!.objects) if (this.fileOf.get(id) === file) out.set(id, o);
    }
    return out;
  }

  /**
   * Sends what changed since the last publish: an event per object added,
   * changed or gone (a changed file is parsed anew, so its objects are
   * compared by value), then one without an event for the status.
   */
  private publish(): void {
    const now = this.objects();
    for (const [key, o] of now) {
      const before = this.sent.get(key);
      if (before && isDeepStrictEqual(before.value, o.value)) {
        now.set(key, before);
        continue;
      }
      this.onChange({ kind: o.kind, type: before ? 'update' : 'add', id: eventId(o), object: o.value } as SourceEvent);
    }
    for (const [key, o] of this.sent) {
      if (!now.has(key)) this.onChange({ kind: o.kind, type: 'delete', id: eventId(o) });
    }
    this.sent = now;
    this.published = true;
    this.onChange();
  }

  /** Re-reads the directory now; resolves once the changes have been sent. */
  async reload(): Promise<void> {
    await this.readAll();
    this.publish();
  }

  private schedule(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.readAll()
        .then(() => this.publish())
        .catch((err: unknown) => this.report({ where: this.opts.dir, reason: `re-read failed: ${(err as Error)?.message ?? String(err)}`, category: 'error' }));
    }, this.opts.debounceMs ?? 50);
  }

  /** Reports a problem (a log line and a count, once per read that finds it). */
  private report(p: Problem): void {
    this.opts.onProblem?.(p);
  }

  private readAll(): Promise<void> {
    // A read that failed (it should not: doReadAll reports what it meets)
    // must not stop the reads after it, which chain on this promise.
    const read = this.reading.then(() => this.doReadAll());
    this.reading = read.catch((err: unknown) => this.report({ where: this.opts.dir, reason: `read failed: ${(err as Error)?.message ?? String(err)}`, category: 'error' }));
    return read;
  }

  /**
   * Re-reads the directory: every file that changed since its last read
   * (by inode, size and change times), so a file costs its parse once.
   */
  private async doReadAll(): Promise<void> {
    let names: string[];
    try {
      names = (await readdir(this.opts.dir)).filter((n) => MANIFEST.test(n)).sort();
    } catch (err) {
      // The directory itself is gone or unreadable: keep everything.
      this.report({ where: this.opts.dir, reason: `cannot list directory: ${(err as Error).message}`, category: 'read' });
      this.dirReadable = false;
      return;
    }
    this.dirReadable = true;
    const present = new Set(names.map((n) => path.join(this.opts.dir, n)));
    for (const file of [...this.files.keys()]) if (!present.has(file)) this.files.delete(file);
    let budget = MAX_DIR_BYTES;
    let index = 0;
    for (const file of present) {
      if (index++ >= MAX_FILES) {
        this.keepPrevious(file, `the directory has ${present.size} manifest files, more than the ${MAX_FILES} lbctl reads`, 'limit');
        continue;
      }
      try {
        budget -= await this.readFile(file, budget);
      } catch (err) {
        // The boundary: nothing in a file may stop the source.
        this.keepPrevious(file, `cannot be read: ${(err as Error)?.message ?? String(err)}`, 'error');
      }
    }

    this.settleDuplicates();
  }

  /** Picks the file in force for each object defined more than once, and reports the others. */
  private settleDuplicates(): void {
    const definers = new Map<string, string[]>();
    for (const file of [...this.files.keys()].sort()) {
      for (const id of this.files.get(file)!.objects.keys()) {
        const list = definers.get(id);
        if (list) list.push(file);
        else definers.set(id, [file]);
      }
    }
    const fileOf = new Map<string, string>();
    const reported = this.duplicates;
    this.duplicates = new Set();
    for (const [id, files] of definers) {
      if (files.length === 1) {
        fileOf.set(id, files[0]!);
        continue;
      }
      const had = this.fileOf.get(id);
      const owner = had !== undefined && files.includes(had) ? had : files[files.length - 1]!;
      fileOf.set(id, owner);
      for (const file of files) {
        if (file === owner) continue;
        const p: Problem = { where: file, reason: `${id} is also defined in ${owner}; the one in ${owner} is used`, category: 'duplicate', object: id };
        const key = `${p.where}|${p.reason}`;
        this.duplicates.add(key);
        // Reported when it appears, not on every read of the directory.
        if (!reported.has(key)) this.report(p);
      }
    }
    this.fileOf = fileOf;
  }

  /**
   * Reports a file that could not be read, and keeps the objects of its last
   * good read. With the file's stamp, it is not tried again until it
   * changes; without, on the next read of the directory.
   */
  private keepPrevious(file: string, reason: string, category: Problem['category'], stamp?: string): void {
    const prev = this.files.get(file);
    this.report({ where: file, reason: prev?.readable ? `${reason} (keeping the objects of its last good read)` : reason, category });
    this.files.set(file, { objects: prev?.objects ?? new Map(), readable: prev?.readable ?? false, bytes: prev?.bytes ?? 0, ...(stamp ? { stamp } : {}) });
  }

  /** Reads one file within `budget` bytes of the directory's; returns the bytes it took. */
  private async readFile(file: string, budget: number): Promise<number> {
    const prev = this.files.get(file);
    let read;
    let stamp: string;
    try {
      const st = await stat(file, { bigint: true });
      stamp = `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;
      if (prev?.stamp === stamp) return prev.bytes; // unchanged since its last read
      read = await readBounded(file, Math.min(MAX_FILE_BYTES, budget));
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      if (e.code === 'ENOENT') {
        this.files.delete(file);
        return 0;
      }
      this.keepPrevious(file, `cannot read: ${e.message}`, 'read');
      return 0;
    }
    if ('refused' in read) {
      // Refused for the directory's budget: tried again next time (others may have shrunk).
      const forBudget = read.category === 'limit' && budget < MAX_FILE_BYTES;
      const reason = forBudget ? `${read.refused} (the directory's files together may hold ${MAX_DIR_BYTES} bytes)` : read.refused;
      this.keepPrevious(file, reason, read.category, forBudget || read.category === 'read' ? undefined : stamp);
      return 0;
    }
    const parsed = parseManifests(read.text, file.endsWith('.json') ? 'json' : 'yaml');
    const objects = new Map<string, Obj>();
    const problems = new FileProblems(file, (p) => this.report(p));
    for (const e of parsed.entries) {
      if ('reason' in e) problems.add({ where: e.where ? `${file}: ${e.where}` : file, reason: e.reason, category: e.category });
      else this.readObject(e.value, `${file}: ${e.where}`, objects, prev, problems, e.beyondLimits);
    }
    problems.summarize();
    // A part that is not YAML at all may have held anything: keep what
    // this file yielded before, on top of what still parses.
    if (parsed.broken && prev) for (const [id, o] of prev.objects) if (!objects.has(id)) objects.set(id, o);
    const bytes = Buffer.byteLength(read.text);
    this.files.set(file, { objects, readable: !parsed.broken || (prev?.readable ?? false), stamp, bytes });
    return bytes;
  }

  private readObject(item: unknown, where: string, into: Map<string, Obj>, prev: FileState | undefined, problems: FileProblems, beyondLimits?: string): void {
    const kind = typeof item === 'object' && item !== null ? (item as { kind?: unknown }).kind : undefined;
    if (kind !== 'Service' && kind !== 'EndpointSlice' && kind !== 'Node') {
      if (beyondLimits) problems.add({ where, reason: beyondLimits, category: 'limit' });
      else if (typeof kind !== 'string') problems.add({ where, reason: 'not a Kubernetes object (no kind)', category: 'invalid' });
      return; // other kinds (Deployments, ConfigMaps…) are not ours
    }
    const id = rawIdentity(kind, item);
    const keepLast = (reason: string, category: Problem['category']): void => {
      const last = id ? prev?.objects.get(id) : undefined;
      if (id && last) into.set(id, last);
      problems.add({ where, reason: last ? `${reason} (keeping its last valid version)` : reason, category, kind, ...(id ? { object: id } : {}) });
    };
    if (beyondLimits) return keepLast(`${kind}: ${beyondLimits}`, 'limit');
    let v;
    try {
      const apiVersion = (item as { apiVersion?: unknown }).apiVersion;
      if (kind === 'EndpointSlice' && apiVersion !== 'discovery.k8s.io/v1') {
        return keepLast(`EndpointSlice apiVersion ${show(apiVersion)} is not discovery.k8s.io/v1`, 'invalid');
      }
      v = kind === 'Service' ? validateService(item) : kind === 'EndpointSlice' ? validateEndpointSlice(item) : validateNode(item);
    } catch (err) {
      // The boundary: a validator that throws reports this object, nothing more.
      return keepLast(`${kind}: cannot be read: ${(err as Error)?.message ?? String(err)}`, 'error');
    }
    if (v.ok) {
      const ns = 'namespace' in v.value ? v.value.namespace : '';
      into.set(identity(kind, ns, v.value.name), { kind, value: v.value } as Obj);
      // An invalid readiness probe is bad input too, but costs only the
      // probe: the service is served from its endpoint conditions.
      const probeProblem = kind === 'Service' ? (v.value as Service).probeProblem : undefined;
      if (probeProblem !== undefined) problems.add({ where, reason: probeProblem, category: 'invalid', kind, ...(id ? { object: id } : {}) });
      return;
    }
    keepLast(v.reason, 'invalid');
  }
}
