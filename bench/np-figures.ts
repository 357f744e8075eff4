// The tc datapath's per-packet figures (bench/nodeport-tc.ts), as its
// report and bench/record.ts both compute them: ns over the empty tc
// program, and issue 37's targets for them. No side effects: record.ts
// imports it without running the bench.

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
