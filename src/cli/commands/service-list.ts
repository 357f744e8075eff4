// `lbctl service list [-o json]`: per frontend, the backends the agent intends
// next to those in the maps, read from the agent's API socket. Every frontend
// where they disagree is flagged DRIFT, and then lbctl exits 1 (after printing
// the whole list), so scripts can wait for the maps to converge.
import { apiGet } from '../../http/api.js';
import type { FrontendStatus } from '../../http/view.js';
import { LbError } from '../../base/errors.js';

type Side = NonNullable<FrontendStatus['desired']>;

function backends(side: Side | undefined): string {
  if (!side) return '-';
  const q = new Set(side.quarantined ?? []);
  const all = [...side.backends, ...side.terminating.map((b) => `${b} [${q.has(b) ? 'quarantined' : 'terminating'}]`)];
  return all.length === 0 ? '(none)' : all.join(', ');
}

/**
 * The service's readiness probe per backend address: state, results in a
 * row, and the last result ("10.0.0.2 quarantined 3x: timeout: no answer
 * within 1s"); '-' for a service without a probe.
 */
export function probeColumn(f: FrontendStatus): string {
  if (!f.probes) return '-';
  const each = f.probes.map((p) => {
    const last = p.last ? `: ${p.last.ok ? 'ok' : 'failed'}${p.last.reason ? ` (${p.last.reason})` : ''}` : '';
    return `${p.address} ${p.state}${p.consecutive > 0 ? ` ${p.consecutive}x` : ''}${last}`;
  });
  const all = f.probeAllFailed ? [`ALL FAILED (fail ${f.probeAllFailed})`] : [];
  return [...all, ...each].join('; ') || '(none)';
}

function sameBackends(a: Side, b: Side): boolean {
  const eq = (x: readonly string[], y: readonly string[]): boolean => x.length === y.length && [...x].sort().every((v, i) => v === [...y].sort()[i]);
  return eq(a.backends, b.backends) && eq(a.terminating, b.terminating);
}

export function formatServiceList(fes: readonly FrontendStatus[]): string {
  // The PROBES column only when some service has a readiness probe (standalone mode).
  const probes = fes.some((f) => f.probes);
  const rows: string[][] = [['FRONTEND', 'SERVICE', 'BACKENDS (desired)', 'REALIZED', ...(probes ? ['PROBES'] : []), 'STATUS']];
  for (const f of fes) {
    const realized = f.desired && f.realized && sameBackends(f.desired, f.realized) ? '(same)' : backends(f.realized);
    const status = f.drift ? `DRIFT${f.details.length > 0 ? `: ${f.details.join('; ')}` : ''}` : 'ok';
    rows.push([f.frontend, f.service ?? '-', backends(f.desired), realized, ...(probes ? [probeColumn(f)] : []), status]);
  }
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)) + 2);
  return rows.map((r) => r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]!))).join('').trimEnd()).join('\n') + '\n';
}

export function driftCount(fes: readonly FrontendStatus[]): number {
  return fes.filter((f) => f.drift).length;
}

export interface ServiceListOptions {
  readonly apiSocket: string;
  readonly output?: string;
}

/** Prints the list; rejects (so lbctl exits 1) when a frontend drifts or the agent is unreachable. */
export async function serviceListCommand(opts: ServiceListOptions, write: (s: string) => void = (s) => void process.stdout.write(s)): Promise<void> {
  const fes = await apiGet<FrontendStatus[]>(opts.apiSocket, '/v1/services');
  write(opts.output === 'json' ? JSON.stringify(fes, null, 2) + '\n' : formatServiceList(fes));
  const n = driftCount(fes);
  if (n > 0) throw new LbError(`${n} frontend${n === 1 ? '' : 's'} drift${n === 1 ? 's' : ''} from the desired state`, 'EDRIFT');
}
