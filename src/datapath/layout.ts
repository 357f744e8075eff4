// Converting map entries from one key or value layout to another, by field
// name, from the BTF layouts of the pinned map and of the new object's map.
// Pure: buffers in, buffers out. The loader uses it when an upgrade changes
// a map's layout, the way it copies a resized map.
//
// Rules, per field of the new layout (fields are named by their path:
// `backend.port`, `address[2]`):
//   - a field of the same name in the old layout is copied; an integer may
//     widen (zero-extended, sign-extended if signed; host order is little
//     endian) or narrow when the value fits (checked per entry);
//   - a field the old layout lacks is zero;
//   - an old field the new layout lacks is dropped;
//   - `pad` fields are never copied (the new ones are zero);
// and a field whose meaning a copy cannot keep is an error naming the map and
// the field, found before any entry moves: a change of byte order (`__be16`
// against `__u16`), of signedness, of kind (an integer that became a
// struct), a network-order integer that changes width, a bitfield, or a
// union or opaque type that is not the same on both sides.
import { ConfigError } from '../base/errors.js';
import type { TypeLayout } from '../native/bpf.js';

interface Leaf {
  readonly path: string;
  readonly offset: number;
  readonly size: number;
  /** int: an integer or enum; bytes: a union or a type BTF does not describe field by field. */
  readonly kind: 'int' | 'bytes';
  readonly signed: boolean;
  /** A network-order typedef (__be16, __be32, __be64). */
  readonly bigEndian: boolean;
  /** For bytes: what the bytes are (the type's name and its shape). */
  readonly shape: string;
}

const isPad = (name: string): boolean => /^_*pad/.test(name);

function shapeOf(t: TypeLayout): string {
  return JSON.stringify(t);
}

/** The fields of a type, flattened to the integers (and opaque blobs) it is made of. */
export function flatten(t: TypeLayout, what: string, prefix = '', base = 0): Leaf[] {
  switch (t.kind) {
    case 'int':
    case 'enum':
      return [{ path: prefix, offset: base, size: t.size, kind: 'int', signed: t.signed ?? false, bigEndian: /^__be\d+$/.test(t.name), shape: '' }];
    case 'struct': {
      const out: Leaf[] = [];
      for (const m of t.members ?? []) {
        const p = m.name === '' ? prefix : prefix ? `${prefix}.${m.name}` : m.name;
        if (m.bitfield) throw new ConfigError(`${what}: field ${p || '(anonymous)'} is a bitfield; lbctl cannot convert bitfields`);
        if (isPad(m.name)) continue;
        out.push(...flatten(m.type, what, p, base + m.offset));
      }
      return out;
    }
    case 'array': {
      const out: Leaf[] = [];
      const elem = t.elem!;
      for (let i = 0; i < (t.count ?? 0); i++) out.push(...flatten(elem, what, `${prefix}[${i}]`, base + i * elem.size));
      return out;
    }
    default:
      return [{ path: prefix, offset: base, size: t.size, kind: 'bytes', signed: false, bigEndian: false, shape: shapeOf(t) }];
  }
}

type Step = (from: Buffer, to: Buffer) => void;

export interface Converter {
  /** The two layouts are the same field for field: entries are copied as they are. */
  readonly identical: boolean;
  readonly fromSize: number;
  readonly toSize: number;
  /** The old fields the new layout drops, and the new fields that start at zero. */
  readonly dropped: readonly string[];
  readonly added: readonly string[];
  /** One entry (fromSize bytes) in the new layout (toSize bytes); throws when a narrowed value does not fit. */
  convert(from: Buffer): Buffer;
}

function sameLeaves(a: readonly Leaf[], b: readonly Leaf[]): boolean {
  return a.length === b.length && a.every((x, i) => JSON.stringify(x) === JSON.stringify(b[i]));
}

/**
 * How to carry an entry of layout `from` into layout `to`; `what` names the
 * map and the part ("map lb4_backends value") in every error.
 */
