import t from 'tap';
import { lb4_key, lb4_sock_revnat, lb6_key, lb6_sock_key, lb6_sock_revnat, lb_affinity_key, lb_service, mapSpecs, u32 } from '../../src/datapath/abi.gen.js';
import * as abi from '../../src/datapath/abi.gen.js';

t.test('lb4_key encodes network-order address and port, host-order slot, the scope in the byte after proto', async (t) => {
  const b = lb4_key.encode({ address: 0x0a60000a, dport: 53, backendSlot: 2, proto: 17, scope: 0 });
  t.equal(b.length, 12);
  t.same([...b], [10, 96, 0, 10, 0, 53, 2, 0, 17, 0, 0, 0], 'the external scope is 0: the bytes of a key written before scopes existed');
  t.same(lb4_key.decode(b), { address: 0x0a60000a, dport: 53, backendSlot: 2, proto: 17, scope: 0 });
  const internal = lb4_key.encode({ address: 0, dport: 30080, backendSlot: 0, proto: 6, scope: abi.LbScope.LB_SCOPE_INT });
  t.same([...internal], [0, 0, 0, 0, 0x75, 0x80, 0, 0, 6, 1, 0, 0]);
  t.equal(lb4_key.decode(internal).scope, 1);
  const v6 = { address: Buffer.alloc(16), dport: 30080, backendSlot: 3, proto: 17, scope: 1 };
  t.same(lb6_key.decode(lb6_key.encode(v6)), v6);
  t.equal(lb6_key.encode(v6)[21], 1, 'lb6_key: scope at byte 21');
});

t.test('lb_service round-trips every field', async (t) => {
  const v = { backendId: 0xdeadbeef, count: 3, qcount: 1, revNatIndex: 0xfffffffe, type: 1, flags: 4, affinityTimeout: 10800 };
  t.equal(lb_service.size, 20);
  t.same(lb_service.decode(lb_service.encode(v)), v);
});

t.test('rev-NAT ids are 32 bits wherever they are stored', async (t) => {
  const id = 100_000; // above what 16 bits hold
  t.equal(mapSpecs.lb4_reverse_nat.key, u32);
  t.equal(mapSpecs.lb6_reverse_nat.key, u32);
  t.equal(lb_service.decode(lb_service.encode({ backendId: 0, count: 1, qcount: 0, revNatIndex: id, type: 1, flags: 0, affinityTimeout: 0 })).revNatIndex, id);
  const v4 = { address: 0x0a60000a, port: 53, revNatIndex: id };
  t.same(lb4_sock_revnat.decode(lb4_sock_revnat.encode(v4)), v4);
  const v6 = { address: Buffer.alloc(16, 1), port: 53, revNatIndex: id };
  t.same(lb6_sock_revnat.decode(lb6_sock_revnat.encode(v6)), v6);
  const k = { netnsCookie: 7n, revNatIndex: id, family: 4 };
  t.same(lb_affinity_key.decode(lb_affinity_key.encode(k)), k);
});

t.test('arrays are raw bytes and refuse a wrong length', async (t) => {
  const addr = Buffer.from('fd000000000000000000000000000010', 'hex');
  const k = { cookie: 123n, address: addr, port: 443 };
  const b = lb6_sock_key.encode(k);
  t.equal(b.length, 32);
  t.same(lb6_sock_key.decode(b), k);
  t.throws(() => lb6_sock_key.encode({ ...k, address: Buffer.alloc(4) }), /expected 16 bytes/);
});

t.test('map specs name their codecs and the compiled defaults', async (t) => {
  t.equal(mapSpecs.lb4_services.key, lb4_key);
  t.equal(mapSpecs.lb4_backends.key, u32);
  t.equal(mapSpecs.lb4_services.maxEntries, 2 * 65536 + 262144);
  t.equal(mapSpecs.lb4_reverse_nat.maxEntries, 65536);
  t.equal(mapSpecs.lb4_sock_revnat.type, 9, 'LRU hash');
});

t.test('every struct codec leaves no stale byte in a reused buffer (padding and holes are zeroed)', async (t) => {
  const codecs = (Object.values(abi) as unknown[]).filter((c): c is abi.Codec<unknown> => typeof c === 'object' && c !== null && 'encode' in c && 'size' in c && !/^(u|be)\d+$/.test((c as unknown as { name: string }).name));
  t.ok(codecs.length >= 10, `${codecs.length} struct codecs`);
  for (const c of codecs) {
    // A value with every field set to a non-zero pattern, of the right types.
    const v = c.decode(Buffer.alloc(c.size, 0x5a));
    const fresh = c.encode(v);
    const dirty = Buffer.alloc(c.size + 8, 0xff);
    c.encode(v, dirty, 4);
    t.same([...dirty.subarray(4, 4 + c.size)], [...fresh], `${c.name}: the same bytes in a dirty buffer as in a fresh one`);
    t.same([...dirty.subarray(0, 4)], [0xff, 0xff, 0xff, 0xff], `${c.name}: nothing written before its offset`);
    t.same([...dirty.subarray(4 + c.size)], [0xff, 0xff, 0xff, 0xff], `${c.name}: nothing written past its end`);
  }
});

