// Flag values issue 14's agent options take, parsed and checked before
// anything starts: a bad value refuses the start, naming the flag.
import { ConfigError } from '../base/errors.js';
import type { PortRange } from '../model/north-south.js';

const isPort = (v: number): boolean => Number.isInteger(v) && v >= 1 && v <= 65535;

/** A --nodeport-range or --snat-port-range value ("30000-32767"); throws naming the flag. */
export function parsePortRange(flag: string, text: string): PortRange {
  const m = /^\s*(\d{1,5})\s*-\s*(\d{1,5})\s*$/.exec(text);
  const first = Number(m?.[1]);
  const last = Number(m?.[2]);
  if (!m || !isPort(first) || !isPort(last) || first > last) throw new ConfigError(`${flag} ${JSON.stringify(text)}: expected FIRST-LAST, two ports with FIRST <= LAST (such as 30000-32767)`);
  return { first, last };
}

/** The start is refused when two port ranges overlap, naming both flags. */
export function checkDisjoint(a: { flag: string; range: PortRange }, b: { flag: string; range: PortRange }): void {
  if (a.range.first <= b.range.last && b.range.first <= a.range.last) {
    throw new ConfigError(`${a.flag} ${a.range.first}-${a.range.last} overlaps ${b.flag} ${b.range.first}-${b.range.last}: they must not share a port`);
  }
}
