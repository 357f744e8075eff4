// The tc half of the datapath (bpf/nodeport.c): loads its object beside the
// socket programs' (sharing their maps by fd), writes its settings, the
// devices it serves and the node addresses NodePorts answer on, and attaches
// its two programs to each device's ingress and egress.
//
// Attachment, per device and direction (--tc-attach; auto: tcx where the
// kernel has it):
//   tcx (6.6+): a link pinned at links/tc-<ifindex>-<direction>, at the head
//     of the device's tcx programs; a restart or upgrade updates the pinned
//     link to the new program (atomic), as the cgroup links are.
//   clsact: a cls_bpf filter at a fixed handle and priority (TC_HANDLE,
//     TC_PRIORITY). An existing filter there is replaced (atomic) only when
//     its program is ours: by the function name in its BTF, which the
//     kernel keeps whole (the program name it keeps is cut at 15
//     characters, `lb_nodeport_ing`, which anyone's program may share). A
//     foreign one is left alone and reported.
// A device attached in one mode loses its attachment of the other mode (an
// agent restarted with another --tc-attach), after the new one is in place:
// exactly one of ours per device and direction, and no gap.
// Untranslated packets return TC_ACT_UNSPEC (TCX_NEXT), so programs after
// ours, and the stack, still see them.
import { existsSync, mkdirSync, readdirSync, renameSync, rmdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ConfigError } from '../base/errors.js';
import { has, type DatapathFeatures } from './features.js';
import { BPF_ANY, BPF_NOEXIST, BpfObject, holdPinnedLink, holdProgram, isErrno, openPinnedMap, pinnedLinkUpdate, progInfoById, unpin, type BpfMap, type HeldLink, type HeldProgram } from '../native/bpf.js';
import { comparePinned, copyPinnedInto, openKept, PROGRESS_EVERY, type MapConverters, type MapMigration } from './migrate.js';
import { links as rtnlLinks } from '../native/rtnl.js';
import { tcAttach, tcDetach, tcQuery, tcxAttach, type TcDirection, type TcFilter } from '../native/tc.js';
import { ipv4ToUint, ipv6Bytes } from '../lb/addr.js';
import { FrontendPorts } from './frontend-ports.js';
import { LbCtDir, LbCtFlags, LbDeviceFlags, LbNpConfigFlags, lb4_ct_entry, lb4_ct_key, lb6_ct_entry, lb6_ct_key, lb_device, lb_node_addr, lb_node_addr_key, lb_np_config, mapSpecs, u32, type MapName } from './abi.gen.js';
import type { Device, DeviceAddress } from './devices.js';
import { monotonicSeconds } from './ct.js';
import { verifyMapLayout } from './maps.js';
import { KernelMaglevMaps, KernelNorthSouthMaps } from './maglev-maps.js';
import { sweep as sweepXdp, XdpAccelerator, xdpObjectFor, xdpPin, type Acceleration } from './xdp.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const NODEPORT_OBJECT = path.join(ROOT, 'bpf/.output/nodeport.bpf.o');

/** The programs for layer-3 tunnels: nodeport.c built with NP_L3_DEVICE. */
export const NODEPORT_L3_OBJECT = path.join(ROOT, 'bpf/.output/nodeport_l3.bpf.o');

/** The programs for layer-3 tunnels that go with a tc object: NODEPORT_L3_OBJECT for the built one, X_l3.bpf.o beside another (--tc-object X.bpf.o). */
export function l3ObjectFor(file: string): string {
  return file === NODEPORT_OBJECT ? NODEPORT_L3_OBJECT : file.replace(/(\.bpf)?\.o$/, '_l3$&');
}

export const PROGRAMS: Record<TcDirection, string> = { ingress: 'lb_nodeport_ingress', egress: 'lb_nodeport_egress' };
/** clsact filter handle and priority: "LB", first. */
export const TC_HANDLE = 0x4c42;
export const TC_PRIORITY = 1;

export interface PortRange {
  readonly first: number;
  readonly last: number;
}

/** Connection tracking lifetimes, seconds (kube-proxy's --conntrack-* flags). */
export interface ConntrackTimeouts {
  /** An established TCP flow, idle. */
  readonly tcpEstablished: number;
  /** A TCP flow one side has closed (its FIN), until the other's. */
  readonly tcpCloseWait: number;
  /** A UDP flow, idle. */
  readonly udp: number;
}

/** The datapath's own defaults (bpf/nodeport.c's CT_LIFETIME_*). */
export const DEFAULT_CONNTRACK: ConntrackTimeouts = { tcpEstablished: 21600, tcpCloseWait: 3600, udp: 60 };

export type NodePortMode = 'snat' | 'dsr' | 'hybrid';

/**
 * How long the programs hold back a flow's packets that find no entry while
 * flows are carried into new maps (LB_NP_F_MIGRATING), seconds from the
 * agent's last renewal (the switch round that set it, then as the window's
 * work goes: renewHold()): the window takes tens of milliseconds
 * here, and an agent killed inside it leaves the flag set, which must not
 * hold a pod's traffic back until the next agent starts.
 */
export const MIGRATION_HOLD_S = 10;

/** lb_np_config's flags for a --nodeport-mode. */
export function nodePortModeFlags(mode: NodePortMode | undefined): number {
  if (mode === 'dsr') return LbNpConfigFlags.LB_NP_F_DSR | LbNpConfigFlags.LB_NP_F_DSR_UDP;
  if (mode === 'hybrid') return LbNpConfigFlags.LB_NP_F_DSR;
  return 0;
}

export interface NodePortSettings {
  readonly nodePortRange: PortRange;
  readonly snatRange: PortRange;
  /** Random SNAT ports tried after the tuple hash's one (bpf/nodeport.c caps it at 31). */
  readonly snatRetries: number;
  /** --external-clusterip: ClusterIPs are served to packets from outside too. */
  readonly externalClusterIP: boolean;
  /**
   * --nodeport-mode: how flows to remote backends go. snat (the default):
   * DNAT and SNAT, replies back through this node. dsr: direct server
   * return, DNAT only with the frontend carried in an IPv4 option / IPv6
   * destination option, the backend's node answering the client itself.
   * hybrid: DSR for TCP, SNAT for UDP. Every node must run the same mode.
   */
  readonly mode?: NodePortMode;
  /** --maglev-table-size (a prime) and the flow hash seeds of --maglev-hash-seed. */
  readonly maglev: { readonly m: number; readonly seed4: number; readonly seed6: number };
  readonly conntrack: ConntrackTimeouts;
}

