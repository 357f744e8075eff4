/**
 * rtnetlink through the addon: the links and addresses of the network
 * namespace this process runs in (what `ip link` and `ip addr` show; not
 * /sys/class/net, which shows the namespace that mounted /sys), its routes,
 * and a watch that calls back when any of them changes. Generic: which devices matter is the
 * caller's business.
 */
import { guard } from './bpf.js';
import { loadBinding } from './binding.js';
import type { RtnlAddr, RtnlLink, RtnlRoute } from './native.js';

export type { RtnlAddr, RtnlLink, RtnlRoute } from './native.js';

export const IFF_UP = 0x1;
export const IFF_LOOPBACK = 0x8;
export const RT_SCOPE_UNIVERSE = 0;
export const IFA_F_SECONDARY = 0x01;
export const IFA_F_DADFAILED = 0x08;
export const IFA_F_DEPRECATED = 0x20;
export const IFA_F_TENTATIVE = 0x40;
export const RT_TABLE_MAIN = 254;

/** The links of this process's network namespace (or of the namespace `netnsFd` refers to). */
export function links(netnsFd?: number): RtnlLink[] {
  return guard(() => loadBinding().rtnlLinks(netnsFd));
}

/** Its IPv4 and IPv6 addresses. */
export function addresses(netnsFd?: number): RtnlAddr[] {
  return guard(() => loadBinding().rtnlAddrs(netnsFd));
}

/** Its routes, every table (one per next hop). */
export function routes(netnsFd?: number): RtnlRoute[] {
  return guard(() => loadBinding().rtnlRoutes(netnsFd));
}

/**
 * Calls `changed` after each burst of link, address or route events (`lost`: the
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
