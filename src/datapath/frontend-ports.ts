// lb_np_ports: the ports frontends have, so the tc datapath skips the
// frontend lookup for a packet to any other port (LB_NP_F_PORTS; most of a
// node's traffic is no service's). A bit per port (bpf/include/lb_types.h);
// a port is marked before a frontend on it is written, and a bit whose last
// frontend went stays set until the next fill (an agent start): a set bit
// costs only the lookup the datapath would have made anyway.
import { lb4_key, lb6_key, u32, u64 } from './abi.gen.js';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { openPinnedMap, type FlatEntries } from '../native/bpf.js';

/** What FrontendPorts needs of a map (maps.ts's ByteMap fits; not imported: maps.ts imports this file). */
export interface PortsMap {
  readonly name: string;
  readonly keySize: number;
  readonly valueSize: number;
  readonly maxEntries: number;
  update(key: Buffer, value: Buffer): void;
  entries(): Array<[Buffer, Buffer]>;
  entriesFlat?(): FlatEntries;
}

const WORDS = 65536 / 64;

export class FrontendPorts {
  private readonly words = new BigUint64Array(WORDS);
  private filledOnce = false;

  constructor(private readonly map: PortsMap) {
    if (map.maxEntries !== WORDS || map.valueSize !== 8) throw new RangeError(`${map.name}: ${map.maxEntries} entries of ${map.valueSize} bytes, lbctl expects ${WORDS} of 8`);
  }

  /** True once fill() wrote every word: the datapath may trust the map (LB_NP_F_PORTS). */
  get filled(): boolean {
    return this.filledOnce;
  }

  /** Writes the whole map from the ports of every entry the services maps hold (any slot, scope and protocol). */
  fill(services: { readonly lb4_services: PortsMap; readonly lb6_services: PortsMap }): void {
    const next = new BigUint64Array(WORDS);
    const mark = (port: number): void => {
      next[port >>> 6]! |= 1n << BigInt(port & 63);
    };
    for (const [map, codec] of [[services.lb4_services, lb4_key], [services.lb6_services, lb6_key]] as const) {
      if (map.entriesFlat) {
        const { keys, count } = map.entriesFlat();
        for (let i = 0; i < count; i++) mark(codec.decode(keys, i * map.keySize).dport);
      } else {
        for (const [k] of map.entries()) mark(codec.decode(k).dport);
      }
    }
    for (let w = 0; w < WORDS; w++) {
      // Every word, even one that is 0 here: the map may hold an earlier agent's bits.
      this.map.update(u32.encode(w), u64.encode(next[w]!));
      this.words[w] = next[w]!;
    }
    this.filledOnce = true;
  }

  /** Marks `port` (before a frontend on it is written). */
  add(port: number): void {
    const w = port >>> 6;
    const bit = 1n << BigInt(port & 63);
    if ((this.words[w]! & bit) !== 0n) return;
    const word = this.words[w]! | bit;
    this.map.update(u32.encode(w), u64.encode(word));
    this.words[w] = word;
  }

  /** Whether `port` is marked (as the datapath reads it). */
  has(port: number): boolean {
    return (this.words[port >>> 6]! & (1n << BigInt(port & 63))) !== 0n;
  }
}

/** The lb_np_ports an earlier agent pinned under `mapsDir`, if there is one (its tc programs may still run and trust it). */
export function pinnedFrontendPorts(mapsDir: string): FrontendPorts | undefined {
  const pin = path.join(mapsDir, 'lb_np_ports');
  return existsSync(pin) ? new FrontendPorts(openPinnedMap(pin)) : undefined;
}
