// lbctl's load-balancing vocabulary: addresses, families, protocols, and the
// one text form of a frontend or backend key. Below both src/model (which
// turns Kubernetes objects into these) and src/datapath (which encodes them
// into map bytes), so neither imports the other for a word. Restart
// adoption relies on the key form: a frontend read back from the maps must
// get the key the model gives it, or every frontend is renumbered and every
// socket's rev-NAT entry goes stale. Cilium keeps the same in
// pkg/loadbalancer.

export type Protocol = 'TCP' | 'UDP' | 'SCTP';
export type Family = 4 | 6;
/**
 * What a frontend serves: a cluster IP, a NodePort (its address is the
 * surrogate 0.0.0.0 or ::, which the tc datapath matches on every node
 * address), a LoadBalancer ingress IP or an external IP.
 */
export type ServiceType = 'ClusterIP' | 'NodePort' | 'LoadBalancer' | 'ExternalIP';
/**
 * Which traffic a frontend's entry serves. Absent: the external (default)
 * entry, the only one most frontends have. 'internal': the twin of a
 * frontend with externalTrafficPolicy Local, for clients on the node, whose
 * backends follow the internal traffic policy (Cilium's two scopes).
 */
export type Scope = 'internal';
/**
 * How lbctl treats a backend. Slots decide selection (slots 1..count are
 * selectable, count+1..count+qcount are kept for established flows only);
 * the state is recorded in the backend entry for listings. 'quarantined':
 * a backend its readiness probe failed (standalone mode, issue 17), in the
 * non-selectable slots as a terminating one is.
 */
export type BackendState = 'active' | 'terminating' | 'quarantined';

/**
 * "10.96.0.10:53/UDP" or "[fd00::a]:80/TCP": the identity of a frontend;
 * an internal-scope entry adds "/internal" ("0.0.0.0:30080/TCP/internal").
 */
export type FrontendKey = string & { readonly __brand: 'FrontendKey' };
/** Same shape as FrontendKey, for a backend address. */
export type BackendKey = string & { readonly __brand: 'BackendKey' };

export interface L3n4Addr {
  /** Canonical text form (RFC 5952 for IPv6). */
  readonly address: string;
  readonly family: Family;
  readonly port: number;
  readonly protocol: Protocol;
}

/** A service map key without its slot. Wildcards: port 0, protocol 'ANY'. */
export interface ServiceAddr {
  readonly address: string;
  readonly family: Family;
  readonly port: number;
  readonly protocol: Protocol | 'ANY';
  /** Absent (or undefined): the external scope, the key every frontend has. */
  readonly scope?: Scope;
}

export interface Backend extends L3n4Addr {
  readonly state: BackendState;
}

export function formatAddr(address: string, family: Family, port: number): string {
  return family === 6 ? `[${address}]:${port}` : `${address}:${port}`;
}

/**
 * A string built from parts, as one flat string. V8 keeps a concatenation of
 * 13 characters or more as a tree of its parts (a cons string: 32 bytes per
 * node, and the parts stay alive), and hashing it as a Map key flattens it
 * but keeps the node; Array.prototype.join allocates its result flat. For
 * the keys the agent keeps for as long as a service exists: at 10,000
 * services they were 89,000 cons nodes and their parts, about 400 bytes a
 * service (a heap snapshot; docs/architecture.md, "Why the agent is built
 * for 100,000 services").
 */
export function joinFlat(...parts: ReadonlyArray<string | number>): string {
  return parts.join('');
}

/**
 * An array's elements in a store of exactly their number. An array grown by
 * push() keeps spare room (V8 grows its store to 1.5 times plus 16
 * elements), which a GC never gives back: kept for as long as a service
 * exists, a one-element array built by push costs 128 bytes more than a
 * literal (measured; docs/architecture.md, "Why the agent is built for
 * 100,000 services"). For the arrays the
 * agent keeps per service, endpoint or frontend; an empty one is shared.
 */
export function packed<T>(a: readonly T[]): readonly T[] {
  return a.length === 0 ? NONE : a.slice();
}
const NONE: readonly never[] = Object.freeze([]);

/**
 * One object per distinct value, shared by every holder of that value (a
 * port, a frontend's options, a node's name: a cluster repeats a few over
 * thousands of objects; each table says which bench target it holds up,
 * in model/k8s.ts and model/from-k8s.ts). `make` runs only for a
 * key not seen yet. Bounded: past `max` distinct keys (input built to grow
 * the table) values are made per call again, so the table never holds
 * more than `max`.
 */
export class Interner<T> {
  private readonly table = new Map<string, T>();

  constructor(private readonly max: number) {}

  get size(): number {
    return this.table.size;
  }

  of(key: string, make: () => T): T {
    const have = this.table.get(key);
    if (have !== undefined) return have;
    const v = make();
    if (this.table.size < this.max) this.table.set(key, v);
    return v;
  }
}

/**
 * The key text of an address, port, protocol and scope: the only definition
 * of the form. The external scope adds nothing, so every key written before
 * scopes existed reads back the same (restart adoption depends on it).
 */
export function serviceAddrKey(a: ServiceAddr): string {
  const internal = a.scope === 'internal' ? '/internal' : '';
  return a.family === 6 ? joinFlat('[', a.address, ']:', a.port, '/', a.protocol, internal) : joinFlat(a.address, ':', a.port, '/', a.protocol, internal);
}

export function frontendKey(a: L3n4Addr & { readonly scope?: Scope }): FrontendKey {
  return serviceAddrKey(a) as FrontendKey;
}

export function backendKey(a: L3n4Addr): BackendKey {
  return serviceAddrKey(a) as BackendKey;
}
