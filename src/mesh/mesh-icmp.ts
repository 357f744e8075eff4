// The health mesh's ICMP probe: one Pinger (src/native/icmp.ts), a ping
// socket per family where net.ipv4.ping_group_range allows it, SOCK_RAW
// otherwise, opened at the first probe of that family. A socket that cannot
// be opened at all (no CAP_NET_RAW, no ping group) makes every ICMP probe
// fail with that reason; the HTTP probes go on.
import { Pinger } from '../native/icmp.js';
import type { Outcome } from './mesh.js';

export class IcmpProber {
  private readonly pinger = new Pinger();

  /** Which sockets are open, e.g. "v4 dgram, v6 raw" (for the start's log line). */
  kind(): string {
    const out: string[] = [];
    for (const family of [4, 6] as const) {
      try {
        out.push(`v${family} ${this.pinger.socketInfo(family).kind}`);
      } catch (err) {
        out.push(`v${family} none (${(err as Error).message})`);
      }
    }
    return out.join(', ');
  }

  async ping(address: string, timeoutMs: number): Promise<Outcome> {
    try {
      const r = await this.pinger.ping(address, timeoutMs);
      return r.ok ? { ok: true, rttMs: r.rttMs } : { ok: false, error: r.error, detail: r.detail };
    } catch (err) {
      const e = err as { code?: string; message?: string };
      return { ok: false, error: e.code ?? 'error', detail: e.message ?? String(err) };
    }
  }

  close(): void {
    this.pinger.close();
  }
}
