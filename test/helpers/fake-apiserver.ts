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
//     that does not grant them; throttled: kinds API Priority and Fairness
//     turns away (429),
//   - available = false: every request gets 503; goAway()/comeBack(): the
//     port refuses connections, then a new server process answers;
//     restart(): a new server process at once (its watch cache starts anew).
// And as a kube-apiserver guards them (new FakeApiServer({ tls: true }),
// setRbac()), for a client that runs as in a pod:
//   - TLS: HTTPS with a certificate for 127.0.0.1 signed by a CA made for
//     this server (caFile: the pod's ca.crt),
//   - authentication: bearer tokens mapped to users (`tokens`); any other
//     token, or none, is 401,
//   - authorization: RBAC objects (ClusterRoles, ClusterRoleBindings, Roles,
//     RoleBindings: the rendered manifests of deploy/) evaluated as
//     kube-apiserver's RBAC authorizer does, from the request attributes its
//     request-info resolver derives; a denied request is 403 with that
//     server's Status message, and requestCounts() says who asked what.
// Objects are real Kubernetes objects (from YAML manifests).
//
// And as a kube-apiserver of a given version serves them (`version`,
// `features`): every list and watch is classified as its watch cache would
// answer it or as read through to etcd, by its parameters and the server's
// feature gates, and counted by kind (requestKinds()), so tests can say
// what a client would cost a real server. The rules are the apiserver's
// (k8s.io/apiserver pkg/storage/cacher: shouldDelegateList in cacher.go up
// to 1.32, delegator.go and delegator/interface.go from 1.33):
//   - resourceVersion "0" (and no resourceVersionMatch, or NotOlderThan):
//     the cache, whatever the limit (the cache ignores it: the whole
//     collection in one answer);
//   - resourceVersion N, no limit: the cache ("not older than" N); an N the
//     cache has not reached is 504 "Too large resource version" (a real
//     server waits up to 3 s first);
//   - resourceVersion "" (a consistent list): etcd before 1.31; the cache
//     with ConsistentListFromCache (1.31+, which reads etcd's current
//     revision, a small request, and waits for the cache to reach it:
//     a cache that cannot, `cacheBehind`, falls back to etcd), a limit
//     honoured with a continue token;
//   - a continue token, resourceVersionMatch=Exact, or a limit with N: etcd
//     (a version older than the compaction is 410 Expired); from the cache's
//     snapshots with ListFromCacheSnapshot (1.34+);
//   - watch: the cache; older than its window (compact(), restart()) 410;
//   - a list from 1.33 on (StreamingCollectionEncodingToJSON, KEP-5116) is
//     sent item by item as each is encoded, with the socket's backpressure;
//     before, it is encoded whole, then sent;
//   - a list whose answer passes 128 KiB is gzip-compressed (level 1) for a
//     client that accepts gzip (APIResponseCompression, beta and on since
//     1.16; writers.go's deferredResponseWriter: defaultGzipThresholdBytes,
//     defaultGzipContentEncodingLevel); a streamed list is held until it
//     passes the threshold or ends, then sent compressed or not. Watches are
//     not compressed;
//   - watch with sendInitialEvents=true (a "watch-list", KEP-3157), with
//     WatchList on (1.32, 1.34+): the current objects as ADDED events, then
//     a BOOKMARK annotated k8s.io/initial-events-end, then the watch; with
//     it off, 422 Invalid with the message of that server's validation.
// What this server does not model: the cache's content is always current
// (`cacheBehind` makes it refuse what a lagging cache would refuse, not
// serve old objects), and a list at an exact version gets the current
// objects.
import { execFileSync } from 'node:child_process';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Writable } from 'node:stream';
import { createGzip, gzipSync } from 'node:zlib';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
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

/** An authenticated user, as kube-apiserver's authenticators hand it to the authorizers. */
export interface UserInfo {
  readonly name: string;
  readonly groups: readonly string[];
}

/** The user a service account's token authenticates as (kube-apiserver's service-account authenticator). */
export function serviceAccountUser(namespace: string, name: string): UserInfo {
  return { name: `system:serviceaccount:${namespace}:${name}`, groups: ['system:serviceaccounts', `system:serviceaccounts:${namespace}`, 'system:authenticated'] };
}

/** The bearer token the kubeconfig carries; it authenticates as LBCTL_SERVICE_ACCOUNT. */
export const AGENT_TOKEN = 'fake-token';

/** The agent's service account in deploy/ (kube-system/lbctl); AGENT_TOKEN authenticates as it. */
export const LBCTL_SERVICE_ACCOUNT = serviceAccountUser('kube-system', 'lbctl');

/**
 * What the authorizer sees of a request: k8s.io/apiserver's RequestInfo
 * (endpoints/request/requestinfo.go) and the user.
 */
export interface RequestAttributes {
  readonly resourceRequest: boolean;
  readonly verb: string;
  readonly path: string;
  readonly apiGroup: string;
  readonly apiVersion: string;
  readonly namespace: string;
  readonly resource: string;
  readonly subresource: string;
  readonly name: string;
}

const WATCH = (q: URLSearchParams): boolean => q.get('watch') === 'true' || q.get('watch') === '1';

/**
 * RequestInfoFactory.NewRequestInfo, for what this server is asked:
 * /api/VERSION/… and /apis/GROUP/VERSION/…, optionally namespaced, a
 * collection or a named object (and a subresource); a GET of a collection
 * is list, or watch with watch=true, and a list or watch whose fieldSelector
 * pins metadata.name names that object (as the resolver does, so that
 * resourceNames rules apply). Anything else is a non-resource request.
 */