/** Flows tracked (lb4_ct, lb6_ct) and SNAT translations (lb4_nat, lb6_nat) per family: --ct-max, --nat-max. */
export interface TrafficMapSizes {
  readonly ct: number;
  readonly nat: number;
}

export const DEFAULT_TRAFFIC_SIZES: TrafficMapSizes = { ct: mapSpecs.lb4_ct.maxEntries, nat: mapSpecs.lb4_nat.maxEntries };

/** The maps the tc programs fill with traffic, sized by --ct-max and --nat-max. */
export const TRAFFIC_MAPS = ['lb4_ct', 'lb6_ct', 'lb4_nat', 'lb6_nat'] as const;

export interface TrafficPressure {
  readonly map: (typeof TRAFFIC_MAPS)[number];
  /** Live entries (not expired). */
  readonly entries: number;
  /** Entries the map holds, dead ones included (the LRU reuses those first). */
  readonly stored: number;
  readonly maxEntries: number;
}

export const DEFAULT_SNAT_RETRIES = 16;

export type AttachMode = 'tcx' | 'clsact';
/** --tc-attach: a mode, or auto (tcx where the kernel has it). */
export type TcAttachSetting = AttachMode | 'auto';

/** The mode the tc programs attach in, and why (for the log and `lbctl status`). */
export interface AttachChoice {
  readonly mode: AttachMode;
  readonly why: string;
}

/**
 * The attach mode --tc-attach and the kernel give. `tcx` on a kernel without
 * tcx refuses the start (ConfigError naming the flag); clsact works on every
 * kernel lbctl runs on.
 */
export function chooseAttachMode(setting: TcAttachSetting, features: DatapathFeatures): AttachChoice {
  const tcx = has(features, 'tcx');
  if (setting === 'clsact') return { mode: 'clsact', why: '--tc-attach clsact' };
  if (setting === 'tcx') {
    if (!tcx) throw new ConfigError(`--tc-attach tcx: this kernel (${features.kernel}) has no tcx links (Linux 6.6+): use --tc-attach auto or clsact`);
    return { mode: 'tcx', why: '--tc-attach tcx' };
  }
  return tcx ? { mode: 'tcx', why: '--tc-attach auto: the kernel has tcx' } : { mode: 'clsact', why: '--tc-attach auto: the kernel has no tcx' };
}

export interface AttachedDevice {
  readonly index: number;
  readonly name: string;
  readonly mode: AttachMode;
  /** nodeport_xdp.bpf.o runs on it too (--nodeport-acceleration). */
  readonly xdp?: true;
}

const tcxPin = (linksDir: string, ifindex: number, dir: TcDirection): string => path.join(linksDir, `tc-${ifindex}-${dir}`);
const filter = (ifindex: number, direction: TcDirection): TcFilter => ({ ifindex, direction, handle: TC_HANDLE, priority: TC_PRIORITY });

/** enum bpf_prog_type: tc programs (cls_bpf and tcx). */
const BPF_PROG_TYPE_SCHED_CLS = 3;
const OUR_FUNCS: ReadonlySet<string> = new Set(Object.values(PROGRAMS));

/**
 * Whether the program with this id is one of ours (any lbctl's, this one's
 * or an earlier version's): a tc program whose main function, as its BTF
 * names it, is one of PROGRAMS. Not the kernel's program name: it keeps 15
 * characters (`lb_nodeport_ing`), which a foreign `lb_nodeport_ingest` has
 * too. Every build of nodeport.c carries BTF (clang -g), and libbpf loads it
 * on every kernel lbctl runs on; a program without it is not ours.
 */
export function isOurs(progId: number): boolean {
  const info = progId ? progInfoById(progId) : null;
  return info !== null && info.type === BPF_PROG_TYPE_SCHED_CLS && info.funcName !== undefined && OUR_FUNCS.has(info.funcName);
}

/** The program a foreign filter runs, for the message that says it was left alone. */
function describe(progId: number): string {
  const info = progInfoById(progId);
  return info ? `id ${progId}, ${info.funcName ?? info.name}` : `id ${progId}`;
}

function nodeAddrKey(a: { family: 4 | 6; address: string }): Buffer {
  const address = Buffer.alloc(16);
  if (a.family === 4) address.writeUInt32BE(ipv4ToUint(a.address), 0);
  else ipv6Bytes(a.address).copy(address);
  return lb_node_addr_key.encode({ address, family: a.family });
}

/**
 * The source address of each family SNATed flows leave the device with
 * (devices.ts's snatSource(): what the kernel would pick) and its MTU (what
 * a packet the datapath redirects out of it must fit, or the sender gets
 * fragmentation needed / packet too big). sync() rewrites it on every
 * rtnetlink burst, so a changed address, route or MTU is followed.
 */
/** The devices --nodeport-acceleration puts XDP on: the front doors (clients' traffic), Ethernet ones. */
const xdpWanted = (d: Device): boolean => d.role === 'nodeport' && !d.l3;

function deviceValue(d: Device, xdp: boolean): Buffer {
  const v4 = d.snat[4];
  const v6 = d.snat[6];
  const flags = (d.l3 ? LbDeviceFlags.LB_DEV_F_L3 : 0) | (xdp ? LbDeviceFlags.LB_DEV_F_XDP : 0);
  return lb_device.encode({ addr4: v4 ? ipv4ToUint(v4) : 0, addr6: v6 ? ipv6Bytes(v6) : Buffer.alloc(16), mtu: d.mtu >>> 0, flags });
}

export interface NodePortOptions {
  readonly bpfRoot: string;
  /** The loaded socket object: its maps are shared by fd. */
  readonly sockObject: BpfObject;
  readonly mapsDir: string;
  readonly linksDir: string;
  /** tcx where the kernel has it (the feature probe says), clsact elsewhere. */
  readonly mode: AttachMode;
  /** Slots of every Maglev table (--maglev-table-size). */
  readonly maglevM: number;
  /** --ct-max, --nat-max (default DEFAULT_TRAFFIC_SIZES). */
  readonly sizes?: Partial<TrafficMapSizes>;
  /** --tc-object: another tc object than the built one (an upgrade, a test). */
  readonly object?: string;
  /** Where a migration makes the maps it carries over (loader.ts's tcStagingDir). */
  readonly stagingDir: string;
  /** --nodeport-acceleration (default disabled): the ingress path at XDP too, on the devices whose drivers take it. */
  readonly acceleration?: Acceleration;
  /**
   * A failpoint for tests (the agent's LBCTL_FAILPOINT_TC_ATTACH): in each
   * of the first `rounds` switch rounds, the attach at position `at`
   * (1-based, over the round's devices and directions) is given a program of
   * another type, which the kernel refuses (EINVAL) without changing anything.
   */
  readonly failAttach?: { readonly at: number; readonly rounds: number };
}

