/**
 * tc attachment through the addon: clsact + cls_bpf filters (every kernel)
 * and tcx links (6.6+), on a device of this process's network namespace or
 * of the namespace `netnsFd` refers to. Generic: the caller picks handles,
 * priorities and pins (src/datapath decides which, and never replaces a
 * filter it did not check is its own).
 */
import { guard } from './bpf.js';
import { loadBinding } from './binding.js';

export type TcDirection = 'ingress' | 'egress';

/** enum bpf_attach_type (6.6) */
export const BPF_TCX_INGRESS = 46;
export const BPF_TCX_EGRESS = 47;
/** BPF_F_BEFORE: with no anchor, at the head of the device's tcx programs. */
export const BPF_F_BEFORE = 1 << 3;

export interface TcFilter {
  readonly ifindex: number;
  readonly direction: TcDirection;
  readonly handle: number;
  readonly priority: number;
}

/** Attaches a filter; `replace` swaps the program of the filter already there (atomic), else EEXIST when one is. */
export function tcAttach(progFd: number, f: TcFilter, replace: boolean, netnsFd?: number): { progId: number } {
  return guard(() => loadBinding().tcAttach(progFd, f.ifindex, f.direction, f.handle, f.priority, replace, netnsFd));
}

/** The id of the program filter `f` runs, 0 when there is no such filter. */
export function tcQuery(f: TcFilter, netnsFd?: number): number {
  return guard(() => loadBinding().tcQuery(f.ifindex, f.direction, f.handle, f.priority, netnsFd));
}

export function tcDetach(f: TcFilter, netnsFd?: number): void {
  guard(() => loadBinding().tcDetach(f.ifindex, f.direction, f.handle, f.priority, netnsFd));
}

/** A tcx link for the program, pinned at `pinPath` (it stays attached after the process exits; unpin to detach). */
export function tcxAttach(progFd: number, ifindex: number, direction: TcDirection, pinPath: string, opts: { head?: boolean; netnsFd?: number } = {}): { linkId: number } {
  const type = direction === 'ingress' ? BPF_TCX_INGRESS : BPF_TCX_EGRESS;
  return guard(() => loadBinding().tcxAttach(progFd, ifindex, type, opts.head ? BPF_F_BEFORE : 0, pinPath, opts.netnsFd));
}

/** enum bpf_attach_type BPF_XDP (5.9+: XDP by bpf_link), and the modes of include/uapi/linux/if_link.h. */
export const BPF_XDP = 37;
export const XDP_FLAGS_SKB_MODE = 1 << 1;
export const XDP_FLAGS_DRV_MODE = 1 << 2;

/**
 * An XDP link for the program on the device, in the driver (`native`) or on
 * the generic path (`generic`, after the skb is made), pinned at `pinPath`;
 * tcxAttach's bpf_link_create and pin serve it as they serve tcx.
 */
export function xdpAttach(progFd: number, ifindex: number, mode: 'native' | 'generic', pinPath: string, netnsFd?: number): { linkId: number } {
  const flags = mode === 'native' ? XDP_FLAGS_DRV_MODE : XDP_FLAGS_SKB_MODE;
  return guard(() => loadBinding().tcxAttach(progFd, ifindex, BPF_XDP, flags, pinPath, netnsFd));
}
