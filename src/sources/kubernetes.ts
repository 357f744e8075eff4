// The Kubernetes source: client-go's Reflector pattern for Services,
// EndpointSlices (discovery.k8s.io/v1) and this node's Node: list (in pages),
// then watch from the list's resourceVersion with bookmarks, through
// @kubernetes/client-node's KubeConfig (auth, TLS, proxies). Lists and
// watches are plain GETs made the way client-node's Watch makes requests
// (node-fetch with the KubeConfig's options), and the objects stay plain
// JSON: client-node's typed
// API classes would bring its generated APIs, models and serializer into
// the agent's bundle (6.0 MB of code instead of 3.0; RSS at 10,000 services
// 172 instead of 165 MiB, docs/benchmarks.md "Memory"), only for the
// validators to read the objects as JSON, as they read manifests. There is no
// informer cache: each object is validated as it arrives and only its
// validated form is kept (the raw objects of 10,000 services are several
// times larger than what lbctl needs). A watch that ends normally is resumed
// from the last resourceVersion seen (bookmarks keep it fresh); one that
// ends in error is retried with exponential backoff and jitter; 410 Gone
// (the version is compacted away) relists, and a relist deletes what is no
// longer there, so no deletion is lost. A bad object is reported and
// counted, and the last valid version of it (if any) stays in force.
// Handlers only record; the agent's runner turns changes into syncs.
//
// Services and EndpointSlices gate the first sync; this node's Node does
// not. The Node only gives the zone for topology hints and tells whether the
// node is being deleted: the node's name, which internalTrafficPolicy Local
// and node hints need, is the agent's own (--node-name). Once the other two
// have listed, the first sync waits at most nodeSyncTimeoutMs more for the
// Node, so that a start with the Node at hand programs its zone from the
// first write; then the source counts as synced without it, says why once,
// and the Node reflector keeps retrying. kube-proxy gates its first sync on
// Services and EndpointSlices alone (isInitialized) and takes the node's
// labels whenever they come; Cilium tries for its own Node a bounded number
// of times and goes on without it when nothing requires it.
//
// The API server's input is bounded like a file's: a watch event longer than
// MAX_WATCH_EVENT_BYTES or a list page over MAX_LIST_PAGE_BYTES is refused
// (client-node's Watch buffers a line of any length, and drops lines that
// are not JSON and exceptions of its callback without a word); a line that
// is not JSON ends the watch, which resumes from the last version seen, so
// no event is lost unseen; a validator that throws reports that object.
import { KubeConfig } from '@kubernetes/client-node';
import fetch, { type Response } from 'node-fetch';
import { DEFAULT_NODE_SYNC_TIMEOUT_MS } from '../defaults.js';
import { ConfigError } from '../errors.js';
import {
  HEADLESS_LABEL,
  show,
  validateEndpointSlice,
  validateNode,
  validateService,
  SERVICE_PROXY_NAME_LABEL,
  type EndpointSlice,
  type Node,
  type Service,
  type Validated,
} from '../model/k8s.js';
import { MAX_LIST_PAGE_BYTES, MAX_WATCH_EVENT_BYTES } from './limits.js';
import type { Problem, Source, SourceEvent, SourceStatus } from './source.js';

/**
 * kube-proxy's informer filters (cmd/kube-proxy/app/server.go: one label
 * selector for its Service and EndpointSlice informers alike): other proxies' services
 * and headless ones are not ours.
 */
export const SERVICE_LABEL_SELECTOR = `!${SERVICE_PROXY_NAME_LABEL},!${HEADLESS_LABEL}`;
export const SLICE_LABEL_SELECTOR = SERVICE_LABEL_SELECTOR;

export interface KubernetesSourceOptions {
  /** Path of a kubeconfig; undefined: in-cluster config (service account). */
  readonly kubeconfig?: string;
  /** The API server's URL, replacing the kubeconfig's or the in-cluster one (kube-proxy's --master). */
  readonly master?: string;
  readonly nodeName: string;
  /**
   * Watch every Node, not only this one (the health mesh probes them all).
   * Each is sent as a Node event; the agent takes this node's for itself.
   */
  readonly allNodes?: boolean;
  readonly onProblem?: (p: Problem) => void;
  readonly onWatchError?: (kind: string, err: unknown, retryInMs: number) => void;
  /** Backoff between informer restarts. */
  readonly backoffMinMs?: number;
  readonly backoffMaxMs?: number;
  /**
   * How long the first sync waits for this node's Node once Services and
   * EndpointSlices have listed (default DEFAULT_NODE_SYNC_TIMEOUT_MS; 0: not at all).
   */
  readonly nodeSyncTimeoutMs?: number;
  /**
   * The source goes on without this node's Node: it could not be listed in
   * time (`reason` names the last error), or the cluster has none of that name.
   * Called once, until the Node arrives.
   */
  readonly onNodeMissing?: (reason: string) => void;
  /** This node's Node arrived after onNodeMissing. */
  readonly onNodeArrived?: (node: Node) => void;
}

