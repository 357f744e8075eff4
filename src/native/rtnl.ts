/**
 * rtnetlink through the addon: the links and addresses of the network
 * namespace this process runs in (what `ip link` and `ip addr` show; not
 * /sys/class/net, which shows the namespace that mounted /sys), and a watch
 * that calls back when either changes. Generic: which devices matter is the
 * caller's business.
 */
import { guard } from './bpf.js';
import { loadBinding } from './binding.js';
import type { RtnlAddr, RtnlLink } from './native.js';

export type { RtnlAddr, RtnlLink } from './native.js';

export const IFF_UP = 0x1;
export const IFF_LOOPBACK = 0x8;
export const RT_SCOPE_UNIVERSE = 0;
export const IFA_F_TENTATIVE = 0x40;
export const IFA_F_DADFAILED = 0x08;

/** The links of this process's network namespace (or of the namespace `netnsFd` refers to). */
export function links(netnsFd?: number): RtnlLink[] {
  return guard(() => loadBinding().rtnlLinks(netnsFd));
}

/** Its IPv4 and IPv6 addresses. */
export function addresses(netnsFd?: number): RtnlAddr[] {
  return guard(() => loadBinding().rtnlAddrs(netnsFd));
}

/**
 * Calls `changed` after each burst of link or address events (`lost`: the
 * kernel dropped some). What `changed` throws goes to `failed`, never back
 * into the event loop's poll callback (where it would end the process).
 * Close it to stop.
 */
export function watch(changed: (lost: boolean) => void, failed: (err: unknown) => void, netnsFd?: number): { close(): void } {
  return guard(() =>
    loadBinding().rtnlWatch((n) => {
      try {
        changed(n < 0);
      } catch (err) {
        failed(err);
      }
    }, netnsFd),
  );
}