/**
 * The maps the tc programs fill with traffic (flows, SNAT translations,
 * fragments, affinity). One whose size, type or layout changed (--ct-max, an
 * upgrade) is made anew beside the pinned one and its entries carried over,
 * converted field by field, so established flows survive; every other tc map
 * holds what the agent writes again at start, and is simply made anew.
 */
const CARRIED_MAPS = new Set(['lb4_ct', 'lb6_ct', 'lb4_nat', 'lb6_nat', 'lb4_frag', 'lb6_frag', 'lb_np_affinity']);

/**
 * The programs' own scratch and state, which the agent neither reads nor
 * writes: per-CPU request buffers (the SNAT search's, which embed a CT
 * entry, so another entry layout has another size) and the ICMP rate
 * limit's buckets. Their layout is the object's business, not checked
 * against this build's (an upgrade's object brings its own).
 */
const PROGRAM_ONLY_MAPS = new Set(['lb_snat_req4', 'lb_snat_req6', 'lb_icmp_bucket']);

/** A load that carried maps over, finished once the programs are switched (commitMigration()). */
interface PendingMigration {
  /** Where the carried maps are pinned until the switch (undefined: none carried). */
  readonly staging: string | undefined;
  readonly carried: readonly string[];
  readonly relaid: ReadonlyMap<string, MapConverters>;
  /** Families whose SNAT translations are still in lb*_ct (a datapath from before lb*_nat): moved out. */
  readonly split: ReadonlyArray<4 | 6>;
}

/** max_entries of the tc object's sized maps. */
export function trafficMaxEntries(sizes: Partial<TrafficMapSizes> = {}): Record<string, number> {
  const s = { ...DEFAULT_TRAFFIC_SIZES, ...sizes };
  for (const [flag, v] of [['--ct-max', s.ct], ['--nat-max', s.nat]] as const) {
    if (!Number.isInteger(v) || v < 1 || v > 1 << 26) throw new ConfigError(`${flag} ${v}: not an integer in 1..${1 << 26}`);
  }
  return { lb4_ct: s.ct, lb6_ct: s.ct, lb4_nat: s.nat, lb6_nat: s.nat };
}

export class NodePortDatapath {
  private readonly attached = new Map<number, AttachedDevice>();
  private readonly addrs: BpfMap;
  private readonly devices: BpfMap;
  /** Maglev tables and source ranges, for the reconciler. */
  readonly northSouthMaps: KernelNorthSouthMaps;
  /**
   * lb_np_ports (absent from an older --tc-object): the programs trust it
   * (LB_NP_F_PORTS) once it is filled, by the writer of the services maps
   * (KernelLbMaps.useFrontendPorts), before configure().
   */
  frontendPorts: FrontendPorts | undefined;

  private constructor(
    readonly object: BpfObject,
    readonly mode: AttachMode,
    private readonly linksDir: string,
    maglevM: number,
  ) {
    this.addrs = object.map('lb_node_addrs');
    this.devices = object.map('lb_devices');
    this.northSouthMaps = new KernelNorthSouthMaps(new KernelMaglevMaps(object.map('lb_maglev'), object.map('lb_maglev_index'), maglevM), { 4: object.map('lb4_src_range'), 6: object.map('lb6_src_range') });
  }

  static async load(opts: NodePortOptions): Promise<NodePortDatapath> {
    const file = opts.object ?? NODEPORT_OBJECT;
    if (!existsSync(file)) throw new ConfigError(`BPF object ${file} is missing: run \`make build\``);
    // Every map the socket object has is shared by fd; the tc-only ones are
    // pinned (and adopted) by name next to them.
    const shared = new Set(opts.sockObject.mapNames());
    const declared = objectMapNames(file);
    // The sizes of the maps this object has (an older layout may lack lb*_nat).
    const maxEntries = Object.fromEntries(Object.entries(trafficMaxEntries(opts.sizes)).filter(([n]) => declared.includes(n)));
    const plan = planTcMaps(file, opts.mapsDir, shared, maxEntries);
    for (const name of plan.remade) unpin(path.join(opts.mapsDir, name));
    // Translations of a datapath from before lb*_nat: in lb*_ct, to be moved out.
    const split = ([4, 6] as const).filter(
      (f) => declared.includes(`lb${f}_nat`) && !existsSync(path.join(opts.mapsDir, `lb${f}_nat`)) && existsSync(path.join(opts.mapsDir, `lb${f}_ct`)) && !plan.remade.includes(`lb${f}_ct`),
    );
    const staging = plan.carried.length > 0 ? opts.stagingDir : undefined;
    let kept = new Map<string, BpfMap>();
    if (staging) {
      // Made beside the pinned maps (which the running programs keep using
      // until the switch), sharing every map that stays as it is.
      rmSync(staging, { recursive: true, force: true });
      mkdirSync(staging, { recursive: true });
      kept = openKept(opts.mapsDir, plan.carried, plan.declared.filter((n) => !shared.has(n)));
    }
    const reuseMaps = {
      ...Object.fromEntries(plan.declared.filter((n) => shared.has(n)).map((n) => [n, opts.sockObject.map(n).fd])),
      ...Object.fromEntries([...kept].map(([n, m]) => [n, m.fd])),
    };
    let object: BpfObject;
    try {
      object = await BpfObject.openLoaded(file, { pinRoot: staging ?? opts.mapsDir, reuseMaps, maxEntries });
    } catch (err) {
      if (staging) rmSync(staging, { recursive: true, force: true });
      throw err;
    } finally {
      for (const m of kept.values()) m.close(); // libbpf duplicated the fds it reuses
    }
    let migrated: MapMigration[] = [];
    try {
      // The agent writes the maps it reads; the traffic maps only the programs (and a migration) write.
      for (const name of object.mapNames().filter((n): n is MapName => n in mapSpecs && !CARRIED_MAPS.has(n) && !PROGRAM_ONLY_MAPS.has(n))) verifyMapLayout(object.map(name), mapSpecs[name]);
      migrated = copyPinnedInto(object, opts.mapsDir, plan.carried, plan.relaid);
      for (const f of split) movePinnedTranslations(opts.mapsDir, object.map(`lb${f}_nat`), f, false);
    } catch (err) {
      object.close();
      if (staging) rmSync(staging, { recursive: true, force: true });
      throw err;
    }
    const dp = new NodePortDatapath(object, opts.mode, opts.linksDir, opts.maglevM);
    dp.declared = new Set(declared);
    if (dp.declared.has('lb_np_ports')) dp.frontendPorts = new FrontendPorts(object.map('lb_np_ports'));
    dp.replacedMaps = plan.remade;
    dp.migrated = migrated;
    dp.mapsDir = opts.mapsDir;
    dp.file = file;
    dp.maxEntries = maxEntries;
    if (opts.failAttach) {
      dp.failAttach = opts.failAttach;
      dp.wrongProgFd = opts.sockObject.progFd(opts.sockObject.programNames()[0]!);
    }
    if (staging || split.length > 0) dp.pending = { staging, carried: plan.carried, relaid: plan.relaid, split };
    if (opts.acceleration && opts.acceleration !== 'disabled') {
      const xdp = new XdpAccelerator(opts.acceleration, opts.linksDir);
      const xdpFile = xdpObjectFor(file);
      try {
        if (!existsSync(xdpFile)) throw new ConfigError(`BPF object ${xdpFile} is missing: run \`make build\``);
        await xdp.load(xdpFile, object, staging ?? opts.mapsDir, maxEntries);
        dp.xdp = xdp;
      } catch (err) {
        dp.xdpError = `${path.basename(xdpFile)} (--nodeport-acceleration ${opts.acceleration}) not loaded: ${(err as Error).message}; every device served at tc`;
      }
    }
    return dp;
  }

