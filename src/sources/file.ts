// The standalone source: a directory of Kubernetes manifests (Service and
// EndpointSlice, several YAML documents per file, or List objects), watched
// and re-read on change. A file that cannot be parsed keeps the objects it
// last yielded; an invalid object keeps its last valid version. Every
// problem names the file, the document index and the reason.
import { watch, type FSWatcher } from 'node:fs';
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { parseAllDocuments } from 'yaml';
import { validateEndpointSlice, validateService, type EndpointSlice, type Service } from '../model/k8s.js';
import type { Problem, Source, SourceEvent, SourceStatus } from './source.js';

const MANIFEST = /\.(ya?ml|json)$/;
/** Files larger than this are refused (a manifest directory is not a data store). */
export const MAX_FILE_BYTES = 16 * 1024 * 1024;

type Obj = { kind: 'Service'; value: Service } | { kind: 'EndpointSlice'; value: EndpointSlice };

interface FileState {
  /** Objects of the last read, by "Kind ns/name". */
  objects: Map<string, Obj>;
  /** False when the last read failed as a whole and there was no earlier good read. */
  readable: boolean;
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

function rawIdentity(kind: string, doc: unknown): string | undefined {
  const meta = (doc as { metadata?: { name?: unknown; namespace?: unknown } } | null)?.metadata;
  if (!meta || typeof meta.name !== 'string') return undefined;
  return identity(kind, typeof meta.namespace === 'string' ? meta.namespace : 'default', meta.name);
}

export class FileSource implements Source {
  readonly name: string;
  private readonly files = new Map<string, FileState>();
  private current: Problem[] = [];
  private dirReadable = true;
  private watcher: FSWatcher | undefined;
  private timer: NodeJS.Timeout | undefined;
  private reading: Promise<void> = Promise.resolve();
  private onChange: (e?: SourceEvent) => void = () => {};
  /** The objects last sent to onChange, by "Kind ns/name". */
  private sent = new Map<string, Obj>();
  private published = false;

  constructor(private readonly opts: FileSourceOptions) {
    this.name = `file:${opts.dir}`;
  }

  async start(onChange: (e?: SourceEvent) => void): Promise<void> {
    this.onChange = onChange;
    await this.readAll();
    this.publish();
    this.watcher = watch(this.opts.dir, { persistent: true }, () => this.schedule());
    this.watcher.on('error', (err) => this.report({ where: this.opts.dir, reason: `watch failed: ${err.message}` }));
  }

  async stop(): Promise<void> {
    this.watcher?.close();
    if (this.timer) clearTimeout(this.timer);
    await this.reading;
  }

  problems(): readonly Problem[] {
    return this.current;
  }

  status(): SourceStatus {
    let complete = this.dirReadable;
    for (const st of this.files.values()) if (!st.readable) complete = false;
    return { synced: this.published, complete };
  }

  /** The objects in force: every file's, a later file's winning a duplicate. */
  private objects(): Map<string, Obj> {
    const out = new Map<string, Obj>();
    for (const file of [...this.files.keys()].sort()) for (const [id, o] of this.files.get(file)!.objects) out.set(id, o);
    return out;
  }

  /**
   * Sends what changed since the last publish: an event per object added,
   * changed or gone (each re-read parses every file anew, so equal objects
   * are compared by value), then one without an event for the status.
   */
  private publish(): void {
    const now = this.objects();
    for (const [key, o] of now) {
      const before = this.sent.get(key);
      if (before && isDeepStrictEqual(before.value, o.value)) {
        now.set(key, before);
        continue;
      }
      const id = `${o.value.namespace}/${o.value.name}`;
      this.onChange({ kind: o.kind, type: before ? 'update' : 'add', id, object: o.value } as SourceEvent);
    }
    for (const [key, o] of this.sent) {
      if (!now.has(key)) this.onChange({ kind: o.kind, type: 'delete', id: `${o.value.namespace}/${o.value.name}` });
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
      void this.readAll().then(() => this.publish());
    }, this.opts.debounceMs ?? 50);
  }

  private report(p: Problem): void {
    this.current.push(p);
    this.opts.onProblem?.(p);
  }

  private readAll(): Promise<void> {
    this.reading = this.reading.then(() => this.doReadAll());
    return this.reading;
  }

