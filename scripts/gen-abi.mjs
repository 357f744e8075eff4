#!/usr/bin/env node
// Generates src/datapath/abi.gen.ts from the BTF of compiled BPF objects:
// every map in a `.maps` section (type, flags, default size, key and value
// types), the layout of each struct those maps use (offset, size, byte order
// per field) and every enum. Prints to stdout; `make gen` writes the file and
// `make check-gen` fails the build when the checked-in copy differs.
//
// Usage: node scripts/gen-abi.mjs [--bpftool PATH] OBJ...
import { execFileSync } from 'node:child_process';
import path from 'node:path';

const args = process.argv.slice(2);
let bpftool = 'bpftool';
const objs = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--bpftool') bpftool = args[++i];
  else objs.push(args[i]);
}
if (objs.length === 0) {
  console.error('usage: gen-abi.mjs [--bpftool PATH] OBJ...');
  process.exit(2);
}

const MAP_TYPES = {
  1: 'HASH', 2: 'ARRAY', 5: 'PERCPU_HASH', 6: 'PERCPU_ARRAY', 9: 'LRU_HASH', 10: 'LRU_PERCPU_HASH',
  11: 'LPM_TRIE', 12: 'ARRAY_OF_MAPS', 13: 'HASH_OF_MAPS', 24: 'SK_STORAGE', 27: 'RINGBUF',
};

const camel = (s) => s.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
const pascal = (s) => camel(s).replace(/^./, (c) => c.toUpperCase());

function loadBtf(obj) {
  const out = execFileSync(bpftool, ['btf', 'dump', 'file', obj, '-j'], { encoding: 'utf8' });
  const types = new Map();
  for (const t of JSON.parse(out).types) types.set(t.id, t);
  return types;
}

/** Resolve a type to a field description, following typedefs; __be* typedefs mean network order. */
function describe(types, id) {
  let bigEndian = false;
  let t = types.get(id);
  for (;;) {
    if (t.kind === 'TYPEDEF') {
      if (t.name.startsWith('__be')) bigEndian = true;
      t = types.get(t.type_id);
    } else if (t.kind === 'VOLATILE' || t.kind === 'CONST') {
      t = types.get(t.type_id);
    } else break;
  }
  if (t.kind === 'INT' || t.kind === 'ENUM') {
    const size = t.size;
    if (![1, 2, 4, 8].includes(size)) throw new Error(`unsupported int size ${size}`);
    return { kind: 'scalar', size, bigEndian: bigEndian && size > 1 };
  }
  if (t.kind === 'ARRAY') {
    const elem = describe(types, t.type_id);
    return { kind: 'bytes', size: elem.size * t.nr_elems };
  }
  if (t.kind === 'STRUCT') return { kind: 'struct', size: t.size, name: t.name, type: t };
  throw new Error(`unsupported BTF kind ${t.kind} (${t.name})`);
}

const structs = new Map(); // name -> { name, size, fields }
const enums = new Map();
// The kernel's own enums an object names only to ask the running kernel
// about (CO-RE: bpf/lib/np.h's np_now() asks for a helper by its id): not
// the agent's ABI.
const KERNEL_ENUMS = new Set(['bpf_func_id']);
const maps = new Map();

function addStruct(types, t) {
  if (t.name === '(anon)' || !t.name) throw new Error('anonymous struct in a map key/value');
  const fields = t.members.map((m) => {
    if (m.bits_offset % 8 !== 0 || m.bitfield_size) throw new Error(`${t.name}.${m.name}: bitfields are not allowed in the ABI`);
    const d = describe(types, m.type_id);
    if (d.kind === 'struct') throw new Error(`${t.name}.${m.name}: nested structs are not supported`);
    return { name: m.name, offset: m.bits_offset / 8, ...d };
  });
  const prev = structs.get(t.name);
  const def = { name: t.name, size: t.size, fields };
  if (prev && JSON.stringify(prev) !== JSON.stringify(def)) throw new Error(`struct ${t.name} differs between objects`);
  structs.set(t.name, def);
  return t.name;
}

function codecFor(types, ptrId) {
  const ptr = types.get(ptrId);
  const d = describe(types, ptr.type_id);
  if (d.kind === 'struct') return { struct: addStruct(types, d.type), size: d.size };
  if (d.kind === 'scalar') return { scalar: `${d.bigEndian ? 'be' : 'u'}${d.size * 8}`, size: d.size };
  throw new Error('unsupported map key/value type');
}