  /** tc maps whose pinned layout, size, type or flags differed from this object's, made anew (nothing carried: the agent writes them again). */
  replacedMaps: readonly string[] = [];
  /** Traffic maps carried over into maps of a new size or layout at this load, with their entries. */
  migrated: readonly MapMigration[] = [];
  private mapsDir = '';
  private settings: NodePortSettings | undefined;
  private declared = new Set<string>();
  private pending: PendingMigration | undefined;

  /** Whether this load carried maps over that wait for the programs' switch (commitMigration()). */
  get migrating(): boolean {
    return this.pending !== undefined;
  }

  /**
   * After the programs are switched onto every device: what the old
   * programs wrote since the load is carried over too (entries the new
   * programs have not written already), the translations left in lb*_ct by
   * a datapath from before lb*_nat are moved out, and the new maps take
   * the pins. Returns the entries carried after the switch, by map.
   */
  commitMigration(): Record<string, number> {
    const m = this.pending;
    if (!m) return {};
    // a long copy keeps the programs' hold (renewHold()); a killed agent's lapses
    const renew = (): void => this.renewHold();
    const after: Record<string, number> = {};
    for (const r of copyPinnedInto(this.object, this.mapsDir, m.carried, m.relaid, true, renew)) after[r.map] = r.entries;
    for (const f of m.split) {
      after[`lb${f}_nat`] = movePinnedTranslations(this.mapsDir, this.object.map(`lb${f}_nat`), f, true, renew);
      // Gone from the flows' map now that no program looks for them there.
      moveTranslations(this.object.map(`lb${f}_ct`), undefined, f, true, renew);
    }
    this.pending = undefined;
    this.switchStarted = 0;
    if (m.staging) {
      for (const name of readdirSync(m.staging)) renameSync(path.join(m.staging, name), path.join(this.mapsDir, name));
      rmdirSync(m.staging);
    }
    if (this.settings) this.configure(this.settings); // LB_NP_F_MIGRATING off
    return after;
  }

  /** The switch failed: the old programs keep the old maps; the carried ones are dropped. */
  discardMigration(): void {
    const m = this.pending;
    this.pending = undefined;
    this.switchStarted = 0;
    if (m?.staging) rmSync(m.staging, { recursive: true, force: true });
    if (this.settings) this.configure(this.settings);
  }

  /**
   * The fill of the maps the programs write themselves (flows, SNAT
   * translations): live entries (not yet expired; an LRU map keeps dead
   * ones until it needs their room) against max_entries, per map. One batch
   * walk each; the agent calls it every few seconds, not per packet.
   */
  trafficPressure(now = monotonicSeconds()): TrafficPressure[] {
    const out: TrafficPressure[] = [];
    for (const name of TRAFFIC_MAPS) {
      if (!this.declared.has(name)) continue; // an older layout (--tc-object) without lb*_nat
      const map = this.object.map(name);
      const { values, count } = map.entriesFlat();
      let live = 0;
      // Every entry's value starts with its expiry (struct lb4_ct_entry, lb6_ct_entry: __u64 expires).
      for (let i = 0; i < count; i++) if (Number(values.readBigUInt64LE(i * map.valueSize)) > now) live++;
      out.push({ map: name, entries: live, stored: count, maxEntries: map.maxEntries });
    }
    return out;
  }

  /**
   * While the programs hold flows back (a migration's switch round, until
   * its commit), writes the hold's deadline again: after each attach and
   * every 4,096 entries the commit copies (one map write each time), so the
   * window's work never outlasts it, and an agent killed inside it stops
   * renewing it.
   */
  private renewHold(): void {
    if (this.settings && this.holding) this.configure(this.settings);
  }

  /** The programs hold back flows not carried yet (LB_NP_F_MIGRATING): a migration's switch round runs. */
  private get holding(): boolean {
    return this.pending !== undefined && this.switching;
  }

  /**
   * Writes the settings the programs read (before any attach). While flows
   * are carried into new maps (a load that migrated them, until
   * commitMigration()), the programs are told so (LB_NP_F_MIGRATING),
   * for MIGRATION_HOLD_S at most.
   */
  configure(s: NodePortSettings): void {
    this.settings = s;
    const migrating = this.holding;
    const value = lb_np_config.encode({
      nodeportMin: s.nodePortRange.first,
      nodeportMax: s.nodePortRange.last,
      snatMin: s.snatRange.first,
      snatMax: s.snatRange.last,
      flags:
        (s.externalClusterIP ? LbNpConfigFlags.LB_NP_F_EXTERNAL_CLUSTERIP : 0) |
        nodePortModeFlags(s.mode) |
        (this.frontendPorts?.filled ? LbNpConfigFlags.LB_NP_F_PORTS : 0) |
        (migrating ? LbNpConfigFlags.LB_NP_F_MIGRATING : 0),
      snatRetries: Math.min(31, Math.max(0, s.snatRetries)),
      maglevM: s.maglev.m,
      maglevSeed4: s.maglev.seed4,
      maglevSeed6: s.maglev.seed6,
      ctTcpEstablished: s.conntrack.tcpEstablished,
      ctTcpCloseWait: s.conntrack.tcpCloseWait,
      ctUdp: s.conntrack.udp,
      migratingUntil: migrating ? monotonicSeconds() + MIGRATION_HOLD_S : 0,
    });
    this.object.map('lb_np_config').update(u32.encode(0), value, BPF_ANY);
  }

