// The Kubernetes source: client-go's Reflector pattern for Services,
// EndpointSlices (discovery.k8s.io/v1) and this node's Node: list (in pages),
// then watch from the list's resourceVersion with bookmarks, through
// @kubernetes/client-node's KubeConfig (auth, TLS, proxies) and Watch. Lists
// are plain GETs made the way its Watch makes requests (node-fetch with the
// KubeConfig's options), and the objects stay plain JSON: client-node's typed
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
import { KubeConfig, Watch } from '@kubernetes/client-node';
import fetch from 'node-fetch';
import { ConfigError } from '../errors.js';
import {
  validateEndpointSlice,
  validateNode,
  validateService,
  SERVICE_PROXY_NAME_LABEL,
  type EndpointSlice,
  type Node,
  type Service,
  type Validated,
} from '../model/k8s.js';
import type { Problem, Source, SourceEvent, SourceStatus } from './source.js';

/** kube-proxy's informer filters: other proxies' services and headless endpoints are not ours. */
export const SERVICE_LABEL_SELECTOR = `!${SERVICE_PROXY_NAME_LABEL}`;
export const SLICE_LABEL_SELECTOR = `!${SERVICE_PROXY_NAME_LABEL},!service.kubernetes.io/headless`;

export interface KubernetesSourceOptions {
  /** Path of a kubeconfig; undefined: in-cluster config (service account). */
  readonly kubeconfig?: string;
  readonly nodeName: string;
  readonly onProblem?: (p: Problem & { kind: string; reason: string }) => void;
  readonly onWatchError?: (kind: string, err: unknown, retryInMs: number) => void;
  /** Backoff between informer restarts. */
  readonly backoffMinMs?: number;
  readonly backoffMaxMs?: number;
}

type Kind = SourceEvent['kind'];

/** namespace/name; a cluster-scoped object (a Node): its name. */
function objectId(meta: { namespace?: string; name?: string } | undefined): string {
  return meta?.namespace ? `${meta.namespace}/${meta.name ?? ''}` : (meta?.name ?? '');
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
    private readonly watcher: Watch,
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
        seen.add(objectId(o.metadata));
        this.upsert(o);
      }
      cont = page.continue || undefined;
      rv = page.resourceVersion;
    } while (cont);
    for (const id of this.items.keys()) if (!seen.has(id)) this.remove(id);
    this.resourceVersion = rv;
    if (!this.synced) {
      this.synced = true;
      this.changed();
    }
  }

  /** One watch from the last resourceVersion; resolves when the server ends it. */
  private watchOnce(): Promise<void> {
    return new Promise((resolve, reject) => {
      let failure: Error | undefined;
      const params = {
        ...this.selectors,
        resourceVersion: this.resourceVersion,
        allowWatchBookmarks: true,
        // As client-go: the server ends the watch after 5-10 minutes, and it is resumed.
        timeoutSeconds: Math.round(300 * (1 + Math.random())),
      };
      const onEvent = (type: string, obj: RawObject & { code?: number; message?: string }): void => {
        if (this.stopped) return;
        switch (type) {
          case 'ADDED':
          case 'MODIFIED':
            this.upsert(obj);
            break;
          case 'DELETED':
            this.remove(objectId(obj.metadata));
            break;
          case 'BOOKMARK':
            break;
          case 'ERROR':
            failure = obj.code === 410 ? new GoneError(obj.message ?? 'resource version too old') : new Error(`watch error ${obj.code ?? ''}: ${obj.message ?? ''}`);
            this.abort?.abort();
            return;
          default:
            return;
        }
        if (obj.metadata?.resourceVersion) this.resourceVersion = obj.metadata.resourceVersion;
      };
      const done = (err: unknown): void => {
        this.abort = undefined;
        const status = (err as { statusCode?: number } | null)?.statusCode;
        if (failure) reject(failure);
        else if (status === 410) reject(new GoneError((err as Error).message));
        else if (err && !this.stopped) reject(err);
        else resolve();
      };
      this.watcher.watch(this.path, params, onEvent, done).then(
        (ctl) => {
          this.abort = ctl;
          if (this.stopped) ctl.abort();
        },
        reject,
      );
    });
  }

  private upsert(o: RawObject): void {
    const id = objectId(o.metadata);
    const v = this.validate(o);
    const had = this.items.has(id);
    if (!v.ok) {
      this.opts.onProblem?.({ where: `${this.kind} ${id}`, kind: this.kind, reason: had ? `${v.reason} (keeping its last valid version)` : v.reason });
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
    this.opts.onWatchError?.(this.kind, err, delay);
    return new Promise((resolve) => {
      this.wake = resolve;
      this.timer = setTimeout(resolve, delay);
    });
  }
}

