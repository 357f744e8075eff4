// The Kubernetes source: client-go's Reflector for Services, EndpointSlices
// (discovery.k8s.io/v1) and this node's Node, through @kubernetes/client-node's
// KubeConfig (auth, TLS, proxies). Lists and watches are plain GETs made the
// way client-node's Watch makes requests (node-fetch with the KubeConfig's
// options), and the objects stay plain JSON: client-node's typed API classes
// would bring its generated APIs, models and serializer into the agent's
// bundle (6.0 MB of code instead of 3.0; RSS at 10,000 services 172 instead
// of 165 MiB, docs/benchmarks.md "Memory"), only for the validators to read
// the objects as JSON, as they read manifests. There is no informer cache:
// each object is validated as it arrives and only its validated form is kept
// (the raw objects of 10,000 services are several times larger than what
// lbctl needs). A bad object is reported and counted, and the last valid
// version of it (if any) stays in force. Handlers only record; the agent's
// runner turns changes into syncs.
//
// What the API server is asked, and in which order, is the reflector's
// (client-go tools/cache/reflector.go, list() and relistResourceVersion(),
// and tools/pager/pager.go), so that every list it can serve from its watch
// cache is served from there and not read through to etcd
// (docs/kubernetes.md, "What the agents cost the API server"):
//   - the first list asks for resourceVersion "0" (any version the cache
//     has), a relist for the last version seen (at least that recent, no
//     limit); both are answered from the cache by every server version;
//   - if that version is refused as expired (410) or too new ("Too large
//     resource version", a cache behind it), a consistent list
//     (resourceVersion "", in pages of 500) follows at once; a continue
//     token that expires makes it one full list (the pager's fallback);
//   - with --watch-list auto or on, a watch with sendInitialEvents (KEP-3157,
//     a "watch-list", reflector.go watchList()) streams the state instead of
//     listing it, from the cache too, and goes on as the watch; a server
//     that refuses it (422: older than 1.27, or the WatchList gate off) makes
//     the source list for the rest of the process (auto), said once. Lists
//     are the default: a list at "0" is served from the cache by every
//     version and costs etcd nothing, and since 1.33 it is encoded item by
//     item, which was the watch-list's advantage (docs/kubernetes.md says
//     what each costs, version by version).
// Then the reflector watches from the list's resourceVersion with
// bookmarks; a watch that ends normally is resumed from the last version
// seen; a watch's 410 relists from that version, and a relist deletes what is
// no longer there, so no deletion is lost.
//
// Retries back off exponentially with jitter (src/sources/backoff.ts). The
// backoff of an outage ends as soon as the server answers a request with
// success, so what changed meanwhile is applied within a second of the
// server's first answer, not after a delay that grew while it was away;
// client-go's backoff starts over only 2 minutes after it last did. An answer to one reflector also cuts short the wait of its
// siblings when they wait out an unreachable server (not a busy one: 429,
// 500). A relist after a watch's 410 is jittered too: an API server restart
// ends every agent's watch at once, and their relists should not arrive at
// once. A first list is not: a rollout already spreads the starts.
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
// MAX_WATCH_EVENT_BYTES or a list item over MAX_LIST_ITEM_BYTES is refused
// (client-node's Watch buffers a line of any length, and drops lines that
// are not JSON and exceptions of its callback without a word); a line that
// is not JSON ends the watch, which resumes from the last version seen, so
// no event is lost unseen; a validator that throws reports that object.
// Lists are read one item at a time (src/sources/list-stream.ts): a list at
// "0" is the whole collection in one answer, and its size must not be the
// agent's memory.
import { KubeConfig } from '@kubernetes/client-node';
import fetch, { type Response } from 'node-fetch';
import yaml from 'js-yaml';
import { readFileSync } from 'node:fs';
import { DEFAULT_NODE_SYNC_TIMEOUT_MS } from '../base/defaults.js';
import { ConfigError } from '../base/errors.js';
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
import { Backoff, type FailureKind } from './backoff.js';
import { MAX_LIST_ITEM_BYTES, MAX_WATCH_EVENT_BYTES } from './limits.js';
import { readList, type ListMeta } from './list-stream.js';
import type { Problem, Source, SourceEvent, SourceStatus } from './source.js';
import { joinFlat } from '../lb/types.js';