  /**
   * Makes the maps and attachments match `devices` and `addresses`: devices
   * and addresses written before attach (a packet never finds a program
   * without them), removed after detach. Returns a problem per device that
   * is not served.
   *
   * The devices not yet running this object's programs switch onto them in
   * one round, all or nothing (switchRound()): if an attach fails, every
   * device goes back to what it ran before (an earlier agent's programs, or
   * nothing) and the round is retried at the next sync. A round that
   * succeeds commits a pending migration (commitMigration()): the old
   * programs run nowhere any more.
   */
  sync(devices: readonly Device[], addresses: readonly DeviceAddress[]): string[] {
    const problems: string[] = [];
    this.syncing = devices;
    // addresses first: new ones in, stale ones out (a removed address stops matching at once)
    const want = new Map(addresses.map((a) => [nodeAddrKey(a).toString('hex'), a]));
    const value = lb_node_addr.encode({ ifindex: 0, flags: 0 });
    for (const [hex] of want) this.addrs.update(Buffer.from(hex, 'hex'), value, BPF_ANY);
    for (const [k] of this.addrs.entries()) if (!want.has(k.toString('hex'))) this.addrs.delete(k);

    // Layer-3 devices wait for their programs (loadL3(), which the caller runs when l3Waiting says so).
    this.l3Waiting = this.l3 || this.l3Error ? [] : devices.filter((d) => d.l3).map((d) => d.name);
    if (this.l3Error) for (const d of devices.filter((x) => x.l3)) problems.push(`device ${d.name} (ifindex ${d.index}): ${this.l3Error}`);
    // Every device is in lb_devices (a flow routed out of a layer-3 tunnel is SNATed to its address, and leaves without a link-layer header), attached or not yet.
    const attachable = this.l3 ? devices : devices.filter((d) => !d.l3);
    const byIndex = new Map(devices.map((d) => [d.index, d]));
    // XDP stays marked only where it stays (a device leaving it is unmarked before its link goes)
    for (const d of devices) this.devices.update(u32.encode(d.index), deviceValue(d, this.xdpOn(d)), BPF_ANY);
    // Devices already switched: still ours (a filter someone removed is put back), one at a time.
    for (const d of attachable.filter((x) => this.attached.has(x.index))) {
      try {
        this.repair(d);
      } catch (err) {
        problems.push(`device ${d.name} (ifindex ${d.index}): ${(err as Error).message}`);
      }
    }
    const round = this.switchRound(attachable.filter((x) => !this.attached.has(x.index)));
    problems.push(...round.problems);
    this.switchFailed = round.failed;
    if (!round.failed && this.pending && this.l3Waiting.length === 0) {
      if (this.xdp) problems.push(...this.syncXdp(devices));
      const opened = this.switchStarted;
      this.committed = { entries: this.commitMigration(), ms: opened ? performance.now() - opened : 0 };
    }
    for (const [index, a] of [...this.attached]) {
      if (byIndex.has(index)) continue;
      try {
        this.detach(index);
      } catch (err) {
        problems.push(`device ${a.name} (ifindex ${index}): detach: ${(err as Error).message}`);
      }
      this.attached.delete(index);
    }
    for (const [k] of this.devices.entries()) if (!byIndex.has(k.readUInt32LE(0))) this.devices.delete(k);
    problems.push(...this.sweepStale(byIndex));
    problems.push(...this.syncXdp(devices));
    return [...new Set(problems)];
  }

  /** The devices of the sync under way (the switch round's XDP update needs them all). */
  private syncing: readonly Device[] = [];

  /** The tc object's XDP build, when --nodeport-acceleration asked for it and it loaded. */
  private xdp: XdpAccelerator | undefined;
  /** Why it did not load (a problem of every sync: the devices are served at tc). */
  xdpError: string | undefined;
  /** Devices best-effort acceleration could not take, and why (served at tc; for the log and status). */
  xdpRefused: ReadonlyArray<{ readonly device: string; readonly why: string }> = [];
  private xdpSwept = false;

  /** Whether `d` runs XDP and keeps it: a front door tc serves, with our XDP link. */
  private xdpOn(d: Device): boolean {
    return !!this.xdp && xdpWanted(d) && this.attached.has(d.index) && this.xdp.devices.has(d.index);
  }

  /**
   * XDP on every front door tc serves (after tc: a frame XDP passes on must
   * find tc there), then lb_devices marks those it runs on. Tunnels stay at
   * tc: a layer-3 one has no link-layer header, and an Ethernet one (vxlan,
   * geneve) has no native XDP and carries pods' traffic, not clients'. Without
   * acceleration, links an earlier agent left are removed (once).
   */
  private syncXdp(devices: readonly Device[]): string[] {
    if (!this.xdp) {
      const problems = this.xdpError ? [this.xdpError] : [];
      if (this.xdpSwept) return problems;
      this.xdpSwept = true;
      try {
        sweepXdp(this.linksDir, new Set());
      } catch (err) {
        problems.push(`removing XDP links an earlier agent left: ${(err as Error).message}`);
      }
      return problems;
    }
    const want = devices.filter((d) => xdpWanted(d) && this.attached.has(d.index));
    const r = this.xdp.sync(want);
    for (const d of want) this.devices.update(u32.encode(d.index), deviceValue(d, r.on.has(d.index)), BPF_ANY);
    this.xdpRefused = r.refused;
    return this.xdp.mode === 'native' ? r.refused.map((x) => `device ${x.device}: ${x.why}`) : [];
  }

  /** Whether the last sync's switch failed and was rolled back (retried at the next sync). */
  switchFailed = false;
  /**
   * What the last commit of a migration carried after the switch
   * (commitMigration()'s answer), and how long the new programs ran without
   * those entries (from the first attach of the round that switched to the
   * commit's end, ms: what a TCP sender's retransmit must outlast), for the
   * log; the reader clears it.
   */
  committed: { entries: Record<string, number>; ms: number } | undefined;
  /** performance.now() at that first attach, while a migration waits for its commit; 0 otherwise. */
  private switchStarted = 0;

