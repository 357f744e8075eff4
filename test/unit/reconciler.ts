import t, { type Test } from 'tap';
import { desiredState } from '../../src/model/desired.js';
import { validateEndpointSlice, validateService } from '../../src/model/k8s.js';
import type { FrontendKey } from '../../src/lb/types.js';
import type { DesiredState, Frontend } from '../../src/model/types.js';
import { Reconciler, backendIdKey, type SyncResult } from '../../src/reconcile/reconciler.js';
import { consistent, FakeLbMaps } from '../fakes/fake-maps.js';
import { service, slice } from '../fakes/objects.js';
import { frontend, state } from '../fakes/frontends.js';

function desired(specs: Array<{ name: string; ip: string; port?: number; proto?: string; backends: string[]; bport?: number }>): DesiredState {
  const services = [];
  const slices = [];
  for (const s of specs) {
    const v = validateService(service(s.name, [s.ip], [{ name: 'p', port: s.port ?? 80, protocol: s.proto ?? 'TCP' }]));
    if (!v.ok) throw new Error(v.reason);
    services.push(v.value);
    const family = s.ip.includes(':') ? 'IPv6' : 'IPv4';
    const e = validateEndpointSlice(
      slice(`${s.name}-1`, s.name, family, [{ name: 'p', port: s.bport ?? 8080, protocol: s.proto ?? 'TCP' }], s.backends.map((a) => ({ addresses: [a] }))),
    );
    if (!e.ok) throw new Error(e.reason);
    slices.push(e.value);
  }
  return desiredState({ services, slices }).frontends;
}

/**
 * Syncs as the agent does: the change set is every key whose Frontend object
 * differs from the one of the previous sync through this reconciler (what
 * DesiredModel.flush reports). The reconciler itself decides when to plan
 * everything instead (first sync, after restore, resync or a failure).
 */
const lastSynced = new WeakMap<Reconciler, DesiredState>();
function sync(r: Reconciler, d: DesiredState, opts: { prune: boolean }): SyncResult {
  const last = lastSynced.get(r) ?? new Map();
  const changed = new Set<FrontendKey>();
  for (const [k, f] of d) if (last.get(k) !== f) changed.add(k);
  for (const k of last.keys()) if (!d.has(k)) changed.add(k);
  lastSynced.set(r, d);
  return r.sync(d, { ...opts, changed });
}


/** Applies a transition one write at a time, checking the invariant after each write. */
function checkEveryPrefix(t: Test, from: DesiredState, to: DesiredState): void {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  sync(r, from, { prune: true });
  const start = m.calls.length;
  // Snapshot check after each call by wrapping failWhen as an observer.
  let violation: string | undefined;
  m.failWhen = () => {
    violation ??= consistent(m);
    return false;
  };
  // failWhen is cleared on throw only; keep observing.
  const res = sync(r, to, { prune: true });
  violation ??= consistent(m);
  t.equal(violation, undefined, 'no half-written service at any point');
  t.ok(res.applied === m.calls.length - start);
}

t.test('a new service: backends, then rev-NAT and slots, then master, then wildcard', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const res = sync(r, desired([{ name: 'web', ip: '10.96.0.10', backends: ['10.0.0.2', '10.0.0.3'] }]), { prune: true });
  t.same(
    m.calls.map((c) => `${c.method} ${c.what}`),
    [
      'putBackend 1',
      'putBackend 2',
      'putRevNat 4/1',
      'putSlot 10.96.0.10:80/TCP#1',
      'putSlot 10.96.0.10:80/TCP#2',
      'putMaster 10.96.0.10:80/TCP',
      'putMaster 10.96.0.10:0/ANY',
    ],
  );
  t.equal(res.applied, 7);
  t.equal(consistent(m), undefined);
});

t.test('an unchanged state writes nothing', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const d = desired([{ name: 'web', ip: '10.96.0.10', backends: ['10.0.0.2'] }]);
  sync(r, d, { prune: true });
  t.equal(sync(r, d, { prune: true }).planned, 0);
});

