// The agent's side of the tc datapath: which devices of this network
// namespace it serves (--devices, or detected), followed through rtnetlink
// as links and addresses change; the node addresses NodePorts answer on
// (--nodeport-addresses); the NodePort range reserved from the ephemeral
// ports (ip_local_reserved_ports, per network namespace). A device that
// vanishes is detached and one that returns is attached again.
import path from 'node:path';
import { readFileSync, writeFileSync } from 'node:fs';
import type { Logger } from 'pino';
import { ConfigError } from '../base/errors.js';
import type ipaddr from 'ipaddr.js';
import { nodePortAddresses, selectDevices, type Device, type DeviceAddress } from '../datapath/devices.js';
import type { AttachChoice, NodePortDatapath, NodePortSettings, PortRange, TcAttachSetting, TrafficMapSizes, TrafficPressure } from '../datapath/nodeport.js';
import type { Acceleration } from '../datapath/xdp.js';
import { sumCounters } from '../datapath/counters.js';
import { addresses as rtnlAddrs, links as rtnlLinks, routes as rtnlRoutes, watch as rtnlWatch } from '../native/rtnl.js';

export interface NodePortOptions {
  readonly settings: NodePortSettings;
  /** --ct-max, --nat-max. */
  readonly sizes?: Partial<TrafficMapSizes>;
  /** --tc-object: another tc object than the built one (an upgrade, a test). */
  readonly object?: string;
  /** Seeds the Maglev tables' permutations (--maglev-hash-seed's first word), the same on every node. */
  readonly maglevTableSeed: number;
  /** --devices; undefined: detect. */
  readonly devices?: readonly string[];
  /** --nodeport-addresses, parsed. */
  readonly addressCidrs?: ReadonlyArray<[ipaddr.IPv4 | ipaddr.IPv6, number]>;
  /** Where the host's /proc is (--procfs): in a pod, a hostPath mount, the container's /proc/sys being read-only. */
  readonly procfs?: string;
  /** The traffic maps' fill, each time it is read (the agent's lbctl_bpf_map_pressure). */
  readonly onTrafficPressure?: (p: readonly TrafficPressure[]) => void;
  /** How often the traffic maps and the datapath's drop counters are read (default TRAFFIC_CHECK_MS). */
  readonly trafficCheckMs?: number;
  /** --tc-attach (default auto: tcx where the kernel has it). */
  readonly tcAttach?: TcAttachSetting;
  /** --nodeport-acceleration (default disabled). */
  readonly acceleration?: Acceleration;
  /** LBCTL_FAILPOINT_TC_ATTACH (tests): an attach of the first switch rounds is refused by the kernel. */
  readonly failAttach?: { readonly at: number; readonly rounds: number };
}

/** How often the flows' and SNAT maps' fill and the counters of traffic dropped for want of room are read. */
export const TRAFFIC_CHECK_MS = 10_000;
/** A tc switch rolled back is retried after 1 s, then 2, 4 ... at most every 60 s. */
const SWITCH_RETRY_FIRST_MS = 1000;
const SWITCH_RETRY_MAX_MS = 60_000;

/**
 * Counters that say something needs doing (mostly flows dropped for want
 * of room), and what to do (the flag that makes more): logged when they
 * grow, with how much, once per check.
 */
const WATCHED_COUNTERS: ReadonlyArray<{ counter: string; what: string; flag: string }> = [
  { counter: 'np_snat_exhausted', what: 'new flows to a remote backend found no free SNAT port and were dropped', flag: 'widen --snat-port-range (or give the service more backends)' },
  { counter: 'np_ct_full', what: 'new flows could not be tracked and were dropped', flag: 'raise --ct-max' },
  { counter: 'np_nat_full', what: 'SNATed packets lost their translation and were dropped', flag: 'raise --nat-max' },
  { counter: 'np_nat_repair', what: 'translations of live SNATed flows were evicted (and written again from their flows)', flag: 'raise --nat-max' },
  { counter: 'np_nat_stolen', what: 'SNATed flows lost their port to newer flows (their translation was evicted) and ended', flag: 'raise --nat-max' },
  {
    counter: 'np_l3_outer',
    what: 'packets came out of a layer-3 tunnel with their outer headers still on, and were not translated',
    flag: 'this kernel hands tc the packets of ipip, sit and ip6tnl tunnels so before Linux 5.14, and flows to pods behind them fail; use a VXLAN, Geneve or WireGuard overlay, or Linux 5.14+',
  },
];

export interface NodePortStatus {
  readonly mode: string;
  /** Why that mode: the flag, and with auto what the kernel has. */
  readonly modeReason: string;
  readonly devices: ReadonlyArray<{ readonly name: string; readonly index: number; readonly role: string; readonly addresses: readonly string[]; readonly snat: readonly string[]; readonly l3?: true; readonly xdp?: true }>;
  /** --nodeport-acceleration, when not disabled. */
  readonly acceleration?: string;
  readonly nodeAddresses: readonly string[];
  readonly waiting: readonly string[];
  readonly problems: readonly string[];
  /** The traffic maps' fill at the last check. */
  readonly traffic?: readonly TrafficPressure[];
}

