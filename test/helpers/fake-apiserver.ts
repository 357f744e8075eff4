// A local server that speaks the Kubernetes API's list/watch wire protocol
// for Services, EndpointSlices and Nodes, reached through an ordinary
// kubeconfig, so the agent's Kubernetes source is tested exactly as it would
// run against a real kube-apiserver:
//   - list with a collection resourceVersion (and labelSelector/fieldSelector),
//   - watch=true: a chunked stream of JSON lines, ADDED/MODIFIED/DELETED
//     events after the given resourceVersion, BOOKMARKs when asked for,
//   - "410 Gone" (an ERROR event with a Status, code 410, reason Expired)
//     when the resourceVersion is older than the compaction point,
//   - dropWatches(): every open watch connection is cut mid-stream,
//   - forbidden: kinds whose list and watch get 403 Forbidden, as from RBAC
//     that does not grant them.
// Objects are real Kubernetes objects (from YAML manifests).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseAllDocuments, stringify } from 'yaml';

type Obj = { apiVersion?: string; kind?: string; metadata: { name: string; namespace?: string; resourceVersion?: string; labels?: Record<string, string>; uid?: string; [k: string]: unknown }; [k: string]: unknown };
type EventType = 'ADDED' | 'MODIFIED' | 'DELETED';

interface Resource {
  readonly kind: string;
  readonly listKind: string;
  readonly apiVersion: string;
  /** Path prefix: /api/v1 or /apis/discovery.k8s.io/v1 */
  readonly prefix: string;
  readonly plural: string;
  readonly namespaced: boolean;
}

const RESOURCES: readonly Resource[] = [
  { kind: 'Service', listKind: 'ServiceList', apiVersion: 'v1', prefix: '/api/v1', plural: 'services', namespaced: true },
  { kind: 'EndpointSlice', listKind: 'EndpointSliceList', apiVersion: 'discovery.k8s.io/v1', prefix: '/apis/discovery.k8s.io/v1', plural: 'endpointslices', namespaced: true },
  { kind: 'Node', listKind: 'NodeList', apiVersion: 'v1', prefix: '/api/v1', plural: 'nodes', namespaced: false },
];

interface Watcher {
  readonly res: ServerResponse;
  readonly resource: Resource;
  readonly namespace?: string;
  readonly matches: (o: Obj) => boolean;
  readonly bookmarks: boolean;
}

interface Change {
  readonly rv: number;
  readonly type: EventType;
  readonly resource: Resource;
  readonly object: Obj;
}

/** Parses the label selector forms kube-proxy and lbctl use: `k`, `!k`, `k=v`, `k==v`, `k!=v`, comma-joined. */
export function labelMatcher(selector: string | null): (labels: Record<string, string> | undefined) => boolean {
  if (!selector) return () => true;
  const terms = selector.split(',').map((t) => t.trim()).filter(Boolean);
  return (labels = {}) =>
    terms.every((t) => {
      if (t.startsWith('!')) return !(t.slice(1) in labels);
      const ne = t.split('!=');
      if (ne.length === 2) return labels[ne[0]!] !== ne[1];
      const eq = t.split(/==?/);
      if (eq.length === 2) return labels[eq[0]!] === eq[1];
      return t in labels;
    });
}

function fieldMatcher(selector: string | null): (o: Obj) => boolean {
  if (!selector) return () => true;
  const terms = selector.split(',').map((t) => t.split('='));
  return (o) =>
    terms.every(([k, v]) => {
      if (k === 'metadata.name') return o.metadata.name === v;
      if (k === 'metadata.namespace') return o.metadata.namespace === v;
      return false;
    });
}

export class FakeApiServer {
  private server!: Server;
  private readonly objects = new Map<string, { resource: Resource; object: Obj }>();
  private readonly history: Change[] = [];
  private readonly watchers = new Set<Watcher>();
  private readonly sockets = new Set<Socket>();
  private rv = 1000;
  /** Changes at or before this resourceVersion are gone: older watches get 410. */
  private compactedRv = 0;
  private dir = '';
  /** Every request, for assertions ("the agent relisted"). */
  readonly requests: Array<{ method: string; url: string }> = [];
  kubeconfig = '';
  port = 0;

