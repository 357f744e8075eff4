// plan(): pure, so these tests give it a realized state and a desired state
// and read the ops. The order is the make-before-break contract of
// src/reconcile/plan.ts: removals of what is no longer desired first, then
// backends, rev-NAT entries, slots, masters, shrinks, wildcards, and rev-NAT
// entries a live master is moving away from.
import t from 'tap';
import type { DesiredState } from '../../src/model/types.js';
import { masterFlags, plan, type IdAssignment, type MapOp, type PlanScope } from '../../src/reconcile/plan.js';
import { LbSvcFlags } from '../../src/datapath/abi.gen.js';
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
    default: return undefined; // north-south ops: a plan without northSouth makes none
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
      case 'put-maglev': return `put-maglev ${o.table} ${o.backends.map((b) => b.id).join(',')}`;
      case 'delete-maglev': return `delete-maglev ${o.table}`;
      case 'put-srcranges': return `put-srcranges ${o.key} +${o.add.map((r) => `${r.address}/${r.prefixLen}`).join(',')} -${o.remove.map((r) => `${r.address}/${r.prefixLen}`).join(',')}`;
      case 'delete-srcranges': return `delete-srcranges ${o.key}`;
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


// North-south frontends: a NodePort surrogate with its internal twin
// (externalTrafficPolicy Local), an external IP, a LoadBalancer IP with
// source ranges, beside a ClusterIP frontend.
const CIP = frontend('10.96.0.5', 80, ['10.0.0.1', '10.0.0.2']);
const NP = frontend('0.0.0.0', 30080, ['10.0.0.1'], [], { type: 'NodePort', externalLocal: true });
const NP_INT = frontend('0.0.0.0', 30080, ['10.0.0.1', '10.0.0.2'], [], { type: 'NodePort', externalLocal: true, scope: 'internal' });
const EXT = frontend('192.0.2.10', 80, ['10.0.0.1'], [], { type: 'ExternalIP' });
const LB = frontend('198.51.100.7', 80, ['10.0.0.2'], [], { type: 'LoadBalancer', sourceRanges: [{ family: 4, address: '203.0.113.0', prefixLen: 24 }] });
const NP6 = frontend('::', 30080, ['fd00::1'], [], { type: 'NodePort' });
const NS_RIDS = { [CIP.key]: 1, [NP.key]: 2, [NP_INT.key]: 3, [EXT.key]: 4, [LB.key]: 5, [NP6.key]: 6 };
const NS_BIDS = { '10.0.0.1': 1, '10.0.0.2': 2, 'fd00::1': 3 };

t.test('north-south: wildcard entries only for ClusterIP addresses, never 0.0.0.0, ::, external or LoadBalancer IPs', async (t) => {
  const { ops } = plan(new RealizedState(), state(CIP, NP, NP_INT, EXT, LB, NP6), ids(NS_BIDS, NS_RIDS), { prune: true });
  const wildcards = ops.filter((o) => o.kind === 'put-master' && o.master.type === 'Wildcard').map((o) => 'key' in o && o.key);
  t.same(wildcards, ['10.96.0.5:0/ANY']);
  t.same(
    ops.filter((o) => o.kind === 'put-master' && o.master.type !== 'Wildcard').map((o) => 'key' in o && o.key),
    ['10.96.0.5:80/TCP', '0.0.0.0:30080/TCP', '0.0.0.0:30080/TCP/internal', '192.0.2.10:80/TCP', '198.51.100.7:80/TCP', '[::]:30080/TCP'],
    'every frontend has its master, the twin under its own key',
  );
});