  /**
   * Switches `devices` onto this object's programs, both directions, all or
   * nothing. First each attachment there is held (a tcx link and the program
   * it runs; a clsact filter's program, by fd: a program whose last
   * attachment lets go of it is freed, and there would be nothing to put
   * back); a device with a foreign filter at our handle is left out and
   * reported. Then each device and direction is attached in turn. If one
   * fails, every attachment made in this round is undone in reverse (held
   * ones restored to their programs, new ones removed) and the round fails.
   * Only after all succeeded does each device lose its attachment of the
   * other mode (one an agent with another --tc-attach left), so a failed
   * round leaves the devices exactly as they were.
   */
  private switchRound(devices: readonly Device[]): { problems: string[]; failed: boolean } {
    const problems: string[] = [];
    const planned: Array<{ device: Device; dir: TcDirection; previous: HeldProgram | HeldLink | undefined }> = [];
    const release = (): void => {
      for (const p of planned) p.previous?.close();
    };
    try {
      for (const d of devices) {
        const held: typeof planned = [];
        try {
          for (const dir of ['ingress', 'egress'] as const) held.push({ device: d, dir, previous: this.holdPrevious(d, dir) });
          planned.push(...held);
        } catch (err) {
          for (const h of held) h.previous?.close();
          problems.push(`device ${d.name} (ifindex ${d.index}): ${(err as Error).message}`);
        }
      }
    } catch (err) {
      release();
      throw err;
    }
    if (planned.length === 0) return { problems, failed: false };

    const switched: typeof planned = [];
    this.rounds++;
    this.switching = true;
    // a migration's window opens at its first round's first attach (a round may leave the commit to a later sync)
    if (this.pending && !this.switchStarted) this.switchStarted = performance.now();
    if (this.settings) this.configure(this.settings); // LB_NP_F_MIGRATING while a migration's programs take over
    try {
      for (const p of planned) {
        try {
          this.attachOne(p.device, p.dir, p.previous, switched.length + 1);
          switched.push(p);
          this.renewHold();
        } catch (err) {
          const notReverted = this.revert([...switched, p]);
          const devicesIn = new Set(planned.map((x) => x.device.name));
          const what = `tc programs not switched: device ${p.device.name} (ifindex ${p.device.index}) ${p.dir} (${switched.length + 1} of ${planned.length} attachments): ${(err as Error).message}`;
          problems.push(
            notReverted.length === 0
              ? `${what}; every device (${[...devicesIn].join(', ')}) runs what it ran before (switched back: ${switched.filter((x) => x.previous).length}, new ones removed: ${switched.filter((x) => !x.previous).length}); retried at the next sync`
              : `${what}; could NOT switch back: ${notReverted.join('; ')} (those run the new programs; retried at the next sync, or lbctl cleanup)`,
          );
          // the window closes only where the old programs run everywhere again (no device switched in an earlier round, none left unreverted)
          if (this.attached.size === 0 && notReverted.length === 0) this.switchStarted = 0;
          return { problems, failed: true };
        }
      }
      // Every device runs our programs: now their attachments of the other mode go.
      for (const d of new Set(planned.map((p) => p.device))) {
        for (const dir of ['ingress', 'egress'] as const) {
          try {
            this.removeOtherMode(d.index, dir);
          } catch (err) {
            problems.push(`device ${d.name} (ifindex ${d.index}): removing our ${this.mode === 'tcx' ? 'clsact filter' : 'tcx link'} (${dir}): ${(err as Error).message}`);
          }
        }
        this.attached.set(d.index, { index: d.index, name: d.name, mode: this.mode });
      }
      // The old programs run nowhere now (unless on a layer-3 device still
      // waiting for its programs): what they wrote since the load is carried
      // too, while the new ones still drop a reply with no entry. The old
      // XDP programs are switched first: they write the old maps too.
      if (this.pending && this.l3Waiting.length === 0) {
        if (this.xdp) problems.push(...this.syncXdp(this.syncing));
        const opened = this.switchStarted;
        this.committed = { entries: this.commitMigration(), ms: opened ? performance.now() - opened : 0 };
      }
      return { problems, failed: false };
    } finally {
      release();
      this.switching = false;
      if (this.settings) this.configure(this.settings);
    }
  }

  /** What device `d` runs in `dir` in this mode now, held so it can be put back; undefined: nothing of ours. Throws for a foreign filter at our handle. */
  private holdPrevious(d: Device, dir: TcDirection): HeldProgram | HeldLink | undefined {
    if (this.mode === 'tcx') {
      const pin = tcxPin(this.linksDir, d.index, dir);
      if (!existsSync(pin)) return undefined;
      try {
        return holdPinnedLink(pin);
      } catch (err) {
        if (isErrno(err, 'ENOENT')) return undefined;
        throw err;
      }
    }
    const have = tcQuery(filter(d.index, dir));
    if (!have) return undefined;
    if (!isOurs(have)) throw new ConfigError(`a tc ${dir} filter of another program (${describe(have)}) holds handle 0x${TC_HANDLE.toString(16)} priority ${TC_PRIORITY}: not replaced`);
    return holdProgram(have) ?? undefined;
  }

  /** Attaches this object's program for `dir` on `d` (the failpoint, for tests, refuses the n-th). */
  private attachOne(d: Device, dir: TcDirection, previous: HeldProgram | HeldLink | undefined, position: number): void {
    const fail = this.failAttach && this.rounds <= this.failAttach.rounds && position === this.failAttach.at;
    const progFd = fail ? this.wrongProgFd : this.objectFor(d).progFd(PROGRAMS[dir]);
    if (this.mode === 'tcx') {
      const pin = tcxPin(this.linksDir, d.index, dir);
      if (previous) {
        try {
          pinnedLinkUpdate(pin, progFd);
          return;
        } catch (err) {
          // the device went away and came back with this index: a new link
          if (!isErrno(err, 'ENOLINK', 'ENODEV') || fail) throw err;
          unpin(pin);
        }
      }
      tcxAttach(progFd, d.index, dir, pin, { head: true });
      return;
    }
    tcAttach(progFd, filter(d.index, dir), previous !== undefined);
  }

  /** Undoes a round's attachments, last first; returns what could not be ("device direction: error"). */
  private revert(done: ReadonlyArray<{ device: Device; dir: TcDirection; previous: HeldProgram | HeldLink | undefined }>): string[] {
    const failed: string[] = [];
    for (const { device: d, dir, previous } of [...done].reverse()) {
      try {
        if (this.mode === 'tcx') {
          const pin = tcxPin(this.linksDir, d.index, dir);
          // A held link restored (a no-op for one never switched); a new one unpinned, which detaches it.
          if (previous) (previous as HeldLink).restore();
          else if (existsSync(pin)) unpin(pin);
        } else {
          const f = filter(d.index, dir);
          if (previous) tcAttach((previous as HeldProgram).fd, f, true);
          else if (tcQuery(f) === this.progId(d, dir)) tcDetach(f);
        }
      } catch (err) {
        failed.push(`${d.name} ${dir}: ${(err as Error).message}`);
      }
    }
    return failed;
  }