export function requestAttributes(method: string, url: URL): RequestAttributes {
  const parts = url.pathname.split('/').filter((p) => p !== '');
  const verbs: Record<string, string> = { POST: 'create', GET: 'get', HEAD: 'get', PUT: 'update', PATCH: 'patch', DELETE: 'delete' };
  const nonResource = { resourceRequest: false, verb: (method || 'GET').toLowerCase(), path: url.pathname, apiGroup: '', apiVersion: '', namespace: '', resource: '', subresource: '', name: '' };
  let group = '';
  let rest: string[];
  if (parts[0] === 'api' && parts.length >= 3) rest = parts.slice(1);
  else if (parts[0] === 'apis' && parts.length >= 4) {
    group = parts[1]!;
    rest = parts.slice(2);
  } else return nonResource;
  const version = rest.shift()!;
  let namespace = '';
  if (rest[0] === 'namespaces' && rest.length >= 3) {
    namespace = rest[1]!;
    rest = rest.slice(2);
  }
  const [resource = '', name = '', subresource = ''] = rest;
  let verb = verbs[method] ?? method.toLowerCase();
  let objectName = name;
  if (name === '' && verb === 'get') {
    verb = WATCH(url.searchParams) ? 'watch' : 'list';
    const pinned = (url.searchParams.get('fieldSelector') ?? '').split(',').map((t) => /^metadata\.name==?(.+)$/.exec(t)?.[1]).find((n) => n !== undefined);
    if (pinned && /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(pinned)) objectName = pinned;
  } else if (name === '' && verb === 'delete') verb = 'deletecollection';
  else if (verb === 'get' && WATCH(url.searchParams)) verb = 'watch';
  return { resourceRequest: true, verb, path: url.pathname, apiGroup: group, apiVersion: version, namespace, resource, subresource, name: objectName };
}

interface PolicyRule {
  verbs?: string[];
  apiGroups?: string[];
  resources?: string[];
  resourceNames?: string[];
  nonResourceURLs?: string[];
}
interface Subject {
  kind: string;
  name: string;
  namespace?: string;
}
interface RbacObject {
  kind: string;
  metadata: { name: string; namespace?: string };
  rules?: PolicyRule[] | null;
  roleRef?: { kind: string; name: string };
  subjects?: Subject[] | null;
}

const RBAC_KINDS = new Set(['ClusterRole', 'ClusterRoleBinding', 'Role', 'RoleBinding']);

/** rbac/v1 helpers.go: VerbMatches, APIGroupMatches, ResourceMatches, ResourceNameMatches, NonResourceURLMatches. */
function ruleAllows(a: RequestAttributes, rule: PolicyRule): boolean {
  const has = (list: readonly string[] | undefined, v: string): boolean => (list ?? []).some((x) => x === '*' || x === v);
  if (!has(rule.verbs, a.verb)) return false;
  if (!a.resourceRequest) {
    return (rule.nonResourceURLs ?? []).some((u) => u === '*' || u === a.path || (u.endsWith('*') && a.path.startsWith(u.slice(0, -1))));
  }
  if (!has(rule.apiGroups, a.apiGroup)) return false;
  const combined = a.subresource ? `${a.resource}/${a.subresource}` : a.resource;
  const resourceOk = (rule.resources ?? []).some((r) => r === '*' || r === combined || (a.subresource !== '' && r === `*/${a.subresource}`));
  if (!resourceOk) return false;
  return !rule.resourceNames?.length || rule.resourceNames.includes(a.name);
}

/** rbac's appliesToUser: a ServiceAccount subject without a namespace takes the binding's. */
function subjectMatches(user: UserInfo, s: Subject, bindingNamespace: string): boolean {
  switch (s.kind) {
    case 'User':
      return user.name === s.name;
    case 'Group':
      return user.groups.includes(s.name);
    case 'ServiceAccount': {
      const ns = s.namespace || bindingNamespace;
      return ns !== '' && user.name === `system:serviceaccount:${ns}:${s.name}`;
    }
    default:
      return false;
  }
}

/**
 * kube-apiserver's RBAC authorizer (plugin/pkg/auth/authorizer/rbac):
 * every ClusterRoleBinding's ClusterRole, then, for a namespaced request,
 * the RoleBindings of that namespace (a Role of it or a ClusterRole); allowed
 * by the first rule that matches. Roles a binding names that do not exist
 * are the reason given with a denial ("RBAC: clusterrole… not found").
 */
export class Rbac {
  private readonly objects: RbacObject[];

  /** The RBAC objects among `manifests` (any YAML text: other kinds are skipped). */
  constructor(manifests: string) {
    this.objects = parseAllDocuments(manifests)
      .map((d) => d.toJS() as RbacObject | null)
      .filter((o): o is RbacObject => o !== null && RBAC_KINDS.has(o.kind));
    if (this.objects.length === 0) throw new Error('fake apiserver: no RBAC objects in the manifests');
  }

  authorize(user: UserInfo, a: RequestAttributes): { allowed: boolean; reason: string } {
    const errors: string[] = [];
    const find = (kind: string, name: string, namespace = ''): RbacObject | undefined => {
      const o = this.objects.find((x) => x.kind === kind && x.metadata.name === name && (kind === 'Role' ? x.metadata.namespace === namespace : true));
      if (!o) errors.push(`${kind.toLowerCase()}.rbac.authorization.k8s.io "${name}" not found`);
      return o;
    };
    const grants = (role: RbacObject | undefined): boolean => (role?.rules ?? []).some((r) => ruleAllows(a, r));
    for (const b of this.objects.filter((o) => o.kind === 'ClusterRoleBinding')) {
      if (!(b.subjects ?? []).some((s) => subjectMatches(user, s, ''))) continue;
      if (b.roleRef?.kind === 'ClusterRole' && grants(find('ClusterRole', b.roleRef.name))) return { allowed: true, reason: '' };
    }
    if (a.namespace !== '') {
      for (const b of this.objects.filter((o) => o.kind === 'RoleBinding' && o.metadata.namespace === a.namespace)) {
        if (!(b.subjects ?? []).some((s) => subjectMatches(user, s, a.namespace))) continue;
        const role = b.roleRef?.kind === 'Role' ? find('Role', b.roleRef.name, a.namespace) : b.roleRef?.kind === 'ClusterRole' ? find('ClusterRole', b.roleRef.name) : undefined;
        if (grants(role)) return { allowed: true, reason: '' };
      }
    }
    const reason = errors.length === 0 ? '' : `RBAC: ${errors.length === 1 ? errors[0] : `[${errors.join(', ')}]`}`;
    return { allowed: false, reason };
  }
}