type Kind = SourceEvent['kind'];

/** namespace/name; a cluster-scoped object (a Node): its name. Anything else in metadata gives ''. */
function objectId(meta: unknown): string {
  if (typeof meta !== 'object' || meta === null) return '';
  const { namespace, name } = meta as { namespace?: unknown; name?: unknown };
  const n = typeof name === 'string' && name.length <= 253 ? name : '';
  return typeof namespace === 'string' && namespace !== '' && namespace.length <= 63 ? `${namespace}/${n}` : n;
}

interface RawObject {
  metadata?: { namespace?: string; name?: string; resourceVersion?: string };
}

/** One page of a list: its items and where the next page starts. */
interface Page {
  readonly items: readonly RawObject[];
  readonly resourceVersion: string;
  readonly continue?: string;
}

/** List pages of this size (client-go's pager default). */
const PAGE_SIZE = 500;

/** A list that takes longer than this is abandoned and retried with backoff. */
const LIST_TIMEOUT_MS = 60_000;

class GoneError extends Error {
  constructor(message: string) {
    super(`410 Gone: ${message}`);
  }
}

/** One resource: its list+watch loop and its validated objects. */
class Reflector<T> {
  readonly items = new Map<string, T>();
  synced = false;
  /**
   * The last list or watch error, until a list or watch succeeds again: the
   * reason given when the source goes on without this kind, and a note of
   * the source's status meanwhile (an RBAC rule missing, a token refused).
   */
  lastError: string | undefined;
  private resourceVersion: string | undefined;
  private failures = 0;
  private stopped = false;
  private timer: NodeJS.Timeout | undefined;
  private wake: (() => void) | undefined;
  private abort: AbortController | undefined;
  /** Aborts a list in flight when the source stops. */
  private readonly listAbort = new AbortController();

  constructor(
    readonly kind: Kind,
    private readonly kc: KubeConfig,
    private readonly path: string,
    private readonly selectors: { labelSelector?: string; fieldSelector?: string },
    private readonly validate: (o: unknown) => Validated<T>,
    private readonly opts: KubernetesSourceOptions,
    private readonly changed: (e?: SourceEvent) => void,
  ) {}

  start(): void {
    void this.loop();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.wake?.();
    this.abort?.abort();
    this.listAbort.abort();
  }

  private async loop(): Promise<void> {
    while (!this.stopped) {
      try {
        if (this.resourceVersion === undefined) await this.relist();
        await this.watchOnce();
        this.failures = 0;
      } catch (err) {
        if (this.stopped) return;
        if (err instanceof GoneError) this.resourceVersion = undefined;
        await this.backoff(err);
      }
    }
  }

  /** Lists every page; what the list no longer holds is deleted. */
  private async relist(): Promise<void> {
    const seen = new Set<string>();
    let cont: string | undefined;
    let rv = '';
    do {
      const page = await listPage(this.kc, this.path, { ...this.selectors, limit: PAGE_SIZE, continue: cont }, this.listAbort.signal);
      if (this.stopped) return;
      for (const o of page.items) {
        seen.add(objectId((o as RawObject | null)?.metadata));
        this.upsert(o);
      }
      cont = page.continue || undefined;
      rv = page.resourceVersion;
    } while (cont);
    for (const id of this.items.keys()) if (!seen.has(id)) this.remove(id);
    this.resourceVersion = rv;
    this.lastError = undefined;
    if (!this.synced) {
      this.synced = true;
      this.changed();
    }
  }

