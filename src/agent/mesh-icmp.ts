// placeholder until the native ping socket lands
import type { Outcome } from './mesh.js';
export class IcmpProber {
  kind(): string { return 'none'; }
  ping(_address: string, _timeoutMs: number): Promise<Outcome> { return Promise.resolve({ ok: false, error: 'unsupported' }); }
  close(): void {}
}
