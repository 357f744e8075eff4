// Loads the datapath object, adopts pinned maps, attaches its programs to a
// cgroup through pinned links, and takes it all down on request. Attach is
// idempotent: a second load finds the pinned links and switches them to the
// new programs (BPF_LINK_UPDATE, atomic per link), so a restarted or upgraded
// agent never leaves sockets unbalanced. The switch of all the links is all or
// nothing: a failure at any link switches the ones already switched back to
// the programs they ran, detaches the links this load created, and removes
// the staging maps, so the old datapath keeps serving as it was.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmdirSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ConfigError, LbError } from '../base/errors.js';
import { BpfObject, holdPinnedLink, isErrno, openPinnedMap, unpin, type AttachResult, type BpfMap, type HeldLink } from '../native/bpf.js';
import { mapSpecs, type MapName } from './abi.gen.js';
import { copyPinnedInto, openKept, planMigration, type MapMigration } from './migrate.js';
export type { MapMigration } from './migrate.js';
import { KernelLbMaps, LB_MAP_NAMES, verifyMapLayout, type LbMapSet } from './maps.js';
import { ensureBpffs } from './bpffs.js';
import { hasSetRetval } from './features.js';
import { cleanupTc } from './nodeport.js';

export { ensureBpffs } from './bpffs.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const DEFAULT_OBJECT = path.join(ROOT, 'bpf/.output/sock.bpf.o');
/** The same programs without bpf_set_retval (kernels before 5.18): refusals are EPERM. */
export const COMPAT_OBJECT = path.join(ROOT, 'bpf/.output/sock_compat.bpf.o');
export { DEFAULT_BPF_ROOT } from '../base/defaults.js';

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

/** Attaches one program through the link pinned at linkPin (BpfObject.attachCgroup's contract). */
export type AttachFn = (object: BpfObject, program: string, cgroup: string, linkPin: string) => AttachResult;

export const attachCgroup: AttachFn = (object, program, cgroup, linkPin) => object.attachCgroup(program, cgroup, linkPin);

export interface DatapathOptions {
  readonly bpfRoot: string;
  readonly cgroup: string;
  readonly object?: string;
  readonly sizes?: Partial<MapSizes>;
  /** How each program is attached (default: attachCgroup); a test wraps it to fail at a chosen link. */
  readonly attach?: AttachFn;
  /**
   * Whether the kernel has bpf_set_retval (the agent's feature probe says);
   * probed here when not given. Without it the compat object is loaded.
   */
  readonly setRetval?: boolean;
}

export interface AttachedProgram {
  readonly name: string;
  readonly linkId: number;
  /** True when an existing pinned link was switched to this program. */
  readonly updated: boolean;
}

export interface Datapath {
  readonly maps: KernelLbMaps;
  /** Maps resized or converted to a new layout at this load, with the entries carried over. */
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
/** Where the tc object's migrated maps are made (src/datapath/nodeport.ts), apart from the socket object's. */
export const tcStagingDir = (bpfRoot: string): string => path.join(bpfRoot, 'tc-maps-next');

/** Where cgroup v2 is mounted (not always /sys/fs/cgroup), from /proc/mounts. */
export function cgroup2Root(mounts = readFileSync('/proc/mounts', 'utf8')): string {
  for (const line of mounts.split('\n')) {
    const [, mountPoint, type] = line.split(' ');
    if (type === 'cgroup2' && mountPoint) return mountPoint.replace(/\\040/g, ' ');
  }
  throw new ConfigError('no cgroup v2 filesystem is mounted (looked in /proc/mounts); lbctl attaches to a cgroup v2 path');
}


/** Each map's max_entries for `sizes` (what the agent creates its maps with). */
export function mapMaxEntries(sizes: MapSizes): Record<string, number> {
  for (const [k, v] of Object.entries(sizes)) {
    if (!Number.isInteger(v) || v < 1 || v > 1 << 26) throw new ConfigError(`map size ${k}=${v} is not an integer in 1..${1 << 26}`);
  }
  // The services map holds, per family: a master entry (slot 0) for every
  // frontend, a backend slot for every backend a frontend uses, and the
  // wildcard entry (port 0, protocol ANY) of every service address, which
  // refuses the address's unused ports. Addresses never outnumber frontends,
  // so 2 * services + backends always fits.
  const entries = 2 * sizes.services + sizes.backends;
  // A hash map's bucket array is max_entries rounded up to a power of two,
  // and the kernel refuses more than 2^27 buckets (E2BIG).
  if (entries > 1 << 27) {
    throw new ConfigError(`map size services=${sizes.services}, backends=${sizes.backends}: the services map would need 2 * services + backends = ${entries} entries, more than ${1 << 27}`);
  }
  return {
    lb4_services: entries,
    lb6_services: entries,
    lb4_backends: sizes.backends,
    lb6_backends: sizes.backends,
    // One rev-NAT id per frontend; ids are 32 bits, so no cap below services.
    lb4_reverse_nat: sizes.services,
    lb6_reverse_nat: sizes.services,
    lb4_sock_revnat: sizes.sockRevNat,
    lb6_sock_revnat: sizes.sockRevNat,
  };
}

/** Maps whose entries record traffic (written by the programs themselves), not the agent's intent. */
const TRAFFIC_MAPS = ['lb4_sock_revnat', 'lb6_sock_revnat', 'lb_affinity'];

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