  /** Our attachment of the mode this agent does not use (tcx link or clsact filter), if one is there. */
  private removeOtherMode(index: number, dir: TcDirection): void {
    if (this.mode === 'tcx') {
      // Meanwhile a packet met the tcx program first; the filter saw only
      // what that passed on (TCX_NEXT) and found no flow for a packet already
      // translated (the CT maps key on the untranslated tuples).
      const f = filter(index, dir);
      let have = 0;
      try {
        have = tcQuery(f);
      } catch {
        return; // no clsact qdisc: no filter
      }
      if (have && isOurs(have)) tcDetach(f);
    } else {
      const pin = tcxPin(this.linksDir, index, dir);
      if (existsSync(pin)) unpin(pin);
    }
  }

  /** A device switched earlier: its attachments still this object's (a filter removed or replaced by hand is put back). */
  private repair(d: Device): void {
    for (const dir of ['ingress', 'egress'] as const) {
      const progFd = this.objectFor(d).progFd(PROGRAMS[dir]);
      if (this.mode === 'tcx') {
        const pin = tcxPin(this.linksDir, d.index, dir);
        if (existsSync(pin)) {
          try {
            pinnedLinkUpdate(pin, progFd); // a no-op on a live link
            continue;
          } catch (err) {
            if (!isErrno(err, 'ENOLINK', 'ENODEV', 'EINVAL')) throw err;
            unpin(pin);
          }
        }
        tcxAttach(progFd, d.index, dir, pin, { head: true });
      } else {
        const f = filter(d.index, dir);
        const have = tcQuery(f);
        if (have === this.progId(d, dir)) continue;
        if (have && !isOurs(have)) throw new ConfigError(`a tc ${dir} filter of another program (${describe(have)}) holds handle 0x${TC_HANDLE.toString(16)} priority ${TC_PRIORITY}: not replaced`);
        tcAttach(progFd, f, have !== 0);
      }
    }
  }

  /** Set by load() for tests (NodePortOptions.failAttach). */
  private failAttach: { readonly at: number; readonly rounds: number } | undefined;
  private wrongProgFd = -1;
  /** Switch rounds so far (with at least one device to switch). */
  private rounds = 0;
  private switching = false;

  /**
   * Attachments of ours this process did not make and no wanted device has:
   * left by an earlier agent on a device that is gone (a tcx link pinned
   * under its old ifindex) or no longer served (--devices changed, detection
   * changed its mind while the agent was down). tcx pins are swept at every
   * sync (a directory listing); clsact filters once, at the first sync (a
   * query per device of the namespace).
   */
  private sweepStale(wanted: ReadonlyMap<number, Device>): string[] {
    const problems: string[] = [];
    if (existsSync(this.linksDir)) {
      for (const name of readdirSync(this.linksDir)) {
        const m = /^tc-(\d+)-(?:ingress|egress)$/.exec(name);
        if (!m || wanted.has(Number(m[1]))) continue;
        try {
          unpin(path.join(this.linksDir, name));
        } catch (err) {
          if (!isErrno(err, 'ENOENT')) problems.push(`stale tcx link ${name}: ${(err as Error).message}`);
        }
      }
    }
    if (this.swept) return problems;
    this.swept = true;
    let all: ReturnType<typeof rtnlLinks> = [];
    try {
      all = rtnlLinks();
    } catch (err) {
      return [...problems, `listing devices for stale filters: ${(err as Error).message}`];
    }
    for (const l of all) {
      if (wanted.has(l.index)) continue;
      for (const dir of ['ingress', 'egress'] as const) {
        const f = filter(l.index, dir);
        try {
          const have = tcQuery(f);
          if (have && isOurs(have)) tcDetach(f);
        } catch {
          // no clsact qdisc there: nothing of ours
        }
      }
    }
    return problems;
  }

  private swept = false;

  /** The devices the programs run on now. */
  get attachedDevices(): AttachedDevice[] {
    return [...this.attached.values()].map((a) => (this.xdp?.devices.has(a.index) ? { ...a, xdp: true as const } : a)).sort((a, b) => a.index - b.index);
  }

  /** The object whose programs serve `d`: this one, or for a layer-3 device nodeport_l3.bpf.o's. */
  private objectFor(d: Device): BpfObject {
    if (!d.l3) return this.object;
    if (!this.l3) throw new Error(`device ${d.name} is a layer-3 device and ${path.basename(l3ObjectFor(this.file))} is not loaded`);
    return this.l3;
  }

  /** Our program's id for `d` and a direction, the steady state's answer to "is the filter there ours?" without a BTF read. */
  private progId(d: Device, dir: TcDirection): number {
    return (this.progIds[`${d.l3 ? 'l3' : 'l2'}-${dir}`] ??= this.objectFor(d).progInfo(PROGRAMS[dir]).id);
  }

  private readonly progIds: Record<string, number> = {};

  /** nodeport_l3.bpf.o, loaded when a layer-3 device is first to be served (loadL3()). */
  private l3: BpfObject | undefined;

  /** The layer-3 tunnels' object, once loaded. */
  get layer3(): BpfObject | undefined {
    return this.l3;
  }
  private l3Loading: Promise<void> | undefined;
  /** Why it could not be loaded: the layer-3 devices' problem. */
  private l3Error: string | undefined;
  /** Layer-3 devices the last sync left out until nodeport_l3.bpf.o is loaded. */
  l3Waiting: readonly string[] = [];
  private file = '';
  private maxEntries: Record<string, number> = {};

  /**
   * Loads the layer-3 tunnels' programs (nodeport_l3.bpf.o, or the
   * --tc-object's `_l3` sibling) beside this object: the same maps, every one
   * of them found pinned where this object pinned its own (staged, during a
   * migration). Once; a failure is kept as the layer-3 devices' problem.
   */
  async loadL3(): Promise<void> {
    if (this.l3 || this.l3Error) return;
    this.l3Loading ??= (async () => {
      const file = l3ObjectFor(this.file);
      try {
        if (!existsSync(file)) throw new ConfigError(`BPF object ${file} is missing: run \`make build\``);
        const reuseMaps = Object.fromEntries(this.object.mapNames().filter((n) => !n.includes('.')).map((n) => [n, this.object.map(n).fd]));
        this.l3 = await BpfObject.openLoaded(file, { pinRoot: this.pending?.staging ?? this.mapsDir, reuseMaps, maxEntries: this.maxEntries });
      } catch (err) {
        this.l3Error = `${path.basename(file)} (the programs for layer-3 tunnels) not loaded: ${(err as Error).message}`;
      }
    })();
    await this.l3Loading;
  }