t.test('removal runs in reverse: master, slots, rev-NAT, wildcard, backends', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  sync(r, desired([{ name: 'web', ip: '10.96.0.10', backends: ['10.0.0.2'] }]), { prune: true });
  m.calls.length = 0;
  sync(r, new Map(), { prune: true });
  t.same(
    m.calls.map((c) => `${c.method} ${c.what}`),
    ['deleteMaster 10.96.0.10:80/TCP', 'deleteSlot 10.96.0.10:80/TCP#1', 'deleteRevNat 4/1', 'deleteMaster 10.96.0.10:0/ANY', 'deleteBackend 1'],
  );
  t.equal(m.services.size + m.backends.size + m.revNat.size, 0, 'maps empty');
});

t.test('shrinking a service lowers the count before deleting slots', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  sync(r, desired([{ name: 'web', ip: '10.96.0.10', backends: ['10.0.0.2', '10.0.0.3', '10.0.0.4'] }]), { prune: true });
  m.calls.length = 0;
  sync(r, desired([{ name: 'web', ip: '10.96.0.10', backends: ['10.0.0.2'] }]), { prune: true });
  t.same(
    m.calls.map((c) => `${c.method} ${c.what}`),
    ['putMaster 10.96.0.10:80/TCP', 'deleteSlot 10.96.0.10:80/TCP#2', 'deleteSlot 10.96.0.10:80/TCP#3', 'deleteBackend 2', 'deleteBackend 3'],
  );
});

t.test('every prefix of every transition is consistent', async (t) => {
  const a = desired([
    { name: 'a', ip: '10.96.0.1', backends: ['10.0.0.2', '10.0.0.3', '10.0.0.4'] },
    { name: 'b', ip: '10.96.0.2', backends: ['10.0.0.2'] },
    { name: 'c', ip: 'fd00:96::3', backends: ['fd00:244::2', 'fd00:244::3'] },
  ]);
  const b = desired([
    { name: 'a', ip: '10.96.0.1', backends: ['10.0.0.5'] },
    { name: 'c', ip: 'fd00:96::3', backends: ['fd00:244::3', 'fd00:244::4', 'fd00:244::5'] },
    { name: 'd', ip: '10.96.0.2', port: 53, proto: 'UDP', backends: ['10.0.0.2', '10.0.0.9'] },
  ]);
  for (const [name, from, to] of [
    ['empty → a', new Map(), a],
    ['a → b', a, b],
    ['b → a', b, a],
    ['a → empty', a, new Map()],
  ] as const) {
    t.test(name, async (t) => checkEveryPrefix(t, from as DesiredState, to as DesiredState));
  }
});

t.test('backends shared by services share one id', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  sync(r, 
    desired([
      { name: 'a', ip: '10.96.0.1', backends: ['10.0.0.2'] },
      { name: 'b', ip: '10.96.0.2', backends: ['10.0.0.2'] },
    ]),
    { prune: true },
  );
  t.equal(m.backends.size, 1);
});

t.test('a restarted reconciler adopts ids from the maps and rewrites nothing', async (t) => {
  const m = new FakeLbMaps();
  const d = desired([
    { name: 'a', ip: '10.96.0.1', backends: ['10.0.0.2', '10.0.0.3'] },
    { name: 'b', ip: 'fd00:96::2', backends: ['fd00:244::2'] },
  ]);
  new Reconciler(m).sync(d, { prune: true });
  const before = JSON.stringify(m.dump());
  const again = new Reconciler(m);
  t.same(again.restore(), { frontends: 2, backends: 3 });
  const res = again.sync(d, { prune: true });
  t.equal(res.planned, 0, 'no writes');
  t.equal(JSON.stringify(m.dump()), before);
  // a new service after restart takes fresh ids, not adopted ones
  again.sync(desired([{ name: 'a', ip: '10.96.0.1', backends: ['10.0.0.2', '10.0.0.3'] }, { name: 'c', ip: '10.96.0.3', backends: ['10.0.0.7'] }]), { prune: true });
  t.same([...m.backends.keys()].sort(), [1, 2, 4], 'ids 1,2 kept; the v6 backend (3) removed; new backend got 4');
});