export function converter(from: TypeLayout, to: TypeLayout, what: string): Converter {
  const old = flatten(from, what);
  const neu = flatten(to, what);
  const byPath = new Map(old.map((l) => [l.path, l]));
  const identical = from.size === to.size && sameLeaves(old, neu);
  const steps: Step[] = [];
  const added: string[] = [];
  const field = (p: string): string => (p === '' ? '' : ` field ${p}`);
  for (const n of neu) {
    const o = byPath.get(n.path);
    const where = `${what}${field(n.path)}`;
    if (!o) {
      // An integer that became a struct or an array (or the reverse) is not a new field.
      const clash = old.find((l) => l.path === '' || n.path === '' || n.path.startsWith(`${l.path}.`) || n.path.startsWith(`${l.path}[`) || l.path.startsWith(`${n.path}.`) || l.path.startsWith(`${n.path}[`));
      if (clash) {
        const [a, b] = clash.path.length < n.path.length ? [clash.path, 'a composite'] : [n.path, 'an integer'];
        throw new ConfigError(`${what}${field(a)}: was ${b === 'a composite' ? 'an integer' : 'a composite'}, is ${b}: cannot convert`);
      }
      added.push(n.path);
      continue;
    }
    if (o.kind !== n.kind) throw new ConfigError(`${where}: was ${o.kind === 'int' ? 'an integer' : 'a composite'}, is ${n.kind === 'int' ? 'an integer' : 'a composite'}: cannot convert`);
    if (n.kind === 'bytes') {
      if (o.shape !== n.shape) throw new ConfigError(`${where}: its type changed and lbctl cannot convert it field by field`);
      steps.push((f, t) => f.copy(t, n.offset, o.offset, o.offset + o.size));
      continue;
    }
    if (o.bigEndian !== n.bigEndian) throw new ConfigError(`${where}: byte order changed (${o.bigEndian ? 'network' : 'host'} to ${n.bigEndian ? 'network' : 'host'} order): cannot convert`);
    if (o.signed !== n.signed) throw new ConfigError(`${where}: signedness changed: cannot convert`);
    if (o.size === n.size) {
      steps.push((f, t) => f.copy(t, n.offset, o.offset, o.offset + o.size));
      continue;
    }
    if (n.bigEndian) throw new ConfigError(`${where}: a network-order integer changed width (${o.size} to ${n.size} bytes): cannot convert`);
    if (n.size > o.size) {
      // Little endian: the low bytes first, then zeros (or the sign).
      steps.push((f, t) => {
        f.copy(t, n.offset, o.offset, o.offset + o.size);
        const negative = n.signed && (f[o.offset + o.size - 1]! & 0x80) !== 0;
        t.fill(negative ? 0xff : 0, n.offset + o.size, n.offset + n.size);
      });
      continue;
    }
    steps.push((f, t) => {
      // Narrowing: the dropped high bytes must be what the sign (or zero) extends to.
      const top = f[o.offset + n.size - 1]!;
      const fill = n.signed && (top & 0x80) !== 0 ? 0xff : 0;
      for (let i = o.offset + n.size; i < o.offset + o.size; i++) {
        if (f[i] !== fill) {
          throw new ConfigError(`${where}: value 0x${Buffer.from(f.subarray(o.offset, o.offset + o.size)).reverse().toString('hex')} does not fit in ${n.size} bytes`);
        }
      }
      f.copy(t, n.offset, o.offset, o.offset + n.size);
    });
  }
  const kept = new Set(neu.map((l) => l.path));
  const dropped = old.filter((l) => !kept.has(l.path)).map((l) => l.path);
  return {
    identical,
    fromSize: from.size,
    toSize: to.size,
    dropped,
    added,
    convert(f: Buffer): Buffer {
      if (f.length !== from.size) throw new ConfigError(`${what}: an entry of ${f.length} bytes, expected ${from.size}`);
      if (identical) return Buffer.from(f);
      const t = Buffer.alloc(to.size);
      for (const s of steps) s(f, t);
      return t;
    },
  };
}

/** Converts a per-CPU value buffer (one slot of roundup(size, 8) bytes per CPU). */
export function convertPerCpu(c: Converter, buf: Buffer, cpus: number): Buffer {
  const fromSlot = Math.ceil(c.fromSize / 8) * 8;
  const toSlot = Math.ceil(c.toSize / 8) * 8;
  const out = Buffer.alloc(toSlot * cpus);
  for (let i = 0; i < cpus; i++) c.convert(buf.subarray(i * fromSlot, i * fromSlot + c.fromSize)).copy(out, i * toSlot);
  return out;
}