/**
 * A denial as kube-apiserver sends it (endpoints/handlers/responsewriters
 * Forbidden + apierrors.NewForbidden): `GROUPRESOURCE ["NAME"] is forbidden:
 * User "U" cannot VERB resource "R" in API group "G" at the cluster scope`
 * (or `in the namespace "NS"`), then `: REASON` if the authorizer gave one.
 */
export function forbiddenStatus(user: UserInfo, a: RequestAttributes, reason = ''): { message: string; details: Record<string, string> } {
  let why: string;
  if (!a.resourceRequest) why = `User "${user.name}" cannot ${a.verb} path "${a.path}"`;
  else {
    const resource = a.subresource ? `${a.resource}/${a.subresource}` : a.resource;
    const scope = a.namespace ? `in the namespace "${a.namespace}"` : 'at the cluster scope';
    why = `User "${user.name}" cannot ${a.verb} resource "${resource}" in API group "${a.apiGroup}" ${scope}`;
  }
  if (reason) why += `: ${reason}`;
  const qualified = a.apiGroup ? `${a.resource}.${a.apiGroup}` : a.resource;
  const message = qualified === '' ? `forbidden: ${why}` : a.name ? `${qualified} "${a.name}" is forbidden: ${why}` : `${qualified} is forbidden: ${why}`;
  const details = { ...(a.name ? { name: a.name } : {}), ...(a.apiGroup ? { group: a.apiGroup } : {}), ...(a.resource ? { kind: a.resource } : {}) };
  return { message, details };
}

/** Makes a CA and a server certificate for 127.0.0.1 signed by it, in `dir` (openssl; a few tens of ms). */
function makeCertificates(dir: string): { ca: string; cert: string; key: string } {
  const file = (name: string): string => path.join(dir, name);
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  const openssl = (args: string[]): void => void execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  openssl(['req', '-x509', ...ec, '-keyout', file('ca.key'), '-out', file('ca.crt'), '-days', '2', '-subj', '/CN=lbctl-test-ca']);
  openssl(['req', ...ec, '-keyout', file('server.key'), '-out', file('server.csr'), '-subj', '/CN=kube-apiserver']);
  writeFileSync(file('server.ext'), 'subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n');
  openssl(['x509', '-req', '-in', file('server.csr'), '-CA', file('ca.crt'), '-CAkey', file('ca.key'), '-set_serial', '2', '-days', '2', '-extfile', file('server.ext'), '-out', file('server.crt')]);
  return { ca: file('ca.crt'), cert: file('server.crt'), key: file('server.key') };
}

/**
 * The feature gates that decide where a list or watch is served from, with
 * their defaults by release (pkg/features/kube_features.go of each
 * release branch).
 */
export interface ServerFeatures {
  /** WatchList: watch with sendInitialEvents. Alpha 1.27 (off), beta on in 1.32, off again in 1.33, on from 1.34. */
  readonly watchList: boolean;
  /** ConsistentListFromCache: a list at resourceVersion "" from the cache. Alpha 1.28 (off), beta on 1.31, GA 1.34. */
  readonly consistentListFromCache: boolean;
  /** ListFromCacheSnapshot: continue tokens and exact versions from the cache's snapshots. Alpha 1.33 (off), beta on 1.34. */
  readonly listFromCacheSnapshot: boolean;
  /**
   * StreamingCollectionEncodingToJSON (KEP-5116): a list's JSON is encoded
   * and sent item by item, so its first items reach the client while the
   * server still encodes the rest. Beta on 1.33, GA 1.34. Before, the whole
   * list was encoded into one buffer and then written.
   */
  readonly streamingListEncoding: boolean;
  /**
   * APIResponseCompression: a list answer over 128 KiB is gzip-compressed
   * at level 1 for a client that sends `Accept-Encoding: gzip`. Beta and on
   * since 1.16 (default true); watches are never compressed.
   */
  readonly responseCompression?: boolean;
  /** Validation before 1.27, which has no sendInitialEvents: resourceVersionMatch is refused on any watch. */
  readonly before127?: boolean;
  /**
   * etcd's progress notifications (RequestWatchProgress: etcd 3.4.31+ or
   * 3.5.13+), default true. Without them a consistent list is read from
   * etcd whatever the gates, and a watch-list is answered with an ERROR
   * event (500).
   */
  readonly etcdProgressNotify?: boolean;
}

export type ServerVersion = '1.26' | '1.30' | '1.31' | '1.32' | '1.33' | '1.34';

