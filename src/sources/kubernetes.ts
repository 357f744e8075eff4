// The Kubernetes source: informers (list, then watch from the list's
// resourceVersion) for Services, EndpointSlices (discovery.k8s.io/v1) and
// this node's Node, through @kubernetes/client-node. A watch that ends in
// error (a broken connection, 410 Gone) is restarted with exponential
// backoff and jitter; a restart relists, and the informer's relist deletes
// objects that vanished meanwhile, so no deletion is lost. Every object is
// validated as it arrives: a bad one is reported and counted, and the last
// valid version of it (if any) stays in force. Handlers only record; the
// agent's runner turns changes into syncs.
import * as k8s from '@kubernetes/client-node';
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
function objectId(meta: k8s.V1ObjectMeta | undefined): string {
  return meta?.namespace ? `${meta.namespace}/${meta.name ?? ''}` : (meta?.name ?? '');
}

/** One informer with its restart loop and its validated cache. */
class Watched<Raw extends k8s.KubernetesObject, T> {
  readonly items = new Map<string, T>();
  synced = false;
  private failures = 0;
  private errored = false;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(
    readonly kind: Kind,
    private readonly informer: k8s.Informer<Raw> & k8s.ObjectCache<Raw>,
    private readonly validate: (o: unknown) => Validated<T>,
    private readonly opts: KubernetesSourceOptions,
    private readonly changed: (e?: SourceEvent) => void,
  ) {
    const id = (o: Raw): string => objectId(o.metadata);
    const upsert = (type: 'add' | 'update') => (o: Raw) => {
      const v = this.validate(o);
      if (!v.ok) {
        const kept = this.items.has(id(o));
        opts.onProblem?.({ where: `${kind} ${id(o)}`, kind, reason: kept ? `${v.reason} (keeping its last valid version)` : v.reason });
        return;
      }
      this.items.set(id(o), v.value);
      this.changed({ kind, type, id: id(o), object: v.value } as SourceEvent);
    };
    informer.on('add', upsert('add'));
    informer.on('update', upsert('update'));
    informer.on('delete', (o) => this.remove(id(o)));
    informer.on('error', (err) => {
      this.errored = true;
      this.restart(err);
    });
  }

  /** Lists (or resumes the watch from the last resourceVersion), then watches. */
  async start(): Promise<void> {
    this.errored = false;
    try {
      // start() resolves even when the list failed: the error callback says so.
      await this.informer.start();
      if (!this.errored) {
        this.failures = 0;
        this.markSynced();
      }
    } catch (err) {
      this.restart(err);
    }
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    void this.informer.stop();
  }

  /** After the initial list: the cache is complete (even when empty). */
  private markSynced(): void {
    if (this.synced) return;
    // The informer's own cache is authoritative after a list: drop what it no longer has.
    const live = new Set(this.informer.list().map((o) => objectId(o.metadata)));
    for (const key of [...this.items.keys()]) if (!live.has(key)) this.remove(key);
    this.synced = true;
    this.changed();
  }

  private remove(id: string): void {
    if (this.items.delete(id)) this.changed({ kind: this.kind, type: 'delete', id });
  }

  private restart(err: unknown): void {
    if (this.stopped || this.timer) return;
    const min = this.opts.backoffMinMs ?? 500;
    const max = this.opts.backoffMaxMs ?? 30_000;
    const base = Math.min(max, min * 2 ** this.failures++);
    const delay = Math.round(base / 2 + Math.random() * (base / 2)); // "equal jitter"
    this.opts.onWatchError?.(this.kind, err, delay);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.start();
    }, delay);
  }
}

export class KubernetesSource implements Source {
  readonly name: string;
  private readonly kc = new k8s.KubeConfig();
  private services!: Watched<k8s.V1Service, Service>;
  private slices!: Watched<k8s.V1EndpointSlice, EndpointSlice>;
  private nodes!: Watched<k8s.V1Node, Node>;
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
    const core = this.kc.makeApiClient(k8s.CoreV1Api);
    const discovery = this.kc.makeApiClient(k8s.DiscoveryV1Api);
    const changed = (e?: SourceEvent): void => this.onChange(e);
    const problem = (p: Problem & { kind: string; reason: string }): void => {
      this.current.push(p);
      if (this.current.length > 1000) this.current.shift();
      this.opts.onProblem?.(p);
    };
    const opts = { ...this.opts, onProblem: problem };
    const nodeSelector = `metadata.name=${this.opts.nodeName}`;

    this.services = new Watched(
      'Service',
      k8s.makeInformer(this.kc, '/api/v1/services', () => core.listServiceForAllNamespaces({ labelSelector: SERVICE_LABEL_SELECTOR }), SERVICE_LABEL_SELECTOR),
      validateService,
      opts,
      changed,
    );
    this.slices = new Watched(
      'EndpointSlice',
      k8s.makeInformer(
        this.kc,
        '/apis/discovery.k8s.io/v1/endpointslices',
        () => discovery.listEndpointSliceForAllNamespaces({ labelSelector: SLICE_LABEL_SELECTOR }),
        SLICE_LABEL_SELECTOR,
      ),
      validateEndpointSlice,
      opts,
      changed,
    );
    this.nodes = new Watched(
      'Node',
      new k8s.ListWatch('/api/v1/nodes', new k8s.Watch(this.kc), () => core.listNode({ fieldSelector: nodeSelector }), false, undefined, nodeSelector),
      validateNode,
      opts,
      changed,
    );
    // Do not wait for the API server: a restart with it unreachable keeps serving from the maps.
    void this.services.start();
    void this.slices.start();
    void this.nodes.start();
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
