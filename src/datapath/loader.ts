// Loads the datapath object, adopts pinned maps, attaches its programs to a
// cgroup through pinned links, and takes it all down on request. Attach is
// idempotent: a second load finds the pinned links and switches them to the
// new programs atomically (BPF_LINK_UPDATE), so a restarted or upgraded
// agent never leaves sockets unbalanced.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmdirSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ConfigError } from '../errors.js';
import { BPF_ANY, BPF_NOEXIST, BpfObject, isErrno, openPinnedMap, unpin, type BpfMap } from '../native/bpf.js';
import { mapSpecs, type MapName } from './abi.gen.js';
import { KernelLbMaps, LB_MAP_NAMES, verifyMapLayout, type LbMapSet } from './maps.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const DEFAULT_OBJECT = path.join(ROOT, 'bpf/.output/sock.bpf.o');
/** The same programs without bpf_set_retval (kernels before 5.18): refusals are EPERM. */
export const COMPAT_OBJECT = path.join(ROOT, 'bpf/.output/sock_compat.bpf.o');
export { DEFAULT_BPF_ROOT } from '../defaults.js';

export interface MapSizes {
  /** Frontends (service address, port, protocol) per family. */
  readonly services: number;
  /** Backends per family; also the number of backend slots. */
  readonly backends: number;
  /** Open sockets whose reverse translation is remembered, per family. */
  readonly sockRevNat: number;
}

export const DEFAULT_SIZES: MapSizes = {
  services: 65536,
  backends: 262144,
  sockRevNat: mapSpecs.lb4_sock_revnat.maxEntries,
};

export interface DatapathOptions {
  readonly bpfRoot: string;
  readonly cgroup: string;
  readonly object?: string;
  readonly sizes?: Partial<MapSizes>;
}

export interface AttachedProgram {
  readonly name: string;
  readonly linkId: number;
  /** True when an existing pinned link was switched to this program. */
  readonly updated: boolean;
}

export interface Datapath {
  readonly maps: KernelLbMaps;
  /** Maps resized at this load, with the entries carried over. */
  readonly migrated: readonly MapMigration[];
  /** Which object is loaded: the standard one, or the compat one (refusals are EPERM). */
  readonly variant: 'standard' | 'compat' | 'custom';
  readonly programs: readonly AttachedProgram[];
  readonly object: BpfObject;
  close(): void;
}

export const mapsDir = (bpfRoot: string): string => path.join(bpfRoot, 'maps');
export const linksDir = (bpfRoot: string): string => path.join(bpfRoot, 'links');
/** Where resized maps are made before they replace the pinned ones. */
// bpffs refuses names with a dot (EPERM), hence no "maps.next".
const stagingDir = (bpfRoot: string): string => path.join(bpfRoot, 'maps-next');

/** Where cgroup v2 is mounted (not always /sys/fs/cgroup), from /proc/mounts. */
export function cgroup2Root(mounts = readFileSync('/proc/mounts', 'utf8')): string {
  for (const line of mounts.split('\n')) {
    const [, mountPoint, type] = line.split(' ');
    if (type === 'cgroup2' && mountPoint) return mountPoint.replace(/\\040/g, ' ');
  }
  throw new ConfigError('no cgroup v2 filesystem is mounted (looked in /proc/mounts); lbctl attaches to a cgroup v2 path');
}

/** Mounts bpffs at /sys/fs/bpf when bpfRoot lives there and it is not mounted yet. */
export function ensureBpffs(bpfRoot: string, mounts = readFileSync('/proc/mounts', 'utf8')): void {
  const bpfMounts = mounts
    .split('\n')
    .map((l) => l.split(' '))
    .filter(([, , type]) => type === 'bpf')
    .map(([, mp]) => mp!);
  const abs = path.resolve(bpfRoot);
  if (bpfMounts.some((mp) => abs === mp || abs.startsWith(mp.endsWith('/') ? mp : `${mp}/`))) return;
  if (abs.startsWith('/sys/fs/bpf/')) {
    mkdirSync('/sys/fs/bpf', { recursive: true });
    execFileSync('mount', ['-t', 'bpf', 'bpf', '/sys/fs/bpf']);
    return;
  }
  throw new ConfigError(`--bpf-root ${bpfRoot} is not on a bpf filesystem (mount one with: mount -t bpf bpf <dir>)`);
}

