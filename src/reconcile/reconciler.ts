// Applies plans to the maps. Realized state changes only after a write
// succeeds, so a failed sync leaves an exact record of what the kernel
// holds, and the next sync (a full re-plan) finishes the job. Writes are
// idempotent: re-running any prefix of a plan is harmless.
import { LbError } from '../errors.js';
import type { LbMaps } from '../datapath/lbmaps.js';
import { PartialWriteError, type LbWrite } from '../datapath/lbmaps.js';
import { backendKey, serviceAddrKey, type Backend, type BackendKey, type Family, type FrontendKey, type L3n4Addr, type ServiceAddr } from '../lb/types.js';
import { type DesiredState, type Frontend } from '../model/types.js';
import { ipv4ToUint } from '../lb/addr.js';
import { IdAllocator } from './ids.js';
import { opFamily, plan, type MapOp } from './plan.js';
import { RealizedState } from './realized.js';

export interface SyncOptions {
  /**
   * Remove what the desired state no longer holds. False while the source
   * is incomplete (e.g. a manifest could not be parsed at all): then a sync
   * only adds and updates, and nothing already programmed is lost.
   */
  readonly prune: boolean;
  /**
   * The frontend keys added, changed or removed since the previous sync
   * (DesiredModel.flush). Only these are planned, when the maps are known to
   * match the previous sync; otherwise (first sync, after restore, resync,
   * a failed or a non-pruning sync) every frontend is.
   */
  readonly changed?: ReadonlySet<FrontendKey>;
}

export interface SyncResult {
  readonly planned: number;
  readonly applied: number;
  readonly byKind: Readonly<Record<string, number>>;
  /** Backends this sync deleted from the maps. */
  readonly removedBackends: readonly Backend[];
  /** Where the sync's time went, in ms: assigning ids, planning, writing (with the bookkeeping). */
  readonly phasesMs: { readonly ids: number; readonly plan: number; readonly apply: number };
}

export class SyncError extends LbError {
  constructor(
    message: string,
    readonly op: MapOp,
    readonly applied: number,
    options?: ErrorOptions,
  ) {
    super(message, 'ESYNC', options);
  }
}

export function describeOp(op: MapOp): string {
  switch (op.kind) {
    case 'put-backend':
      return `put backend ${op.id} (${backendKey(op.backend)})`;
    case 'delete-backend':
      return `delete backend ${op.id}`;
    case 'put-revnat':
      return `put rev-NAT ${op.id} (IPv${op.family})`;
    case 'delete-revnat':
      return `delete rev-NAT ${op.id} (IPv${op.family})`;
    case 'put-slot':
      return `put ${serviceAddrKey(op.fe)} slot ${op.slot} → backend ${op.backendId}`;
    case 'delete-slot':
      return `delete ${serviceAddrKey(op.fe)} slot ${op.slot}`;
    case 'put-master':
      return `put ${serviceAddrKey(op.fe)} master (count ${op.master.count})`;
    case 'delete-master':
      return `delete ${serviceAddrKey(op.fe)} master`;
  }
}

/** Writes per batch syscall: bounds the buffers (a cold sync of 100,000 services is ~800,000 writes). */
const MAX_BATCH = 8192;

/**
 * A backend's identity in the id allocator: address, port and protocol.
 * IPv4 packs into one number below 2^53 (no key string per backend: at
 * 10,000 services that is 30,000 strings built, hashed and kept); IPv6
 * uses the key string.
 */
export type BackendIdKey = number | BackendKey;
export function backendIdKey(b: L3n4Addr): BackendIdKey {
  if (b.family === 6) return backendKey(b);
  return (ipv4ToUint(b.address) * 65536 + b.port) * 2 + (b.protocol === 'UDP' ? 1 : 0);
}

export class Reconciler {
  private realizedState = new RealizedState();
  /**
   * The maps hold exactly the desired state of the last sync (it wrote
   * everything and pruned, and they were not re-read since): the next sync
   * may plan only what changed.
   */
  private clean = false;
  /** Backends deleted by the sync in progress. */
  private readonly removed: Backend[] = [];
  readonly backendIds = new IdAllocator<BackendIdKey>('backend', 1, 0xffffffff);
  readonly revNatIds: Record<Family, IdAllocator<FrontendKey>> = {
    4: new IdAllocator<FrontendKey>('IPv4 rev-NAT', 1, 0xffffffff),
    6: new IdAllocator<FrontendKey>('IPv6 rev-NAT', 1, 0xffffffff),
  };

  constructor(private readonly maps: LbMaps) {}

  get realized(): RealizedState {
    return this.realizedState;
  }

