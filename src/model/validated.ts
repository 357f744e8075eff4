// What validation answers, and how it quotes input: shared by the model's
// validators (k8s.ts, probe.ts). Pure.

export type Validated<T> = { ok: true; value: T } | { ok: false; reason: string };

/**
 * A value of the input, for a message: short whatever it is. Input is never
 * serialized whole into a reason (a hostile object may be megabytes, or an
 * alias graph that expands to billions of values).
 */
export function show(v: unknown): string {
  if (typeof v === 'string') return v.length > 64 ? `${JSON.stringify(v.slice(0, 64))}… (${v.length} characters)` : JSON.stringify(v);
  if (v === null || v === undefined || typeof v === 'number' || typeof v === 'boolean') return String(v);
  if (Array.isArray(v)) return `a list of ${v.length}`;
  return typeof v === 'object' ? 'an object' : typeof v;
}