t.test('rev-NAT ids are 32 bits: one above 0xffff is adopted, and new ids follow it', async (t) => {
  const m = new FakeLbMaps();
  const a = { name: 'a', ip: '10.96.0.1', backends: ['10.0.0.2'] };
  new Reconciler(m).sync(desired([a]), { prune: true });
  // The maps as an agent that has handed out 100,000 ids leaves them.
  const master = m.services.get('10.96.0.1:80/TCP#0')!;
  const rn = m.revNat.get('4/1')!;
  m.putRevNat(100_000, 4, { address: rn.address, port: rn.port });
  m.putMaster(master.fe, { ...master.master!, revNatId: 100_000 });
  m.deleteRevNat(1, 4);
  const again = new Reconciler(m);
  again.restore();
  t.equal(again.sync(desired([a]), { prune: true }).planned, 0, 'adopted: nothing rewritten');
  again.sync(desired([a, { name: 'b', ip: '10.96.0.2', backends: ['10.0.0.3'] }]), { prune: true });
  t.same([...m.revNat.keys()].sort(), ['4/100000', '4/100001']);
  t.equal(m.services.get('10.96.0.2:80/TCP#0')?.master?.revNatId, 100_001);
});

t.test('a failed write (not for want of room) stops the sync, keeps realized state exact, and the next sync finishes', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const d = desired([
    { name: 'a', ip: '10.96.0.1', backends: ['10.0.0.2'] },
    { name: 'b', ip: '10.96.0.2', backends: ['10.0.0.3'] },
  ]);
  m.failWhen = (c) => c.method === 'putSlot' && c.what.startsWith('10.96.0.2');
  t.throws(() => sync(r, d, { prune: true }), { code: 'ESYNC', message: /put 10\.96\.0\.2:80\/TCP slot 1 → backend 2: .*EPERM/ });
  t.equal(consistent(m), undefined, 'nothing half-written');
  t.notOk(m.services.has('10.96.0.2:80/TCP#0'), 'b is not visible');
  const res = sync(r, d, { prune: true });
  t.ok(res.applied > 0);
  t.equal(sync(r, d, { prune: true }).planned, 0, 'converged');
});

t.test('without prune, nothing absent from the desired state is removed', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  sync(r, desired([{ name: 'a', ip: '10.96.0.1', backends: ['10.0.0.2'] }]), { prune: true });
  sync(r, desired([{ name: 'b', ip: '10.96.0.2', backends: ['10.0.0.3'] }]), { prune: false });
  t.ok(m.services.has('10.96.0.1:80/TCP#0'), 'a kept');
  t.ok(m.services.has('10.96.0.2:80/TCP#0'), 'b added');
  t.equal(consistent(m), undefined);
});

// Change syncs: after a sync that wrote everything, the next one skips the
// Frontend objects it already wrote (same object, ===) and writes only what
// changed. restore(), resync() and a failed sync make the next one full.



const ops = (m: FakeLbMaps, from: number): string[] => m.calls.slice(from).map((c) => `${c.method} ${c.what}`);

/** The maps hold exactly `d`: a reconciler that reads them back has nothing to write. */
function holdsExactly(t: Test, m: FakeLbMaps, d: DesiredState, what: string): void {
  t.equal(consistent(m), undefined, `${what}: consistent`);
  const fresh = new Reconciler(m);
  fresh.restore();
  const calls = m.calls.length;
  const res = sync(fresh, d, { prune: true });
  t.same(ops(m, calls), [], `${what}: a full plan from the maps writes nothing`);
  t.equal(res.planned, 0);
}

