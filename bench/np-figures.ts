// The NodePort benches' figures as their reports and bench/record.ts both
// compute them: the tc datapath's ns over the empty tc program and issue
// 37's targets for them (bench/nodeport-tc.ts), and end to end, the ratios
// over the routed pod measured beside each mode (bench/nodeport-e2e.ts).
// No side effects: record.ts imports it without running the benches.
import type { E2eResults } from './nodeport-e2e.js';

/** Targets (issue 37): ns per packet over an empty program, at every N from 1 to 100,000 services. */
export const TARGET_NS: Readonly<Record<string, number>> = { a: 40, b: 250, c: 250, d: 150, d_egress: 150 };

const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

/** A case's ns per packet over the empty program (the header wrapper's cost, where it has one, included). */
export function overEmpty(p: { samples: Record<string, number[]> }, id: string): number {
  return median(p.samples[id]!) - median(p.samples.empty!);
}

/** The header save/restore wrapper's own cost over the empty program (in (b)-(d')'s figures). */
export function wrapperCost(p: { samples: Record<string, number[]> }): number {
  return overEmpty(p, 'wrapped');
}

/**
 * `mode`'s ratios over the routed pod at N to one pod, every round of every
 * repetition (each measured beside the floor); the routed pod's own: 1.
 */
export function pairedRatios(r: E2eResults, mode: string, n: number, target: 'local' | 'remote', what: 'rps' | 'p50'): number[] {
  if (mode === 'routed') return [1];
  return r.points.filter((p) => p.mode === mode && p.n === n).flatMap((p) => (p.rounds ?? []).map((x) => x[target][what]));
}