/** Each release's defaults; '1.34' stands for 1.34 and later (1.35 and 1.36 change none of these). */
export const SERVER_FEATURES: Readonly<Record<ServerVersion, ServerFeatures>> = {
  '1.26': { watchList: false, consistentListFromCache: false, listFromCacheSnapshot: false, streamingListEncoding: false, before127: true },
  '1.30': { watchList: false, consistentListFromCache: false, listFromCacheSnapshot: false, streamingListEncoding: false },
  '1.31': { watchList: false, consistentListFromCache: true, listFromCacheSnapshot: false, streamingListEncoding: false },
  '1.32': { watchList: true, consistentListFromCache: true, listFromCacheSnapshot: false, streamingListEncoding: false },
  '1.33': { watchList: false, consistentListFromCache: true, listFromCacheSnapshot: false, streamingListEncoding: true },
  '1.34': { watchList: true, consistentListFromCache: true, listFromCacheSnapshot: true, streamingListEncoding: true },
};

/** How much of a streamed list is written at once (a Go server writes as its response buffer fills). */
export const STREAM_WRITE_BYTES = 64 * 1024;

/** Until `out` (the response, or the compressor writing to it) can take more, or `res` is closed (each wait leaves no listener behind). */
function drained(out: Writable, res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = (): void => {
      out.off('drain', done);
      res.off('close', done);
      resolve();
    };
    out.on('drain', done);
    res.on('close', done);
  });
}

const GZIP_HEADERS = { 'content-type': 'application/json', 'content-encoding': 'gzip', vary: 'Accept-Encoding' } as const;

/** A kube-apiserver compresses an answer whose first write (or, streamed, whose start) passes this (writers.go defaultGzipThresholdBytes). */
export const GZIP_THRESHOLD_BYTES = 128 * 1024;

/** Whether an Accept-Encoding header admits gzip (a `q=0` refuses it). */
function acceptsGzip(header: string | undefined): boolean {
  if (!header) return false;
  return header.split(',').some((part) => {
    const [coding, ...params] = part.trim().toLowerCase().split(';');
    if (coding !== 'gzip') return false;
    const q = params.map((x) => x.trim()).find((x) => x.startsWith('q='));
    return q === undefined || Number(q.slice(2)) > 0;
  });
}

/** The directories of servers not stopped yet: removed when the process exits (a run interrupted, a test that failed before stop()). */
const liveDirs = new Set<string>();
let exitHooked = false;
function removeAtExit(dir: string): void {
  if (!exitHooked) process.on('exit', () => liveDirs.forEach((d) => rmSync(d, { recursive: true, force: true })));
  exitHooked = true;
  liveDirs.add(dir);
}

export interface FakeApiServerOptions {
  /** HTTPS with a certificate for 127.0.0.1 from a CA made for this server (caFile); default plain HTTP. */
  readonly tls?: boolean;
  /** The release whose default feature gates the server has (default '1.34': 1.34 and later). */
  readonly version?: ServerVersion;
  /** Gates that differ from the release's defaults. */
  readonly features?: Partial<ServerFeatures>;
}

/**
 * How a real server would have served a request: a list from its watch
 * cache, or read through to etcd; a watch (always the cache); a watch-list;
 * or refused by validation (400, 422) before it reached either.
 */
export type RequestKind = 'list-cache' | 'list-storage' | 'watch' | 'watch-list' | 'invalid';

/** One request as the server saw it; who and what once authenticated. */
export interface RequestRecord {
  readonly method: string;
  readonly url: string;
  /** When it arrived (performance.now() of this process). */
  readonly at: number;
  readonly user?: string;
  readonly verb?: string;
  /** GROUPRESOURCE as kube-apiserver names it: "services", "endpointslices.discovery.k8s.io"; the path of a non-resource request. */
  readonly resource?: string;
  /** 401 or 403 when refused. */
  readonly refused?: number;
  /** Where a real server would have served it, once it got past authentication, authorization and routing. */
  readonly kind?: RequestKind;
  /** The answer's status: 200 for a watch whose stream then carried an ERROR event (see `watchError`). */
  readonly status?: number;
  /** The code of the ERROR event a watch was answered with (410 Expired, 504 Too large resource version). */
  readonly watchError?: number;
  /** The request's Accept-Encoding header, as sent. */
  readonly acceptEncoding?: string;
  /** 'gzip': the answer was sent compressed (a list over GZIP_THRESHOLD_BYTES to a client that accepts gzip). */
  readonly contentEncoding?: 'gzip';
  /** The answer's body as sent (compressed or not), bytes: lists only. */
  readonly bytesSent?: number;
}

export class FakeApiServer {
  private server!: Server;
  private readonly objects = new Map<string, { resource: Resource; object: Obj }>();
  private readonly history: Change[] = [];
  private readonly watchers = new Set<Watcher>();
  /**
   * Called as each watch event is handed to its connection, after it was
   * serialized, with the time (absolute: performance.timeOrigin +
   * performance.now()): where a measurement "from the API server sending"
   * starts.
   */
  onSend: ((at: number) => void) | undefined;
  private readonly sockets = new Set<Socket>();
  private rv = 1000;
  /** Changes at or before this resourceVersion are gone: older watches get 410. */
  private compactedRv = 0;
  /** The oldest version a watch may start from: the watch cache's window (compact(), restart()). */
  private cacheStartRv = 0;
  private dir = '';
  /** Every request, for assertions ("the agent relisted"). */
  readonly requests: RequestRecord[] = [];
  kubeconfig = '';
  port = 0;
  /** With tls: the CA that signed the server's certificate (a pod's ca.crt). */
  caFile = '';
  /** https://127.0.0.1:PORT, or http:// without tls. */
  url = '';

  /** Bearer tokens and the users they authenticate as; any other token, or none, is 401. */
  readonly tokens = new Map<string, UserInfo>([[AGENT_TOKEN, LBCTL_SERVICE_ACCOUNT]]);

  /**
   * The RBAC in force (setRbac()); undefined: every authenticated request
   * is allowed (the kinds in `forbidden` aside).
   */
  rbac: Rbac | undefined;