  const wanted = mapMaxEntries(sizes);
  // A map size changed (a flag), or its layout (an upgrade): load into fresh
  // maps beside the pinned ones (sharing every map that stays as it is), copy
  // (and convert) the changed maps' entries, switch the links, then move the
  // new pins into place.
  const plan = planMigration(mapsDir(opts.bpfRoot), objectPath, wanted);
  const changed = plan.changed;
  const migrating = changed.length > 0;
  const pinRoot = migrating ? stagingDir(opts.bpfRoot) : mapsDir(opts.bpfRoot);
  const kept = migrating ? openKept(mapsDir(opts.bpfRoot), changed, plan.declared) : new Map<string, BpfMap>();
  if (migrating) {
    rmSync(pinRoot, { recursive: true, force: true });
    mkdirSync(pinRoot, { recursive: true });
  }
  const reuseMaps = Object.fromEntries([...kept].map(([name, m]) => [name, m.fd]));
  // Maps this load pins beside the adopted ones (a first load, a map new in
  // this object) are its own, removed again if it fails.
  const pinnedBefore = new Set(readdirSync(mapsDir(opts.bpfRoot)));
  const unpinNew = (): void => {
    if (migrating) return;
    for (const name of readdirSync(mapsDir(opts.bpfRoot))) if (!pinnedBefore.has(name)) rmSync(path.join(mapsDir(opts.bpfRoot), name), { force: true });
  };

  // Kernels before 5.18 have no bpf_set_retval: the compat object (refusals are EPERM).
  const variant: Datapath['variant'] = opts.object ? 'custom' : (opts.setRetval ?? (await hasSetRetval())) ? 'standard' : 'compat';
  let object: BpfObject;
  try {
    object = await BpfObject.openLoaded(variant === 'compat' ? COMPAT_OBJECT : objectPath, { pinRoot, maxEntries: wanted, reuseMaps });
  } catch (err) {
    if (migrating) rmSync(pinRoot, { recursive: true, force: true });
    throw err;
  } finally {
    // libbpf duplicated the fds it reuses.
    for (const m of kept.values()) m.close();
  }
  let migrated: MapMigration[] = [];
  if (migrating) {
    try {
      migrated = copyPinnedInto(object, mapsDir(opts.bpfRoot), changed, plan.relaid);
    } catch (err) {
      object.close();
      rmSync(pinRoot, { recursive: true, force: true });
      throw err;
    }
  }
  let links: LinkSwitch | undefined;
  let maps: KernelLbMaps;
  try {
    const set = {} as LbMapSet;
    for (const name of LB_MAP_NAMES) set[name] = object.map(name);
    // The object's own maps: a second object (issue 14's tc datapath) pins maps this one lacks.
    for (const name of object.mapNames().filter((n): n is MapName => n in mapSpecs)) verifyMapLayout(object.map(name), mapSpecs[name]);
    maps = new KernelLbMaps(set);
    links = switchLinks(object, opts.cgroup, linksDir(opts.bpfRoot), opts.attach ?? attachCgroup);
    if (migrating) {
      // A migrated traffic map: sockets connected between the copy and the
      // switch recorded their reverse translation in the old map; carry those
      // over too. (Maps the agent writes are not written during a load.)
      const again = TRAFFIC_MAPS.filter((n) => changed.includes(n));
      if (again.length > 0) copyPinnedInto(object, mapsDir(opts.bpfRoot), again, plan.relaid, true);
    }
  } catch (err) {
    // Nothing is committed yet: the old programs and maps take over again.
    // switchLinks reverts its own partial switch and names what it could not.
    const notReverted = err instanceof LinkSwitchError ? err.notReverted : (links?.revert() ?? []);
    links?.release();
    object.close();
    if (notReverted.length === 0) {
      if (migrating) rmSync(pinRoot, { recursive: true, force: true });
      else unpinNew();
    }
    if (notReverted.length > 0 && !(err instanceof LinkSwitchError)) throw new LinkSwitchError(`${(err as Error).message}; ${describeNotReverted(notReverted)}`, notReverted, { cause: err });
    throw err;
  }
  links.release();
  if (migrating) {
    // The commit: the new maps take the pins (a rename replaces a pin atomically).
    for (const name of readdirSync(pinRoot)) renameSync(path.join(pinRoot, name), path.join(mapsDir(opts.bpfRoot), name));
    rmdirSync(pinRoot);
  }
  const loaded = object;
  return { maps, variant, programs: links.programs, object, migrated, close: () => loaded.close() };
}