t.test('change sync: reused Frontend objects cost nothing, a new frontend costs its own writes', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const fes = Array.from({ length: 20 }, (_, i) => frontend(`10.96.1.${i + 1}`, 80, [`10.1.${i}.1`, `10.1.${i}.2`, '10.0.0.100']));
  const d1 = state(...fes);
  sync(r, d1, { prune: true });

  // Count backend id look-ups: a change sync touches only what changed.
  let acquired = 0;
  const acquire = r.backendIds.tryAcquire.bind(r.backendIds);
  r.backendIds.tryAcquire = (k) => (acquired++, acquire(k));

  const added = frontend('10.96.2.1', 80, ['10.2.0.1', '10.2.0.2', '10.2.0.3']);
  const d2 = state(...fes, added);
  const res = sync(r, d2, { prune: true });
  t.same(res.byKind, { 'put-backend': 3, 'put-revnat': 1, 'put-slot': 3, 'put-master': 2 }, 'the new frontend and its wildcard only');
  t.equal(res.planned, 9);
  t.same(res.removedBackends, []);
  t.equal(acquired, 3, 'backend ids looked up for the new frontend only');
  holdsExactly(t, m, d2, 'after adding');

  // A second port on an address already in use: no wildcard write; a shared backend is not rewritten.
  acquired = 0;
  const second = frontend('10.96.2.1', 443, ['10.2.0.1', '10.0.0.100']);
  const d3 = state(...fes, added, second);
  const res3 = sync(r, d3, { prune: true });
  t.same(res3.byKind, { 'put-revnat': 1, 'put-slot': 2, 'put-master': 1 });
  t.equal(acquired, 2);
  holdsExactly(t, m, d3, 'after a second port');

  // The same objects again: nothing at all.
  t.equal(sync(r, d3, { prune: true }).planned, 0);
});

t.test('change sync: identity, not key, decides what is unchanged', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const a = frontend('10.96.0.1', 80, ['10.0.0.2']);
  sync(r, state(a), { prune: true });
  const before = m.calls.length;
  // Same key, new object with another backend: written.
  const res = sync(r, state(frontend('10.96.0.1', 80, ['10.0.0.3'])), { prune: true });
  t.same(ops(m, before), ['putBackend 2', 'putSlot 10.96.0.1:80/TCP#1', 'deleteBackend 1']);
  t.same(res.removedBackends.map((b) => b.address), ['10.0.0.2']);
});

t.test('change sync: a dropped endpoint is deleted and reported, unless an unchanged frontend still uses it', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const a = frontend('10.96.0.1', 80, ['10.0.0.2', '10.0.0.9']); // 10.0.0.2: a's alone; 10.0.0.9: shared with b
  const b = frontend('10.96.0.2', 80, ['10.0.0.3', '10.0.0.9']);
  sync(r, state(a, b), { prune: true });
  const v4 = (address: string) => backendIdKey({ address, family: 4, port: 8080, protocol: 'TCP' });
  const ids = (addr: string): number => r.backendIds.get(v4(addr))!;
  const own = ids('10.0.0.2');
  const shared = ids('10.0.0.9');

  const a2 = frontend('10.96.0.1', 80, ['10.0.0.4']); // drops both
  const d2 = state(a2, b);
  const calls = m.calls.length;
  const res = sync(r, d2, { prune: true });
  t.same(res.removedBackends, [{ address: '10.0.0.2', family: 4, port: 8080, protocol: 'TCP', state: 'active' }], 'only a\'s own backend');
  t.ok(ops(m, calls).includes(`deleteBackend ${own}`));
  t.notOk(ops(m, calls).includes(`deleteBackend ${shared}`), 'the shared backend is kept');
  t.ok(m.backends.has(shared), 'b still has its backend');
  t.equal(r.backendIds.get(v4('10.0.0.2')), undefined, 'the deleted backend\'s id is freed');
  t.equal(ids('10.0.0.9'), shared, 'the shared backend keeps its id');
  holdsExactly(t, m, d2, 'after dropping');

  // Now b drops it too (b is the changed one, a2 unchanged): deleted.
  const b2 = frontend('10.96.0.2', 80, ['10.0.0.3']);
  const res3 = sync(r, state(a2, b2), { prune: true });
  t.same(res3.removedBackends.map((x) => x.address), ['10.0.0.9']);
  t.notOk(m.backends.has(shared));
  holdsExactly(t, m, state(a2, b2), 'after b drops it');
});

