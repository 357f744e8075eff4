// `lbctl service list`'s drift check (src/agent/drift.ts) against maps a
// reconciler wrote and then damaged one way at a time: each damage that the
// socket programs would act on must be reported, in words.
import t from 'tap';
import { frontendStatuses } from '../../src/agent/drift.js';
import { Reconciler } from '../../src/reconcile/reconciler.js';
import { FakeLbMaps } from '../fakes/fake-maps.js';
import { frontend, state } from '../fakes/frontends.js';


const WEB = frontend('10.96.0.1', 80, ['10.244.1.1', '10.244.1.2'], ['10.244.1.3']);
const DNS = frontend('10.96.0.1', 53, ['10.244.1.4']);

/** Maps holding WEB and DNS as a sync wrote them, and the check over them. */
function programmed(): { maps: FakeLbMaps; check: () => ReturnType<typeof frontendStatuses> } {
  const maps = new FakeLbMaps();
  const r = new Reconciler(maps);
  const desired = new Map([WEB, DNS].map((f) => [f.key, f]));
  r.sync(desired, { prune: true });
  return { maps, check: () => frontendStatuses(desired.values(), (fe) => r.revNatIds[fe.family].get(fe.key) ?? 0, maps.dump()) };
}

const webDetails = (s: ReturnType<typeof frontendStatuses>): readonly string[] => s.find((f) => f.frontend === WEB.key)!.details;

t.test('maps as written: no drift, realized split by the maps own count', async (t) => {
  const { check } = programmed();
  const s = check();
  t.same(s.map((f) => [f.frontend, f.drift]), [
    [DNS.key, false],
    [WEB.key, false],
  ]);
  t.same(s.find((f) => f.frontend === WEB.key)!.realized, { backends: ['10.244.1.1:8080', '10.244.1.2:8080'], terminating: ['10.244.1.3:8080'], revNatId: 1 });
});

t.test('a wrong count or qcount in the master is drift (the slots alone look right)', async (t) => {
  const { maps, check } = programmed();
  const m = maps.services.get(`${WEB.key}#0`)!;
  maps.services.set(`${WEB.key}#0`, { ...m, master: { ...m.master!, count: 0 } });
  const s = check();
  t.ok(s.find((f) => f.frontend === WEB.key)!.drift, 'count 0 makes every backend unselectable: drift');
  t.same(webDetails(s), ['count 0, intended 2']);
  t.same(s.find((f) => f.frontend === WEB.key)!.realized!.backends, [], 'realized backends follow the maps count');

  maps.services.set(`${WEB.key}#0`, { ...m, master: { ...m.master!, qcount: 0 } });
  t.same(webDetails(check()), ['qcount 0, intended 1'], 'qcount');
});

t.test('orphaned slots beyond count + qcount are drift', async (t) => {
  const { maps, check } = programmed();
  maps.services.set(`${WEB.key}#4`, { fe: WEB, slot: 4, backendId: 1 });
  t.same(webDetails(check()), ['slot 4 is beyond count + qcount (orphaned)']);
});

t.test('flags, type, affinity timeout and rev-NAT id of the master are compared', async (t) => {
  const { maps, check } = programmed();
  const m = maps.services.get(`${WEB.key}#0`)!;
  maps.services.set(`${WEB.key}#0`, { ...m, master: { ...m.master!, flags: 1, type: 'Wildcard', affinityTimeout: 30, revNatId: 7 } });
  t.same(webDetails(check()), ['rev-NAT id 7, intended 1', 'type Wildcard, intended ClusterIP', 'flags 0x1, intended 0x0', 'affinity timeout 30 s, intended 0 s', 'rev-NAT entry 7 is missing']);
});

t.test('a missing or wrong rev-NAT entry is drift (replies would not be translated back)', async (t) => {
  const { maps, check } = programmed();
  const rn = maps.revNat.get('4/1')!;
  maps.revNat.set('4/1', { ...rn, port: 81 });
  t.same(webDetails(check()), ['rev-NAT entry 1 is 10.96.0.1:81, intended 10.96.0.1:80']);
  maps.revNat.delete('4/1');
  t.same(webDetails(check()), ['rev-NAT entry 1 is missing']);
});

t.test('slots: missing, naming a missing backend, naming another backend', async (t) => {
  const { maps, check } = programmed();
  const slot2 = maps.services.get(`${WEB.key}#2`)!;
  maps.services.delete(`${WEB.key}#2`);
  t.same(webDetails(check()), ['slot 2 is missing, intended 10.244.1.2:8080']);
  maps.services.set(`${WEB.key}#2`, { ...slot2, backendId: 99 });
  t.same(webDetails(check()), ['slot 2 names missing backend 99']);
  maps.services.set(`${WEB.key}#2`, { ...slot2, backendId: slot2.backendId! + 2 });
  t.same(webDetails(check()), ['slot 2 is 10.244.1.4:8080, intended 10.244.1.2:8080']);
});

t.test('the wildcard entry: missing for a served address, present for an unused one', async (t) => {
  const { maps, check } = programmed();
  const wild = maps.services.get('10.96.0.1:0/ANY#0')!;
  maps.services.delete('10.96.0.1:0/ANY#0');
  t.same(webDetails(check()), ['no wildcard entry for 10.96.0.1: its other ports are not refused']);
  maps.services.set('10.96.0.9:0/ANY#0', { ...wild, fe: { ...wild.fe, address: '10.96.0.9' } });
  const extra = check().find((f) => f.frontend === '10.96.0.9:0/ANY');
  t.same(extra, { frontend: '10.96.0.9:0/ANY', drift: true, details: ['wildcard entry for 10.96.0.9, which no service uses: its ports are refused'] });
});

t.test('a frontend in the maps that nothing intends', async (t) => {
  const { maps, check } = programmed();
  const m = maps.services.get(`${DNS.key}#0`)!;
  const other = { ...m.fe, port: 54 };
  maps.services.set('10.96.0.1:54/TCP#0', { ...m, fe: other });
  const extra = check().find((f) => f.frontend === '10.96.0.1:54/TCP')!;
  t.equal(extra.drift, true);
  t.same(extra.details, ['in the maps but not intended']);
});
