// Converting map entries between BTF layouts, field by field by name.
import t from 'tap';
import { converter, convertPerCpu, flatten } from '../../src/datapath/layout.js';
import type { TypeLayout } from '../../src/native/bpf.js';

const int = (name: string, size: number, signed = false): TypeLayout => ({ kind: 'int', name, size, signed });
const arr = (elem: TypeLayout, count: number): TypeLayout => ({ kind: 'array', name: '', size: elem.size * count, elem, count });
const struct = (name: string, size: number, members: Array<[string, number, TypeLayout, boolean?]>): TypeLayout => ({
  kind: 'struct', name, size,
  members: members.map(([n, offset, type, bitfield]) => (bitfield ? { name: n, offset, type, bitfield } : { name: n, offset, type })),
});

// struct lb4_backend and a reordered variant of it (same size).
const backend = struct('lb4_backend', 8, [['address', 0, int('__be32', 4)], ['port', 4, int('__be16', 2)], ['proto', 6, int('__u8', 1)], ['state', 7, int('__u8', 1)]]);
const reordered = struct('lb4_backend', 8, [['state', 0, int('__u8', 1)], ['proto', 1, int('__u8', 1)], ['port', 2, int('__be16', 2)], ['address', 4, int('__be32', 4)]]);

t.test('flatten names nested fields and array elements, and leaves pads out', async (t) => {
  const key = struct('k', 24, [['address', 0, arr(int('__be32', 4), 4)], ['inner', 16, struct('i', 4, [['port', 0, int('__be16', 2)], ['pad', 2, arr(int('__u8', 1), 2)]])], ['__pad1', 20, int('__u32', 4)]]);
  t.same(flatten(key, 'k').map((l) => [l.path, l.offset, l.size, l.bigEndian]), [
    ['address[0]', 0, 4, true], ['address[1]', 4, 4, true], ['address[2]', 8, 4, true], ['address[3]', 12, 4, true], ['inner.port', 16, 2, true],
  ]);
});

t.test('identical layouts copy bytes as they are', async (t) => {
  const c = converter(backend, structuredClone(backend), 'map lb4_backends value');
  t.ok(c.identical);
  const b = Buffer.from('0a000001', 'hex');
  const v = Buffer.concat([b, Buffer.from([0x1f, 0x90, 6, 0])]);
  t.same(c.convert(v), v);
});

t.test('a reordered struct moves every field to its new place', async (t) => {
  const c = converter(reordered, backend, 'map lb4_backends value');
  t.notOk(c.identical, 'same size, other layout: not identical');
  const old = Buffer.from([2, 6, 0x1f, 0x90, 10, 0, 0, 1]);
  t.same(c.convert(old), Buffer.from([10, 0, 0, 1, 0x1f, 0x90, 6, 2]));
  t.same(converter(backend, reordered, 'x').convert(Buffer.from([10, 0, 0, 1, 0x1f, 0x90, 6, 2])), old, 'and back');
});

t.test('widening, narrowing when the value fits, dropped and new fields', async (t) => {
  const from = struct('s', 12, [['count', 0, int('__u32', 4)], ['weight', 4, int('__u32', 4)], ['delta', 8, int('__s16', 2, true)]]);
  const to = struct('s', 12, [['count', 0, int('__u16', 2)], ['delta', 4, int('__s32', 4, true)], ['fresh', 8, int('__u32', 4)]]);
  const c = converter(from, to, 'map m value');
  t.same(c.dropped, ['weight']);
  t.same(c.added, ['fresh']);
  const v = Buffer.alloc(12);
  v.writeUInt32LE(300, 0);
  v.writeUInt32LE(7, 4);
  v.writeInt16LE(-2, 8);
  const out = c.convert(v);
  t.equal(out.readUInt16LE(0), 300, 'narrowed, the value fits');
  t.equal(out.readInt32LE(4), -2, 'widened with the sign');
  t.equal(out.readUInt32LE(8), 0, 'a new field is zero');
  v.writeUInt32LE(70000, 0);
  t.throws(() => c.convert(v), { code: 'ECONFIG', message: /map m value field count: value 0x00011170 does not fit in 2 bytes/ });
  t.throws(() => c.convert(Buffer.alloc(3)), { message: /map m value: an entry of 3 bytes, expected 12/ });
});

t.test('changes a copy cannot keep the meaning of are refused, naming the map and the field', async (t) => {
  const one = (type: TypeLayout): TypeLayout => struct('s', 4, [['port', 0, type]]);
  t.throws(() => converter(one(int('__be16', 2)), one(int('__u16', 2)), 'map m key'), { code: 'ECONFIG', message: /map m key field port: byte order changed/ });
  t.throws(() => converter(one(int('__be16', 2)), one(int('__be32', 4)), 'map m key'), { message: /field port: a network-order integer changed width/ });
  t.throws(() => converter(one(int('__u32', 4)), one(int('__s32', 4, true)), 'map m key'), { message: /field port: signedness changed/ });
  t.throws(() => converter(one(int('__u32', 4)), one(struct('p', 4, [['x', 0, int('__u32', 4)]])), 'map m key'), { message: /field port: was an integer, is a composite/ });
  t.throws(() => converter(int('__u32', 4), struct('k', 4, [['id', 0, int('__u32', 4)]]), 'map m key'), { message: /map m key: was an integer, is a composite/ });
  t.throws(() => converter(struct('s', 4, [['flags', 0, int('__u32', 4), true]]), one(int('__u32', 4)), 'map m value'), { message: /map m value: field flags is a bitfield/ });
  const u = (size: number): TypeLayout => struct('s', size, [['u', 0, { kind: 'union', name: 'u', size, members: [] }]]);
  t.throws(() => converter(u(4), u(8), 'map m value'), { message: /field u: its type changed/ });
  t.ok(converter(u(4), u(4), 'map m value').identical, 'an unchanged union is copied');
});

t.test('plain integer keys and per-CPU values', async (t) => {
  t.ok(converter(int('__u32', 4), int('__u32', 4), 'k').identical);
  const c = converter(int('__u32', 4), int('__u64', 8), 'map lb_metrics value');
  const buf = Buffer.alloc(16);
  buf.writeUInt32LE(5, 0);
  buf.writeUInt32LE(9, 8);
  const out = convertPerCpu(c, buf, 2);
  t.equal(out.length, 16);
  t.equal(out.readBigUInt64LE(0), 5n);
  t.equal(out.readBigUInt64LE(8), 9n);
});