t.test('change sync: a removed frontend loses master, slots and rev-NAT; its wildcard only when its address is unused', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const http = frontend('10.96.0.1', 80, ['10.0.0.2']);
  const https = frontend('10.96.0.1', 443, ['10.0.0.2']); // same address, same backend
  const other = frontend('10.96.0.2', 80, ['10.0.0.3']);
  const lone = frontend('10.96.0.3', 80, ['10.0.0.4', '10.0.0.5']);
  sync(r, state(http, https, other, lone), { prune: true });
  const rn = (fe: Frontend): number => r.revNatIds[4].get(fe.key)!;
  const [httpRn, loneRn] = [rn(http), rn(lone)];

  let calls = m.calls.length;
  const d1 = state(https, other, lone);
  t.same(sync(r, d1, { prune: true }).removedBackends, [], 'its backend is still used by :443');
  t.same(ops(m, calls), ['deleteMaster 10.96.0.1:80/TCP', 'deleteSlot 10.96.0.1:80/TCP#1', `deleteRevNat 4/${httpRn}`], 'the wildcard of 10.96.0.1 stays');
  t.equal(r.revNatIds[4].get(http.key), undefined, 'rev-NAT id released');
  holdsExactly(t, m, d1, 'after removing :80');

  calls = m.calls.length;
  const d2 = state(https, other);
  const res = sync(r, d2, { prune: true });
  t.same(ops(m, calls), [
    'deleteMaster 10.96.0.3:80/TCP',
    'deleteSlot 10.96.0.3:80/TCP#1',
    'deleteSlot 10.96.0.3:80/TCP#2',
    `deleteRevNat 4/${loneRn}`,
    'deleteMaster 10.96.0.3:0/ANY',
    'deleteBackend 3',
    'deleteBackend 4',
  ]);
  t.same(res.removedBackends.map((b) => b.address), ['10.0.0.4', '10.0.0.5']);
  t.equal(r.revNatIds[4].get(lone.key), undefined, 'rev-NAT id released');
  holdsExactly(t, m, d2, 'after removing the lone frontend');

  // A new frontend (even at a removed key) gets a fresh id and works.
  const back = frontend('10.96.0.3', 80, ['10.0.0.4']);
  const d3 = state(https, other, back);
  sync(r, d3, { prune: true });
  t.ok(r.revNatIds[4].get(back.key)! > loneRn, 'round-robin: not the freed id');
  holdsExactly(t, m, d3, 'after re-adding');
});

t.test('change sync does not see drift; resync() and restore() make the next sync repair it', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const a = frontend('10.96.0.1', 80, ['10.0.0.2', '10.0.0.3']);
  const b = frontend('10.96.0.2', 80, ['10.0.0.4']);
  const d = state(a, b);
  sync(r, d, { prune: true });

  m.services.delete('10.96.0.1:80/TCP#2'); // behind the agent's back
  let calls = m.calls.length;
  t.equal(sync(r, d, { prune: true }).planned, 0, 'by design: the same objects are not looked at');
  r.resync();
  sync(r, d, { prune: true });
  t.same(ops(m, calls), ['putSlot 10.96.0.1:80/TCP#2'], 'resync: full plan, the slot is rewritten');
  holdsExactly(t, m, d, 'after resync');

  m.revNat.delete(`4/${r.revNatIds[4].get(b.key)}`);
  calls = m.calls.length;
  t.equal(sync(r, d, { prune: true }).planned, 0);
  r.restore();
  sync(r, d, { prune: true });
  t.same(ops(m, calls), [`putRevNat 4/${r.revNatIds[4].get(b.key)}`], 'restore: full plan, the rev-NAT entry is rewritten');
  holdsExactly(t, m, d, 'after restore');
});