t.test('north-south: master types and flags; the twin has its own rev-NAT id; the surrogate\'s rev-NAT entry is 0.0.0.0 and the nodePort', async (t) => {
  const { ops } = plan(new RealizedState(), state(CIP, NP, NP_INT, EXT, LB), ids(NS_BIDS, NS_RIDS), { prune: true });
  const master = (key: string) => {
    const op = ops.find((o) => o.kind === 'put-master' && o.key === key);
    if (op?.kind !== 'put-master') throw new Error(`no master for ${key}`);
    return op.master;
  };
  const F = LbSvcFlags;
  t.match(master(NP.key), { type: 'NodePort', flags: F.LB_SVC_F_LOCAL_EXTERNAL | F.LB_SVC_F_TWO_SCOPES, revNatId: 2, count: 1 });
  t.match(master(NP_INT.key), { type: 'NodePort', flags: 0, revNatId: 3, count: 2 }, 'the twin: neither Local (its backends are not local only) nor two-scopes');
  t.match(master(EXT.key), { type: 'ExternalIP', flags: 0 });
  t.match(master(LB.key), { type: 'LoadBalancer', flags: F.LB_SVC_F_SRC_RANGE });
  t.match(master(CIP.key), { type: 'ClusterIP', flags: 0 });
  t.equal(masterFlags({ ...NP, localOnly: true, affinityTimeout: 10 }), F.LB_SVC_F_AFFINITY | F.LB_SVC_F_LOCAL_INTERNAL | F.LB_SVC_F_LOCAL_EXTERNAL | F.LB_SVC_F_TWO_SCOPES);
  const revNat = ops.filter((o) => o.kind === 'put-revnat').map((o) => o.kind === 'put-revnat' && [o.id, o.entry.address, o.entry.port]);
  t.same(revNat, [[1, '10.96.0.5', 80], [2, '0.0.0.0', 30080], [3, '0.0.0.0', 30080], [4, '192.0.2.10', 80], [5, '198.51.100.7', 80]]);
  t.same(plan(realize(state(CIP, NP, NP_INT, EXT, LB), ids(NS_BIDS, NS_RIDS)), state(CIP, NP, NP_INT, EXT, LB), ids(NS_BIDS, NS_RIDS), { prune: true }).ops, [], 'read back from the maps: nothing to write');
});

t.test('north-south: a removed ClusterIP frontend takes its wildcard, though an external IP of another service stays at its address', async (t) => {
  const id = ids({ '10.0.0.1': 1, '10.0.0.2': 2 }, { [CIP.key]: 1, '10.96.0.5:443/TCP': 2 });
  const ext = frontend('10.96.0.5', 443, ['10.0.0.1'], [], { type: 'ExternalIP' });
  const r = realize(state(CIP, ext), id);
  t.ok(r.hasPlainWildcard('10.96.0.5'), 'the ClusterIP has its wildcard');
  for (const changed of [undefined, [CIP.key]]) {
    const { ops } = plan(r, state(ext), id, { prune: true, ...(changed ? { changed } : {}) });
    t.same(show(ops).filter((o) => o.includes('ANY')), ['delete-master 10.96.0.5:0/ANY'], `${changed ? 'change' : 'full'} plan: the wildcard goes`);
  }
  const np = realize(state(NP), ids(NS_BIDS, NS_RIDS));
  t.same(show(plan(np, state(), ids(NS_BIDS, NS_RIDS), { prune: true, changed: [NP.key] }).ops), ['delete-master 0.0.0.0:30080/TCP', 'delete-slot 0.0.0.0:30080/TCP#1', 'delete-revnat 2', 'delete-backend 1'], 'a NodePort goes without a wildcard to remove');
});