  /** The feature gates in force: the release's defaults and the overrides. */
  readonly features: ServerFeatures;

  /**
   * How many versions the watch cache is behind etcd (an API server that
   * lags, as one of several may): a cache list or watch-list asking for a
   * version past it gets 504 "Too large resource version", and a consistent
   * list from the cache falls back to etcd. 0: the cache is current.
   */
  cacheBehind = 0;

  constructor(private readonly opts: FakeApiServerOptions = {}) {
    this.features = { ...SERVER_FEATURES[opts.version ?? '1.34'], ...opts.features };
  }

  /**
   * Requests by kind (RequestKind), from request `since` on (an index into
   * `requests`), optionally only those whose path starts with `path`.
   */
  requestKinds(opts: { since?: number; path?: string } = {}): Partial<Record<RequestKind, number>> {
    const counts: Partial<Record<RequestKind, number>> = {};
    for (const r of this.requests.slice(opts.since ?? 0)) {
      if (!r.kind || (opts.path !== undefined && !r.url.startsWith(opts.path))) continue;
      counts[r.kind] = (counts[r.kind] ?? 0) + 1;
    }
    return counts;
  }

  /** Enforces the RBAC objects among `manifests` from now on (any YAML: `kubectl kustomize deploy`'s output); takes effect at the next request. */
  setRbac(manifests: string): void {
    this.rbac = new Rbac(manifests);
  }

  /**
   * How many requests each user made, by verb and resource, as
   * "USER VERB RESOURCE" (RESOURCE as in RequestRecord); refused ones only
   * with `refused: true`.
   */
  requestCounts(opts: { refused?: boolean } = {}): Record<string, number> {
    const counts: Record<string, number> = {};
    for (const r of this.requests) {
      if (r.user === undefined || Boolean(r.refused) !== Boolean(opts.refused)) continue;
      const key = `${r.user} ${r.verb} ${r.resource}`;
      counts[key] = (counts[key] ?? 0) + 1;
    }
    return counts;
  }

  async start(): Promise<void> {
    this.dir = mkdtempSync(path.join(tmpdir(), 'lbctl-fake-apiserver-'));
    removeAtExit(this.dir);
    const handler = (req: IncomingMessage, res: ServerResponse): void => this.handle(req, res);
    if (this.opts.tls) {
      const { ca, cert, key } = makeCertificates(this.dir);
      this.caFile = ca;
      this.server = createHttpsServer({ cert: readFileSync(cert), key: readFileSync(key) }, handler);
    } else {
      this.server = createServer(handler);
    }
    this.server.on('connection', (s) => {
      this.sockets.add(s);
      s.on('close', () => this.sockets.delete(s));
    });
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as AddressInfo).port;
    this.url = `${this.opts.tls ? 'https' : 'http'}://127.0.0.1:${this.port}`;
    this.kubeconfig = path.join(this.dir, 'kubeconfig');
    writeFileSync(
      this.kubeconfig,
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [
          {
            name: 'fake',
            // client-node refuses plain HTTP unless TLS verification is off (there is no TLS to verify).
            cluster: this.opts.tls ? { server: this.url, 'certificate-authority': this.caFile } : { server: this.url, 'insecure-skip-tls-verify': true },
          },
        ],
        users: [{ name: 'lbctl', user: { token: AGENT_TOKEN } }],
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
    liveDirs.delete(this.dir);
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

  /**
   * Forget history up to now (etcd's compaction, and the watch cache's
   * window with it): a watch, an exact list or a continue token from an
   * older resourceVersion gets 410.
   */
  compact(): void {
    this.compactedRv = this.rv;
    this.cacheStartRv = this.rv;
    this.history.length = 0;
  }

  /**
   * An API server restart: every connection is cut, and the new process's
   * watch cache starts at the current version, so a watch resumed from an
   * older one gets 410 Gone and its client relists (etcd's history, and the
   * continue tokens it serves, are untouched).
   */
  restart(): void {
    this.dropWatches();
    for (const s of this.sockets) s.destroy();
    this.cacheStartRv = this.rv;
    this.history.length = 0;
  }

  /**
   * The API server goes away: every connection is cut and the port refuses
   * new ones (ECONNREFUSED) until comeBack(). The store stays (etcd is not
   * the API server): put() and delete() change it meanwhile.
   */
  async goAway(): Promise<void> {
    this.dropWatches();
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** A new API server process on the same port: as restart(), its watch cache starts at the current version. */
  async comeBack(): Promise<void> {
    this.restart();
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.port, '127.0.0.1', () => {
        this.server.off('error', reject);
        resolve();
      });
    });
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

  /** The store's current resourceVersion (the last write's). */
  get resourceVersion(): number {
    return this.rv;
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
    const line = JSON.stringify(event) + '\n';
    this.onSend?.(performance.timeOrigin + performance.now());
    w.res.write(line);
  }

  private route(pathname: string): { resource: Resource; namespace?: string } | undefined {
    for (const r of RESOURCES) {
      if (pathname === `${r.prefix}/${r.plural}`) return { resource: r };
      const m = new RegExp(`^${r.prefix.replace(/\./g, '\\.')}/namespaces/([^/]+)/${r.plural}$`).exec(pathname);
      if (m && r.namespaced) return { resource: r, namespace: m[1]! };
    }
    return undefined;
  }