/** A switch of the pinned links that failed; `notReverted` names links left on the new programs (normally none). */
export class LinkSwitchError extends LbError {
  constructor(message: string, readonly notReverted: readonly string[] = [], options?: ErrorOptions) {
    super(message, 'ELINKSWITCH', options);
  }
}

function describeNotReverted(notReverted: readonly string[]): string {
  return `could NOT switch back: ${notReverted.join('; ')} (those links run the new programs; staging maps, if any, stay pinned under maps-next until the next start stages afresh; start the agent again, which switches every link, or lbctl cleanup)`;
}

interface LinkSwitch {
  readonly programs: AttachedProgram[];
  /** Every link back to where it was before the switch; returns what could not be reverted ("program: error"). */
  revert(): string[];
  /** Releases the held links (after a commit or a revert). */
  release(): void;
}

/**
 * Switches every program of the object onto its pinned link (creating the
 * links that do not exist yet), all or nothing. Before the first switch it
 * holds each existing link and, by fd, the program it runs: a program that
 * loses its last link is freed by the kernel, and the fd keeps it alive to be
 * switched back to. If the n-th attach fails, the links are put back as they
 * were (held ones restored to their programs, new ones unpinned, which
 * detaches them), and the error names the program and the kernel's error.
 */
function switchLinks(object: BpfObject, cgroup: string, dir: string, attach: AttachFn): LinkSwitch {
  const names = object.programNames();
  const held = new Map<string, HeldLink>();
  const release = (): void => {
    for (const h of held.values()) h.close();
    held.clear();
  };
  try {
    for (const name of names) {
      const pin = path.join(dir, name);
      if (existsSync(pin)) held.set(name, holdPinnedLink(pin));
    }
  } catch (err) {
    release();
    throw err;
  }
  const revert = (): string[] => {
    const failed: string[] = [];
    for (const name of [...names].reverse()) {
      const pin = path.join(dir, name);
      try {
        const h = held.get(name);
        // Restoring a link that was never switched is a no-op update.
        if (h) h.restore();
        else if (existsSync(pin)) unpin(pin);
      } catch (err) {
        failed.push(`${name}: ${(err as Error).message}`);
      }
    }
    return failed;
  };
  const programs: AttachedProgram[] = [];
  for (const [i, name] of names.entries()) {
    try {
      const r = attach(object, name, cgroup, path.join(dir, name));
      programs.push({ name, linkId: r.linkId, updated: r.updated });
    } catch (err) {
      const failed = revert();
      const pinnedBefore = held.size;
      release();
      const what = `switching the pinned links to ${object.path}: program ${name} (link ${i + 1} of ${names.length}, ${path.join(dir, name)}) failed: ${(err as Error).message}`;
      const outcome = failed.length === 0
        ? `every link was switched back to the program it ran (${i} switched, ${pinnedBefore} pinned before), links made by this load were removed`
        : describeNotReverted(failed);
      throw new LinkSwitchError(`${what}; ${outcome}`, failed, { cause: err });
    }
  }
  return { programs, revert, release };
}

/** The datapath object the agent loads on this kernel: the standard one, or the compat one without bpf_set_retval. */
export async function datapathObject(): Promise<string> {
  return (await hasSetRetval()) ? DEFAULT_OBJECT : COMPAT_OBJECT;
}

/** The verifier's words for a kernel without bpf_set_retval (helper #187, 5.18): which object a failed load needed. */
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

/**
 * Detaches every program (by unpinning its link; the tc datapath's clsact
 * filters in this network namespace by handle, when their program is ours)
 * and removes every pinned map.
 */
export function cleanupDatapath(bpfRoot: string): { links: string[]; maps: string[]; tc: string[] } {
  const removed = { links: [] as string[], maps: [] as string[], tc: cleanupTc(linksDir(bpfRoot)) };
  for (const [dir, into] of [
    [linksDir(bpfRoot), removed.links],
    [mapsDir(bpfRoot), removed.maps],
    [stagingDir(bpfRoot), removed.maps],
    [tcStagingDir(bpfRoot), removed.maps],
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