t.test('after a failed write the next sync is a full plan and repairs what the failed one left', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const a = frontend('10.96.0.1', 80, ['10.0.0.2']);
  const b = frontend('10.96.0.2', 80, ['10.0.0.3', '10.0.0.4']);
  const d = state(a, b);
  sync(r, d, { prune: true });

  // Removing b fails half-way: its master and slot 1 are gone, slot 2 is not.
  m.failWhen = (c) => c.method === 'deleteSlot' && c.what === '10.96.0.2:80/TCP#2';
  t.throws(() => sync(r, state(a), { prune: true }), { code: 'ESYNC' });
  t.notOk(m.services.has('10.96.0.2:80/TCP#0'), 'b is not served');

  // Back to the very objects last applied: b must be rewritten, not skipped.
  const calls = m.calls.length;
  sync(r, d, { prune: true });
  t.same(ops(m, calls), ['putSlot 10.96.0.2:80/TCP#1', 'putMaster 10.96.0.2:80/TCP']);
  t.ok(m.services.has('10.96.0.2:80/TCP#0'), 'b is served again');
  holdsExactly(t, m, d, 'after the repair');

  // A failure while adding: the retry with the same objects finishes the job.
  const c = frontend('10.96.0.3', 80, ['10.0.0.5']);
  const d2 = state(a, b, c);
  m.failWhen = (x) => x.method === 'putMaster' && x.what === '10.96.0.3:0/ANY';
  t.throws(() => sync(r, d2, { prune: true }), { code: 'ESYNC' });
  const calls2 = m.calls.length;
  sync(r, d2, { prune: true });
  t.same(ops(m, calls2), ['putMaster 10.96.0.3:0/ANY'], 'the missing wildcard is written');
  holdsExactly(t, m, d2, 'after the retry');
});

t.test('what a sync without prune kept, the next pruning sync removes', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const a = frontend('10.96.0.1', 80, ['10.0.0.2']);
  const b = frontend('10.96.0.2', 80, ['10.0.0.3']);
  sync(r, state(a, b), { prune: true });
  // Without prune b is kept in the maps although the desired state lacks it.
  sync(r, state(a), { prune: false });
  t.ok(m.services.has('10.96.0.2:80/TCP#0'));
  // With prune, b goes, whatever the previous sync skipped.
  sync(r, state(a), { prune: true });
  t.notOk(m.services.has('10.96.0.2:80/TCP#0'));
  holdsExactly(t, m, state(a), 'after pruning');
});

t.test('change syncs over random transitions leave exactly what a full plan would', async (t) => {
  // A small universe, so frontends share addresses (wildcards) and backends
  // (reference counts) and keep colliding: 200 random transitions, each
  // applied as a change sync, must leave maps that a full plan from a fresh
  // read finds nothing to change in, and never a half-written service.
  let seed = 42;
  const rand = (n: number): number => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed % n;
  };
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  let d = new Map<FrontendKey, Frontend>();
  sync(r, d, { prune: true });
  let violations = 0;
  m.failWhen = () => {
    if (consistent(m)) violations++;
    return false;
  };
  for (let step = 0; step < 200; step++) {
    const next = new Map(d);
    for (let k = 1 + rand(3); k > 0; k--) {
      const fe = frontend(`10.96.0.${1 + rand(4)}`, [80, 443, 53][rand(3)]!, Array.from({ length: rand(4) }, () => `10.0.0.${1 + rand(6)}`).filter((a, i, all) => all.indexOf(a) === i).sort());
      if (rand(3) === 0) next.delete(fe.key);
      else next.set(fe.key, fe);
    }
    d = next;
    sync(r, d, { prune: true });
    if (step % 25 === 24) {
      m.failWhen = undefined;
      holdsExactly(t, m, d, `after step ${step}`);
      m.failWhen = () => (consistent(m) && violations++, false);
    }
  }
  m.failWhen = undefined;
  t.equal(violations, 0, 'no half-written service between any two writes');
  holdsExactly(t, m, d, 'after 200 change syncs');
  t.equal(m.backends.size, new Set([...d.values()].flatMap((f) => f.backends.map((b) => b.address))).size, 'no backend left that no frontend names');
});