  private status(res: ServerResponse, code: number, reason: string, message: string, details?: Record<string, unknown>): void {
    res.writeHead(code, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, ...(details ? { details } : {}), code }));
  }

  /** While unavailable, every request gets 503, as from an API server that is down. */
  available = true;

  /**
   * Kinds the client may not list or watch: 403 with the Status an API
   * server's RBAC authorizer sends (a service account without that rule).
   */
  readonly forbidden = new Set<string>();

  /**
   * Kinds whose lists and watches API Priority and Fairness turns away: 429
   * with Retry-After, as from a server that is up and too busy.
   */
  readonly throttled = new Set<string>();

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const record: { -readonly [K in keyof RequestRecord]: RequestRecord[K] } = { method: req.method ?? 'GET', url: req.url ?? '', at: performance.now() };
    if (req.headers['accept-encoding'] !== undefined) record.acceptEncoding = req.headers['accept-encoding'];
    this.requests.push(record);
    const status = (code: number, reason: string, message: string, details?: Record<string, unknown>): void => {
      record.status = code;
      this.status(res, code, reason, message, details);
    };
    if (!this.available) return status(503, 'ServiceUnavailable', 'the fake API server is down');
    const url = new URL(req.url ?? '/', 'http://fake');
    // Authentication, then authorization, then the handler: kube-apiserver's order.
    const auth = /^Bearer (.+)$/.exec(req.headers.authorization ?? '');
    const user = auth ? this.tokens.get(auth[1]!) : undefined;
    if (!user) {
      record.refused = 401;
      return status(401, 'Unauthorized', 'Unauthorized');
    }
    const attrs = requestAttributes(record.method, url);
    record.user = user.name;
    record.verb = attrs.verb;
    record.resource = !attrs.resourceRequest ? attrs.path : attrs.apiGroup ? `${attrs.resource}.${attrs.apiGroup}` : attrs.resource;
    const decision = this.rbac?.authorize(user, attrs);
    if (decision && !decision.allowed) {
      record.refused = 403;
      const { message, details } = forbiddenStatus(user, attrs, decision.reason);
      return status(403, 'Forbidden', message, details);
    }
    const route = this.route(url.pathname);
    if (req.method !== 'GET' || !route) return status(404, 'NotFound', `the server could not find ${url.pathname}`);
    const { resource, namespace } = route;
    if (this.forbidden.has(resource.kind)) {
      record.refused = 403;
      const verb = WATCH(url.searchParams) ? 'watch' : 'list';
      const scope = namespace ? `in the namespace "${namespace}"` : 'at the cluster scope';
      const group = resource.apiVersion.includes('/') ? resource.apiVersion.split('/')[0] : '';
      return status(403, 'Forbidden', `${resource.plural} is forbidden: User "${user.name}" cannot ${verb} resource "${resource.plural}" in API group "${group}" ${scope}`);
    }
    if (this.throttled.has(resource.kind)) {
      res.setHeader('retry-after', '1');
      return status(429, 'TooManyRequests', 'Too many requests, please try again later.', { retryAfterSeconds: 1 });
    }
    const invalid = this.validateListOptions(url.searchParams);
    if (invalid.length > 0) {
      record.kind = 'invalid';
      return status(422, 'Invalid', `ListOptions.meta.k8s.io "" is invalid: ${invalid.length === 1 ? invalid[0]!.text : `[${invalid.map((e) => e.text).join(', ')}]`}`, {
        group: 'meta.k8s.io',
        kind: 'ListOptions',
        causes: invalid.map((e) => ({ reason: 'FieldValueForbidden', message: e.body, field: e.field })),
      });
    }
    const labels = labelMatcher(url.searchParams.get('labelSelector'));
    const fields = fieldMatcher(url.searchParams.get('fieldSelector'));
    const matches = (o: Obj): boolean => labels(o.metadata.labels) && fields(o);
    if (WATCH(url.searchParams)) return this.watch(res, record, url.searchParams, resource, namespace, matches);
    const gzip = this.features.responseCompression !== false && acceptsGzip(req.headers['accept-encoding']);
    return this.list(res, record, status, url.searchParams, resource, namespace, matches, gzip);
  }

  /**
   * ValidateListOptions (apimachinery pkg/apis/meta/internalversion/
   * validation), the part a watch-list meets: errors as field.Error prints
   * them ("FIELD: Forbidden: DETAIL") and their cause's message ("Forbidden: DETAIL").
   */
  private validateListOptions(q: URLSearchParams): Array<{ field: string; text: string; body: string }> {
    const errs: Array<{ field: string; text: string; body: string }> = [];
    const forbidden = (field: string, detail: string): void => void errs.push({ field, text: `${field}: Forbidden: ${detail}`, body: `Forbidden: ${detail}` });
    const match = q.get('resourceVersionMatch') ?? '';
    if (WATCH(q)) {
      if (this.features.before127) {
        // No sendInitialEvents field: the parameter is not decoded at all.
        if (match !== '') forbidden('resourceVersionMatch', 'resourceVersionMatch is forbidden for watch');
        return errs;
      }
      const sendInitialEvents = q.has('sendInitialEvents');
      if (sendInitialEvents) {
        if (match !== 'NotOlderThan') forbidden('resourceVersionMatch', 'sendInitialEvents requires setting resourceVersionMatch to NotOlderThan');
        if (!this.features.watchList) forbidden('sendInitialEvents', 'sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled');
      }
      if (match !== '' && !sendInitialEvents) forbidden('resourceVersionMatch', 'resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided');
      return errs;
    }
    if (match !== '') {
      if (!q.get('resourceVersion')) forbidden('resourceVersionMatch', 'resourceVersionMatch is forbidden unless resourceVersion is provided');
      if (q.get('continue')) forbidden('resourceVersionMatch', 'resourceVersionMatch is forbidden when continue is provided');
    }
    if (q.has('sendInitialEvents') && !this.features.before127) forbidden('sendInitialEvents', 'sendInitialEvents is forbidden for list');
    return errs;
  }

  /** The version the watch cache has reached. */
  private get cacheRv(): number {
    return this.rv - this.cacheBehind;
  }

  /** storage.NewTooLargeResourceVersionError: 504 Timeout with the ResourceVersionTooLarge cause. */
  private tooLarge(asked: number): { message: string; details: Record<string, unknown> } {
    return {
      message: `Timeout: Too large resource version: ${asked}, current: ${this.cacheRv}`,
      details: { retryAfterSeconds: 1, causes: [{ reason: 'ResourceVersionTooLarge', message: 'Too large resource version' }] },
    };
  }

  private watch(res: ServerResponse, record: { kind?: RequestKind; status?: number; watchError?: number }, q: URLSearchParams, resource: Resource, namespace: string | undefined, matches: (o: Obj) => boolean): void {
    const watchList = q.get('sendInitialEvents') === 'true' && !this.features.before127;
    const bookmarks = q.get('allowWatchBookmarks') === 'true';
    record.kind = watchList ? 'watch-list' : 'watch';
    record.status = 200;
    const rvParam = q.get('resourceVersion') ?? '';
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.flushHeaders();
    const w: Watcher = { res, resource, ...(namespace ? { namespace } : {}), matches, bookmarks };
    const fail = (code: number, reason: string, message: string, details?: Record<string, unknown>): void => {
      record.watchError = code;
      this.send(w, { type: 'ERROR', object: { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code, ...(details ? { details } : {}) } });
      res.end();
    };
    let from: number;
    if (watchList) {
      if (this.features.etcdProgressNotify === false) {
        return fail(500, 'InternalError', 'a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled');
      }
      // cacher.go: "" waits for the cache to reach etcd's current revision
      // (3 s at most); N waits for N; "0" takes the cache as it is.
      const asked = rvParam === '' ? this.rv : Number(rvParam);
      if (asked > this.cacheRv) {
        const { message, details } = this.tooLarge(asked);
        return fail(504, 'Timeout', message, details);
      }
      // The initial events: every object the watch selects, as ADDED, in key order.
      for (const { object } of this.sortedObjects(resource)) {
        if ((namespace && object.metadata.namespace !== namespace) || !matches(object)) continue;
        this.send(w, { type: 'ADDED', object });
      }
      for (const raw of this.rawListItems.get(resource.kind) ?? []) this.send(w, { type: 'ADDED', object: raw });
      from = this.rv;
      if (bookmarks) {
        this.send(w, {
          type: 'BOOKMARK',
          object: { kind: resource.kind, apiVersion: resource.apiVersion, metadata: { resourceVersion: String(from), annotations: { 'k8s.io/initial-events-end': 'true' } } },
        });
      }
    } else {
      from = Number(rvParam || this.rv);
      const floor = Math.max(this.compactedRv, this.cacheStartRv);
      if (from < floor) return fail(410, 'Expired', `too old resource version: ${from} (${floor})`);
      for (const c of this.history) if (c.rv > from) this.deliver(w, c);
    }
    this.watchers.add(w);
    const timeout = Number(q.get('timeoutSeconds') || 0);
    const timer = timeout > 0 ? setTimeout(() => res.end(), timeout * 1000) : undefined;
    res.on('close', () => {
      if (timer) clearTimeout(timer);
      this.watchers.delete(w);
    });
  }

  /**
   * Where a real server would serve a list from, by its parameters and
   * features (see the top of this file), and the version it would answer at.
   */
  private listSource(q: URLSearchParams, continueRv: number | undefined): { from: 'cache' | 'storage'; asked?: number; exact: boolean } {
    const rv = q.get('resourceVersion') ?? '';
    const match = q.get('resourceVersionMatch') ?? '';
    const limit = Number(q.get('limit') || 0);
    const snapshot = (version: number): 'cache' | 'storage' => (this.features.listFromCacheSnapshot && version >= this.cacheStartRv && version <= this.cacheRv ? 'cache' : 'storage');
    if (continueRv !== undefined) return { from: snapshot(continueRv), asked: continueRv, exact: true };
    if (match === 'Exact' || (match === '' && limit > 0 && rv !== '' && rv !== '0')) return { from: snapshot(Number(rv)), asked: Number(rv), exact: true };
    if (rv === '') return { from: this.features.consistentListFromCache && this.features.etcdProgressNotify !== false && this.cacheBehind === 0 ? 'cache' : 'storage', exact: false };
    return { from: 'cache', asked: Number(rv), exact: false };
  }

  /** Every object of a resource in key order, sorted once per version of the store. */
  private sortedObjects(resource: Resource): Array<{ key: string; object: Obj }> {
    let all = this.sorted.get(resource.plural);
    if (!all || all.rv !== this.rv) {
      const list = [...this.objects].filter(([, e]) => e.resource === resource).map(([key, e]) => ({ key, object: e.object }));
      list.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
      this.sorted.set(resource.plural, (all = { rv: this.rv, list }));
    }
    return all.list;
  }

  private list(
    res: ServerResponse,
    record: { kind?: RequestKind; contentEncoding?: 'gzip'; bytesSent?: number },
    status: (code: number, reason: string, message: string, details?: Record<string, unknown>) => void,
    q: URLSearchParams,
    resource: Resource,
    namespace: string | undefined,
    matches: (o: Obj) => boolean,
    gzip: boolean,
  ): void {
    // Paging as the API server does it: `limit` items in the store's key
    // order, and an opaque continue token naming the list's resourceVersion
    // and the last key. A token older than the compaction (or expired on
    // purpose) is 410.
    let after = '';
    let continueRv: number | undefined;
    const token = q.get('continue');
    if (token) {
      let parsed: { rv: number; after: string };
      try {
        parsed = JSON.parse(Buffer.from(token, 'base64url').toString()) as { rv: number; after: string };
      } catch {
        return status(400, 'BadRequest', 'continue key is not valid');
      }
      continueRv = parsed.rv;
      after = parsed.after;
    }
    const source = this.listSource(q, continueRv);
    record.kind = source.from === 'cache' ? 'list-cache' : 'list-storage';
    let listRv = this.rv;
    if (source.exact) {
      // etcd at an exact revision (or a snapshot of the cache): gone once compacted.
      if (this.expireContinue && token) {
        this.expireContinue = false;
        return status(410, 'Expired', 'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.');
      }
      if (source.asked! < this.compactedRv) {
        return token
          ? status(410, 'Expired', 'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.')
          : status(410, 'Expired', `too old resource version: ${source.asked} (${this.compactedRv})`);
      }
      listRv = source.asked!;
    } else if (source.from === 'cache' && source.asked !== undefined && source.asked > this.cacheRv) {
      const { message, details } = this.tooLarge(source.asked);
      return status(504, 'Timeout', message, details);
    }
    // The cache ignores the limit at resourceVersion "0" (cacher.go computeListLimit).
    const limit = source.from === 'cache' && q.get('resourceVersion') === '0' ? 0 : Number(q.get('limit') || 0);
    const all = this.sortedObjects(resource);
    let lo = 0;
    for (let hi = all.length; lo < hi; ) {
      const mid = (lo + hi) >>> 1;
      if (all[mid]!.key <= after) lo = mid + 1;
      else hi = mid;
    }
    const items: Obj[] = [];
    let last = '';
    let next: string | undefined;
    for (let i = lo; i < all.length; i++) {
      const { key, object } = all[i]!;
      if ((namespace && object.metadata.namespace !== namespace) || !matches(object)) continue;
      if (limit > 0 && items.length === limit) {
        next = Buffer.from(JSON.stringify({ rv: listRv, after: last })).toString('base64url');
        break;
      }
      items.push(object);
      last = key;
    }
    (record as { status?: number }).status = 200;
    const list = {
      kind: resource.listKind,
      apiVersion: resource.apiVersion,
      metadata: { resourceVersion: String(listRv), ...(next ? { continue: next } : {}) },
      items: after ? items : [...(this.rawListItems.get(resource.kind) ?? []), ...items],
    };
    if (!this.features.streamingListEncoding) {
      // Encoded whole, then written: nothing reaches the client before the last item is encoded.
      const body = Buffer.from(JSON.stringify(list));
      const compress = gzip && body.length > GZIP_THRESHOLD_BYTES;
      const sent = compress ? gzipSync(body, { level: 1 }) : body;
      if (compress) record.contentEncoding = 'gzip';
      record.bytesSent = sent.length;
      res.writeHead(200, compress ? GZIP_HEADERS : { 'content-type': 'application/json' });
      res.end(sent);
      return;
    }
    void this.streamList(res, record, list, gzip);
  }

  /**
   * A list as a server with streaming encoding sends it (KEP-5116;
   * apimachinery's streamEncodeCollections): the list's own members, then
   * each item encoded on its own and written as the buffer fills, chunked,
   * with the socket's backpressure honoured. The bytes are those of
   * JSON.stringify of the whole list. An item that fails to encode ends the
   * answer where it is, as a Go server's failed write does: the client gets
   * a truncated body, not a Status. With `gzip` (the client accepts it), the
   * start is held until it passes GZIP_THRESHOLD_BYTES, and from there the
   * answer goes through a level-1 gzip stream (writers.go's
   * deferredResponseWriter); a list that ends below it is sent plain.
   */
  private async streamList(
    res: ServerResponse,
    record: { contentEncoding?: 'gzip'; bytesSent?: number },
    list: { kind: string; apiVersion: string; metadata: object; items: readonly unknown[] },
    gzip: boolean,
  ): Promise<void> {
    let sent = 0;
    const count = (chunk: Buffer | string): void => {
      sent += Buffer.byteLength(chunk);
    };
    let out: Writable | undefined;
    let held = '';
    /** Headers and the body's writer, once the answer is known to be compressed or not. */
    const commit = (compress: boolean): Writable => {
      if (!compress) {
        res.writeHead(200, { 'content-type': 'application/json' });
        return res;
      }
      record.contentEncoding = 'gzip';
      res.writeHead(200, GZIP_HEADERS);
      const z = createGzip({ level: 1 });
      z.on('data', count);
      z.pipe(res);
      res.on('close', () => z.destroy());
      return z;
    };
    /** Writes `text`; false when the writer asks to wait. */
    const write = (text: string): boolean => {
      if (!out) {
        held += text;
        if (!gzip || held.length <= GZIP_THRESHOLD_BYTES) return true;
        out = commit(true);
        text = held;
        held = '';
      }
      if (out === res) count(text);
      return out.write(text);
    };
    try {
      if (!gzip) out = commit(false);
      let buf = `{"kind":${JSON.stringify(list.kind)},"apiVersion":${JSON.stringify(list.apiVersion)},"metadata":${JSON.stringify(list.metadata)},"items":[`;
      for (let i = 0; i < list.items.length; i++) {
        buf += (i > 0 ? ',' : '') + (JSON.stringify(list.items[i]) ?? 'null');
        if (buf.length < STREAM_WRITE_BYTES) continue;
        const more = write(buf);
        buf = '';
        if (!more && !res.destroyed) await drained(out!, res);
        if (res.destroyed) return;
      }
      res.once('finish', () => (record.bytesSent = sent));
      // Ended below the threshold: sent as it is.
      out ??= commit(false);
      const tail = `${held}${buf}]}`;
      if (out === res) count(tail);
      out.end(tail);
    } catch (err) {
      res.destroy(err as Error);
    }
  }
}
