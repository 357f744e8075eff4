// Desired frontends for reconciler, plan and drift tests: one frontend
// (TCP unless asked) at ip:port with backends on port 8080, and a desired
// state of several.
import { frontendKey, type Backend } from '../../src/lb/types.js';
import type { DesiredState, Frontend } from '../../src/model/types.js';

/** What a north-south frontend adds: its type, scope, externalTrafficPolicy Local, source ranges. */
export type FrontendExtra = Partial<Pick<Frontend, 'type' | 'scope' | 'externalLocal' | 'sourceRanges' | 'healthCheckNodePort' | 'localOnly' | 'maglev' | 'protocol'>>;

export function frontend(ip: string, port: number, backends: string[], terminating: string[] = [], extra: FrontendExtra = {}): Frontend {
  const family = ip.includes(':') ? 6 : 4;
  const protocol = extra.protocol ?? 'TCP';
  const addr = { address: ip, family, port, protocol } as const;
  const be = (a: string, state: Backend['state']): Backend => ({ address: a, family, port: 8080, protocol, state });
  return {
    ...addr,
    key: frontendKey({ ...addr, scope: extra.scope }),
    type: 'ClusterIP',
    service: { namespace: 'default', name: `svc-${ip}-${port}`, portName: 'p' },
    backends: backends.map((a) => be(a, 'active')),
    terminating: terminating.map((a) => be(a, 'terminating')),
    affinityTimeout: 0,
    localOnly: false,
    externalLocal: false,
    sourceRanges: [],
    maglev: false,
    ...extra,
  };
}

export const state = (...fes: Frontend[]): DesiredState => new Map(fes.map((f) => [f.key, f]));