t.test("liveness' write probe: a rewrite of a realized rev-NAT entry, else id 0 written and deleted; the maps unchanged", async (t) => {
  const maps = new FakeLbMaps();
  const r = new Reconciler(maps);
  r.probeWrite();
  t.same(maps.calls.map((c) => `${c.method} ${c.what}`), ['putRevNat 4/0', 'deleteRevNat 4/0'], 'nothing realized: id 0, never allocated');
  t.equal(maps.revNat.size, 0);
  sync(r, desired([{ name: 'web', ip: '10.96.0.10', backends: ['10.0.0.2'] }]), { prune: true });
  const before = JSON.stringify(maps.dump());
  maps.calls.length = 0;
  r.probeWrite();
  t.same(maps.calls.map((c) => c.method), ['rewriteRevNat'], 'one rewrite of an existing entry (BPF_EXIST: no room needed)');
  t.equal(JSON.stringify(maps.dump()), before, 'with the bytes it held');
  // Drift: the entry vanished behind the agent's back; the probe still works, and leaves the repair to the resync.
  maps.revNat.clear();
  maps.calls.length = 0;
  r.probeWrite();
  t.same(maps.calls.map((c) => `${c.method} ${c.what}`), ['rewriteRevNat 4/1', 'putRevNat 4/0', 'deleteRevNat 4/0']);
});

// North-south frontends through the reconciler and the fake maps: the twin
// of an externalTrafficPolicy Local frontend is its own entry, with its own
// rev-NAT id, and reads back under its own key.
const npDesired = (): DesiredState => {
  const v = validateService({
    ...service('web', ['10.96.0.10'], [{ name: 'p', port: 80, nodePort: 30080 }], { type: 'LoadBalancer', externalTrafficPolicy: 'Local', externalIPs: ['192.0.2.10'] }),
    status: { loadBalancer: { ingress: [{ ip: '198.51.100.7' }] } },
  });
  if (!v.ok) throw new Error(v.reason);
  const e = validateEndpointSlice(slice('web-1', 'web', 'IPv4', [{ name: 'p', port: 8080 }], [{ addresses: ['10.0.0.2'] }, { addresses: ['10.0.0.3'] }]));
  if (!e.ok) throw new Error(e.reason);
  return desiredState({ services: [v.value], slices: [e.value] }).frontends;
};

t.test('north-south: twins round-trip through the maps with their scope; a restarted reconciler adopts every id and writes nothing', async (t) => {
  const m = new FakeLbMaps();
  const d = npDesired();
  t.same([...d.keys()].sort(), [
    '0.0.0.0:30080/TCP',
    '0.0.0.0:30080/TCP/internal',
    '10.96.0.10:80/TCP',
    '192.0.2.10:80/TCP',
    '192.0.2.10:80/TCP/internal',
    '198.51.100.7:80/TCP',
    '198.51.100.7:80/TCP/internal',
  ]);
  const first = new Reconciler(m);
  first.sync(d, { prune: true });
  t.equal(consistent(m), undefined);
  const masters = [...m.services.values()].filter((e) => e.slot === 0);
  t.same(masters.filter((e) => e.master!.type === 'Wildcard').map((e) => e.fe.address), ['10.96.0.10'], 'one wildcard: the cluster IP\'s');
  const twin = m.services.get('0.0.0.0:30080/TCP/internal#0')!;
  t.same(twin.fe, { address: '0.0.0.0', family: 4, port: 30080, protocol: 'TCP', scope: 'internal' }, 'the key keeps its scope');
  t.same(m.services.get('0.0.0.0:30080/TCP#0')!.fe, { address: '0.0.0.0', family: 4, port: 30080, protocol: 'TCP' }, 'the external key has none');
  const ids = new Set(masters.filter((e) => e.master!.type !== 'Wildcard').map((e) => e.master!.revNatId));
  t.equal(ids.size, 7, 'seven frontends, seven rev-NAT ids');
  const before = JSON.stringify(m.dump());
  const again = new Reconciler(m);
  t.same(again.restore(), { frontends: 7, backends: 2 });
  for (const [key, fe] of d) t.equal(again.revNatIds[4].get(key), first.revNatIds[4].get(key), `${fe.key}: its id adopted`);
  t.equal(again.sync(d, { prune: true }).planned, 0, 'nothing to write');
  t.equal(JSON.stringify(m.dump()), before);
  again.sync(new Map(), { prune: true });
  t.same([...m.services.keys()], [], 'and all of it removed, twins included');
});