  /** One watch from the last resourceVersion; resolves when the server ends it. */
  private async watchOnce(): Promise<void> {
    const params = {
      ...this.selectors,
      watch: 'true',
      resourceVersion: this.resourceVersion,
      allowWatchBookmarks: 'true',
      // As client-go: the server ends the watch after 5-10 minutes, and it is resumed.
      timeoutSeconds: Math.round(300 * (1 + Math.random())),
    };
    const abort = new AbortController();
    this.abort = abort;
    // A server that goes silent (no event, no bookmark, no end) past the
    // watch's own timeout is given up on, and the watch started again.
    let silent = false;
    const deadline = setTimeout(() => {
      silent = true;
      abort.abort();
    }, (params.timeoutSeconds + 60) * 1000);
    try {
      const res = await apiGet(this.kc, this.path, params, abort.signal);
      if (res.status !== 200) throw await httpError(res, `watch ${this.path}`);
      this.lastError = undefined;
      await readLines(res.body as unknown as AsyncIterable<Buffer>, MAX_WATCH_EVENT_BYTES, (line) => {
        if (this.stopped) return false;
        let event: unknown;
        try {
          event = JSON.parse(line);
        } catch (err) {
          throw new Error(`watch ${this.path}: the server sent a line that is not JSON (${line.length} bytes: ${(err as Error).message}); watching again from version ${this.resourceVersion}`);
        }
        return this.onWatchEvent(event);
      });
    } catch (err) {
      if (this.stopped) return;
      if (silent) throw new Error(`watch ${this.path}: the server did not end the watch within ${params.timeoutSeconds + 60} s of its ${params.timeoutSeconds} s timeout`);
      throw err;
    } finally {
      clearTimeout(deadline);
      abort.abort(); // ends the request if an error left it open
      this.abort = undefined;
    }
  }

  /** Applies one watch event (any JSON value at all); false ends the watch. */
  private onWatchEvent(line: unknown): boolean {
    if (typeof line !== 'object' || line === null || Array.isArray(line)) {
      this.problem(`watch ${this.path}`, `an event that is not an object: ${show(line)}`, 'invalid');
      return true;
    }
    const event = line as { type?: unknown; object?: unknown };
    const obj = event.object as (RawObject & { code?: unknown; message?: unknown }) | null | undefined;
    if (typeof obj !== 'object' || obj === null) {
      this.problem(`watch ${this.path}`, `a ${show(event.type)} event without an object`, 'invalid');
      return true;
    }
    switch (event.type) {
      case 'ADDED':
      case 'MODIFIED':
        this.upsert(obj);
        break;
      case 'DELETED':
        this.remove(objectId(obj.metadata));
        break;
      case 'BOOKMARK':
        break;
      case 'ERROR': {
        const message = typeof obj.message === 'string' ? obj.message.slice(0, 300) : '';
        throw obj.code === 410 ? new GoneError(message || 'resource version too old') : new Error(`watch error ${show(obj.code)}: ${message}`);
      }
      default:
        this.problem(`watch ${this.path}`, `an event of unknown type ${show(event.type)}`, 'invalid');
        return true;
    }
    const rv = (obj.metadata as { resourceVersion?: unknown } | undefined)?.resourceVersion;
    if (typeof rv === 'string' && rv !== '') this.resourceVersion = rv;
    return true;
  }

  private problem(where: string, reason: string, category: Problem['category'], object?: string): void {
    this.opts.onProblem?.({ where, reason, category, kind: this.kind, ...(object ? { object } : {}) });
  }

  /**
   * Validates and records one object. The boundary for API input: whatever
   * the object holds, and whatever a validator does with it, it is reported
   * and counted, and its last valid version stays.
   */
  private upsert(o: RawObject): void {
    let id = '';
    let v: Validated<T>;
    let category: Problem['category'] = 'invalid';
    try {
      id = objectId((o as RawObject | null)?.metadata);
      v = this.validate(o);
    } catch (err) {
      v = { ok: false, reason: `${this.kind}: cannot be read: ${(err as Error)?.message ?? String(err)}` };
      category = 'error';
    }
    const had = this.items.has(id);
    if (!v.ok) {
      const object = id ? `${this.kind} ${id}` : undefined;
      // An object without a usable name is named by where it came from.
      const where = object ?? `${this.kind} without a name, from ${this.path}`;
      this.problem(where, had ? `${v.reason} (keeping its last valid version)` : v.reason, category, object);
      return;
    }
    this.items.set(id, v.value);
    this.changed({ kind: this.kind, type: had ? 'update' : 'add', id, object: v.value } as SourceEvent);
  }

  private remove(id: string): void {
    if (this.items.delete(id)) this.changed({ kind: this.kind, type: 'delete', id });
  }

