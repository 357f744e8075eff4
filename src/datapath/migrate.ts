// Carrying pinned maps into a new object: which pinned maps the object can
// adopt as they are, and which it must have made anew (resized, redefined,
// or of another key or value layout, by their BTF), and the copy of their
// entries, converted field by field where the layout changed. Both objects'
// loaders use it: the socket programs' (loader.ts) and the tc programs'
// (nodeport.ts).
import { existsSync } from 'node:fs';
import path from 'node:path';
import { ConfigError } from '../base/errors.js';
import { BPF_ANY, BPF_NOEXIST, BpfObject, isErrno, openPinnedMap, type BpfMap } from '../native/bpf.js';
import { mapSpecs } from './abi.gen.js';
import { convertPerCpu, converter, type Converter } from './layout.js';

/** copyPinnedInto()'s `progress` is called once per this many + 1 entries (a mask). */
export const PROGRESS_EVERY = 0xfff;

/** BPF_MAP_TYPE_PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH. */
const PERCPU_TYPES = new Set([5, 6, 10]);
/** BPF_MAP_TYPE_ARRAY_OF_MAPS, HASH_OF_MAPS. */
const MAP_IN_MAP_TYPES = new Set([12, 13]);

/** The pinned maps this load cannot adopt as they are: resized ones, redefined ones (type, flags), and those whose layout changed (with their converters). */
export interface MigrationPlan {
  readonly resized: readonly string[];
  readonly relaid: ReadonlyMap<string, MapConverters>;
  /** Every map that is made anew in the staging directory and takes the pin at the end (resized, redefined or relaid). */
  readonly changed: readonly string[];
  /** The maps the object declares (another object may pin maps this one does not have). */
  readonly declared: readonly string[];
}

export interface MapConverters {
  readonly key: Converter;
  readonly value: Converter;
}

/**
 * Compares every pinned map of ours with what the object declares: its size
 * (what this load asks for) and its key and value layouts (BTF). libbpf would
 * reuse a pinned map whose layout changed but whose sizes did not, and the new
 * programs would read the old bytes in the new layout, so layouts are
 * compared here, before the load. A layout that cannot be converted, or a
 * pinned map without BTF, is an error naming the map, before anything moves.
 */
export function planMigration(dir: string, objectPath: string, wanted: Record<string, number>): MigrationPlan {
  const resized: string[] = [];
  const redefined: string[] = [];
  const relaid = new Map<string, MapConverters>();
  const object = BpfObject.open(objectPath);
  const declared = object.mapNames();
  try {
    for (const name of declared) {
      const c = comparePinned(dir, object, name, wanted);
      if (!c) continue;
      if (c.resized) resized.push(name);
      if (c.redefined) redefined.push(name);
      if (c.relaid) relaid.set(name, c.relaid);
    }
  } finally {
    object.close();
  }
  return { resized, relaid, changed: [...new Set([...resized, ...redefined, ...relaid.keys()])], declared };
}

/** How the map `name` pinned in `dir` differs from the open (not loaded) object's; undefined: not pinned, or not one of lbctl's maps. */
export interface PinnedDifference {
  readonly resized: boolean;
  readonly redefined: boolean;
  /** The converters from the pinned layout to the object's, when they differ. */
  readonly relaid?: MapConverters;
}

/** One map of planMigration(); throws ConfigError, naming the map, where its entries cannot be carried over. */
export function comparePinned(dir: string, object: BpfObject, name: string, wanted: Readonly<Record<string, number>>): PinnedDifference | undefined {
  const p = path.join(dir, name);
  if (!(name in mapSpecs) || !existsSync(p)) return undefined;
  const declared = object.mapLayout(name);
  const m = openPinnedMap(p);
  try {
    // Sized by a flag (wanted), or by the object itself (lb_metrics
    // grows with enum lb_metric): libbpf refuses a pin of another size.
    const resized = m.maxEntries !== (wanted[name] ?? declared.maxEntries);
    // Another map type or flags (an LRU that was a hash, BPF_F_NO_PREALLOC):
    // libbpf would refuse the pin, so the map is made anew and its entries
    // copied. Values shared by all CPUs cannot become per-CPU ones, or back.
    const redefined = m.type !== declared.type || m.flags !== declared.flags;
    if (redefined && PERCPU_TYPES.has(m.type) !== PERCPU_TYPES.has(declared.type)) {
      throw new ConfigError(`map ${name} pinned at ${p} is ${PERCPU_TYPES.has(m.type) ? '' : 'not '}per-CPU and ${object.path} declares it ${PERCPU_TYPES.has(declared.type) ? '' : 'not '}per-CPU: its values cannot be carried over; run \`lbctl cleanup\` and start again (this drops the datapath's state)`);
    }
    if (!declared.key || !declared.value) return { resized, redefined }; // an object without BTF for this map: only libbpf's size checks apply
    // A map of maps holds other maps' ids, which no BTF describes (its entries are never carried over).
    if (MAP_IN_MAP_TYPES.has(m.type)) return { resized, redefined };
    const pinned = m.layout();
    if (!pinned?.key || !pinned.value) {
      throw new ConfigError(`map ${name} pinned at ${p} has no BTF, so its key and value layout cannot be compared with ${object.path}'s; run \`lbctl cleanup\` and start again (this drops the datapath's state)`);
    }
    const key = converter(pinned.key, declared.key, `map ${name} key`);
    const value = converter(pinned.value, declared.value, `map ${name} value`);
    return { resized, redefined, ...(!key.identical || !value.identical ? { relaid: { key, value } } : {}) };
  } finally {
    m.close();
  }
}