/**
 * kube-proxy's informer filters (cmd/kube-proxy/app/server.go: one label
 * selector for its Service and EndpointSlice informers alike): other proxies' services
 * and headless ones are not ours.
 */
export const SERVICE_LABEL_SELECTOR = `!${SERVICE_PROXY_NAME_LABEL},!${HEADLESS_LABEL}`;
export const SLICE_LABEL_SELECTOR = SERVICE_LABEL_SELECTOR;

/**
 * Streamed lists (watch with sendInitialEvents, KEP-3157): `off` lists;
 * `auto` streams where the server supports it and lists, for the rest of
 * the process, once a server has refused it; `on` streams only, and a
 * refusal is an error, retried with backoff (docs/kubernetes.md).
 */
export type WatchListMode = 'off' | 'auto' | 'on';
export const WATCH_LIST_MODES: readonly WatchListMode[] = ['off', 'auto', 'on'];

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
  /** Backoff between informer restarts (src/sources/backoff.ts): the first step and the largest. */
  readonly backoffMinMs?: number;
  readonly backoffMaxMs?: number;
  /** Random numbers in [0, 1) for the jitter and the watches' timeouts: Math.random unless a test injects its own. */
  readonly random?: () => number;
  /** Default 'off'. */
  readonly watchList?: WatchListMode;
  /**
   * Ask for answers uncompressed (client-go's DisableCompression, kubectl's
   * --disable-compression); a kubeconfig whose current cluster sets
   * `disable-compression: true` asks the same. Otherwise lists are asked for
   * gzip, as client-go asks, and a server compresses those over 128 KiB
   * (docs/kubernetes.md, "Compression").
   */
  readonly disableCompression?: boolean;
  /** `auto`: the server refused a watch-list, so this source lists from now on (called once, with the server's answer). */
  readonly onWatchListRefused?: (kind: string, reason: string) => void;
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

export const DEFAULT_BACKOFF_MIN_MS = 500;
export const DEFAULT_BACKOFF_MAX_MS = 30_000;
/**
 * The largest step while the API server is unreachable (no connection, 502,
 * 503): asking an absent server costs it nothing, and the first ask after
 * its return comes within this (2.5 to 5 s, jittered), so a change made
 * during the outage is applied within seconds of the server's return rather
 * than after a step that grew while it was away. A busy server (429, 500)
 * gets the full backoff.
 */
export const UNREACHABLE_BACKOFF_MAX_MS = 5_000;

type Kind = SourceEvent['kind'];

/** namespace/name; a cluster-scoped object (a Node): its name. Anything else in metadata gives ''. */
function objectId(meta: unknown): string {
  if (typeof meta !== 'object' || meta === null) return '';
  const { namespace, name } = meta as { namespace?: unknown; name?: unknown };
  const n = typeof name === 'string' && name.length <= 253 ? name : '';
  return typeof namespace === 'string' && namespace !== '' && namespace.length <= 63 ? joinFlat(namespace, '/', n) : n;
}

interface RawObject {
  metadata?: { namespace?: string; name?: string; resourceVersion?: string; annotations?: Record<string, unknown> };
}

/** List pages of this size (client-go's pager default). */
const PAGE_SIZE = 500;

/** A list that does not answer, or whose answer stalls, for this long is abandoned and retried with backoff. */
const LIST_TIMEOUT_MS = 60_000;

/** The bookmark annotation that ends a watch-list's initial events (metav1.InitialEventsAnnotationKey). */
export const INITIAL_EVENTS_END_ANNOTATION = 'k8s.io/initial-events-end';

/** A watch that ends normally sooner than this, having sent nothing, is a failure (reflector.go, VeryShortWatchError). */
const VERY_SHORT_WATCH_MS = 1000;

/**
 * An answer of the API server other than success: the HTTP status (or the
 * code of a watch's ERROR event) and, when it sent a Status, its reason and
 * the reasons of its causes.
 */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly statusCode: number,
    readonly reason = '',
    readonly causes: readonly string[] = [],
  ) {
    super(message);
  }
}

/** The server does not stream lists: a 400 or 422 to the watch-list, or a stream without its end-of-initial-events bookmark. */
class WatchListRefused extends ApiError {}