  private backoff(err: unknown): Promise<void> {
    const min = this.opts.backoffMinMs ?? 500;
    const max = this.opts.backoffMaxMs ?? 30_000;
    const base = Math.min(max, min * 2 ** this.failures++);
    const delay = Math.round(base / 2 + Math.random() * (base / 2)); // "equal jitter"
    this.lastError = (err as Error)?.message ?? String(err);
    this.opts.onWatchError?.(this.kind, err, delay);
    return new Promise((resolve) => {
      this.wake = resolve;
      this.timer = setTimeout(resolve, delay);
    });
  }
}

type Query = Record<string, string | number | undefined>;

/** GET `path` with `query`, authenticated as client-node's Watch does (the KubeConfig's TLS, tokens, proxies). */
async function apiGet(kc: KubeConfig, path: string, query: Query, signal: AbortSignal, maxBytes = 0): Promise<Response> {
  const server = kc.getCurrentCluster()?.server;
  if (!server) throw new Error('no current cluster in the kubeconfig');
  const url = new URL(server + path);
  for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, String(v));
  const init = await kc.applyToFetchOptions({});
  init.method = 'GET';
  init.signal = signal as NonNullable<typeof init.signal>;
  // node-fetch's cap on a body read with text() or json(): past it, they fail.
  (init as { size?: number }).size = maxBytes;
  return fetch(url, init);
}

/** An answer other than 200 as an error naming the request; 410 as GoneError. */
async function httpError(res: Response, what: string): Promise<Error> {
  const body = await res.text().catch(() => '');
  let message = body.slice(0, 300);
  try {
    const status = JSON.parse(body) as { message?: unknown };
    if (typeof status.message === 'string') message = status.message.slice(0, 300);
  } catch {
    // not a Status object: keep the text
  }
  const text = `${what}: HTTP ${res.status}${message ? `: ${message}` : ''}`;
  if (res.status === 410) return new GoneError(text);
  return Object.assign(new Error(text), { statusCode: res.status });
}

/**
 * Calls `onLine` with each line of a stream, without the newline; stops
 * when it returns false. A line longer than `maxBytes` is an error: what
 * the stream holds is bounded by the cap, not by the sender.
 */
async function readLines(body: AsyncIterable<Buffer>, maxBytes: number, onLine: (line: string) => boolean): Promise<void> {
  let parts: Buffer[] = [];
  let size = 0;
  const tooLong = (): Error => new Error(`a line longer than ${maxBytes} bytes (the most lbctl reads as one event)`);
  for await (const chunk of body) {
    let from = 0;
    for (let nl = chunk.indexOf(10, from); nl >= 0; nl = chunk.indexOf(10, from)) {
      const piece = chunk.subarray(from, nl);
      from = nl + 1;
      if (size + piece.length > maxBytes) throw tooLong();
      const line = size === 0 ? piece.toString('utf8') : Buffer.concat([...parts, piece]).toString('utf8');
      parts = [];
      size = 0;
      if (line.trim() !== '' && !onLine(line)) return;
    }
    if (from < chunk.length) {
      if (size + chunk.length - from > maxBytes) throw tooLong();
      parts.push(chunk.subarray(from));
      size += chunk.length - from;
    }
  }
  if (size > 0) onLine(Buffer.concat(parts).toString('utf8'));
}

/**
 * One page of a list: GET `path` with the selectors, limit and continue
 * token. A 410 (an expired continue token) relists from the start.
 */
async function listPage(kc: KubeConfig, path: string, query: Query, stop: AbortSignal): Promise<Page> {
  const timeout = AbortSignal.timeout(LIST_TIMEOUT_MS);
  try {
    const res = await apiGet(kc, path, query, AbortSignal.any([stop, timeout]), MAX_LIST_PAGE_BYTES);
    if (res.status !== 200) throw await httpError(res, `list ${path}`);
    const list = (await res.json()) as { items?: unknown; metadata?: { resourceVersion?: unknown; continue?: unknown } } | null;
    if (typeof list !== 'object' || list === null || (list.items != null && !Array.isArray(list.items))) throw new Error(`list ${path}: not a list`);
    const meta = typeof list.metadata === 'object' && list.metadata !== null ? list.metadata : {};
    return {
      items: (list.items ?? []) as RawObject[],
      resourceVersion: typeof meta.resourceVersion === 'string' ? meta.resourceVersion : '',
      ...(typeof meta.continue === 'string' && meta.continue !== '' ? { continue: meta.continue } : {}),
    };
  } catch (err) {
    // node-fetch reports every abort as "The user aborted a request".
    if (timeout.aborted && !stop.aborted) throw new Error(`list ${path}: no answer in ${LIST_TIMEOUT_MS / 1000} s`, { cause: err });
    if ((err as { type?: string }).type === 'max-size') throw new Error(`list ${path}: a page larger than ${MAX_LIST_PAGE_BYTES} bytes`, { cause: err });
    throw err;
  }
}