t.test('a full plan streams its puts a chunk of frontends at a time, after every delete, and ends where planning at once ends', async (t) => {
  // Z and an orphan backend (9) are realized and no longer desired; five
  // frontends are, A and E sharing backend 10.0.0.1 across chunks of two.
  const fes = ['10.96.1.1', '10.96.1.2', '10.96.1.3', '10.96.1.4', '10.96.1.5'].map((ip, i) => frontend(ip, 80, i === 4 ? ['10.0.0.1', '10.0.1.5'] : [`10.0.${i === 0 ? 0 : 1}.${i === 0 ? 1 : i + 1}`, `10.0.2.${i + 1}`]));
  const Z = frontend('10.96.9.9', 80, ['10.0.9.9']);
  const bids: Record<string, number> = {};
  let next = 1;
  for (const fe of [...fes, Z]) for (const b of fe.backends) bids[b.address] ??= next++;
  const rids = Object.fromEntries([...fes, Z].map((fe, i) => [fe.key, i + 1]));
  const id = ids(bids, rids);

  // Planned at once, applied after.
  const eager = plan(realize(state(Z), id), state(...fes), id, { prune: true, chunk: 2 });
  const m1 = new FakeLbMaps();
  const before = realize(state(Z), id);
  for (const op of plan(new RealizedState(), state(Z), id, { prune: true }).ops) apply(m1, op);
  for (const op of eager.ops) apply(m1, op);

  // Streamed: each step applied, to the maps and the realized state, before the next is planned.
  const r = before;
  const m2 = new FakeLbMaps();
  for (const op of plan(new RealizedState(), state(Z), id, { prune: true }).ops) apply(m2, op);
  const p = plan(r, state(...fes), id, { prune: true, chunk: 2 });
  const streamed: MapOp[] = [];
  for (const step of p.stream()) {
    const ops = step instanceof Array ? step : Array.from({ length: step.length }, (_, i) => step.op(i));
    for (const op of ops) {
      apply(m2, op);
      note(r, op);
      streamed.push(op);
    }
  }
  t.throws(() => [...p.stream()], /streamed once/, 'a plan streams once');
  t.equal(p.size, streamed.length, 'size counts what was streamed');
  t.same([...p.refused], []);
  t.same(show(streamed).sort(), show(eager.ops).sort(), 'the same writes as planned at once');
  t.same(m2.dump(), m1.dump(), 'and the same maps at the end');

  const at = (line: string): number => show(streamed).indexOf(line);
  const firstPut = show(streamed).findIndex((l) => l.startsWith('put-'));
  t.ok(show(streamed).slice(0, firstPut).includes('delete-master 10.96.9.9:80/TCP') && at(`delete-backend ${bids['10.0.9.9']}`) < firstPut, 'the removal and the backend it leaves unused go before any put');
  t.ok(at(`put-master ${fes[1]!.key}`) < at(`put-backend ${bids['10.0.1.3']}`), 'the first chunk (A, B) is written whole, masters included, before the second starts');
  t.ok(at(`put-master ${fes[3]!.key}`) < at(`put-backend ${bids['10.0.1.5']}`), 'and the second before the third');
  t.equal(show(streamed).filter((l) => l === `put-backend ${bids['10.0.0.1']}`).length, 1, 'a backend two chunks share is written once, by the first');
  t.ok(at(`put-slot ${fes[4]!.key}#1=${bids['10.0.0.1']}`) > at(`put-backend ${bids['10.0.0.1']}`), 'and named by the later chunk after it');
});

/** The realized state's bookkeeping of one write, as the reconciler notes it. */
function note(r: RealizedState, op: MapOp): void {
  switch (op.kind) {
    case 'put-backend': return r.setBackend(op.id, op.backend);
    case 'delete-backend': return void r.deleteBackend(op.id);
    case 'put-revnat': return r.setRevNat(op.id, op.family, op.entry);
    case 'delete-revnat': return r.deleteRevNat(op.id, op.family);
    case 'put-slot': return r.putSlot(op.key, op.fe, op.slot, op.backendId);
    case 'delete-slot': return r.deleteSlot(op.key, op.slot);
    case 'put-master': return r.putMaster(op.key, op.fe, op.master);
    case 'delete-master': return r.deleteMaster(op.key);
    default: return undefined;
  }
}

t.test('a full plan in chunks: a wildcard waits for every frontend at its address, also one in a later chunk', async (t) => {
  const X80 = frontend('10.96.2.1', 80, ['10.0.3.1']);
  const Y80 = frontend('10.96.2.2', 80, ['10.0.3.2']);
  const X443 = frontend('10.96.2.1', 443, ['10.0.3.3']);
  const id = ids({ '10.0.3.1': 1, '10.0.3.2': 2, '10.0.3.3': 3 }, { [X80.key]: 1, [Y80.key]: 2, [X443.key]: 3 });
  const p = plan(new RealizedState(), state(X80, Y80, X443), id, { prune: true, chunk: 1 });
  const streamed: string[] = [];
  for (const step of p.stream()) for (const op of step instanceof Array ? step : Array.from({ length: step.length }, (_, i) => step.op(i))) streamed.push(...show([op]));
  const at = (line: string): number => streamed.indexOf(line);
  t.ok(at('put-master 10.96.2.1:0/ANY') > at(`put-master ${X443.key}`), 'X\'s wildcard after X:443\'s master, two chunks later');
  t.ok(at('put-master 10.96.2.2:0/ANY') < at('put-backend 3'), 'Y\'s, whose only frontend is in its chunk, with that chunk');
  t.equal(streamed.filter((l) => l.endsWith(':0/ANY')).length, 2, 'each written once');
  t.same(streamed.slice().sort(), show(plan(new RealizedState(), state(X80, Y80, X443), id, { prune: true }).ops).sort(), 'the same writes as one chunk');
});