function intOf(types, ptrId) {
  return types.get(types.get(ptrId).type_id).nr_elems;
}

/** The inner map of `__array(values, struct { __uint(...) ... })`: sizes given by __uint, never __type. */
function innerOf(types, arrayId, outer) {
  const arr = types.get(arrayId);
  const ptr = arr?.kind === 'ARRAY' ? types.get(arr.type_id) : undefined;
  const def = ptr?.kind === 'PTR' ? types.get(ptr.type_id) : undefined;
  if (def?.kind !== 'STRUCT') throw new Error(`map ${outer}: values is not an array of pointers to a map definition`);
  const m = Object.fromEntries(def.members.map((x) => [x.name, x.type_id]));
  for (const f of ['type', 'key_size', 'value_size', 'max_entries']) {
    if (m[f] === undefined) throw new Error(`map ${outer}: its inner map must declare ${f} with __uint`);
  }
  return {
    type: intOf(types, m.type),
    keySize: intOf(types, m.key_size),
    valueSize: intOf(types, m.value_size),
    maxEntries: intOf(types, m.max_entries),
    flags: m.map_flags ? intOf(types, m.map_flags) : 0,
  };
}

for (const obj of objs) {
  const types = loadBtf(obj);
  for (const t of types.values()) {
    if (t.kind === 'ENUM' && t.name && t.name !== '(anon)' && !KERNEL_ENUMS.has(t.name)) {
      enums.set(t.name, t.values.map((v) => [v.name, v.val]));
    }
    if (t.kind !== 'DATASEC' || t.name !== '.maps') continue;
    for (const v of t.vars) {
      const variable = types.get(v.type_id);
      const def = types.get(variable.type_id);
      const m = Object.fromEntries(def.members.map((x) => [x.name, x.type_id]));
      const entry = {
        name: variable.name,
        type: intOf(types, m.type),
        key: codecFor(types, m.key),
        value: codecFor(types, m.value),
        maxEntries: intOf(types, m.max_entries),
        flags: m.map_flags ? intOf(types, m.map_flags) : 0,
        object: path.basename(obj),
      };
      // A map of maps (__array(values, struct {...})): its inner map's
      // definition, which user space creates (bpf_map_create) and puts in
      // the outer map by fd. Lookups of the outer map give the inner's id.
      if (m.values !== undefined) entry.inner = innerOf(types, m.values, variable.name);
      const prev = maps.get(entry.name);
      if (prev && JSON.stringify({ ...prev, object: '' }) !== JSON.stringify({ ...entry, object: '' })) {
        throw new Error(`map ${entry.name} is defined differently in ${prev.object} and ${entry.object}`);
      }
      if (!prev) maps.set(entry.name, entry);
    }
  }
}

/**
 * A field read as byte arithmetic on the buffer (its bounds checked once per
 * struct by decode, not per field as Buffer's read methods do).
 */
function readExpr(f) {
  if (f.kind === 'bytes') return `Buffer.from(b.subarray(o + ${f.offset}, o + ${f.offset + f.size}))`;
  if (f.size === 8) return `b.readBigUInt64LE(o + ${f.offset})`;
  const at = (i) => `b[o + ${f.offset + i}]!`;
  // The byte that holds bits 8i..8i+7 of the value.
  const byte = (i) => at(f.bigEndian ? f.size - 1 - i : i);
  if (f.size === 1) return at(0);
  if (f.size === 2) return `(${byte(0)} | (${byte(1)} << 8))`;
  return `((${byte(0)} | (${byte(1)} << 8) | (${byte(2)} << 16) | (${byte(3)} << 24)) >>> 0)`;
}
/**
 * A field written as byte stores, after a range check of its value (as
 * Buffer's write methods check; NaN is refused too). The struct's bounds are
 * checked once by encode.
 */
