// Profiles lbctl's sync path on real maps, outside the agent: validate N
// Services and EndpointSlices, compute the desired state, and program it
// into freshly created (unattached) maps; then add one service on top,
// change one service's endpoints, and run one periodic full resync (re-read
// the maps, then the sync after it) with no drift and with some.
//   node --expose-gc --import=@tapjs/typescript/import bench/profile/sync.ts --services 10000 [--json] [--passes N]
// (TS_NODE_TRANSPILE_ONLY=1 as the Makefile's bench targets set it; node's
// --cpu-prof before the script for a CPU profile.)
// Prints each stage's wall and CPU time and, with --expose-gc, the memory
// (V8 heap and ArrayBuffers) each stage keeps after a full collection (where the agent's memory per
// service goes) and the process's peak RSS. --json prints one JSON object
// instead (one a pass). --passes N runs it all N times in one process, each
// on fresh maps: the first pass runs code V8 has not optimized yet, as the
// agent's one cold sync does, and the later ones show what the same work
// costs once it has (docs/benchmarks.md, "Programming and changes").
import { rmSync, mkdirSync } from 'node:fs';
import { BpfObject } from '../../src/native/bpf.js';
import { DEFAULT_OBJECT, ensureBpffs } from '../../src/datapath/loader.js';
import { KernelLbMaps, LB_MAP_NAMES, type LbMapSet } from '../../src/datapath/maps.js';
import { u32 } from '../../src/datapath/abi.gen.js';
import { validateEndpointSlice, validateService, type EndpointSlice, type Service } from '../../src/model/k8s.js';
import { DesiredModel, serviceId } from '../../src/model/desired.js';
import { Reconciler } from '../../src/reconcile/reconciler.js';
import { serviceObject, sliceObject } from '../lbctl.js';
import { makeServices } from '../services.js';

/** One stage: wall and CPU (user + system) time in ms. */
export interface StageTime {
  readonly wallMs: number;
  readonly cpuMs: number;
}

/** What measure() returns: times by stage, memory kept by stage (V8 heap and ArrayBuffers, MiB; absent without --expose-gc), RSS. */
export interface SyncProfile {
  readonly services: number;
  readonly times: Record<string, StageTime>;
  /** The reconciler's own split of the cold sync (SyncResult.phasesMs). */
  readonly coldPhasesMs: Record<string, number>;
  readonly heapMiB: Record<string, number>;
  /** Peak RSS of the process (getrusage maxrss), MiB, after the cold sync; and RSS at the end. */
  readonly peakRssMiB: number;
  readonly rssMiB: number;
}

const round = (x: number): number => Math.round(x * 100) / 100;

/**
 * Runs the profile at `n` services on maps created for it (pinned under a
 * fresh directory of /sys/fs/bpf, removed after; bpffs is mounted there
 * when it is not). Needs CAP_BPF.
 */
