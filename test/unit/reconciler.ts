import t, { type Test } from 'tap';
import { desiredState } from '../../src/model/from-k8s.js';
import { validateEndpointSlice, validateService } from '../../src/model/k8s.js';
import type { DesiredState } from '../../src/model/types.js';
import { Reconciler } from '../../src/reconcile/reconciler.js';
import { FakeLbMaps } from '../fakes/fake-maps.js';
import { service, slice } from '../fakes/objects.js';

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
 * What a connecting socket may see at any moment: every master's selectable
 * slots exist and name existing backends.
 */
function consistent(m: FakeLbMaps): string | undefined {
  for (const e of m.services.values()) {
    if (e.slot !== 0 || !e.master || e.master.type === 'Wildcard') continue;
    const key = `${e.fe.family === 6 ? `[${e.fe.address}]` : e.fe.address}:${e.fe.port}/${e.fe.protocol}`;
    for (let s = 1; s <= e.master.count + e.master.qcount; s++) {
      const slot = m.services.get(`${key}#${s}`);
      if (!slot) return `${key} counts slot ${s}, which is missing`;
      if (!m.backends.has(slot.backendId!)) return `${key} slot ${s} names missing backend ${slot.backendId}`;
    }
    if (!m.revNat.has(`${e.fe.family}/${e.master.revNatId}`)) return `${key} names missing rev-NAT ${e.master.revNatId}`;
  }
  return undefined;
}

/** Applies a transition one write at a time, checking the invariant after each write. */
function checkEveryPrefix(t: Test, from: DesiredState, to: DesiredState): void {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  r.sync(from, { prune: true });
  const start = m.calls.length;
  // Snapshot check after each call by wrapping failWhen as an observer.
  let violation: string | undefined;
  m.failWhen = () => {
    violation ??= consistent(m);
    return false;
  };
  // failWhen is cleared on throw only; keep observing.
  const res = r.sync(to, { prune: true });
  violation ??= consistent(m);
  t.equal(violation, undefined, 'no half-written service at any point');
  t.ok(res.applied === m.calls.length - start);
}

t.test('a new service: backends, then rev-NAT and slots, then master, then wildcard', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const res = r.sync(desired([{ name: 'web', ip: '10.96.0.10', backends: ['10.0.0.2', '10.0.0.3'] }]), { prune: true });
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
  r.sync(d, { prune: true });
  t.equal(r.sync(d, { prune: true }).planned, 0);
});

t.test('removal runs in reverse: master, slots, rev-NAT, wildcard, backends', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  r.sync(desired([{ name: 'web', ip: '10.96.0.10', backends: ['10.0.0.2'] }]), { prune: true });
  m.calls.length = 0;
  r.sync(new Map(), { prune: true });
  t.same(
    m.calls.map((c) => `${c.method} ${c.what}`),
    ['deleteMaster 10.96.0.10:80/TCP', 'deleteSlot 10.96.0.10:80/TCP#1', 'deleteRevNat 4/1', 'deleteMaster 10.96.0.10:0/ANY', 'deleteBackend 1'],
  );
  t.equal(m.services.size + m.backends.size + m.revNat.size, 0, 'maps empty');
});

t.test('shrinking a service lowers the count before deleting slots', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  r.sync(desired([{ name: 'web', ip: '10.96.0.10', backends: ['10.0.0.2', '10.0.0.3', '10.0.0.4'] }]), { prune: true });
  m.calls.length = 0;
  r.sync(desired([{ name: 'web', ip: '10.96.0.10', backends: ['10.0.0.2'] }]), { prune: true });
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
  r.sync(
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

t.test('a failed write stops the sync, keeps realized state exact, and the next sync finishes', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  const d = desired([
    { name: 'a', ip: '10.96.0.1', backends: ['10.0.0.2'] },
    { name: 'b', ip: '10.96.0.2', backends: ['10.0.0.3'] },
  ]);
  m.failWhen = (c) => c.method === 'putSlot' && c.what.startsWith('10.96.0.2');
  t.throws(() => r.sync(d, { prune: true }), { code: 'ESYNC', message: /put 10\.96\.0\.2:80\/TCP slot 1 → backend 2: .*E2BIG/ });
  t.equal(consistent(m), undefined, 'nothing half-written');
  t.notOk(m.services.has('10.96.0.2:80/TCP#0'), 'b is not visible');
  const res = r.sync(d, { prune: true });
  t.ok(res.applied > 0);
  t.equal(r.sync(d, { prune: true }).planned, 0, 'converged');
});

t.test('without prune, nothing absent from the desired state is removed', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m);
  r.sync(desired([{ name: 'a', ip: '10.96.0.1', backends: ['10.0.0.2'] }]), { prune: true });
  r.sync(desired([{ name: 'b', ip: '10.96.0.2', backends: ['10.0.0.3'] }]), { prune: false });
  t.ok(m.services.has('10.96.0.1:80/TCP#0'), 'a kept');
  t.ok(m.services.has('10.96.0.2:80/TCP#0'), 'b added');
  t.equal(consistent(m), undefined);
});