/**
 * One page of a list: GET `path` with the selectors, limit and continue
 * token, authenticated as client-node's Watch does. A 410 (an expired
 * continue token) relists from the start.
 */
async function listPage(kc: KubeConfig, path: string, query: Record<string, string | number | undefined>, stop: AbortSignal): Promise<Page> {
  const server = kc.getCurrentCluster()?.server;
  if (!server) throw new Error('no current cluster in the kubeconfig');
  const url = new URL(server + path);
  for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, String(v));
  const init = await kc.applyToFetchOptions({});
  init.method = 'GET';
  const timeout = AbortSignal.timeout(LIST_TIMEOUT_MS);
  init.signal = AbortSignal.any([stop, timeout]) as NonNullable<typeof init.signal>;
  try {
    const res = await fetch(url, init);
    if (res.status !== 200) {
      const body = await res.text().catch(() => '');
      let message = body.slice(0, 300);
      try {
        message = (JSON.parse(body) as { message?: string }).message ?? message;
      } catch {
        // not a Status object: keep the text
      }
      const what = `list ${url.pathname}: HTTP ${res.status}${message ? `: ${message}` : ''}`;
      throw res.status === 410 ? new GoneError(what) : new Error(what);
    }
    const list = (await res.json()) as { items?: RawObject[] | null; metadata?: { resourceVersion?: string; continue?: string } };
    if (!list || typeof list !== 'object' || (list.items != null && !Array.isArray(list.items))) throw new Error(`list ${url.pathname}: not a list`);
    return {
      items: list.items ?? [],
      resourceVersion: list.metadata?.resourceVersion ?? '',
      ...(list.metadata?.continue ? { continue: list.metadata.continue } : {}),
    };
  } catch (err) {
    // node-fetch reports every abort as "The user aborted a request".
    if (timeout.aborted && !stop.aborted) throw new Error(`list ${url.pathname}: no answer in ${LIST_TIMEOUT_MS / 1000} s`, { cause: err });
    throw err;
  }
}

export class KubernetesSource implements Source {
  readonly name: string;
  private readonly kc = new KubeConfig();
  private services!: Reflector<Service>;
  private slices!: Reflector<EndpointSlice>;
  private nodes!: Reflector<Node>;
  private current: Problem[] = [];
  private onChange: (e?: SourceEvent) => void = () => {};

  constructor(private readonly opts: KubernetesSourceOptions) {
    try {
      if (opts.kubeconfig) this.kc.loadFromFile(opts.kubeconfig);
      else this.kc.loadFromCluster();
    } catch (err) {
      throw new ConfigError(`cannot load ${opts.kubeconfig ? `kubeconfig ${opts.kubeconfig}` : 'the in-cluster config'}: ${(err as Error).message}`);
    }
    if (!this.kc.getCurrentCluster()) throw new ConfigError(`${opts.kubeconfig ?? 'in-cluster config'}: no current cluster`);
    this.name = `kubernetes:${this.kc.getCurrentCluster()!.server}`;
  }

  async start(onChange: (e?: SourceEvent) => void): Promise<void> {
    this.onChange = onChange;
    const changed = (e?: SourceEvent): void => this.onChange(e);
    const problem = (p: Problem & { kind: string; reason: string }): void => {
      this.current.push(p);
      if (this.current.length > 1000) this.current.shift();
      this.opts.onProblem?.(p);
    };
    const opts = { ...this.opts, onProblem: problem };

    const watch = new Watch(this.kc);
    const reflector = <T>(kind: Kind, path: string, selectors: { labelSelector?: string; fieldSelector?: string }, validate: (o: unknown) => Validated<T>): Reflector<T> =>
      new Reflector(kind, this.kc, watch, path, selectors, validate, opts, changed);
    this.services = reflector('Service', '/api/v1/services', { labelSelector: SERVICE_LABEL_SELECTOR }, validateService);
    this.slices = reflector('EndpointSlice', '/apis/discovery.k8s.io/v1/endpointslices', { labelSelector: SLICE_LABEL_SELECTOR }, validateEndpointSlice);
    this.nodes = reflector('Node', '/api/v1/nodes', { fieldSelector: `metadata.name=${this.opts.nodeName}` }, validateNode);
    // Do not wait for the API server: a restart with it unreachable keeps serving from the maps.
    this.services.start();
    this.slices.start();
    this.nodes.start();
  }

  async stop(): Promise<void> {
    this.services?.stop();
    this.slices?.stop();
    this.nodes?.stop();
  }

  problems(): readonly Problem[] {
    return this.current;
  }

  /** Complete once every informer has listed once; before that the agent must not prune. */
  status(): SourceStatus {
    const synced = Boolean(this.services?.synced && this.slices?.synced && this.nodes?.synced);
    return { synced, complete: synced };
  }
}
