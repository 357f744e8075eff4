// Profiles lbctl's sync path on real maps, outside the agent: validate N
// Services and EndpointSlices, compute the desired state, and program it
// into freshly created (unattached) maps; then add one service on top.
//   node --cpu-prof --import=@tapjs/typescript/import bench/profile/sync.ts 10000
import { mkdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { BpfObject } from '../../src/native/bpf.js';
import { DEFAULT_OBJECT } from '../../src/datapath/loader.js';
import { KernelLbMaps, LB_MAP_NAMES, type LbMapSet } from '../../src/datapath/maps.js';
import { validateEndpointSlice, validateService, type EndpointSlice, type Service } from '../../src/model/k8s.js';
import { desiredState, ModelMemo } from '../../src/model/from-k8s.js';
import { Reconciler } from '../../src/reconcile/reconciler.js';
import { serviceObject, sliceObject } from '../lbctl.js';
import { makeServices } from '../services.js';

const n = Number(process.argv[2] ?? 10_000);
const pin = `/sys/fs/bpf/lbctl-bench-${process.pid}-profile`;
mkdirSync(pin, { recursive: true });
const obj = BpfObject.open(DEFAULT_OBJECT, {
  pinRoot: pin,
  maxEntries: { lb4_services: 2 * 2 * n + 4 * n + 64, lb4_backends: 4 * n + 64, lb4_reverse_nat: 2 * n + 64 },
});
try {
  await obj.load();
  const set = {} as LbMapSet;
  for (const name of LB_MAP_NAMES) set[name] = obj.map(name);
  const rec = new Reconciler(new KernelLbMaps(set));
  rec.restore();
  const all = makeServices(n);
  const ok = <T>(v: { ok: true; value: T } | { ok: false; reason: string }): T => {
    if (!v.ok) throw new Error(v.reason);
    return v.value;
  };
  const t = (label: string, fn: () => void): void => {
    const t0 = performance.now();
    fn();
    process.stdout.write(`${label}: ${(performance.now() - t0).toFixed(1)} ms\n`);
  };
  const memo = new ModelMemo();
  let services: Service[] = [];
  let slices: EndpointSlice[] = [];
  t(`validate ${n}`, () => {
    services = all.slice(0, n).map((s) => ok(validateService(serviceObject(s))));
    slices = all.slice(0, n).map((s) => ok(validateEndpointSlice(sliceObject(s))));
  });
  let model = desiredState({ services, slices }, memo);
  t('desired state', () => (model = desiredState({ services, slices }, memo)));
  t('sync cold', () => rec.sync(model.frontends, { prune: true }));
  services.push(ok(validateService(serviceObject(all[n]!))));
  slices.push(ok(validateEndpointSlice(sliceObject(all[n]!))));
  t('add one: desired state', () => (model = desiredState({ services, slices }, memo)));
  t('add one: sync', () => rec.sync(model.frontends, { prune: true }));
  t('nothing changed: sync', () => rec.sync(model.frontends, { prune: true }));
} finally {
  obj.close();
  rmSync(pin, { recursive: true, force: true });
}
void path;