/** 410, the version asked for is compacted away (reflector.go isExpiredError: reason Expired, or Gone from servers before 1.18). */
function isExpired(err: unknown): boolean {
  return err instanceof ApiError && (err.statusCode === 410 || err.reason === 'Expired' || err.reason === 'Gone');
}

/**
 * The version asked for is newer than the server's cache has seen
 * (reflector.go isTooLargeResourceVersionError: the ResourceVersionTooLarge
 * cause, or the message servers before 1.18.6 sent with a 504).
 */
function isTooLargeResourceVersion(err: unknown): boolean {
  if (!(err instanceof ApiError)) return false;
  return err.causes.includes('ResourceVersionTooLarge') || (err.statusCode === 504 && err.message.includes('Too large resource version'));
}

/**
 * Whether the server refused (4xx but 429: counted until the resource makes
 * progress) or could not serve (no answer, 5xx, 429: counted until it
 * answers a request with success).
 */
function failureKind(err: unknown): FailureKind {
  return err instanceof ApiError && err.statusCode < 500 && err.statusCode !== 429 ? 'answered' : 'unanswered';
}

/**
 * No server to answer: the connection failed (ECONNREFUSED, ECONNRESET,
 * EHOSTUNREACH, ETIMEDOUT, ENOTFOUND: node-fetch passes the system error's
 * code on), or a 502 or 503 (a load balancer or proxy with no API server
 * behind it, a server shutting down). Only then does another reflector's
 * answer cut the wait short: a 429 or a 500 comes from a server that is
 * there and busy, a stalled list from one that is slow, and a cheap request
 * of another kind getting through says nothing of a large list.
 */
function unreachable(err: unknown): boolean {
  if (err instanceof ApiError) return err.statusCode === 502 || err.statusCode === 503;
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && /^E[A-Z]+$/.test(code);
}

/** What the reflectors of one source share: the watch-list mode and news that the server answers. */
interface SourceShared {
  watchList: WatchListMode;
  /** Ask for gzip (Accept-Encoding), and inflate what comes compressed. */
  readonly compress: boolean;
  /** A reflector found the server refusing watch-lists. */
  watchListRefused(kind: Kind, reason: string): void;
  /** A reflector's request was answered with success: the others' outage backoff is over. */
  answered(from: Reflector<unknown>): void;
}

