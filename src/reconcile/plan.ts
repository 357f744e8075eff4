// desired vs realized → the ordered writes that turn one into the other.
// Pure: no I/O, no id allocation (ids are assigned before planning).
//
// Invariant (make before break): at every point between two writes, a
// connecting socket sees either the old service or the new one, never a
// half-written one, and never a slot pointing at a missing backend:
//   1. backends are written before any slot names them;
//   2. a frontend's rev-NAT entry and slots are written before its master
//      entry, whose count makes them selectable; slots beyond a shrunk count
//      are deleted only after the master stops counting them;
//   3. wildcard (address-only) entries follow their frontends;
//   4. removals run in reverse: master first (no new selection), then its
//      slots and rev-NAT entry, then unused wildcards, then unused backends.
// Only differences are written, so a plan over unchanged state is empty.
import type { Backend, DesiredState, Family, Frontend, FrontendKey } from '../model/types.js';
import { LbSvcFlags } from '../datapath/abi.gen.js';
import { serviceAddrKey, type MasterEntry, type RevNatEntry, type ServiceAddr } from '../datapath/lbmaps.js';
import { revNatKey, type RealizedState } from './realized.js';

export type MapOp =
  | { readonly kind: 'put-backend'; readonly id: number; readonly backend: Backend }
  | { readonly kind: 'delete-backend'; readonly id: number; readonly family: Family }
  | { readonly kind: 'put-revnat'; readonly id: number; readonly family: Family; readonly entry: RevNatEntry }
  | { readonly kind: 'delete-revnat'; readonly id: number; readonly family: Family }
  | { readonly kind: 'put-slot'; readonly fe: ServiceAddr; readonly slot: number; readonly backendId: number }
  | { readonly kind: 'delete-slot'; readonly fe: ServiceAddr; readonly slot: number }
  | { readonly kind: 'put-master'; readonly fe: ServiceAddr; readonly master: MasterEntry }
  | { readonly kind: 'delete-master'; readonly fe: ServiceAddr };

export interface IdAssignment {
  backendId(b: Backend): number;
  revNatId(fe: Frontend): number;
}

export function wildcardOf(address: string, family: Family): ServiceAddr {
  return { address, family, port: 0, protocol: 'ANY' };
}

export const WILDCARD_MASTER: MasterEntry = {
  count: 0,
  qcount: 0,
  revNatId: 0,
  type: 'Wildcard',
  flags: 0,
  affinityTimeout: 0,
};

function sameBackend(a: Backend, b: Backend): boolean {
  return a.address === b.address && a.port === b.port && a.protocol === b.protocol && a.state === b.state && a.family === b.family;
}

function sameMaster(a: MasterEntry, b: MasterEntry): boolean {
  return (
    a.count === b.count &&
    a.qcount === b.qcount &&
    a.revNatId === b.revNatId &&
    a.type === b.type &&
    a.flags === b.flags &&
    a.affinityTimeout === b.affinityTimeout
  );
}

/** Slot layout of a frontend: selectable backends, then terminating ones. */
export function slotLayout(fe: Frontend): { active: readonly Backend[]; terminating: readonly Backend[] } {
  return { active: fe.backends, terminating: fe.terminating };
}

export function masterFlags(fe: Frontend): number {
  return (fe.affinityTimeout > 0 ? LbSvcFlags.LB_SVC_F_AFFINITY : 0) | (fe.localOnly ? LbSvcFlags.LB_SVC_F_LOCAL_INTERNAL : 0);
}

/**
 * `unchanged(fe)`: true when this very Frontend was fully written by an
 * earlier sync and the maps have not been re-read since; its writes are then
 * skipped (a change sync touches only what changed). Omitted: every
 * frontend is compared with the realized state (a full plan).
 */
/** The address family an op writes (each family has its own maps). */
export function opFamily(op: MapOp): Family {
  switch (op.kind) {
    case 'put-backend':
      return op.backend.family;
    case 'delete-backend':
    case 'put-revnat':
    case 'delete-revnat':
      return op.family;
    default:
      return op.fe.family;
  }
}

/** ops.push(...more) without a spread: plans reach hundreds of thousands of ops, past the call stack's argument limit. */
function append(ops: MapOp[], more: readonly MapOp[]): void {
  for (const op of more) ops.push(op);
}