function writeStmt(f, v, structName) {
  if (f.kind === 'bytes') return `putBytes(b, o + ${f.offset}, ${f.size}, ${v}, '${f.name}');`;
  if (f.size === 8) return `b.writeBigUInt64LE(${v}, o + ${f.offset});`;
  const max = 2 ** (8 * f.size) - 1;
  const at = (i) => `b[o + ${f.offset + i}]`;
  const byte = (i) => at(f.bigEndian ? f.size - 1 - i : i);
  const out = [`{ const x = ${v}; if (!(x >= 0 && x <= ${max})) throw outOfRange('${structName}.${f.name}', x, ${max});`];
  for (let i = 0; i < f.size; i++) out.push(`${byte(i)} = ${i === 0 ? 'x' : `x >>> ${8 * i}`};`);
  return `${out.join(' ')} }`;
}
/** Byte ranges [from, to) of struct s that none of `fields` covers. */
function uncovered(s, fields) {
  const covered = new Array(s.size).fill(false);
  for (const f of fields) for (let i = f.offset; i < f.offset + f.size; i++) covered[i] = true;
  const out = [];
  for (let i = 0; i < s.size; ) {
    if (covered[i]) {
      i++;
      continue;
    }
    let j = i;
    while (j < s.size && !covered[j]) j++;
    out.push([i, j]);
    i = j;
  }
  return out;
}
function zeroStmt(from, to) {
  if (to - from > 8) return `b.fill(0, o + ${from}, o + ${to});`;
  const out = [];
  for (let i = from; i < to; i++) out.push(`b[o + ${i}] = 0;`);
  return out.join(' ');
}
const tsType = (f) => (f.kind === 'bytes' ? 'Buffer' : f.size === 8 ? 'bigint' : 'number');
const isPad = (f) => /^pad\d*$/.test(f.name);

const lines = [];
const emit = (s = '') => lines.push(s);
emit('// Code generated by scripts/gen-abi.mjs from the BTF of');
emit(`// ${objs.map((o) => path.basename(o)).join(', ')} (bpf/include/lb_types.h, bpf/include/lb_maps.h).`);
emit('// DO NOT EDIT: run `make gen`. `make check-gen` fails the build when this file is stale.');
emit('// Integers without a __be type are host order; this assumes a little-endian host (x86_64, arm64).');
emit('/* eslint-disable */');
emit('');
emit('export interface Codec<T> {');
emit('  readonly name: string;');
emit('  readonly size: number;');
emit('  encode(v: T, b?: Buffer, o?: number): Buffer;');
emit('  decode(b: Buffer, o?: number): T;');
emit('}');
emit('');
emit('function outOfRange(field: string, v: number, max: number): RangeError {');
emit('  return new RangeError(`${field}: ${v} is out of range [0, ${max}]`);');
emit('}');
emit('');
emit('function putBytes(b: Buffer, o: number, size: number, v: Buffer, field: string): void {');
emit('  if (v.length !== size) throw new RangeError(`${field}: expected ${size} bytes, got ${v.length}`);');
emit('  v.copy(b, o);');
emit('}');
emit('');
for (const [bits, size, bigEndian] of [
  ['u8', 1, false],
  ['u16', 2, false],
  ['u32', 4, false],
  ['be16', 2, true],
  ['be32', 4, true],
]) {
  const f = { kind: 'scalar', name: 'value', offset: 0, size, bigEndian };
  const bounds = `if (!(o >= 0 && o + ${size} <= b.length)) throw new RangeError(\`${bits}: ${size} bytes at offset \${o} of \${b.length}\`);`;
  emit(`export const ${bits}: Codec<number> = {`);
  emit(`  name: '${bits}',`);
  emit(`  size: ${size},`);
  emit(`  encode(v, b = Buffer.alloc(${size}), o = 0) {`);
  emit(`    ${bounds}`);
  emit(`    ${writeStmt(f, 'v', bits)}`);
  emit('    return b;');
  emit('  },');
  emit('  decode(b, o = 0) {');
  emit(`    ${bounds}`);
  emit(`    return ${readExpr(f)};`);
  emit('  },');
  emit('};');
  emit('');
}
emit('export const u64: Codec<bigint> = {');
emit("  name: 'u64',");
emit('  size: 8,');
emit('  encode(v, b = Buffer.alloc(8), o = 0) { b.writeBigUInt64LE(v, o); return b; },');
emit('  decode(b, o = 0) { return b.readBigUInt64LE(o); },');
emit('};');
emit('');

