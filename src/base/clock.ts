// Timers behind an interface, so that the agent's schedulers (the sync
// runner, the health mesh, the backend prober) run on a fake clock in tests
// with no sleeps. Two real clocks: a monotonic one for intervals only, and
// the wall clock where the times are also shown (last probe, last success).

export interface Clock {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

const unrefTimeout = (f: () => void, ms: number): unknown => {
  const h = setTimeout(f, ms);
  h.unref?.();
  return h;
};
const clear = (h: unknown): void => clearTimeout(h as NodeJS.Timeout);

/** Monotonic milliseconds (performance.now): intervals that a change of the wall clock must not bend. */
export const systemClock: Clock = { now: () => performance.now(), setTimeout: unrefTimeout, clearTimeout: clear };

/** Epoch milliseconds (Date.now): times that are also reported. */
export const wallClock: Clock = { now: () => Date.now(), setTimeout: unrefTimeout, clearTimeout: clear };