/** Under --procfs: the kernel's reserved ports of this network namespace. */
const RESERVED_PORTS = 'sys/net/ipv4/ip_local_reserved_ports';

/** `ip_local_reserved_ports` with `range` added, or undefined when it is already covered. */
export function withReservedRange(current: string, range: PortRange): string | undefined {
  const parts = current.trim() === '' ? [] : current.trim().split(',').map((s) => s.trim());
  let covered = false;
  for (const p of parts) {
    const [a, b] = p.split('-').map(Number);
    const lo = a!;
    const hi = b ?? lo;
    if (lo <= range.first && hi >= range.last) covered = true;
  }
  if (covered) return undefined;
  return [...parts, `${range.first}-${range.last}`].join(',');
}

export class NodePortAgent {
  private watcher: { close(): void } | undefined;
  private timer: NodeJS.Timeout | undefined;
  private retryTimer: NodeJS.Timeout | undefined;
  private retryMs = 0;
  private trafficTimer: NodeJS.Timeout | undefined;
  private counters: Record<string, bigint> | undefined;
  private traffic: readonly TrafficPressure[] | undefined;
  private status: NodePortStatus;
  private xdpRefusedSaid = '';

  constructor(
    readonly datapath: NodePortDatapath,
    private readonly opts: NodePortOptions,
    private readonly log: Logger,
    private readonly attach: AttachChoice = { mode: datapath.mode, why: '' },
  ) {
    this.status = { mode: datapath.mode, modeReason: attach.why, devices: [], nodeAddresses: [], waiting: [], problems: [] };
  }

  /**
   * Before start(): the programs for layer-3 tunnels are loaded first when
   * this node has one to serve, so the first switch takes every device.
   */
  async prepare(): Promise<void> {
    const sel = selectDevices(rtnlLinks(), rtnlAddrs(), this.opts.devices, rtnlRoutes());
    if (sel.devices.some((d) => d.l3)) await this.datapath.loadL3();
  }

  /** Throws (ConfigError) when --devices names a device this network namespace does not have. */
  start(): void {
    if (this.opts.devices) {
      const names = new Set(rtnlLinks().map((l) => l.name));
      const missing = this.opts.devices.filter((d) => !names.has(d));
      if (missing.length > 0) throw new ConfigError(`--devices: no device ${missing.join(', ')} in this network namespace (ip link lists ${[...names].join(', ')})`);
    }
    this.datapath.configure(this.opts.settings);
    this.reservePorts();
    this.refresh();
    this.watcher = rtnlWatch(
      () => this.schedule(),
      (err) => this.log.error({ err: (err as Error)?.message ?? String(err) }, 'following the devices failed'),
    );
    this.checkTraffic();
    this.trafficTimer = setInterval(() => this.checkTraffic(), this.opts.trafficCheckMs ?? TRAFFIC_CHECK_MS);
    this.trafficTimer.unref();
  }

  /**
   * The flows' and SNAT maps' fill (exported as their pressure), and the
   * counters of traffic dropped for want of room: each that grew since the
   * last check is logged with how much and the flag that makes room. A map
   * full of live entries is logged too: its LRU then evicts live flows.
   */
  checkTraffic(): void {
    try {
      const traffic = this.datapath.trafficPressure();
      this.traffic = traffic;
      this.opts.onTrafficPressure?.(traffic);
      for (const t of traffic) {
        if (t.maxEntries > 0 && t.entries >= 0.9 * t.maxEntries) {
          this.log.warn({ map: t.map, live: t.entries, maxEntries: t.maxEntries }, `${t.map} is ${Math.round((100 * t.entries) / t.maxEntries)}% full of live entries: its LRU evicts live ones; raise ${t.map.endsWith('_nat') ? '--nat-max' : '--ct-max'}`);
        }
      }
      const now = sumCounters(this.datapath.object.map('lb_metrics'));
      const before = this.counters;
      this.counters = now;
      if (!before) return;
      for (const c of WATCHED_COUNTERS) {
        const grew = (now[c.counter] ?? 0n) - (before[c.counter] ?? 0n);
        if (grew > 0n) this.log.warn({ counter: c.counter, count: Number(grew), total: Number(now[c.counter] ?? 0n) }, `${grew} ${c.what} since the last check: ${c.flag}`);
      }
    } catch (err) {
      this.log.error({ err: (err as Error)?.message ?? String(err) }, 'reading the tc traffic maps failed');
    }
  }

