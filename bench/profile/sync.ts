// Profiles lbctl's sync path on real maps, outside the agent: validate N
// Services and EndpointSlices, compute the desired state, and program it
// into freshly created (unattached) maps; then add one service on top, and
// change one service's endpoints.
//   node --cpu-prof --import=@tapjs/typescript/import bench/profile/sync.ts 10000
// With --expose-gc it also prints the V8 heap each stage keeps (after a full
// collection): where the agent's memory per service goes.
import { rmSync, mkdirSync } from 'node:fs';
import { BpfObject } from '../../src/native/bpf.js';
import { DEFAULT_OBJECT } from '../../src/datapath/loader.js';
import { KernelLbMaps, LB_MAP_NAMES, type LbMapSet } from '../../src/datapath/maps.js';
import { validateEndpointSlice, validateService, type EndpointSlice, type Service } from '../../src/model/k8s.js';
import { DesiredModel, serviceId } from '../../src/model/desired.js';
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
  const all = makeServices(n + 1);
  const ok = <T>(v: { ok: true; value: T } | { ok: false; reason: string }): T => {
    if (!v.ok) throw new Error(v.reason);
    return v.value;
  };
  const t = <T>(label: string, fn: () => T): T => {
    const t0 = performance.now();
    const c0 = process.cpuUsage();
    const out = fn();
    const cpu = process.cpuUsage(c0);
    process.stdout.write(`${label}: ${(performance.now() - t0).toFixed(2)} ms (cpu ${((cpu.user + cpu.system) / 1000).toFixed(2)} ms)\n`);
    return out;
  };
  const gc = (globalThis as { gc?: () => void }).gc;
  let heapBefore = 0;
  const heap = (label: string): void => {
    if (!gc) return;
    gc();
    gc();
    const used = process.memoryUsage().heapUsed;
    if (heapBefore) process.stdout.write(`  heap kept by ${label}: ${((used - heapBefore) / 2 ** 20).toFixed(1)} MiB (${((used - heapBefore) / n).toFixed(0)} B per service)\n`);
    heapBefore = used;
  };
  heap('');
  const model = new DesiredModel();
  const add = (svc: Service, slice: EndpointSlice): void => {
    model.setService(serviceId(svc.namespace, svc.name), svc);
    model.setSlice(serviceId(slice.namespace, slice.name), slice);
  };
  const objs = t(`validate ${n}`, () => all.map((s) => [ok(validateService(serviceObject(s))), ok(validateEndpointSlice(sliceObject(s)))] as const));
  heap('the validated Services and EndpointSlices');
  t(`model: ${n} events`, () => objs.slice(0, n).forEach(([s, e]) => add(s, e)));
  heap('the model\'s indexes');
  let flushed = t('model: flush (cold)', () => model.flush());
  heap('the computed frontends');
  t('sync cold', () => rec.sync(model.frontends, { prune: true, changed: flushed.changed }));
  heap('the reconciler (realized state, ids)');
  add(...objs[n]!);
  flushed = t('add one: model flush', () => model.flush());
  t('add one: sync', () => rec.sync(model.frontends, { prune: true, changed: flushed.changed }));
  const [svc0, slice0] = objs[0]!;
  model.setSlice(serviceId(slice0.namespace, slice0.name), { ...slice0, endpoints: slice0.endpoints.slice(1) });
  flushed = t('one endpoint less: model flush', () => model.flush());
  t('one endpoint less: sync', () => rec.sync(model.frontends, { prune: true, changed: flushed.changed }));
  t('200 endpoint changes, one sync each (total)', () => {
    for (let i = 0; i < 200; i++) {
      model.setSlice(serviceId(slice0.namespace, slice0.name), { ...slice0, endpoints: slice0.endpoints.slice(i % 2) });
      const f = model.flush();
      rec.sync(model.frontends, { prune: true, changed: f.changed });
    }
  });
  flushed = t('nothing changed: model flush', () => model.flush());
  t('nothing changed: sync', () => rec.sync(model.frontends, { prune: true, changed: flushed.changed }));
  t('full resync (re-read the maps, full plan)', () => {
    rec.resync();
    return rec.sync(model.frontends, { prune: true });
  });
  void svc0;
} finally {
  obj.close();
  rmSync(pin, { recursive: true, force: true });
}