t.test('change syncs over random transitions of mixed types and scopes leave exactly what a full plan would', async (t) => {
  // As above, with each key's type drawn at random (a ClusterIP address may
  // turn into an external IP and back) and twins: wildcards must follow the
  // ClusterIP frontends alone.
  let seed = 7;
  const rand = (n: number): number => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed % n;
  };
  const types = ['ClusterIP', 'ClusterIP', 'ExternalIP', 'LoadBalancer', 'NodePort'] as const;
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  let d = new Map<FrontendKey, Frontend>();
  let violations = 0;
  m.failWhen = () => (consistent(m) && violations++, false);
  for (let step = 0; step < 200; step++) {
    const next = new Map(d);
    for (let k = 1 + rand(3); k > 0; k--) {
      const type = types[rand(types.length)]!;
      const ip = type === 'NodePort' ? '0.0.0.0' : `10.96.0.${1 + rand(3)}`;
      const port = [80, 443][rand(2)]!;
      const backends = Array.from({ length: rand(3) }, () => `10.0.0.${1 + rand(5)}`).filter((a, i, all) => all.indexOf(a) === i).sort();
      const local = type !== 'ClusterIP' && rand(2) === 0;
      const fe = frontend(ip, port, backends, [], { type, externalLocal: local });
      const twin = frontend(ip, port, backends, [], { type, externalLocal: local, scope: 'internal' });
      if (rand(3) === 0) {
        next.delete(fe.key);
        next.delete(twin.key);
        continue;
      }
      next.set(fe.key, fe);
      if (local) next.set(twin.key, twin);
      else next.delete(twin.key);
    }
    d = next;
    sync(r, d, { prune: true });
    const wildcards = [...m.services.values()].filter((e) => e.master?.type === 'Wildcard').map((e) => e.fe.address).sort();
    const clusterIPs = [...new Set([...d.values()].filter((f) => f.type === 'ClusterIP').map((f) => f.address))].sort();
    if (wildcards.join() !== clusterIPs.join()) t.fail(`step ${step}: wildcards ${wildcards.join()} for cluster IPs ${clusterIPs.join()}`);
    if (step % 25 === 24) {
      m.failWhen = undefined;
      holdsExactly(t, m, d, `after step ${step}`);
      m.failWhen = () => (consistent(m) && violations++, false);
    }
  }
  m.failWhen = undefined;
  t.equal(violations, 0, 'no half-written service between any two writes');
  holdsExactly(t, m, d, 'after 200 change syncs');
});

t.test('SCTP frontends: their backends get ids of their own, apart from TCP ones at the same address and port', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const tcp = frontend('10.96.0.1', 3868, ['10.0.0.2']);
  const sctp = frontend('10.96.0.1', 3868, ['10.0.0.2'], [], { protocol: 'SCTP' });
  const d = state(tcp, sctp);
  sync(r, d, { prune: true });
  const key = (protocol: 'TCP' | 'UDP' | 'SCTP') => backendIdKey({ address: '10.0.0.2', family: 4, port: 8080, protocol });
  t.equal(new Set([key('TCP'), key('UDP'), key('SCTP')]).size, 3, 'one id key per protocol');
  t.not(r.backendIds.get(key('SCTP')), r.backendIds.get(key('TCP')), 'two backends, two ids');
  t.same([...m.backends.values()].map((b) => b.protocol).sort(), ['SCTP', 'TCP']);
  holdsExactly(t, m, d, 'both frontends written');
});