  async start(): Promise<void> {
    this.server = createServer((req, res) => this.handle(req, res));
    this.server.on('connection', (s) => {
      this.sockets.add(s);
      s.on('close', () => this.sockets.delete(s));
    });
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as AddressInfo).port;
    this.dir = mkdtempSync(path.join(tmpdir(), 'lbctl-fake-apiserver-'));
    this.kubeconfig = path.join(this.dir, 'kubeconfig');
    writeFileSync(
      this.kubeconfig,
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        // client-node refuses plain HTTP unless TLS verification is off (there is no TLS to verify).
        clusters: [{ name: 'fake', cluster: { server: `http://127.0.0.1:${this.port}`, 'insecure-skip-tls-verify': true } }],
        users: [{ name: 'lbctl', user: { token: 'fake-token' } }],
        contexts: [{ name: 'fake', context: { cluster: 'fake', user: 'lbctl' } }],
        'current-context': 'fake',
      }),
    );
  }

  async stop(): Promise<void> {
    for (const w of this.watchers) w.res.destroy();
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** Creates or updates every object of a YAML manifest (several documents allowed). */
  apply(yamlText: string): void {
    for (const doc of parseAllDocuments(yamlText)) {
      const o = doc.toJS() as Obj | null;
      if (o) this.put(o);
    }
  }

  put(o: Obj): void {
    const resource = RESOURCES.find((r) => r.kind === o.kind);
    if (!resource) throw new Error(`fake apiserver: unsupported kind ${o.kind}`);
    const obj = structuredClone(o);
    if (resource.namespaced) obj.metadata.namespace ??= 'default';
    const key = this.key(resource, obj);
    const had = this.objects.get(key);
    obj.metadata.uid = (had?.object.metadata.uid as string | undefined) ?? `uid-${key}`;
    obj.metadata.resourceVersion = String(++this.rv);
    this.objects.set(key, { resource, object: obj });
    this.record(had ? 'MODIFIED' : 'ADDED', resource, obj);
  }

  delete(kind: string, name: string, namespace = 'default'): void {
    const resource = RESOURCES.find((r) => r.kind === kind)!;
    const key = `${resource.plural}/${resource.namespaced ? namespace : ''}/${name}`;
    const had = this.objects.get(key);
    if (!had) throw new Error(`fake apiserver: no ${key}`);
    this.objects.delete(key);
    const obj = { ...had.object, metadata: { ...had.object.metadata, resourceVersion: String(++this.rv) } };
    this.record('DELETED', resource, obj);
  }

  /**
   * Changes the store without telling open watches (as if they were missed
   * while the client was away): used with dropWatches() and compact().
   */
  silently(fn: () => void): void {
    const saved = [...this.watchers];
    this.watchers.clear();
    try {
      fn();
    } finally {
      for (const w of saved) this.watchers.add(w);
    }
  }

  private readonly sorted = new Map<string, { rv: number; list: Array<{ key: string; object: Obj }> }>();

  /** The next list request with a continue token gets 410 Expired (once). */
  expireContinue = false;

  /** Forget history up to now: a watch from an older resourceVersion gets 410 Gone. */
  compact(): void {
    this.compactedRv = this.rv;
    this.history.length = 0;
  }

  /** Cuts every open watch connection mid-stream. */
  dropWatches(): void {
    for (const w of this.watchers) w.res.socket?.destroy();
    this.watchers.clear();
  }

  /**
   * Sends a BOOKMARK with the current resourceVersion to every watch that
   * asked for them. Resolves once each is handed to the kernel: from then on
   * the client reads it before whatever follows on its connection, even the
   * end of one that dropWatches() cuts.
   */
  bookmark(): Promise<void> {
    const sent: Array<Promise<void>> = [];
    for (const w of this.watchers) {
      if (!w.bookmarks) continue;
      const event = { type: 'BOOKMARK', object: { kind: w.resource.kind, apiVersion: w.resource.apiVersion, metadata: { resourceVersion: String(this.rv) } } };
      sent.push(new Promise((resolve) => w.res.write(JSON.stringify(event) + '\n', () => resolve())));
    }
    return Promise.all(sent).then(() => undefined);
  }

  /**
   * Values added as they are to the first page of every list of a kind
   * (hostile-input tests: items no API server would hold, null among them).
   */
  readonly rawListItems = new Map<string, unknown[]>();

  /**
   * Writes `text` as it is to every open watch of `kind`: lines that are not
   * JSON, events of unknown types, objects no API server would hold, lines
   * too long to be an object (hostile-input tests).
   */
  sendRaw(kind: string, text: string | Buffer): void {
    for (const w of this.watchers) if (w.resource.kind === kind) w.res.write(text);
  }

  get openWatches(): number {
    return this.watchers.size;
  }

  private key(resource: Resource, o: Obj): string {
    return `${resource.plural}/${resource.namespaced ? (o.metadata.namespace ?? 'default') : ''}/${o.metadata.name}`;
  }

  private record(type: EventType, resource: Resource, object: Obj): void {
    const change: Change = { rv: this.rv, type, resource, object };
    this.history.push(change);
    for (const w of this.watchers) this.deliver(w, change);
  }

  private deliver(w: Watcher, c: Change): void {
    if (c.resource !== w.resource) return;
    if (w.namespace && c.object.metadata.namespace !== w.namespace) return;
    if (!w.matches(c.object)) return;
    this.send(w, { type: c.type, object: c.object });
  }

  private send(w: Watcher, event: unknown): void {
    w.res.write(JSON.stringify(event) + '\n');
  }

  private route(pathname: string): { resource: Resource; namespace?: string } | undefined {
    for (const r of RESOURCES) {
      if (pathname === `${r.prefix}/${r.plural}`) return { resource: r };
      const m = new RegExp(`^${r.prefix.replace(/\./g, '\\.')}/namespaces/([^/]+)/${r.plural}$`).exec(pathname);
      if (m && r.namespaced) return { resource: r, namespace: m[1]! };
    }
    return undefined;
  }

  private status(res: ServerResponse, code: number, reason: string, message: string): void {
    res.writeHead(code, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code }));
  }

  /** While unavailable, every request gets 503, as from an API server that is down. */
  available = true;

  /**
   * Kinds the client may not list or watch: 403 with the Status an API
   * server's RBAC authorizer sends (a service account without that rule).
   */
  readonly forbidden = new Set<string>();

  private handle(req: IncomingMessage, res: ServerResponse): void {
    this.requests.push({ method: req.method ?? 'GET', url: req.url ?? '' });
    if (!this.available) return this.status(res, 503, 'ServiceUnavailable', 'the fake API server is down');
    const url = new URL(req.url ?? '/', 'http://fake');
    if (req.headers.authorization !== 'Bearer fake-token') return this.status(res, 401, 'Unauthorized', 'Unauthorized');
    const route = this.route(url.pathname);
    if (req.method !== 'GET' || !route) return this.status(res, 404, 'NotFound', `the server could not find ${url.pathname}`);
    const { resource, namespace } = route;
    if (this.forbidden.has(resource.kind)) {
      const verb = url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1' ? 'watch' : 'list';
      const scope = namespace ? `in the namespace "${namespace}"` : 'at the cluster scope';
      const group = resource.apiVersion.includes('/') ? resource.apiVersion.split('/')[0] : '';
      return this.status(res, 403, 'Forbidden', `${resource.plural} is forbidden: User "system:serviceaccount:kube-system:lbctl" cannot ${verb} resource "${resource.plural}" in API group "${group}" ${scope}`);
    }
    const labels = labelMatcher(url.searchParams.get('labelSelector'));
    const fields = fieldMatcher(url.searchParams.get('fieldSelector'));
    const matches = (o: Obj): boolean => labels(o.metadata.labels) && fields(o);

    if (url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1') {
      const from = Number(url.searchParams.get('resourceVersion') || this.rv);
      res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
      res.flushHeaders();
      const w: Watcher = { res, resource, ...(namespace ? { namespace } : {}), matches, bookmarks: url.searchParams.get('allowWatchBookmarks') === 'true' };
      if (from < this.compactedRv) {
        this.send(w, {
          type: 'ERROR',
          object: { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: `too old resource version: ${from} (${this.compactedRv})`, reason: 'Expired', code: 410 },
        });
        res.end();
        return;
      }
      for (const c of this.history) if (c.rv > from) this.deliver(w, c);
      this.watchers.add(w);
      const timeout = Number(url.searchParams.get('timeoutSeconds') || 0);
      const timer = timeout > 0 ? setTimeout(() => res.end(), timeout * 1000) : undefined;
      res.on('close', () => {
        if (timer) clearTimeout(timer);
        this.watchers.delete(w);
      });
      return;
    }

    // Paging as the API server does it: `limit` items in the store's key
    // order, and an opaque continue token naming the list's resourceVersion
    // and the last key. A token older than the compaction (or expired on
    // purpose) is 410.
    let listRv = this.rv;
    let after = '';
    const token = url.searchParams.get('continue');
    if (token) {
      let parsed: { rv: number; after: string };
      try {
        parsed = JSON.parse(Buffer.from(token, 'base64url').toString()) as { rv: number; after: string };
      } catch {
        return this.status(res, 400, 'BadRequest', 'continue key is not valid');
      }
      if (this.expireContinue || parsed.rv < this.compactedRv) {
        this.expireContinue = false;
        return this.status(res, 410, 'Expired', 'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.');
      }
      listRv = parsed.rv;
      after = parsed.after;
    }
    // Every object of the resource in key order, sorted once per version of the store.
    let all = this.sorted.get(resource.plural);
    if (!all || all.rv !== this.rv) {
      const list = [...this.objects].filter(([, e]) => e.resource === resource).map(([key, e]) => ({ key, object: e.object }));
      list.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
      this.sorted.set(resource.plural, (all = { rv: this.rv, list }));
    }
    let lo = 0;
    for (let hi = all.list.length; lo < hi; ) {
      const mid = (lo + hi) >>> 1;
      if (all.list[mid]!.key <= after) lo = mid + 1;
      else hi = mid;
    }
    const limit = Number(url.searchParams.get('limit') || 0);
    const items: Obj[] = [];
    let last = '';
    let next: string | undefined;
    for (let i = lo; i < all.list.length; i++) {
      const { key, object } = all.list[i]!;
      if ((namespace && object.metadata.namespace !== namespace) || !matches(object)) continue;
      if (limit > 0 && items.length === limit) {
        next = Buffer.from(JSON.stringify({ rv: listRv, after: last })).toString('base64url');
        break;
      }
      items.push(object);
      last = key;
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify({
        kind: resource.listKind,
        apiVersion: resource.apiVersion,
        metadata: { resourceVersion: String(listRv), ...(next ? { continue: next } : {}) },
        items: after ? items : [...(this.rawListItems.get(resource.kind) ?? []), ...items],
      }),
    );
  }
}
