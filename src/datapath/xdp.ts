// XDP acceleration of the tc datapath's ingress (--nodeport-acceleration,
// Cilium's loadBalancer.acceleration): nodeport_xdp.bpf.o (bpf/nodeport.c
// built with NP_XDP) on the NodePort devices, in the driver, on the very
// maps the tc object uses. tc stays attached everywhere: what XDP cannot
// finish it hands to tc unchanged, so a device without native XDP, or a
// failed attach, loses speed, never service.
//
// Each device's XDP program is a bpf_link pinned at links/xdp-<ifindex>; a
// restart or upgrade updates the pinned link in place (atomic), as tcx's.
// lb_devices marks the devices XDP runs on (LB_DEV_F_XDP): the only ones the
// XDP program sends frames out of (XDP_REDIRECT needs the driver's
// ndo_xdp_xmit, which some drivers only set up while a program is attached).
import { existsSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { BpfObject, isErrno, pinnedLinkUpdate, unpin } from '../native/bpf.js';
import { xdpAttach } from '../native/tc.js';
import type { Device } from './devices.js';

/** --nodeport-acceleration. */
export type Acceleration = 'disabled' | 'native' | 'best-effort';
export const ACCELERATIONS: readonly Acceleration[] = ['disabled', 'native', 'best-effort'];

export const XDP_PROGRAM = 'lb_nodeport_xdp';

/** The XDP build that goes with a tc object: X_xdp.bpf.o beside X.bpf.o. */
export function xdpObjectFor(tcObject: string): string {
  return tcObject.replace(/(\.bpf)?\.o$/, '_xdp$&');
}

export const xdpPin = (linksDir: string, ifindex: number): string => path.join(linksDir, `xdp-${ifindex}`);

export interface XdpSync {
  /** Devices XDP runs on now. */
  readonly on: ReadonlySet<number>;
  /** Devices it could not be attached to (native: problems; best-effort: served at tc, said once in the log). */
  readonly refused: ReadonlyArray<{ readonly device: string; readonly why: string }>;
}

export class XdpAccelerator {
  private object: BpfObject | undefined;
  private readonly on = new Set<number>();

  constructor(
    readonly mode: Exclude<Acceleration, 'disabled'>,
    private readonly linksDir: string,
  ) {}

  /** Loads the XDP object on `tc`'s maps (every one shared by fd). Throws with the loader's error. */
  async load(file: string, tc: BpfObject, pinRoot: string, maxEntries: Record<string, number>): Promise<void> {
    const probe = BpfObject.open(file);
    let declared: Set<string>;
    try {
      declared = new Set(probe.mapNames());
    } finally {
      probe.close();
    }
    // every map it declares is tc's (the XDP build leaves out egress's and ICMP's)
    const reuseMaps = Object.fromEntries(tc.mapNames().filter((n) => declared.has(n) && !n.includes('.')).map((n) => [n, tc.map(n).fd]));
    this.object = await BpfObject.openLoaded(file, { pinRoot, reuseMaps, maxEntries });
  }

  /**
   * XDP on each of `devices` (Ethernet devices tc already serves): a pinned
   * link updated to this object's program, else a new one. A device that
   * refuses it is left to tc; one no longer wanted loses its link.
   */
  sync(devices: readonly Device[]): XdpSync {
    const refused: Array<{ device: string; why: string }> = [];
    const progFd = this.object!.progFd(XDP_PROGRAM);
    const wanted = new Set(devices.map((d) => d.index));
    for (const d of devices) {
      const pin = xdpPin(this.linksDir, d.index);
      try {
        if (existsSync(pin)) {
          try {
            pinnedLinkUpdate(pin, progFd); // a no-op on a live link of this program
            this.on.add(d.index);
            continue;
          } catch (err) {
            // the device went away and came back with this index: a new link
            if (!isErrno(err, 'ENOLINK', 'ENODEV', 'EINVAL')) throw err;
            unpin(pin);
          }
        }
        xdpAttach(progFd, d.index, 'native', pin);
        this.on.add(d.index);
      } catch (err) {
        this.on.delete(d.index);
        refused.push({ device: `${d.name} (ifindex ${d.index})`, why: `native XDP not attached (${(err as Error).message}); served at tc` });
      }
    }
    sweep(this.linksDir, wanted);
    for (const i of [...this.on]) if (!wanted.has(i)) this.on.delete(i);
    return { on: new Set(this.on), refused };
  }

  /** The devices XDP runs on. */
  get devices(): ReadonlySet<number> {
    return this.on;
  }

  detachAll(): void {
    sweep(this.linksDir, new Set());
    this.on.clear();
  }

  close(): void {
    this.object?.close();
  }
}

/** Unpins (detaches) every XDP link of ours under `linksDir` whose device is not in `keep`; returns their pin names. */
export function sweep(linksDir: string, keep: ReadonlySet<number>): string[] {
  const removed: string[] = [];
  if (!existsSync(linksDir)) return removed;
  for (const name of readdirSync(linksDir)) {
    const m = /^xdp-(\d+)$/.exec(name);
    if (!m || keep.has(Number(m[1]))) continue;
    try {
      unpin(path.join(linksDir, name));
      removed.push(name);
    } catch (err) {
      if (!isErrno(err, 'ENOENT')) throw err;
    }
  }
  return removed;
}