/** One resource: its list+watch loop, and which objects it holds. */
class Reflector<T> {
  /**
   * The ids of the objects held (their last valid versions went to the
   * consumer with each change; it keeps them, so they are not kept twice).
   */
  readonly items = new Set<string>();
  synced = false;
  /**
   * The last list or watch error, until a list or watch succeeds again: the
   * reason given when the source goes on without this kind, and a note of
   * the source's status meanwhile (an RBAC rule missing, a token refused).
   */
  lastError: string | undefined;
  /** reflector.go lastSyncResourceVersion: the version of the last list, event or bookmark; '' before the first list. */
  private lastSyncRv = '';
  /**
   * reflector.go isLastSyncResourceVersionUnavailable: a list or watch-list
   * at lastSyncRv was refused as expired or too new, so the next one is
   * consistent (resourceVersion "").
   */
  private rvUnavailable = false;
  /**
   * reflector.go paginatedResult: a list at "0" came back in pages, so the
   * server has no watch cache for the resource and later lists page too.
   */
  private paginated = false;
  /** The next attempt lists (or watch-lists) before it watches: at start, and after a watch's 410. */
  private needList = true;
  private readonly backoff: Backoff;
  private stopped = false;
  /** The retry being waited for, and whether the server was unreachable. */
  private sleeping: { until: number; unreachable: boolean; timer: NodeJS.Timeout; resolve: () => void } | undefined;
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
    private readonly shared: SourceShared,
    private readonly changed: (e?: SourceEvent) => void,
  ) {
    this.backoff = new Backoff({
      minMs: opts.backoffMinMs ?? DEFAULT_BACKOFF_MIN_MS,
      maxMs: opts.backoffMaxMs ?? DEFAULT_BACKOFF_MAX_MS,
      ...(opts.random ? { random: opts.random } : {}),
    });
  }

  start(): void {
    void this.loop();
  }

  stop(): void {
    this.stopped = true;
    this.wake();
    this.abort?.abort();
    this.listAbort.abort();
  }

  /**
   * Another reflector of the source got an answer: if this one is waiting
   * out an outage (the server unreachable), its backoff is over and it
   * retries no later than a first step from now.
   */
  serverBack(): void {
    const s = this.sleeping;
    if (!s?.unreachable) return;
    this.backoff.serverAnswered();
    const delay = this.backoff.first();
    if (s.until - performance.now() <= delay) return;
    clearTimeout(s.timer);
    s.until = performance.now() + delay;
    s.timer = setTimeout(() => this.wake(), delay);
  }

  private async loop(): Promise<void> {
    while (!this.stopped) {
      try {
        if (this.needList) await this.sync();
        else await this.watch();
      } catch (err) {
        if (this.stopped) return;
        // A watch's 410: relist, from the last version seen (reflector.go
        // keeps it: a list "not older than" it is served from the cache).
        if (isExpired(err) && !this.needList) this.needList = true;
        await this.retryAfter(err);
      }
    }
  }

  /** A request of this reflector was answered with success. */
  private answered(): void {
    this.lastError = undefined;
    this.backoff.serverAnswered();
    this.shared.answered(this as Reflector<unknown>);
  }

  private retryAfter(err: unknown): Promise<void> {
    const delay = this.backoff.next(failureKind(err), unreachable(err) ? UNREACHABLE_BACKOFF_MAX_MS : undefined);
    this.lastError = (err as Error)?.message ?? String(err);
    this.opts.onWatchError?.(this.kind, err, delay);
    return new Promise((resolve) => {
      this.sleeping = { until: performance.now() + delay, unreachable: unreachable(err), resolve, timer: setTimeout(() => this.wake(), delay) };
    });
  }

  private wake(): void {
    const s = this.sleeping;
    this.sleeping = undefined;
    if (s) {
      clearTimeout(s.timer);
      s.resolve();
    }
  }

  /** The state, by a watch-list (which goes on as the watch) or a list. */
  private async sync(): Promise<void> {
    if (this.shared.watchList !== 'off') {
      try {
        return await this.watchList();
      } catch (err) {
        if (!(err instanceof WatchListRefused) || this.stopped || this.shared.watchList === 'on') throw err;
        this.shared.watchListRefused(this.kind, err.message);
      }
    }
    await this.list();
  }

  /**
   * reflector.go list(): at relistResourceVersion(), in pages or not as
   * its page size rule says; a version refused as expired or too new is
   * listed again at once at "" (a consistent list). What the list no longer
   * holds is deleted.
   */
  private async list(): Promise<void> {
    let result: { seen: Set<string>; resourceVersion: string; paged: boolean };
    const rv = this.relistResourceVersion();
    try {
      result = await this.listAt(rv);
    } catch (err) {
      if (this.stopped || !(isExpired(err) || isTooLargeResourceVersion(err))) throw err;
      this.rvUnavailable = true;
      result = await this.listAt('');
    }
    if (this.stopped) return;
    for (const id of this.items) if (!result.seen.has(id)) this.remove(id);
    if (rv === '0' && result.paged) this.paginated = true;
    this.rvUnavailable = false;
    this.lastSyncRv = result.resourceVersion;
    this.needList = false;
    this.listed();
  }

  /**
   * reflector.go relistResourceVersion(): "" after a refusal (consistent);
   * "0" for the first list ("For performance reasons, initial list
   * performed by reflector uses "0" as resource version to allow it to be
   * served from the watch cache"); else the last version seen.
   */
  private relistResourceVersion(): string {
    if (this.rvUnavailable) return '';
    return this.lastSyncRv === '' ? '0' : this.lastSyncRv;
  }

  /**
   * reflector.go list()'s page size: 500 for "" and "0" (a cache ignores the
   * limit at "0"; a server without one pages instead of reading everything
   * at once) and once a list at "0" came back paged; none for a version
   * ("To avoid thundering herd on etcd (e.g. on master upgrades), we
   * explicitly switch off pagination to force listing from watch cache"):
   * a limit with a version asks for that exact version, which only etcd
   * has before 1.34.
   */
  private pageSize(rv: string): number {
    if (this.paginated) return PAGE_SIZE;
    return rv !== '' && rv !== '0' ? 0 : PAGE_SIZE;
  }

  /**
   * Every page of a list at `rv`, each applied as it arrives. A continue
   * token that expires (page 2 or later) ends in one full list at `rv`
   * (pager.go, FullListIfExpired).
   */
  private async listAt(rv: string): Promise<{ seen: Set<string>; resourceVersion: string; paged: boolean }> {
    const limit = this.pageSize(rv);
    const first: Query = { ...this.selectors, resourceVersion: rv === '' ? undefined : rv, limit: limit > 0 ? limit : undefined };
    let query = first;
    let seen = new Set<string>();
    let resourceVersion = '';
    let pages = 0;
    for (;;) {
      let page: ListMeta;
      try {
        page = await listPage(this.kc, this.shared.compress, this.path, query, this.listAbort.signal, () => this.answered(), (o) => {
          if (this.stopped) return;
          seen.add(objectId((o as RawObject | null)?.metadata));
          this.upsert(o as RawObject);
        });
      } catch (err) {
        if (query.continue === undefined || !isExpired(err) || this.stopped) throw err;
        query = { ...first, limit: undefined };
        seen = new Set();
        pages = 0;
        continue;
      }
      if (this.stopped) break;
      if (pages++ === 0) resourceVersion = page.resourceVersion;
      if (!page.continue) break;
      // The version goes with the token (pager.go clears it on later pages).
      query = { ...this.selectors, limit: limit > 0 ? limit : undefined, continue: page.continue };
    }
    return { seen, resourceVersion, paged: pages > 1 };
  }

  /** The first complete state has arrived. */
  private listed(): void {
    if (!this.synced) {
      this.synced = true;
      this.changed();
    }
  }

  /**
   * reflector.go watchList(): a watch with sendInitialEvents from
   * rewatchResourceVersion() ("" after a refusal, else the last version
   * seen), whose initial events, up to the bookmark annotated
   * k8s.io/initial-events-end, are the list; then it goes on as the watch.
   * A version refused as expired or too new is asked again at once at "".
   */
  private async watchList(): Promise<void> {
    for (;;) {
      const rv = this.rvUnavailable ? '' : this.lastSyncRv;
      try {
        return await this.stream(
          {
            ...this.selectors,
            watch: 'true',
            sendInitialEvents: 'true',
            resourceVersionMatch: 'NotOlderThan',
            allowWatchBookmarks: 'true',
            resourceVersion: rv === '' ? undefined : rv,
            timeoutSeconds: this.watchTimeoutSeconds(),
          },
          true,
        );
      } catch (err) {
        if (this.stopped || !this.needList || rv === '' || !(isExpired(err) || isTooLargeResourceVersion(err))) throw err;
        this.rvUnavailable = true;
      }
    }
  }

  /** One watch from the last version seen; resolves when the server ends it. */
  private watch(): Promise<void> {
    return this.stream(
      { ...this.selectors, watch: 'true', resourceVersion: this.lastSyncRv, allowWatchBookmarks: 'true', timeoutSeconds: this.watchTimeoutSeconds() },
      false,
    );
  }

  /** As client-go: the server ends the watch after 5-10 minutes, and it is resumed. */
  private watchTimeoutSeconds(): number {
    return Math.round(300 * (1 + (this.opts.random ?? Math.random)()));
  }

  /**
   * One watch (a watch-list when `initial`): resolves when the server ends
   * it normally; a failure, a refusal or a watch-list that ends before its
   * initial events did throws.
   */
  private async stream(params: Query, initial: boolean): Promise<void> {
    const timeoutSeconds = params.timeoutSeconds as number;
    const what = `${initial ? 'watch-list' : 'watch'} ${this.path}`;
    const abort = new AbortController();
    this.abort = abort;
    // A server that goes silent (no event, no bookmark, no end) past the
    // watch's own timeout is given up on, and the watch started again.
    let silent = false;
    const deadline = setTimeout(() => {
      silent = true;
      abort.abort();
    }, (timeoutSeconds + 60) * 1000);
    const started = performance.now();
    let events = 0;
    // The objects of the initial events, until their end: the list's `seen`.
    const list = initial ? new Set<string>() : undefined;
    try {
      const res = await apiGet(this.kc, this.shared.compress, this.path, params, abort.signal);
      if (res.status !== 200) {
        const err = await httpError(res, what);
        // Validation's answer: the fields of a watch-list are not allowed (WatchList off, or older than 1.27).
        if (initial && (res.status === 400 || res.status === 422)) throw new WatchListRefused(err.message, err.statusCode, err.reason, err.causes);
        throw err;
      }
      this.answered();
      await readLines(res.body as unknown as AsyncIterable<Buffer>, MAX_WATCH_EVENT_BYTES, (line) => {
        if (this.stopped) return false;
        let event: unknown;
        try {
          event = JSON.parse(line);
        } catch (err) {
          throw new Error(`${what}: the server sent a line that is not JSON (${line.length} bytes: ${(err as Error).message}); watching again from version ${this.lastSyncRv}`);
        }
        events++;
        return this.onWatchEvent(event, initial && this.needList ? list : undefined);
      });
    } catch (err) {
      if (this.stopped) return;
      if (silent) throw new Error(`${what}: the server did not end the watch within ${timeoutSeconds + 60} s of its ${timeoutSeconds} s timeout`);
      throw err;
    } finally {
      clearTimeout(deadline);
      abort.abort(); // ends the request if an error left it open
      this.abort = undefined;
    }
    if (this.stopped) return;
    if (initial && this.needList) throw new Error(`${what}: the server ended the stream before the end of its initial events; trying again`);
    if (events === 0 && performance.now() - started < VERY_SHORT_WATCH_MS) {
      throw new ApiError(`${what}: the server ended the watch within a second without an event (client-go's "very short watch")`, 200);
    }
    this.backoff.progressed();
  }

  /**
   * Applies one watch event (any JSON value at all); false ends the watch.
   * `initial`: the objects seen so far among a watch-list's initial events.
   */
  private onWatchEvent(line: unknown, initial: Set<string> | undefined): boolean {
    const where = `${initial ? 'watch-list' : 'watch'} ${this.path}`;
    if (typeof line !== 'object' || line === null || Array.isArray(line)) {
      this.problem(where, `an event that is not an object: ${show(line)}`, 'invalid');
      return true;
    }
    const event = line as { type?: unknown; object?: unknown };
    const obj = event.object as (RawObject & { code?: unknown; message?: unknown; reason?: unknown; details?: unknown }) | null | undefined;
    if (typeof obj !== 'object' || obj === null) {
      this.problem(where, `a ${show(event.type)} event without an object`, 'invalid');
      return true;
    }
    const rv = (obj.metadata as { resourceVersion?: unknown } | undefined)?.resourceVersion;
    switch (event.type) {
      case 'ADDED':
      case 'MODIFIED':
        this.upsert(obj);
        initial?.add(objectId(obj.metadata));
        break;
      case 'DELETED': {
        const id = objectId(obj.metadata);
        this.remove(id);
        initial?.delete(id);
        break;
      }
      case 'BOOKMARK':
        if (initial) {
          const annotations = (obj.metadata as { annotations?: unknown } | undefined)?.annotations;
          if (typeof annotations !== 'object' || annotations === null || (annotations as Record<string, unknown>)[INITIAL_EVENTS_END_ANNOTATION] !== 'true') {
            throw new WatchListRefused(`${where}: a bookmark without the ${INITIAL_EVENTS_END_ANNOTATION} annotation among the initial events: the server does not stream lists`, 200);
          }
          this.initialEventsEnd(initial, typeof rv === 'string' ? rv : '');
          return true;
        }
        break;
      case 'ERROR':
        throw watchError(obj, where, initial !== undefined);
      default:
        this.problem(where, `an event of unknown type ${show(event.type)}`, 'invalid');
        return true;
    }
    this.backoff.progressed();
    // The initial events come in no order of version (reflector.go waits for the bookmark).
    if (!initial && typeof rv === 'string' && rv !== '') this.lastSyncRv = rv;
    return true;
  }

  /** The end of a watch-list's initial events: they were the list. */
  private initialEventsEnd(seen: Set<string>, rv: string): void {
    for (const id of this.items) if (!seen.has(id)) this.remove(id);
    if (rv !== '') this.lastSyncRv = rv;
    this.rvUnavailable = false;
    this.needList = false;
    this.backoff.progressed();
    this.listed();
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
    this.items.add(id);
    this.changed({ kind: this.kind, type: had ? 'update' : 'add', id, object: v.value } as SourceEvent);
  }

  private remove(id: string): void {
    if (this.items.delete(id)) this.changed({ kind: this.kind, type: 'delete', id });
  }
}