t.test('the ABI enums, at the numbers pinned maps already carry', async (t) => {
  t.same(
    abi.LbSvcType,
    { LB_SVC_NONE: 0, LB_SVC_CLUSTER_IP: 1, LB_SVC_NODEPORT: 2, LB_SVC_LOADBALANCER: 3, LB_SVC_EXTERNAL_IP: 4, LB_SVC_WILDCARD: 5 },
    'wildcards stay 5 across upgrades',
  );
  t.same(abi.LbSvcFlags, {
    LB_SVC_F_AFFINITY: 1,
    LB_SVC_F_LOCAL_INTERNAL: 2,
    LB_SVC_F_LOCAL_EXTERNAL: 4,
    LB_SVC_F_TWO_SCOPES: 8,
    LB_SVC_F_SRC_RANGE: 16,
    LB_SVC_F_MAGLEV: 32,
  });
  t.same(abi.LbScope, { LB_SCOPE_EXT: 0, LB_SCOPE_INT: 1 }, 'the external scope is the old padding byte: 0');
  t.same(abi.LbBackendState, { LB_BACKEND_ACTIVE: 0, LB_BACKEND_TERMINATING: 1, LB_BACKEND_QUARANTINED: 2 }, 'quarantined is new: an older lbctl reads it as terminating');
});

t.test('the scalar codecs read and write the bytes Buffer does, and refuse what Buffer refuses', async (t) => {
  const cases = [
    [abi.u8, 'UInt8', 0xff],
    [abi.u16, 'UInt16LE', 0xffff],
    [abi.u32, 'UInt32LE', 0xffffffff],
    [abi.be16, 'UInt16BE', 0xffff],
    [abi.be32, 'UInt32BE', 0xffffffff],
  ] as const;
  for (const [c, method, max] of cases) {
    for (const v of [0, 1, 0x80, (0x1234 & max) >>> 0, (0xdeadbeef & max) >>> 0, max]) {
      const want = Buffer.alloc(c.size + 2);
      (want[`write${method}`] as (v: number, o: number) => number).call(want, v, 1);
      t.same([...c.encode(v, Buffer.alloc(c.size + 2), 1)], [...want], `${c.name}: ${v} encodes as Buffer.write${method}`);
      t.equal(c.decode(want, 1), (want[`read${method}`] as (o: number) => number).call(want, 1), `${c.name}: ${v} decodes as Buffer.read${method}`);
    }
    for (const bad of [-1, max + 1, NaN]) t.throws(() => c.encode(bad), new RegExp(`${c.name}.*out of range`), `${c.name}: ${bad} refused`);
    t.throws(() => c.decode(Buffer.alloc(c.size), 1), new RegExp(`${c.name}: ${c.size} bytes at offset 1`), `${c.name}: a read past the end is refused`);
    t.throws(() => c.encode(0, Buffer.alloc(c.size), 1), RangeError, `${c.name}: a write past the end is refused`);
  }
});

t.test('struct codecs check a value against its field and the struct against its buffer, naming them', async (t) => {
  const ok = { address: 0x0a60000a, dport: 53, backendSlot: 2, proto: 17, scope: 0 };
  t.throws(() => lb4_key.encode({ ...ok, dport: 70_000 }), /lb4_key\.dport: 70000 is out of range \[0, 65535\]/);
  t.throws(() => lb4_key.encode({ ...ok, address: -1 }), /lb4_key\.address: -1 is out of range/);
  t.throws(() => lb_service.encode({ backendId: NaN, count: 1, qcount: 0, revNatIndex: 1, type: 1, flags: 0, affinityTimeout: 0 }), /lb_service\.backend_id: NaN/);
  t.throws(() => lb4_key.encode(ok, Buffer.alloc(12), 4), /lb4_key: 12 bytes at offset 4 of 12/);
  t.throws(() => lb4_key.decode(Buffer.alloc(11)), /lb4_key: 12 bytes at offset 0 of 11/);
  t.throws(() => lb4_key.decode(Buffer.alloc(24), -1), /lb4_key: 12 bytes at offset -1/);
  // Every struct codec: patterned bytes decoded and encoded again, at an
  // offset, give every field's bytes back as they were and zero padding.
  // Which bytes are padding: those an all-ones struct does not bring back.
  const codecs = (Object.values(abi) as unknown[]).filter((c): c is abi.Codec<unknown> => typeof c === 'object' && c !== null && 'encode' in c && 'size' in c && !/^(u|be)\d+$/.test((c as unknown as { name: string }).name));
  for (const c of codecs) {
    const raw = Buffer.alloc(c.size + 3);
    for (let i = 0; i < raw.length; i++) raw[i] = (i * 73 + 41) & 0xff;
    const back = c.encode(c.decode(raw, 3), Buffer.alloc(c.size + 3, 0xee), 3);
    const fieldBytes = c.encode(c.decode(Buffer.alloc(c.size, 0xff)));
    const want = [...raw.subarray(3)].map((b, i) => (fieldBytes[i] === 0xff ? b : 0));
    t.same([...back.subarray(3)], want, `${c.name}: every field's bytes as they were, padding zero`);
    t.same(c.decode(back, 3), c.decode(raw, 3), `${c.name}: a field's bytes survive decode and encode at an offset`);
  }
});
