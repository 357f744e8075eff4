// The benchmark's services, the same for every mode.
import type { BenchService } from './kube-proxy.js';
import { POD_IPS, POD_PORT } from './world.js';

const ipv4 = (n: number): string => [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');

/**
 * N services, one TCP port each, 3 endpoints each. The first and the last
 * (and the one added on top, index N) have the real pods as endpoints; the
 * others point at addresses nothing answers (only their rules matter).
 */
export function makeServices(n: number): BenchService[] {
  const out: BenchService[] = [];
  for (let i = 0; i <= n; i++) {
    const real = i === 0 || i >= n - 1;
    out.push({
      namespace: 'bench',
      name: `svc-${i}`,
      portName: 'http',
      clusterIP: ipv4(0x0a60000a + i), // 10.96.0.10 + i, inside 10.96.0.0/12
      port: 80,
      endpoints: [0, 1, 2].map((k) => ({ ip: real ? POD_IPS[k]! : ipv4(0x0af50000 + 3 * i + k + 1), port: POD_PORT })),
    });
  }
  return out;
}


