// plan(): pure, so these tests give it a realized state and a desired state
// and read the ops. The order is the make-before-break contract of
// src/reconcile/plan.ts: removals of what is no longer desired first, then
// backends, rev-NAT entries, slots, masters, shrinks, wildcards, and rev-NAT
// entries a live master is moving away from.
import t from 'tap';
import type { DesiredState } from '../../src/model/types.js';
import { plan, type IdAssignment, type MapOp, type PlanScope } from '../../src/reconcile/plan.js';
import { RealizedState } from '../../src/reconcile/realized.js';
import { FakeLbMaps } from '../fakes/fake-maps.js';
import { frontend, state } from '../fakes/frontends.js';


/** Ids as a reconciler would give them: backends by address, rev-NAT by frontend, from fixed tables. */
function ids(backends: Record<string, number>, revNat: Record<string, number>): IdAssignment {
  return { backendId: (b) => backends[b.address]!, revNatId: (fe) => revNat[fe.key]! };
}

/** The realized state a reconciler leaves after writing `d` with these ids. */
function realize(d: DesiredState, id: IdAssignment): RealizedState {
  const r = new RealizedState();
  const { ops } = plan(r, d, id, { prune: true });
  const m = new FakeLbMaps();
  for (const op of ops) apply(m, op);
  return RealizedState.from(m.dump());
}

function apply(m: FakeLbMaps, op: MapOp): void {
  switch (op.kind) {
    case 'put-backend': return m.putBackend(op.id, op.backend);
    case 'delete-backend': return m.deleteBackend(op.id);
    case 'put-revnat': return m.putRevNat(op.id, op.family, op.entry);
    case 'delete-revnat': return m.deleteRevNat(op.id, op.family);
    case 'put-slot': return m.putSlot(op.fe, op.slot, op.backendId);
    case 'delete-slot': return m.deleteSlot(op.fe, op.slot);
    case 'put-master': return m.putMaster(op.fe, op.master);
    case 'delete-master': return m.deleteMaster(op.fe);
  }
}

const show = (ops: readonly MapOp[]): string[] =>
  ops.map((o) => {
    switch (o.kind) {
      case 'put-backend': return `put-backend ${o.id}`;
      case 'delete-backend': return `delete-backend ${o.id}`;
      case 'put-revnat': return `put-revnat ${o.id}`;
      case 'delete-revnat': return `delete-revnat ${o.id}${o.namedBy ? ' (late)' : ''}`;
      case 'put-slot': return `put-slot ${o.key}#${o.slot}=${o.backendId}`;
      case 'delete-slot': return `delete-slot ${o.key}#${o.slot}`;
      case 'put-master': return `put-master ${o.key}`;
      case 'delete-master': return `delete-master ${o.key}`;
    }
  });

const A = frontend('10.96.0.1', 80, ['10.0.0.1', '10.0.0.2']);
const B = frontend('10.96.0.2', 80, ['10.0.0.3']);
const BIDS = { '10.0.0.1': 1, '10.0.0.2': 2, '10.0.0.3': 3, '10.0.0.4': 4 };
const RIDS = { [A.key]: 1, [B.key]: 2 };

t.test('removals of what is no longer desired come before every put', async (t) => {
  const id = ids(BIDS, RIDS);
  const r = realize(state(A, B), id);
  const A2 = frontend('10.96.0.1', 80, ['10.0.0.4']);
  const { ops, refused } = plan(r, state(A2), id, { prune: true });
  t.same(show(ops), [
    // B goes: master, slot, rev-NAT, wildcard, its backend
    'delete-master 10.96.0.2:80/TCP',
    'delete-slot 10.96.0.2:80/TCP#1',
    'delete-revnat 2',
    'delete-master 10.96.0.2:0/ANY',
    'delete-backend 1',
    'delete-backend 2',
    'delete-backend 3',
    // A moves to backend 4: backend, slot, master, then the shrink
    'put-backend 4',
    'put-slot 10.96.0.1:80/TCP#1=4',
    'put-master 10.96.0.1:80/TCP',
    'delete-slot 10.96.0.1:80/TCP#2',
  ]);
  t.same([...refused], []);
});

t.test('a change plan gives the same ops as a full plan for the frontends it is told changed', async (t) => {
  const id = ids(BIDS, RIDS);
  const r = realize(state(A, B), id);
  const A2 = frontend('10.96.0.1', 80, ['10.0.0.4']);
  const full = plan(r, state(A2), id, { prune: true }).ops;
  const change = plan(r, state(A2), id, { prune: true, changed: [A.key, B.key] }).ops;
  t.same(show(change).sort(), show(full).sort());
  t.same(plan(r, state(A, B), id, { prune: true }).ops, [], 'unchanged state: an empty plan');
  t.same(plan(r, state(A, B), id, { prune: true, changed: [] }).ops, [], 'no changed keys: an empty plan');
});

t.test('without prune nothing is deleted', async (t) => {
  const id = ids(BIDS, RIDS);
  const r = realize(state(A, B), id);
  const { ops } = plan(r, state(frontend('10.96.0.1', 80, ['10.0.0.4'])), id, { prune: false });
  t.same(show(ops), ['put-backend 4', 'put-slot 10.96.0.1:80/TCP#1=4', 'put-master 10.96.0.1:80/TCP', 'delete-slot 10.96.0.1:80/TCP#2'], 'only the shrink of the updated frontend, after its master');
});

t.test('a rev-NAT entry a live master moves away from is deleted last, marked with that master', async (t) => {
  const r = realize(state(A), ids(BIDS, RIDS));
  const { ops } = plan(r, state(A), ids(BIDS, { [A.key]: 9 }), { prune: true });
  t.same(show(ops), ['put-revnat 9', 'put-master 10.96.0.1:80/TCP', 'delete-revnat 1 (late)']);
  t.match(ops[2], { kind: 'delete-revnat', id: 1, namedBy: A.key });
});

t.test('held frontends are left as the maps have them, with all they use', async (t) => {
  const id = ids(BIDS, RIDS);
  const r = realize(state(A, B), id);
  const A2 = frontend('10.96.0.1', 80, ['10.0.0.4']);
  const { ops } = plan(r, state(A2, B), id, { prune: true, hold: new Set([A.key]) });
  t.same(show(ops), [], 'nothing written or deleted: not A, not its backends 1 and 2, not its rev-NAT entry or wildcard');
});

t.test('maxEntries: a frontend whose new entries do not fit is held whole and listed', async (t) => {
  const id = ids({ ...BIDS, '10.0.0.5': 5 }, { ...RIDS, [frontend('10.96.0.3', 80, []).key]: 3 });
  const r = realize(state(A), id);
  // lb4_services holds A's master, 2 slots and wildcard: 4 entries. B needs 3 more, C 3 more.
  const C = frontend('10.96.0.3', 80, ['10.0.0.5']);
  const scope: PlanScope = { prune: true, maxEntries: { lb4_services: 7 } };
  const { ops, refused } = plan(r, state(A, B, C), id, scope);
  t.same([...refused.keys()], [C.key], 'C does not fit after B');
  t.match(refused.get(C.key), { map: 'lb4_services', reason: 'lb4_services is full: 0 free of 7 entries, 10.96.0.3:80/TCP needs 3 more' });
  t.notOk(ops.some((o) => ('key' in o && o.key === C.key) || (o.kind === 'put-backend' && o.id === 5)), 'none of C is written, not even its backend');
  // Removing A frees 4 entries in the same plan: then both fit.
  const after = plan(r, state(B, C), id, scope);
  t.same([...after.refused], [], 'the room A\'s removal frees counts');
});