  /** Reads the maps back and adopts their ids, so unchanged state is not rewritten. */
  restore(): { frontends: number; backends: number } {
    this.realizedState = RealizedState.from(this.maps.dump());
    this.clean = false;
    let frontends = 0;
    for (const [key, fe] of this.realizedState.frontends) {
      if (fe.fe.protocol === 'ANY' || !fe.master) continue;
      frontends++;
      this.revNatIds[fe.fe.family].adopt(key as FrontendKey, fe.master.revNatId);
    }
    for (const [id, b] of this.realizedState.backends) this.backendIds.adopt(backendIdKey(b), id);
    return { frontends, backends: this.realizedState.backends.size };
  }

  /**
   * Liveness' write probe (src/agent/health.ts, "canary"), inside the
   * reconciler's accounting rather than beside it: it rewrites one IPv4
   * rev-NAT entry the realized state holds with exactly the bytes it holds
   * (BPF_EXIST): a write the datapath cannot tell from no write, that needs
   * no free room, so a full map does not fail liveness (a restart would not
   * give it room). With no such entry (or one that drifted away), the map
   * has room for id 0, which the allocators never hand out: it is written
   * and deleted. Runs between syncs (a sync is synchronous), so no sync's
   * write is ever interleaved with it. Throws the kernel's error.
   */
  probeWrite(): void {
    for (const [id, entry] of this.realizedState.revNat[4]) {
      try {
        this.maps.rewriteRevNat(id, 4, entry);
        return;
      } catch (err) {
        if ((err as { code?: string }).code !== 'ENOENT') throw err;
        break; // drifted away: the next resync repairs it
      }
    }
    const none = { address: '0.0.0.0', port: 0 };
    this.maps.putRevNat(0, 4, none);
    this.maps.deleteRevNat(0, 4);
  }

  /**
   * Re-reads the maps as the realized state, keeping the ids in use: the
   * next plan then repairs whatever changed behind the agent's back (drift).
   */
  resync(): void {
    this.realizedState = RealizedState.from(this.maps.dump());
    this.clean = false;
    for (const [id, b] of this.realizedState.backends) this.backendIds.adopt(backendIdKey(b), id);
  }

  /**
   * Plans desired vs realized and applies the plan in order; throws SyncError
   * at the first failed write. A change sync (options.changed, maps clean)
   * plans the changed frontends only: it costs what changed, not what
   * exists. A full plan runs otherwise.
   */
  sync(desired: DesiredState, options: SyncOptions): SyncResult {
    const t0 = performance.now();
    const changed = this.clean ? options.changed : undefined;
    this.clean = false;
    this.removed.length = 0;
    // Ids by Backend object for this sync: one key string and one lookup per backend.
    const backendIds = new Map<Backend, number>();
    const acquire = (fe: Frontend): void => {
      this.revNatIds[fe.family].acquire(fe.key);
      for (const b of fe.backends) backendIds.set(b, this.backendIds.acquire(backendIdKey(b)));
      for (const b of fe.terminating) backendIds.set(b, this.backendIds.acquire(backendIdKey(b)));
    };
    if (changed) {
      for (const key of changed) {
        const fe = desired.get(key);
        if (fe) acquire(fe);
      }
    } else {
      for (const fe of desired.values()) acquire(fe);
    }
    const t1 = performance.now();
    const ops = plan(
      this.realizedState,
      desired,
      {
        backendId: (b) => backendIds.get(b)!,
        revNatId: (fe) => this.revNatIds[fe.family].get(fe.key)!,
      },
      { prune: options.prune, ...(changed ? { changed } : {}) },
    );

    const t2 = performance.now();
    const byKind: Record<string, number> = {};
    let applied_ = 0;
    let ok = false;
    try {
      for (let i = 0; i < ops.length; ) {
        const run = this.batchAt(ops, i);
        if (run > 1) {
          const batch = ops.slice(i, i + run) as Array<MapOp & LbWrite>;
          try {
            this.maps.putMany!(batch);
          } catch (err) {
            const written = err instanceof PartialWriteError ? err.written : 0;
            for (let k = 0; k < written; k++) this.note(batch[k]!);
            if (written > 0) byKind[batch[0]!.kind] = (byKind[batch[0]!.kind] ?? 0) + written;
            applied_ += written;
            const failed = batch[written] ?? batch[0]!;
            const cause = err instanceof PartialWriteError && err.cause ? err.cause : err;
            throw new SyncError(`${describeOp(failed)}: ${(err as Error).message}`, failed, applied_, { cause });
          }
          for (const op of batch) this.note(op);
          byKind[batch[0]!.kind] = (byKind[batch[0]!.kind] ?? 0) + run;
          applied_ += run;
          i += run;
          continue;
        }
        const op = ops[i]!;
        try {
          this.apply(op);
        } catch (err) {
          throw new SyncError(`${describeOp(op)}: ${(err as Error).message}`, op, applied_, { cause: err });
        }
        applied_++;
        byKind[op.kind] = (byKind[op.kind] ?? 0) + 1;
        i++;
      }
      ok = true;
    } finally {
      // A change sync frees exactly the ids of what it deleted; a full one
      // (or a failed one) looks at every id.
      // (A failed change sync frees nothing: the full sync after it does.)
      if (ok && changed) this.releaseDeleted(ops, changed, desired);
      else if (!changed) this.releaseUnused(desired, new Set(backendIds.values()));
    }
    this.clean = options.prune;
    const ms = (x: number): number => Math.round(x * 1000) / 1000;
    return {
      planned: ops.length,
      applied: applied_,
      byKind,
      removedBackends: this.removed.splice(0),
      phasesMs: { ids: ms(t1 - t0), plan: ms(t2 - t1), apply: ms(performance.now() - t2) },
    };
  }