/**
 * The pinned maps a resize keeps as they are (every pinned map of ours that is
 * not being resized): the new object shares them instead of copying them, so
 * the programs on both sides of the link switch see the same entries.
 */
export function openKept(dir: string, resized: readonly string[], declared: readonly string[]): Map<string, BpfMap> {
  const kept = new Map<string, BpfMap>();
  for (const name of declared.filter((n) => n in mapSpecs)) {
    const p = path.join(dir, name);
    if (resized.includes(name) || !existsSync(p)) continue;
    kept.set(name, openPinnedMap(p));
  }
  return kept;
}

export interface MapMigration {
  readonly map: string;
  readonly from: number;
  readonly to: number;
  readonly entries: number;
  /** The key or value layout changed: every entry was converted field by field. */
  readonly converted: boolean;
  /** Fields of the old layout that the new one dropped, and new fields (zero in every entry). */
  readonly dropped?: readonly string[];
  readonly added?: readonly string[];
}

/**
 * Copies every entry of the maps `names` pinned in `dir` into the object's
 * maps of the same name (with `keepNewer`, entries already present win),
 * converting the entries of maps whose layout changed. An entry that does not
 * fit (a shrunk map, a narrowed field) fails the whole migration.
 */
export function copyPinnedInto(
  object: BpfObject,
  dir: string,
  names: readonly string[],
  relaid: ReadonlyMap<string, MapConverters>,
  keepNewer = false,
  progress?: () => void,
): MapMigration[] {
  const out: MapMigration[] = [];
  for (const name of object.mapNames()) {
    if (!(name in mapSpecs) || !names.includes(name)) continue;
    const file = path.join(dir, name);
    if (!existsSync(file)) continue;
    const from = openPinnedMap(file);
    const to = object.map(name);
    const conv = relaid.get(name);
    try {
      if (!conv && (from.keySize !== to.keySize || from.valueBufSize !== to.valueBufSize)) {
        throw new ConfigError(`map ${name}: the pinned map's key or value size differs from the new one's, and neither has a layout to convert by`);
      }
      // A converted key could collide with another converted key (a dropped
      // key field): never let one entry overwrite another.
      const keyChanged = conv !== undefined && !conv.key.identical;
      const cpus = from.perCpu ? from.valueBufSize / Math.ceil(from.valueSize / 8) / 8 : 1;
      let entries = 0;
      let seen = 0;
      for (const [k, v] of from.entries()) {
        if (progress && (++seen & PROGRESS_EVERY) === 0) progress();
        const key = conv ? conv.key.convert(k) : k;
        const value = !conv ? v : from.perCpu ? convertPerCpu(conv.value, v, cpus) : conv.value.convert(v);
        try {
          to.update(key, value, keepNewer || keyChanged ? BPF_NOEXIST : BPF_ANY);
          entries++;
        } catch (err) {
          if (keepNewer && isErrno(err, 'EEXIST')) continue;
          if (keyChanged && isErrno(err, 'EEXIST')) {
            throw new ConfigError(`map ${name}: two entries of the pinned map convert to the same key ${key.toString('hex')} (dropped key fields: ${conv.key.dropped.join(', ') || 'none'})`, { cause: err });
          }
          throw new ConfigError(`map ${name}: cannot carry ${from.maxEntries}-entry contents into ${to.maxEntries} entries: ${(err as Error).message}`, { cause: err });
        }
      }
      const m: MapMigration = { map: name, from: from.maxEntries, to: to.maxEntries, entries, converted: conv !== undefined };
      out.push(conv ? { ...m, dropped: [...conv.key.dropped, ...conv.value.dropped], added: [...conv.key.added, ...conv.value.added] } : m);
    } finally {
      from.close();
    }
  }
  return out;
}