export async function measure(n: number, log: (line: string) => void = () => {}): Promise<SyncProfile> {
  const pin = `/sys/fs/bpf/lbctl-bench-${process.pid}-profile`;
  // First: on the unmounted /sys/fs/bpf of sysfs, node's recursive (20 and 24)
  // mkdirSync spins for ever (mkdir of the child: ENOENT, of the parent:
  // EEXIST), where it should throw.
  ensureBpffs(pin);
  mkdirSync(pin, { recursive: true });
  const obj = BpfObject.open(DEFAULT_OBJECT, {
    pinRoot: pin,
    maxEntries: { lb4_services: 2 * 2 * n + 4 * n + 64, lb4_backends: 4 * n + 64, lb4_reverse_nat: 2 * n + 64 },
  });
  const times: Record<string, StageTime> = {};
  const heapMiB: Record<string, number> = {};
  try {
    await obj.load();
    const set = {} as LbMapSet;
    for (const name of LB_MAP_NAMES) set[name] = obj.map(name);
    const rec = new Reconciler(new KernelLbMaps(set));
    rec.restore();
    const ok = <T>(v: { ok: true; value: T } | { ok: false; reason: string }): T => {
      if (!v.ok) throw new Error(v.reason);
      return v.value;
    };
    const t = <T>(label: string, fn: () => T): T => {
      const t0 = performance.now();
      const c0 = process.cpuUsage();
      const out = fn();
      const cpu = process.cpuUsage(c0);
      const s = { wallMs: round(performance.now() - t0), cpuMs: round((cpu.user + cpu.system) / 1000) };
      times[label] = s;
      log(`${label}: ${s.wallMs.toFixed(2)} ms (cpu ${s.cpuMs.toFixed(2)} ms)`);
      return out;
    };
    const gc = (globalThis as { gc?: () => void }).gc;
    let heapBefore = 0;
    const heap = (label: string): void => {
      if (!gc) return;
      gc();
      gc();
      // ArrayBuffers too: typed columns (the realized state's) and Buffers
      // live outside V8's heap but are kept all the same.
      const { heapUsed, arrayBuffers } = process.memoryUsage();
      const used = heapUsed + arrayBuffers;
      if (label) {
        heapMiB[label] = round((used - heapBefore) / 2 ** 20);
        log(`  kept by ${label} (heap and ArrayBuffers): ${heapMiB[label]!.toFixed(1)} MiB (${((used - heapBefore) / n).toFixed(0)} B per service)`);
      }
      heapBefore = used;
    };
    heap('');
    const model = new DesiredModel();
    const add = (svc: Service, slice: EndpointSlice): void => {
      model.setService(serviceId(svc.namespace, svc.name), svc);
      model.setSlice(serviceId(slice.namespace, slice.name), slice);
    };
    // Each object as the agent gets it: parsed from its own JSON text, as
    // the Kubernetes source parses a list item by item (V8 shares a parsed
    // string across parses only when it has 10 characters or fewer).
    const wire = makeServices(n + 1).map((s) => [JSON.stringify(serviceObject(s)), JSON.stringify(sliceObject(s))] as const);
    const raw = wire.map(([svc, slice]) => [JSON.parse(svc) as unknown, JSON.parse(slice) as unknown] as const);
    wire.length = 0;
    const objs = t(`validate`, () => raw.map(([svc, slice]) => [ok(validateService(svc)), ok(validateEndpointSlice(slice))] as const));
    // What validation keeps, measured with the JSON and the parsed objects gone.
    raw.length = 0;
    heap('validated objects');
    t(`model events`, () => objs.slice(0, n).forEach(([s, e]) => add(s, e)));
    heap('model indexes');
    let flushed = t('model flush (cold)', () => model.flush());
    heap('frontends');
    const cold = t('sync cold', () => rec.sync(model.frontends, { prune: true, changed: flushed.changed }));
    const peakRssMiB = round((process.resourceUsage().maxRSS * 1024) / 2 ** 20);
    log(`  reconciler phases: ${JSON.stringify(cold.phasesMs)}; peak RSS so far ${peakRssMiB} MiB`);
    heap('reconciler');
    add(...objs[n]!);
    flushed = t('add one: model flush', () => model.flush());
    t('add one: sync', () => rec.sync(model.frontends, { prune: true, changed: flushed.changed }));
    const [, slice0] = objs[0]!;
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
    // The agent's periodic run: resync(), then a sync with what the model
    // flushed (nothing). The first one runs code the process has not run
    // before; the agent runs one every syncPeriod, so the steady cost is the
    // median of the next five.
    t('resync', () => rec.resync());
    const after = t('sync after resync', () => rec.sync(model.frontends, { prune: true, changed: new Set() }));
    if (after.planned !== 0) throw new Error(`a resync with no drift planned ${after.planned} writes`);
    const steady: StageTime[] = [];
    for (let i = 0; i < 5; i++) {
      const t0 = performance.now();
      const c0 = process.cpuUsage();
      rec.resync();
      rec.sync(model.frontends, { prune: true, changed: new Set() });
      const cpu = process.cpuUsage(c0);
      steady.push({ wallMs: round(performance.now() - t0), cpuMs: round((cpu.user + cpu.system) / 1000) });
    }
    const mid = (k: keyof StageTime): number => [...steady].sort((x, y) => x[k] - y[k])[2]![k];
    const label = 'resync + sync, steady (median of 5)';
    times[label] = { wallMs: mid('wallMs'), cpuMs: mid('cpuMs') };
    log(`${label}: ${mid('wallMs').toFixed(2)} ms (cpu ${mid('cpuMs').toFixed(2)} ms)`);
    // Drift: one backend deleted behind the agent's back; the resync finds it and the sync rewrites it.
    set.lb4_backends.delete(u32.encode(rec.realized.backends.keys().next().value!));
    t('resync (one entry drifted)', () => rec.resync());
    const repaired = t('sync after resync (one entry drifted)', () => rec.sync(model.frontends, { prune: true, changed: new Set() }));
    if (repaired.applied < 1) throw new Error('the drifted backend was not rewritten');
    return { services: n, times, coldPhasesMs: { ...cold.phasesMs }, heapMiB, peakRssMiB, rssMiB: round(process.memoryUsage().rss / 2 ** 20) };
  } finally {
    obj.close();
    rmSync(pin, { recursive: true, force: true });
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const args = process.argv.slice(2);
  const at = args.indexOf('--services');
  const n = Number(at >= 0 ? args[at + 1] : (args.find((a) => /^\d+$/.test(a)) ?? 10_000));
  const json = args.includes('--json');
  const p = args.indexOf('--passes');
  const passes = p >= 0 ? Number(args[p + 1]) : 1;
  if (!Number.isInteger(passes) || passes < 1) throw new Error(`--passes ${args[p + 1]}: a whole number of passes, 1 or more`);
  for (let k = 1; k <= passes; k++) {
    const prefix = passes > 1 ? `pass ${k}: ` : '';
    const profile = await measure(n, json ? undefined : (line) => process.stdout.write(`${prefix}${line}\n`));
    if (json) process.stdout.write(`${JSON.stringify(profile)}\n`);
  }
}