function maxEntries(sizes: MapSizes): Record<string, number> {
  for (const [k, v] of Object.entries(sizes)) {
    if (!Number.isInteger(v) || v < 1 || v > 1 << 26) throw new ConfigError(`map size ${k}=${v} is not an integer in 1..${1 << 26}`);
  }
  const slots = sizes.services + sizes.backends;
  return {
    lb4_services: slots,
    lb6_services: slots,
    lb4_backends: sizes.backends,
    lb6_backends: sizes.backends,
    lb4_reverse_nat: Math.min(sizes.services, 65536),
    lb6_reverse_nat: Math.min(sizes.services, 65536),
    lb4_sock_revnat: sizes.sockRevNat,
    lb6_sock_revnat: sizes.sockRevNat,
  };
}

/** Pinned maps whose size differs from what this load asks for: named, so the error can say so. */
function sizeMismatches(bpfRoot: string, wanted: Record<string, number>): string[] {
  const out: string[] = [];
  for (const [name, n] of Object.entries(wanted)) {
    const p = path.join(mapsDir(bpfRoot), name);
    if (!existsSync(p)) continue;
    const m = openPinnedMap(p);
    try {
      if (m.maxEntries !== n) out.push(`${name} holds ${m.maxEntries} entries, ${n} requested`);
    } finally {
      m.close();
    }
  }
  return out;
}

export async function loadDatapath(opts: DatapathOptions): Promise<Datapath> {
  const sizes = { ...DEFAULT_SIZES, ...opts.sizes };
  const objectPath = opts.object ?? DEFAULT_OBJECT;
  if (!existsSync(objectPath)) throw new ConfigError(`BPF object ${objectPath} is missing: run \`make build\``);
  if (!statSync(opts.cgroup, { throwIfNoEntry: false })?.isDirectory()) {
    throw new ConfigError(`--cgroup ${opts.cgroup} is not a directory of the cgroup v2 hierarchy`);
  }
  ensureBpffs(opts.bpfRoot);
  mkdirSync(mapsDir(opts.bpfRoot), { recursive: true });
  mkdirSync(linksDir(opts.bpfRoot), { recursive: true });

  const wanted = maxEntries(sizes);
  // A map size changed (a flag): load into fresh maps beside the pinned ones,
  // copy every entry, switch the links, then move the new pins into place.
  const mismatches = sizeMismatches(opts.bpfRoot, wanted);
  const migrating = mismatches.length > 0;
  const pinRoot = migrating ? stagingDir(opts.bpfRoot) : mapsDir(opts.bpfRoot);
  if (migrating) {
    rmSync(pinRoot, { recursive: true, force: true });
    mkdirSync(pinRoot, { recursive: true });
  }

  let variant: Datapath['variant'] = opts.object ? 'custom' : 'standard';
  let object: BpfObject;
  try {
    object = await openAndLoad(objectPath, pinRoot, wanted);
  } catch (err) {
    if (opts.object || !lacksSetRetval(err)) throw err;
    object = await openAndLoad(COMPAT_OBJECT, pinRoot, wanted);
    variant = 'compat';
  }
  let migrated: MapMigration[] = [];
  if (migrating) {
    try {
      migrated = copyPinnedInto(object, mapsDir(opts.bpfRoot));
    } catch (err) {
      object.close();
      rmSync(pinRoot, { recursive: true, force: true });
      throw err;
    }
  }
  try {
    const set = {} as LbMapSet;
    for (const name of LB_MAP_NAMES) set[name] = object.map(name);
    for (const name of Object.keys(mapSpecs) as MapName[]) verifyMapLayout(object.map(name), mapSpecs[name]);
    const maps = new KernelLbMaps(set);

    const programs: AttachedProgram[] = [];
    for (const name of object.programNames()) {
      const r = object.attachCgroup(name, opts.cgroup, path.join(linksDir(opts.bpfRoot), name));
      programs.push({ name, linkId: r.linkId, updated: r.updated });
    }
    if (migrating) {
      // Sockets connected between the copy and the switch recorded their
      // reverse translation in the old maps: carry those over too.
      copyPinnedInto(object, mapsDir(opts.bpfRoot), ['lb4_sock_revnat', 'lb6_sock_revnat', 'lb_affinity']);
      for (const name of readdirSync(pinRoot)) renameSync(path.join(pinRoot, name), path.join(mapsDir(opts.bpfRoot), name));
      rmdirSync(pinRoot);
    }
    const loaded = object;
    return { maps, variant, programs, object, migrated, close: () => loaded.close() };
  } catch (err) {
    object.close();
    throw err;
  }
}