/**
 * A watch's ERROR event as an error: its Status's code, reason and causes.
 * Among a watch-list's initial events a 400, 422 or 500 is the server
 * refusing to stream (a 500 is what a watch cache over etcd without
 * progress notifications answers: cacher.go "a watch stream was requested
 * by the client but the required storage feature RequestWatchProgress is
 * disabled").
 */
function watchError(status: { code?: unknown; message?: unknown; reason?: unknown; details?: unknown }, where: string, initial: boolean): ApiError {
  const code = typeof status.code === 'number' ? status.code : 0;
  const message = typeof status.message === 'string' ? status.message.slice(0, 300) : '';
  const reason = typeof status.reason === 'string' ? status.reason : '';
  const causes = statusCauses(status.details);
  if (code === 410) return new ApiError(`410 Gone: ${message || 'resource version too old'}`, 410, reason, causes);
  if (initial && (code === 400 || code === 422 || code === 500)) return new WatchListRefused(`${where}: watch error ${code}: ${message}`, code, reason, causes);
  return new ApiError(`watch error ${show(status.code)}: ${message}`, code, reason, causes);
}

/** The reasons of a Status's causes (metav1.StatusCause's `reason`: ResourceVersionTooLarge, FieldValueForbidden). */
function statusCauses(details: unknown): string[] {
  const causes = (details as { causes?: unknown } | null | undefined)?.causes;
  if (!Array.isArray(causes)) return [];
  return causes.map((c) => (c as { reason?: unknown } | null)?.reason).filter((r): r is string => typeof r === 'string').slice(0, 10);
}