  /** Link and address events come in bursts: one refresh after them. */
  private schedule(): void {
    if (this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      try {
        this.refresh();
      } catch (err) {
        this.log.error({ err: (err as Error)?.message ?? String(err) }, 'device refresh failed; the last attachments stay');
      }
    }, 100);
    this.timer.unref();
  }

  private reservePorts(): void {
    const range = this.opts.settings.nodePortRange;
    const file = path.join(this.opts.procfs ?? '/proc', RESERVED_PORTS);
    try {
      const next = withReservedRange(readFileSync(file, 'utf8'), range);
      if (next !== undefined) writeFileSync(file, next);
      this.log.info({ range: `${range.first}-${range.last}` }, 'NodePort range reserved from ephemeral ports (ip_local_reserved_ports)');
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, `could not reserve the NodePort range in ${file}: a local socket may take a NodePort as its ephemeral port (in a pod: mount the host's /proc/sys/net and give --procfs)`);
    }
  }

  refresh(): void {
    const links = rtnlLinks();
    const addrs = rtnlAddrs();
    const sel = selectDevices(links, addrs, this.opts.devices, rtnlRoutes());
    const nodeAddrs = nodePortAddresses(sel.devices, this.opts.addressCidrs ?? []);
    const before = this.status;
    const problems = this.datapath.sync(sel.devices, nodeAddrs);
    const xdp = new Set(this.datapath.attachedDevices.filter((a) => a.xdp).map((a) => a.index));
    const accel = this.opts.acceleration ?? 'disabled';
    this.status = {
      mode: this.datapath.mode,
      modeReason: this.attach.why,
      ...(accel !== 'disabled' ? { acceleration: accel } : {}),
      devices: sel.devices.map((d: Device) => ({
        name: d.name,
        index: d.index,
        role: d.role,
        ...(d.l3 ? { l3: true as const } : {}),
        ...(xdp.has(d.index) ? { xdp: true as const } : {}),
        addresses: d.addresses.map((a) => `${a.address}/${a.prefixLen}`),
        snat: [d.snat[4], d.snat[6]].filter((a): a is string => a !== undefined),
      })),
      nodeAddresses: nodeAddrs.map((a: DeviceAddress) => a.address),
      waiting: [...sel.waiting, ...this.datapath.l3Waiting.map((n) => `${n}: a layer-3 tunnel, attached once its programs (nodeport_l3.bpf.o) are loaded`)],
      problems,
    };
    const names = (s: NodePortStatus): string => s.devices.map((d) => `${d.name}#${d.index}:${d.role}:${d.snat.join('/')}`).join(',');
    if (names(before) !== names(this.status) || before.nodeAddresses.join() !== this.status.nodeAddresses.join()) {
      this.log.info(
        {
          devices: this.status.devices.filter((d) => d.role === 'nodeport').map((d) => d.name),
          tunnels: this.status.devices.filter((d) => d.role === 'tunnel').map((d) => d.name),
          snat: Object.fromEntries(this.status.devices.map((d) => [d.name, d.snat])),
          nodeAddresses: this.status.nodeAddresses,
          mode: this.datapath.mode,
        },
        'tc datapath: devices and node addresses',
      );
    }
    for (const w of sel.waiting) if (!before.waiting.includes(w)) this.log.warn({ device: w }, 'device named by --devices is not usable yet; attached when it is');
    const refused = this.datapath.xdpRefused.map((r) => `${r.device}: ${r.why}`);
    if (accel === 'best-effort' && refused.join() !== this.xdpRefusedSaid) this.log.info({ devices: refused }, '--nodeport-acceleration best-effort: devices served at tc only');
    this.xdpRefusedSaid = refused.join();
    // A problem is logged when it appears, not at every refresh that retries it.
    for (const p of problems) if (!before.problems.includes(p)) this.log.error({ problem: p }, 'tc datapath: device not attached');
    const committed = this.datapath.committed;
    if (committed) {
      this.datapath.committed = undefined;
      this.log.info({ after: committed.entries, ms: Math.round(committed.ms * 10) / 10 }, 'tc maps carried over: committed after the switch (entries the old programs wrote meanwhile carried too)');
    }
    // Layer-3 tunnels wait for their programs, loaded once, then attached.
    if (this.datapath.l3Waiting.length > 0) void this.datapath.loadL3().then(() => this.schedule());
    // A switch rolled back is tried again, whole, until it succeeds.
    if (this.datapath.switchFailed) this.retrySoon();
    else this.retryMs = 0;
  }

  /** Another refresh after a failed switch: after 1 s, doubling to 60 s while it keeps failing. */
  private retrySoon(): void {
    if (this.retryTimer) return;
    this.retryMs = Math.min(SWITCH_RETRY_MAX_MS, this.retryMs === 0 ? SWITCH_RETRY_FIRST_MS : this.retryMs * 2);
    this.retryTimer = setTimeout(() => {
      this.retryTimer = undefined;
      this.schedule();
    }, this.retryMs);
    this.retryTimer.unref();
  }

  get nodeAddresses(): readonly string[] {
    return this.status.nodeAddresses;
  }

  view(): NodePortStatus {
    return this.traffic ? { ...this.status, traffic: this.traffic } : this.status;
  }

  stop(): void {
    this.watcher?.close();
    this.watcher = undefined;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    if (this.trafficTimer) clearInterval(this.trafficTimer);
    this.trafficTimer = undefined;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
    // A switch that never succeeded: the old programs keep the old maps.
    if (this.datapath.migrating) this.datapath.discardMigration();
    this.datapath.close();
  }
}