  private async doReadAll(): Promise<void> {
    this.current = [];
    let names: string[];
    try {
      names = (await readdir(this.opts.dir)).filter((n) => MANIFEST.test(n)).sort();
    } catch (err) {
      // The directory itself is gone or unreadable: keep everything.
      this.report({ where: this.opts.dir, reason: `cannot list directory: ${(err as Error).message}` });
      this.dirReadable = false;
      return;
    }
    this.dirReadable = true;
    const present = new Set(names.map((n) => path.join(this.opts.dir, n)));
    for (const file of [...this.files.keys()]) if (!present.has(file)) this.files.delete(file);
    for (const file of present) await this.readFile(file);

    const seen = new Map<string, string>();
    for (const file of [...this.files.keys()].sort()) {
      for (const id of this.files.get(file)!.objects.keys()) {
        const first = seen.get(id);
        if (first) this.report({ where: file, reason: `${id} is also defined in ${first}; the one in ${file} is used` });
        seen.set(id, file);
      }
    }
  }

  private async readFile(file: string): Promise<void> {
    const prev = this.files.get(file);
    const keepPrevious = (reason: string): void => {
      this.report({ where: file, reason: prev?.readable ? `${reason} (keeping the objects of its last good read)` : reason });
      this.files.set(file, { objects: prev?.objects ?? new Map(), readable: prev?.readable ?? false });
    };

    let text: string;
    try {
      text = await readFile(file, 'utf8');
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      if (e.code === 'ENOENT') {
        this.files.delete(file);
        return;
      }
      return keepPrevious(`cannot read: ${e.message}`);
    }
    if (Buffer.byteLength(text) > MAX_FILE_BYTES) return keepPrevious(`larger than ${MAX_FILE_BYTES} bytes`);

    let docs;
    try {
      docs = parseAllDocuments(text, { prettyErrors: true });
    } catch (err) {
      return keepPrevious(`not YAML: ${(err as Error).message}`);
    }
    const list = Array.isArray(docs) ? docs : [docs];
    const objects = new Map<string, Obj>();
    let broken = false;
    for (const [index, doc] of list.entries()) {
      const where = `${file}: document ${index}`;
      if (doc.errors.length > 0) {
        this.report({ where, reason: `YAML error: ${doc.errors[0]!.message.split('\n')[0]}` });
        broken = true;
        continue;
      }
      const js: unknown = doc.toJS({ maxAliasCount: 100 });
      if (js === null || js === undefined) continue;
      const items =
        typeof js === 'object' && (js as { kind?: unknown }).kind === 'List' && Array.isArray((js as { items?: unknown }).items)
          ? ((js as { items: unknown[] }).items)
          : [js];
      for (const [i, item] of items.entries()) {
        const at = items.length > 1 || item !== js ? `${where}, item ${i}` : where;
        this.readObject(item, at, objects, prev);
      }
    }
    // A document that is not YAML at all may have held anything: keep what
    // this file yielded before, on top of what still parses.
    if (broken && prev) for (const [id, o] of prev.objects) if (!objects.has(id)) objects.set(id, o);
    this.files.set(file, { objects, readable: !broken || (prev?.readable ?? false) });
  }

  private readObject(item: unknown, where: string, into: Map<string, Obj>, prev: FileState | undefined): void {
    const kind = (item as { kind?: unknown } | null)?.kind;
    if (kind !== 'Service' && kind !== 'EndpointSlice') {
      if (typeof kind !== 'string') this.report({ where, reason: 'not a Kubernetes object (no kind)' });
      return; // other kinds (Deployments, ConfigMaps…) are not ours
    }
    const apiVersion = (item as { apiVersion?: unknown }).apiVersion;
    if (kind === 'EndpointSlice' && apiVersion !== 'discovery.k8s.io/v1') {
      this.report({ where, reason: `EndpointSlice apiVersion ${JSON.stringify(apiVersion)} is not discovery.k8s.io/v1` });
      return;
    }
    const v = kind === 'Service' ? validateService(item) : validateEndpointSlice(item);
    if (v.ok) {
      const id = identity(kind, v.value.namespace, v.value.name);
      into.set(id, { kind, value: v.value } as Obj);
      return;
    }
    const id = rawIdentity(kind, item);
    const last = id ? prev?.objects.get(id) : undefined;
    if (id && last) {
      into.set(id, last);
      this.report({ where, reason: `${v.reason} (keeping its last valid version)` });
    } else {
      this.report({ where, reason: v.reason });
    }
  }
}