export interface MapMigration {
  readonly map: string;
  readonly from: number;
  readonly to: number;
  readonly entries: number;
}

/**
 * Copies every entry of the maps pinned in `dir` into the object's maps of
 * the same name (only `only`, when given; entries already present are kept).
 * An entry that does not fit (a shrunk map) fails the whole migration.
 */
function copyPinnedInto(object: BpfObject, dir: string, only?: readonly string[]): MapMigration[] {
  const out: MapMigration[] = [];
  for (const name of object.mapNames()) {
    if (!(name in mapSpecs) || (only && !only.includes(name))) continue;
    const file = path.join(dir, name);
    if (!existsSync(file)) continue;
    const from = openPinnedMap(file);
    const to = object.map(name);
    try {
      if (from.keySize !== to.keySize || from.valueBufSize !== to.valueBufSize) {
        throw new ConfigError(`map ${name}: the pinned map's layout differs from the new one; migration needs lbctl cleanup`);
      }
      let entries = 0;
      for (const [k, v] of from.entries()) {
        try {
          to.update(k, v, only ? BPF_NOEXIST : BPF_ANY);
          entries++;
        } catch (err) {
          if (only && isErrno(err, 'EEXIST')) continue;
          throw new ConfigError(`map ${name}: cannot carry ${from.maxEntries}-entry contents into ${to.maxEntries} entries: ${(err as Error).message}`, { cause: err });
        }
      }
      out.push({ map: name, from: from.maxEntries, to: to.maxEntries, entries });
    } finally {
      from.close();
    }
  }
  return out;
}

async function openAndLoad(objectPath: string, pinRoot: string, maxEntries: Record<string, number>): Promise<BpfObject> {
  const object = BpfObject.open(objectPath, { pinRoot, maxEntries });
  try {
    await object.load();
    return object;
  } catch (err) {
    object.close();
    throw err;
  }
}

/** The verifier's words for a kernel without bpf_set_retval (helper #187, 5.18). */
export function lacksSetRetval(err: unknown): boolean {
  const text = `${(err as { log?: unknown })?.log ?? ''} ${(err as Error)?.message ?? ''}`;
  return /unknown func bpf_set_retval|invalid func unknown#187|unknown func #187|cannot use helper bpf_set_retval/.test(text);
}

export interface PinnedMaps {
  readonly maps: LbMapSet;
  get(name: MapName): BpfMap;
  close(): void;
}

/** Opens the pinned maps for reading (works with the agent down). */
export function openPinnedMaps(bpfRoot: string): PinnedMaps {
  const dir = mapsDir(bpfRoot);
  if (!existsSync(dir)) throw new ConfigError(`no lbctl datapath is pinned under ${bpfRoot} (is the agent running with this --bpf-root?)`);
  const opened = new Map<MapName, BpfMap>();
  const get = (name: MapName): BpfMap => {
    let m = opened.get(name);
    if (!m) {
      try {
        m = openPinnedMap(path.join(dir, name));
      } catch (err) {
        if (isErrno(err, 'ENOENT')) throw new ConfigError(`map ${name} is not pinned under ${dir}`);
        throw err;
      }
      verifyMapLayout(m, mapSpecs[name]);
      opened.set(name, m);
    }
    return m;
  };
  const maps = {} as LbMapSet;
  for (const name of LB_MAP_NAMES) maps[name] = get(name);
  return { maps, get, close: () => opened.forEach((m) => m.close()) };
}

/** Detaches every program (by unpinning its link) and removes every pinned map. */
export function cleanupDatapath(bpfRoot: string): { links: string[]; maps: string[] } {
  const removed = { links: [] as string[], maps: [] as string[] };
  for (const [dir, into] of [
    [linksDir(bpfRoot), removed.links],
    [mapsDir(bpfRoot), removed.maps],
    [stagingDir(bpfRoot), removed.maps],
  ] as const) {
    if (!existsSync(dir)) continue;
    for (const name of readdirSync(dir)) {
      try {
        unpin(path.join(dir, name));
        into.push(name);
      } catch (err) {
        if (!isErrno(err, 'ENOENT')) throw err;
      }
    }
    rmdirSync(dir);
  }
  if (existsSync(bpfRoot)) rmdirSync(bpfRoot);
  return removed;
}