/**
 * Everything this source asks of the API server: list and watch, nothing
 * else (no get, no writes, no events). The reflectors' paths are built from
 * this table, so it is the whole of the agent's RBAC needs: deploy/rbac.yaml
 * is checked against it (test/deploy/manifests.ts), and the test API server
 * enforces that ClusterRole on the agent (test/deploy/in-cluster.ts).
 */
export const API_ACCESS = {
  Service: { group: '', version: 'v1', resource: 'services', verbs: ['list', 'watch'] },
  EndpointSlice: { group: 'discovery.k8s.io', version: 'v1', resource: 'endpointslices', verbs: ['list', 'watch'] },
  Node: { group: '', version: 'v1', resource: 'nodes', verbs: ['list', 'watch'] },
} as const satisfies Record<Kind, { group: string; version: string; resource: string; verbs: readonly string[] }>;

/** The collection path of a kind, as API_ACCESS names it. */
function collectionPath(kind: Kind): string {
  const a = API_ACCESS[kind];
  return a.group === '' ? `/api/${a.version}/${a.resource}` : `/apis/${a.group}/${a.version}/${a.resource}`;
}

/**
 * The API server's connection: a kubeconfig file, else the in-cluster
 * config (the pod's service-account token and CA, KUBERNETES_SERVICE_HOST);
 * `master` replaces the server's URL in either, as kube-proxy's --master
 * does: a node bootstrapping a cluster reaches the API server directly while
 * the kubernetes Service's VIP is not served yet (kube-proxy, or lbctl, is
 * what serves it). With `master` alone outside a pod: no credentials.
 */
export function loadKubeConfig(opts: { kubeconfig?: string; master?: string }): KubeConfig {
  const kc = new KubeConfig();
  const inCluster = Boolean(process.env.KUBERNETES_SERVICE_HOST && process.env.KUBERNETES_SERVICE_PORT);
  try {
    if (opts.kubeconfig) kc.loadFromFile(opts.kubeconfig);
    else if (inCluster) kc.loadFromCluster();
    else if (opts.master) kc.loadFromClusterAndUser({ name: 'master', server: opts.master, skipTLSVerify: false }, { name: 'anonymous' });
    else throw new Error('no kubeconfig, no --master, and not in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT unset)');
  } catch (err) {
    throw new ConfigError(`cannot load ${opts.kubeconfig ? `kubeconfig ${opts.kubeconfig}` : 'the in-cluster config'}: ${(err as Error).message}`);
  }
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new ConfigError(`${opts.kubeconfig ?? 'in-cluster config'}: no current cluster`);
  if (opts.master) {
    let url: URL;
    try {
      url = new URL(opts.master);
    } catch {
      throw new ConfigError(`--master ${JSON.stringify(opts.master)}: not a URL (such as https://10.0.0.1:6443)`);
    }
    if (url.protocol !== 'https:' && url.protocol !== 'http:') throw new ConfigError(`--master ${opts.master}: expected an http or https URL`);
    const server = opts.master.replace(/\/+$/, '');
    kc.loadFromOptions({
      clusters: kc.clusters.map((c) => (c.name === cluster.name ? { ...c, server } : c)),
      users: kc.users,
      contexts: kc.contexts,
      currentContext: kc.currentContext,
    });
  }
  return kc;
}

export class KubernetesSource implements Source {
  readonly name: string;
  private readonly kc: KubeConfig;
  private services!: Reflector<Service>;
  private slices!: Reflector<EndpointSlice>;
  private nodes!: Reflector<Node>;
  private onChange: (e?: SourceEvent) => void = () => {};
  /** Counts down the Node's grace once Services and EndpointSlices have listed. */
  private nodeTimer: NodeJS.Timeout | undefined;
  /** The grace ran out before the Node list answered: synced without it. */
  private nodeWaitOver = false;
  /** The Node list's first answer was seen (and reported if it held no Node). */
  private nodeListSeen = false;
  /** onNodeMissing was called and the Node has not arrived since. */
  private nodeMissing = false;
  private nodeMissingReason = '';
  private stopped = false;

  constructor(private readonly opts: KubernetesSourceOptions) {
    this.kc = loadKubeConfig(opts);
    this.name = `kubernetes:${this.kc.getCurrentCluster()!.server}`;
  }