  /** How many ops from `i` on can go in one batch: puts of one kind and family (1: write it alone). */
  private batchAt(ops: readonly MapOp[], i: number): number {
    if (!this.maps.putMany) return 1;
    const first = ops[i]!;
    const kind = first.kind;
    if (kind !== 'put-backend' && kind !== 'put-revnat' && kind !== 'put-slot' && kind !== 'put-master') return 1;
    const fam = opFamily(first);
    const end = Math.min(ops.length, i + MAX_BATCH);
    let j = i + 1;
    while (j < end && ops[j]!.kind === kind && opFamily(ops[j]!) === fam) j++;
    return j - i;
  }

  private releaseDeleted(ops: readonly MapOp[], changed: ReadonlySet<FrontendKey>, desired: DesiredState): void {
    for (const op of ops) {
      if (op.kind === 'delete-backend') this.backendIds.releaseId(op.id);
      else if (op.kind === 'delete-revnat') this.revNatIds[op.family].releaseId(op.id);
    }
    for (const key of changed) {
      if (desired.has(key)) continue;
      this.revNatIds[4].release(key);
      this.revNatIds[6].release(key);
    }
  }

  private apply(op: MapOp): void {
    this.write(op);
    this.note(op);
  }

  /** The map write of one op. */
  private write(op: MapOp): void {
    const m = this.maps;
    switch (op.kind) {
      case 'put-backend':
        return m.putBackend(op.id, op.backend);
      case 'delete-backend':
        return m.deleteBackend(op.id, op.family);
      case 'put-revnat':
        return m.putRevNat(op.id, op.family, op.entry);
      case 'delete-revnat':
        return m.deleteRevNat(op.id, op.family);
      case 'put-slot':
        return m.putSlot(op.fe, op.slot, op.backendId);
      case 'delete-slot':
        return m.deleteSlot(op.fe, op.slot);
      case 'put-master':
        return m.putMaster(op.fe, op.master);
      case 'delete-master':
        return m.deleteMaster(op.fe);
    }
  }

  /** Realized-state bookkeeping of a write the maps accepted. */
  private note(op: MapOp): void {
    const r = this.realizedState;
    switch (op.kind) {
      case 'put-backend':
        r.backends.set(op.id, op.backend);
        break;
      case 'delete-backend': {
        const gone = r.backends.get(op.id);
        if (gone) this.removed.push(gone);
        r.backends.delete(op.id);
        break;
      }
      case 'put-revnat':
        r.revNat[op.family].set(op.id, op.entry);
        break;
      case 'delete-revnat':
        r.revNat[op.family].delete(op.id);
        break;
      case 'put-slot':
        r.putSlot(op.key, op.fe, op.slot, op.backendId);
        break;
      case 'delete-slot':
        r.deleteSlot(op.key, op.slot);
        break;
      case 'put-master':
        r.putMaster(op.key, op.fe, op.master);
        break;
      case 'delete-master':
        r.deleteMaster(op.key);
        break;
    }
  }

  /** Frees ids that neither the desired state nor the maps use any more. */
  private releaseUnused(desired: DesiredState, needed: ReadonlySet<number>): void {
    const r = this.realizedState;
    for (const family of [4, 6] as const) {
      const alloc = this.revNatIds[family];
      for (const [key, id] of alloc.entries()) {
        if (!desired.has(key) && !r.revNat[family].has(id) && !r.frontends.get(key)?.master) alloc.release(key);
      }
    }
    for (const [key, id] of this.backendIds.entries()) {
      if (!needed.has(id) && !r.backends.has(id)) this.backendIds.release(key);
    }
  }
}