for (const s of [...structs.values()].sort((a, b) => a.name.localeCompare(b.name))) {
  const T = pascal(s.name);
  const fields = s.fields.filter((f) => !isPad(f));
  emit(`/** struct ${s.name} (${s.size} bytes) */`);
  emit(`export interface ${T} {`);
  for (const f of fields) emit(`  ${camel(f.name)}: ${tsType(f)};${f.bigEndian ? ' // network order in the map' : ''}`);
  emit('}');
  emit('');
  emit(`export const ${s.name}: Codec<${T}> = {`);
  emit(`  name: '${s.name}',`);
  emit(`  size: ${s.size},`);
  emit(`  encode(v, b = Buffer.alloc(${s.size}), o = 0) {`);
  // Every field's bytes are written; only the bytes no field covers (pad
  // fields, holes, tail padding) are zeroed, so a reused buffer holds no stale
  // bytes. Cheaper than a fill over the whole struct, on every map write.
  emit(`    if (!(o >= 0 && o + ${s.size} <= b.length)) throw new RangeError(\`${s.name}: ${s.size} bytes at offset \${o} of \${b.length}\`);`);
  for (const [from, to] of uncovered(s, fields)) emit(`    ${zeroStmt(from, to)}`);
  for (const f of fields) emit(`    ${writeStmt(f, `v.${camel(f.name)}`, s.name)}`);
  emit('    return b;');
  emit('  },');
  emit('  decode(b, o = 0) {');
  emit(`    if (!(o >= 0 && o + ${s.size} <= b.length)) throw new RangeError(\`${s.name}: ${s.size} bytes at offset \${o} of \${b.length}\`);`);
  emit('    return {');
  for (const f of fields) emit(`      ${camel(f.name)}: ${readExpr(f)},`);
  emit('    };');
  emit('  },');
  emit('};');
  emit('');
}

for (const [name, values] of [...enums.entries()].sort((a, b) => a[0].localeCompare(b[0]))) {
  emit(`/** enum ${name} */`);
  emit(`export const ${pascal(name)} = {`);
  for (const [k, v] of values) emit(`  ${k}: ${v},`);
  emit('} as const;');
  emit('');
}

emit('export const MapType = {');
for (const [k, v] of Object.entries(MAP_TYPES)) emit(`  ${v}: ${k},`);
emit('} as const;');
emit('');
emit('export interface MapSpec<K, V> {');
emit('  readonly name: string;');
emit('  readonly type: number;');
emit('  readonly flags: number;');
emit('  readonly maxEntries: number;');
emit('  readonly key: Codec<K>;');
emit('  readonly value: Codec<V>;');
emit('  readonly object: string;');
emit('  /** A map of maps: the inner map user space creates (the outer value is its fd on update, its id on lookup). */');
emit('  readonly inner?: InnerMapSpec;');
emit('}');
emit('');
emit('export interface InnerMapSpec {');
emit('  readonly type: number;');
emit('  readonly keySize: number;');
emit('  readonly valueSize: number;');
emit('  /** The template\'s size; with BPF_F_INNER_MAP in flags, inner maps may have any size. */');
emit('  readonly maxEntries: number;');
emit('  readonly flags: number;');
emit('}');
emit('');
const codecName = (c) => c.struct ?? c.scalar;
const codecType = (c) => (c.struct ? pascal(c.struct) : c.scalar === 'u64' ? 'bigint' : 'number');
emit('/** Every map of the datapath, with the defaults compiled into the object. */');
emit('export const mapSpecs = {');
for (const m of [...maps.values()].sort((a, b) => a.name.localeCompare(b.name))) {
  emit(`  ${m.name}: {`);
  emit(`    name: '${m.name}',`);
  emit(`    type: MapType.${MAP_TYPES[m.type] ?? m.type},`);
  emit(`    flags: ${m.flags},`);
  emit(`    maxEntries: ${m.maxEntries},`);
  emit(`    key: ${codecName(m.key)},`);
  emit(`    value: ${codecName(m.value)},`);
  emit(`    object: '${m.object}',`);
  if (m.inner) emit(`    inner: { type: MapType.${MAP_TYPES[m.inner.type] ?? m.inner.type}, keySize: ${m.inner.keySize}, valueSize: ${m.inner.valueSize}, maxEntries: ${m.inner.maxEntries}, flags: ${m.inner.flags} },`);
  emit(`  } as MapSpec<${codecType(m.key)}, ${codecType(m.value)}>,`);
}
emit('} as const;');
emit('');
emit('export type MapName = keyof typeof mapSpecs;');
process.stdout.write(lines.join('\n') + '\n');