type Query = Record<string, string | number | undefined>;

/**
 * GET `path` with `query`, authenticated as client-node's Watch does (the
 * KubeConfig's TLS, tokens, proxies). With `compress`, node-fetch asks for
 * gzip and inflates the answer as it is read; without, it asks for none.
 */
async function apiGet(kc: KubeConfig, compress: boolean, path: string, query: Query, signal: AbortSignal, maxBytes = 0): Promise<Response> {
  const server = kc.getCurrentCluster()?.server;
  if (!server) throw new Error('no current cluster in the kubeconfig');
  const url = new URL(server + path);
  for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, String(v));
  const init = await kc.applyToFetchOptions({});
  init.method = 'GET';
  init.signal = signal as NonNullable<typeof init.signal>;
  // node-fetch's cap on a body read with text() or json(): past it, they fail.
  (init as { size?: number }).size = maxBytes;
  (init as { compress?: boolean }).compress = compress;
  return fetch(url, init);
}

/** An answer other than 200 as an error naming the request, with the Status's reason and causes. */
async function httpError(res: Response, what: string): Promise<ApiError> {
  const body = await res.text().catch(() => '');
  let message = body.slice(0, 300);
  let reason = '';
  let causes: string[] = [];
  try {
    const status = JSON.parse(body) as { message?: unknown; reason?: unknown; details?: unknown };
    if (typeof status.message === 'string') message = status.message.slice(0, 300);
    if (typeof status.reason === 'string') reason = status.reason;
    causes = statusCauses(status.details);
  } catch {
    // not a Status object: keep the text
  }
  return new ApiError(`${what}: HTTP ${res.status}${message ? `: ${message}` : ''}`, res.status, reason, causes);
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
 * One page of a list (a whole list, when the server does not page it):
 * GET `path` with the selectors, version, limit and continue token, its
 * items handed to `onItem` as they arrive; `onAnswer` once the server has
 * answered 200.
 */
async function listPage(kc: KubeConfig, compress: boolean, path: string, query: Query, stop: AbortSignal, onAnswer: () => void, onItem: (item: unknown) => void): Promise<ListMeta> {
  const stalled = new AbortController();
  const timer = setTimeout(() => stalled.abort(), LIST_TIMEOUT_MS);
  let answered = false;
  try {
    const res = await apiGet(kc, compress, path, query, AbortSignal.any([stop, stalled.signal]));
    if (res.status !== 200) throw await httpError(res, `list ${path}`);
    answered = true;
    onAnswer();
    const body = async function* (): AsyncIterable<Buffer> {
      for await (const chunk of res.body as unknown as AsyncIterable<Buffer>) {
        timer.refresh();
        yield chunk;
      }
    };
    try {
      return await readList(body(), MAX_LIST_ITEM_BYTES, onItem);
    } catch (err) {
      if (stalled.signal.aborted || stop.aborted) throw err;
      throw new Error(`list ${path}: ${(err as Error).message}`, { cause: err });
    }
  } catch (err) {
    // node-fetch reports every abort as "The user aborted a request".
    if (stalled.signal.aborted && !stop.aborted) {
      throw new Error(`list ${path}: ${answered ? `the answer stalled for ${LIST_TIMEOUT_MS / 1000} s` : `no answer in ${LIST_TIMEOUT_MS / 1000} s`}`, { cause: err });
    }
    throw err;
  } finally {
    clearTimeout(timer);
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

/**
 * Whether the kubeconfig at `path` sets `disable-compression: true` on the
 * cluster `kc` uses (client-go reads it into DisableCompression;
 * client-node's KubeConfig drops the field, so it is read here). No file
 * (in-cluster config): false.
 */
export function kubeconfigDisablesCompression(path: string | undefined, kc: KubeConfig): boolean {
  if (!path) return false;
  const name = kc.getCurrentCluster()?.name;
  let doc: unknown;
  try {
    doc = yaml.load(readFileSync(path, 'utf8'));
  } catch (err) {
    throw new ConfigError(`cannot load kubeconfig ${path}: ${(err as Error).message}`);
  }
  const clusters = (doc as { clusters?: unknown } | null)?.clusters;
  if (!Array.isArray(clusters)) return false;
  const entry = clusters.find((c) => (c as { name?: unknown } | null)?.name === name) as { cluster?: Record<string, unknown> } | undefined;
  const value = entry?.cluster?.['disable-compression'];
  if (value === undefined || value === null) return false;
  if (typeof value !== 'boolean') throw new ConfigError(`kubeconfig ${path}: cluster ${JSON.stringify(name)}: disable-compression must be true or false, not ${JSON.stringify(value)}`);
  return value;
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
  /** The reflectors' shared state: the watch-list mode, which a refusal turns off (auto), and news of the server answering. */
  private readonly shared: SourceShared;

  constructor(private readonly opts: KubernetesSourceOptions) {
    this.kc = loadKubeConfig(opts);
    this.name = `kubernetes:${this.kc.getCurrentCluster()!.server}`;
    const shared: SourceShared = {
      watchList: opts.watchList ?? 'off',
      compress: !(opts.disableCompression || kubeconfigDisablesCompression(opts.kubeconfig, this.kc)),
      watchListRefused: (kind, reason) => {
        if (shared.watchList !== 'auto') return;
        shared.watchList = 'off';
        opts.onWatchListRefused?.(kind, reason);
      },
      answered: (from) => {
        for (const r of [this.services, this.slices, this.nodes] as Array<Reflector<unknown> | undefined>) if (r && r !== from) r.serverBack();
      },
    };
    this.shared = shared;
  }

  /** Whether this source asks for compressed answers (not when told not to, by option or kubeconfig). */
  get compression(): boolean {
    return this.shared.compress;
  }

  /** Whether this source streams its lists: the mode it was given, until a refusal ends `auto`. */
  get watchList(): WatchListMode {
    return this.shared.watchList;
  }

  async start(onChange: (e?: SourceEvent) => void): Promise<void> {
    this.onChange = onChange;
    const changed = (e?: SourceEvent): void => this.changed(e);
    const reflector = <T>(kind: Kind, selectors: { labelSelector?: string; fieldSelector?: string }, validate: (o: unknown) => Validated<T>): Reflector<T> =>
      new Reflector(kind, this.kc, collectionPath(kind), selectors, validate, this.opts, this.shared, changed);
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