  async start(onChange: (e?: SourceEvent) => void): Promise<void> {
    this.onChange = onChange;
    const changed = (e?: SourceEvent): void => this.changed(e);
    const reflector = <T>(kind: Kind, selectors: { labelSelector?: string; fieldSelector?: string }, validate: (o: unknown) => Validated<T>): Reflector<T> =>
      new Reflector(kind, this.kc, collectionPath(kind), selectors, validate, this.opts, changed);
    this.services = reflector('Service', { labelSelector: SERVICE_LABEL_SELECTOR }, validateService);
    this.slices = reflector('EndpointSlice', { labelSelector: SLICE_LABEL_SELECTOR }, validateEndpointSlice);
    this.nodes = reflector('Node', this.opts.allNodes ? {} : { fieldSelector: `metadata.name=${this.opts.nodeName}` }, validateNode);
    // Do not wait for the API server: a restart with it unreachable keeps serving from the maps.
    this.services.start();
    this.slices.start();
    this.nodes.start();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.nodeTimer) clearTimeout(this.nodeTimer);
    this.services?.stop();
    this.slices?.stop();
    this.nodes?.stop();
  }

  /**
   * Synced once Services and EndpointSlices have listed, and the Node has
   * too or its grace is over; complete as soon as synced (the Node decides
   * nothing about what may be removed). The notes say what is failing: each
   * kind whose list or watch is being retried, with the API server's answer
   * (a 403 names the resource, verb and API group the RBAC does not grant).
   */
  status(): SourceStatus {
    const synced = Boolean(this.services?.synced && this.slices?.synced && (this.nodes?.synced || this.nodeWaitOver));
    const notes: string[] = [];
    if (this.nodeMissing) notes.push(`without this node's Node (zone hints ignored): ${this.nodeMissingReason}`);
    for (const r of [this.services, this.slices, this.nodes]) {
      // A missing Node's note already gives its error.
      if (r?.lastError !== undefined && !(r.kind === 'Node' && this.nodeMissing)) notes.push(`${r.kind} list or watch failing, retrying: ${r.lastError}`);
    }
    return { synced, complete: synced, ...(notes.length > 0 ? { notes } : {}) };
  }

  /** Every event and status change of the reflectors passes here on its way to the agent. */
  private changed(e?: SourceEvent): void {
    if (e?.kind === 'Node' && e.object && e.id === this.opts.nodeName && this.nodeMissing) {
      this.nodeMissing = false;
      this.opts.onNodeArrived?.(e.object);
    }
    // A reflector's first list (an event without an object) may start or end the Node's grace.
    if (!e) this.watchNodeGrace();
    this.onChange(e);
  }

  /**
   * Ends the wait for the Node when its list answers (reporting a list
   * without it), and starts the grace once Services and EndpointSlices have
   * listed without it; when the grace runs out, the source is synced
   * without the Node and says why.
   */
  private watchNodeGrace(): void {
    if (this.nodes.synced && !this.nodeListSeen) {
      this.nodeListSeen = true;
      if (this.nodeTimer) clearTimeout(this.nodeTimer);
      this.nodeTimer = undefined;
      if (!this.nodes.items.has(this.opts.nodeName)) this.reportNodeMissing(`the cluster has no Node named ${JSON.stringify(this.opts.nodeName)}`);
    }
    if (this.nodes.synced || this.nodeWaitOver || this.nodeTimer || !this.services.synced || !this.slices.synced) return;
    const timeoutMs = this.opts.nodeSyncTimeoutMs ?? DEFAULT_NODE_SYNC_TIMEOUT_MS;
    const giveUp = (): void => {
      this.nodeTimer = undefined;
      if (this.stopped || this.nodes.synced) return;
      this.nodeWaitOver = true;
      const waited = timeoutMs === 0 ? 'not waited for (--node-sync-timeout 0)' : `not listed within ${timeoutMs} ms of the Services and EndpointSlices`;
      this.reportNodeMissing(`Node ${JSON.stringify(this.opts.nodeName)} ${waited}: ${this.nodes.lastError ?? 'no answer yet'}`);
    };
    if (timeoutMs === 0) return giveUp(); // the caller's onChange reports the new status
    this.nodeTimer = setTimeout(() => {
      giveUp();
      if (this.nodeWaitOver) this.onChange();
    }, timeoutMs);
  }

  private reportNodeMissing(reason: string): void {
    if (this.nodeMissing) return;
    this.nodeMissing = true;
    this.nodeMissingReason = reason;
    this.opts.onNodeMissing?.(reason);
  }
}