  private detach(index: number): void {
    // XDP first: a frame it passes on must find tc there
    const xp = xdpPin(this.linksDir, index);
    if (existsSync(xp)) unpin(xp);
    for (const dir of ['ingress', 'egress'] as const) {
      if (this.mode === 'tcx') {
        const pin = tcxPin(this.linksDir, index, dir);
        if (existsSync(pin)) unpin(pin);
      } else {
        const f = filter(index, dir);
        const have = tcQuery(f);
        if (have && isOurs(have)) tcDetach(f);
      }
    }
  }

  /**
   * Stops serving: the programs are detached from every device (the agent
   * does this only at cleanup; a stop or restart leaves them attached, as it
   * leaves the cgroup links).
   */
  detachAll(): void {
    this.xdp?.detachAll();
    for (const index of [...this.attached.keys()]) {
      this.detach(index);
      this.attached.delete(index);
    }
  }

  close(): void {
    this.xdp?.close();
    this.l3?.close();
    this.object.close();
  }
}

/** The maps an object declares (opened, not loaded). */
function objectMapNames(file: string): string[] {
  const object = BpfObject.open(file);
  try {
    return object.mapNames();
  } finally {
    object.close();
  }
}

interface TcMapPlan {
  /** The object's maps. */
  readonly declared: readonly string[];
  /** Traffic maps to make anew with their entries carried over (resized, redefined, or relaid with converters). */
  readonly carried: readonly string[];
  readonly relaid: ReadonlyMap<string, MapConverters>;
  /** tc maps that are made anew: what the agent writes (config, devices, ranges, Maglev tables), or traffic no converter can relate. */
  readonly remade: readonly string[];
}

/**
 * The tc object's own maps against their pins (migrate.ts's comparison):
 * traffic maps are carried over when their size, type or layout changed,
 * every other changed map is unpinned and made anew (the agent rewrites it
 * at start; established NodePort flows are kept). A traffic map whose old
 * layout no converter can relate to the new one is made anew too: its flows
 * start over, and the agent says so.
 */
function planTcMaps(file: string, mapsDir: string, shared: ReadonlySet<string>, maxEntries: Readonly<Record<string, number>>): TcMapPlan {
  const carried: string[] = [];
  const remade: string[] = [];
  const relaid = new Map<string, MapConverters>();
  const object = BpfObject.open(file);
  const declared = object.mapNames();
  try {
    for (const name of declared) {
      if (shared.has(name)) continue;
      let diff;
      try {
        diff = comparePinned(mapsDir, object, name, maxEntries);
      } catch {
        remade.push(name); // no converter relates the layouts (or no BTF to compare): made anew all the same
        continue;
      }
      if (!diff || (!diff.resized && !diff.redefined && !diff.relaid)) continue;
      if (!CARRIED_MAPS.has(name) || name === 'lb_maglev') {
        remade.push(name);
        continue;
      }
      carried.push(name);
      if (diff.relaid) relaid.set(name, diff.relaid);
    }
  } finally {
    object.close();
  }
  return { declared, carried, relaid, remade };
}

/**
 * Moves the SNAT translations (REPLY entries of SNATed flows) of a lb*_ct map
 * written by a datapath from before lb*_nat into `to` (none: only deletes
 * them). With `keepNewer` an entry already in `to` stays. Returns how many.
 */
function moveTranslations(from: BpfMap, to: BpfMap | undefined, family: 4 | 6, keepNewer: boolean, progress?: () => void): number {
  const keyCodec = family === 4 ? lb4_ct_key : lb6_ct_key;
  const valueCodec = family === 4 ? lb4_ct_entry : lb6_ct_entry;
  let moved = 0;
  const { keys, values, count } = from.entriesFlat();
  for (let i = 0; i < count; i++) {
    if (progress && (i & PROGRESS_EVERY) === PROGRESS_EVERY) progress();
    const key = keys.subarray(i * from.keySize, (i + 1) * from.keySize);
    const value = values.subarray(i * from.valueSize, (i + 1) * from.valueSize);
    if (keyCodec.decode(key).dir !== LbCtDir.LB_CT_REPLY || !(valueCodec.decode(value).flags & LbCtFlags.LB_CT_F_SNAT)) continue;
    if (!to) {
      if (from.delete(key)) moved++;
      continue;
    }
    try {
      to.update(key, value, keepNewer ? BPF_NOEXIST : BPF_ANY);
      moved++;
    } catch (err) {
      if (!isErrno(err, 'EEXIST')) throw err;
    }
  }
  return moved;
}

/** moveTranslations() out of the lb*_ct map pinned in `mapsDir`. */
function movePinnedTranslations(mapsDir: string, to: BpfMap, family: 4 | 6, keepNewer: boolean, progress?: () => void): number {
  const from = openPinnedMap(path.join(mapsDir, `lb${family}_ct`));
  try {
    return moveTranslations(from, to, family, keepNewer, progress);
  } finally {
    from.close();
  }
}

/**
 * Removes every tc attachment of ours in this network namespace: tcx links
 * pinned under linksDir (unpinned by the caller's sweep too) and clsact
 * filters at our handle and priority whose program is ours. For `lbctl
 * cleanup`, which must work when the devices changed since the agent ran.
 */
export function cleanupTc(linksDir: string): string[] {
  const removed: string[] = sweepXdp(linksDir, new Set());
  if (existsSync(linksDir)) {
    for (const name of readdirSync(linksDir)) {
      if (!name.startsWith('tc-')) continue;
      try {
        unpin(path.join(linksDir, name));
        removed.push(name);
      } catch (err) {
        if (!isErrno(err, 'ENOENT')) throw err;
      }
    }
  }
  let links: ReturnType<typeof rtnlLinks> = [];
  try {
    links = rtnlLinks();
  } catch {
    return removed;
  }
  for (const l of links) {
    for (const dir of ['ingress', 'egress'] as const) {
      const f = filter(l.index, dir);
      try {
        const have = tcQuery(f);
        if (have && isOurs(have)) {
          tcDetach(f);
          removed.push(`${l.name}/${dir}`);
        }
      } catch {
        // no clsact qdisc on the device: nothing of ours there
      }
    }
  }
  return removed;
}