export function plan(realized: RealizedState, desired: DesiredState, ids: IdAssignment, unchanged?: (fe: Frontend) => boolean): MapOp[] {
  const ops: MapOp[] = [];
  const tail: MapOp[] = [];
  const same = unchanged ?? (() => false);

  // 1. Backends every changed frontend needs.
  const neededBackends = new Map<number, Backend>();
  for (const fe of desired.values()) {
    if (same(fe)) continue;
    for (const b of fe.backends) neededBackends.set(ids.backendId(b), b);
    for (const b of fe.terminating) neededBackends.set(ids.backendId(b), b);
  }
  for (const [id, b] of neededBackends) {
    const have = realized.backends.get(id);
    if (!have || !sameBackend(have, b)) ops.push({ kind: 'put-backend', id, backend: b });
  }
  ops.sort((a, b) => opFamily(a) - opFamily(b));

  // 2. Frontends: every rev-NAT entry, then every slot, then every master,
  // then slots beyond a shrunk count. Grouped by kind (rather than frontend
  // by frontend) so that runs of one kind go to the kernel in one batch; the
  // order between kinds is what the invariant above needs.
  const revNatOps: MapOp[] = [];
  const slotOps: MapOp[] = [];
  const masterOps: MapOp[] = [];
  const shrinkOps: MapOp[] = [];
  const neededRevNat: Record<Family, Set<number>> = { 4: new Set(), 6: new Set() };
  const addresses = new Set<string>();
  const wildcards: ServiceAddr[] = [];
  for (const fe of desired.values()) {
    const revNatId = ids.revNatId(fe);
    neededRevNat[fe.family].add(revNatId);
    if (!addresses.has(fe.address)) {
      addresses.add(fe.address);
      if (!same(fe)) wildcards.push(wildcardOf(fe.address, fe.family));
    }
    if (same(fe)) continue;
    const addr: ServiceAddr = { address: fe.address, family: fe.family, port: fe.port, protocol: fe.protocol };
    const key = serviceAddrKey(addr);
    const have = realized.frontends.get(key);
    const rn = realized.revNat.get(revNatKey(fe.family, revNatId));
    if (!rn || rn.address !== fe.address || rn.port !== fe.port) {
      revNatOps.push({ kind: 'put-revnat', id: revNatId, family: fe.family, entry: { address: fe.address, port: fe.port } });
    }

    const { active, terminating } = slotLayout(fe);
    const slots = [...active, ...terminating].map((b) => ids.backendId(b));
    slots.forEach((backendId, i) => {
      if (have?.slots.get(i + 1) !== backendId) slotOps.push({ kind: 'put-slot', fe: addr, slot: i + 1, backendId });
    });
    const master: MasterEntry = {
      count: active.length,
      qcount: terminating.length,
      revNatId,
      type: fe.type,
      flags: masterFlags(fe),
      affinityTimeout: fe.affinityTimeout,
    };
    if (!have?.master || !sameMaster(have.master, master)) masterOps.push({ kind: 'put-master', fe: addr, master });
    if (have) {
      for (const slot of [...have.slots.keys()].sort((a, b) => a - b)) {
        if (slot > slots.length) shrinkOps.push({ kind: 'delete-slot', fe: addr, slot });
      }
    }
  }
  for (const list of [revNatOps, slotOps, masterOps]) {
    for (const family of [4, 6] as const) for (const op of list) if (opFamily(op) === family) ops.push(op);
  }
  append(ops, shrinkOps);

  // 3. Wildcards of every address in use (of changed frontends: the others' are written).
  wildcards.sort((a, b) => a.family - b.family);
  for (const wild of wildcards) {
    const have = realized.frontends.get(serviceAddrKey(wild));
    if (!have?.master || !sameMaster(have.master, WILDCARD_MASTER)) {
      ops.push({ kind: 'put-master', fe: wild, master: WILDCARD_MASTER });
    }
  }

  // 4. Removals, in reverse order of creation.
  const wildcardRemovals: MapOp[] = [];
  for (const [key, have] of realized.frontends) {
    if (have.fe.protocol === 'ANY' && have.fe.port === 0) {
      if (addresses.has(have.fe.address)) continue;
      if (have.master) wildcardRemovals.push({ kind: 'delete-master', fe: have.fe });
      for (const slot of have.slots.keys()) wildcardRemovals.push({ kind: 'delete-slot', fe: have.fe, slot });
      continue;
    }
    if (desired.has(key as FrontendKey)) continue;
    if (have.master) ops.push({ kind: 'delete-master', fe: have.fe });
    for (const slot of [...have.slots.keys()].sort((a, b) => a - b)) ops.push({ kind: 'delete-slot', fe: have.fe, slot });
  }
  for (const rn of realized.revNat.values()) {
    if (!neededRevNat[rn.family].has(rn.id)) tail.push({ kind: 'delete-revnat', id: rn.id, family: rn.family });
  }
  append(ops, tail);
  append(ops, wildcardRemovals);
  // Backends no frontend uses any more. A change sync skipped the unchanged
  // frontends above: their backends are the ones in their written slots.
  if (unchanged) {
    for (const fe of desired.values()) {
      if (!same(fe)) continue;
      const have = realized.frontends.get(fe.key);
      if (have) for (const id of have.slots.values()) neededBackends.set(id, realized.backends.get(id)!);
    }
  }
  for (const [id, b] of realized.backends) {
    if (!neededBackends.has(id)) ops.push({ kind: 'delete-backend', id, family: b.family });
  }
  return ops;
}
