// KernelLbMaps and dumpMaps over in-memory byte maps: what the reconciler
// writes is encoded with the generated codecs and reads back as the same
// keys the model gives (restart adoption depends on it), the lookup scope
// and the north-south service types included.
import t from 'tap';
import { lb4_key, lb6_key, lb_service, LbScope, LbSvcType, mapSpecs, u32, u64 } from '../../src/datapath/abi.gen.js';
import { FrontendPorts } from '../../src/datapath/frontend-ports.js';
import { dumpMaps, KernelLbMaps, LB_MAP_NAMES, type ByteMap, type LbMapSet } from '../../src/datapath/maps.js';
import type { MasterEntry } from '../../src/datapath/lbmaps.js';
import { serviceAddrKey, type ServiceAddr } from '../../src/lb/types.js';

class MemMap implements ByteMap {
  readonly entriesByKey = new Map<string, [Buffer, Buffer]>();
  constructor(
    readonly name: string,
    readonly keySize: number,
    readonly valueSize: number,
    readonly maxEntries: number,
  ) {}
  lookup(key: Buffer): Buffer | null {
    return this.entriesByKey.get(key.toString('hex'))?.[1] ?? null;
  }
  update(key: Buffer, value: Buffer): void {
    if (key.length !== this.keySize || value.length !== this.valueSize) throw new Error(`${this.name}: wrong size`);
    this.entriesByKey.set(key.toString('hex'), [Buffer.from(key), Buffer.from(value)]);
  }
  delete(key: Buffer): boolean {
    return this.entriesByKey.delete(key.toString('hex'));
  }
  entries(): Array<[Buffer, Buffer]> {
    return [...this.entriesByKey.values()];
  }
}

function memMaps(): LbMapSet {
  const set = {} as Record<string, ByteMap>;
  for (const name of LB_MAP_NAMES) {
    const spec = mapSpecs[name];
    set[name] = new MemMap(name, spec.key.size, spec.value.size, spec.maxEntries);
  }
  return set as LbMapSet;
}

const master = (type: MasterEntry['type'], revNatId: number, flags = 0): MasterEntry => ({ count: 1, qcount: 0, revNatId, type, flags, affinityTimeout: 0 });

t.test('service keys: the scope byte and the north-south types round-trip; the external scope is the old key', async (t) => {
  const m = memMaps();
  const maps = new KernelLbMaps(m);
  const fes: Array<[ServiceAddr, MasterEntry]> = [
    [{ address: '10.96.0.10', family: 4, port: 80, protocol: 'TCP' }, master('ClusterIP', 1)],
    [{ address: '0.0.0.0', family: 4, port: 30080, protocol: 'TCP' }, master('NodePort', 2, 12)],
    [{ address: '0.0.0.0', family: 4, port: 30080, protocol: 'TCP', scope: 'internal' }, master('NodePort', 3)],
    [{ address: '198.51.100.7', family: 4, port: 80, protocol: 'UDP' }, master('LoadBalancer', 4, 16)],
    [{ address: '192.0.2.10', family: 4, port: 80, protocol: 'TCP' }, master('ExternalIP', 5)],
    [{ address: '::', family: 6, port: 30080, protocol: 'TCP' }, master('NodePort', 6)],
    [{ address: '::', family: 6, port: 30080, protocol: 'TCP', scope: 'internal' }, master('NodePort', 7)],
    [{ address: '10.96.0.10', family: 4, port: 0, protocol: 'ANY' }, { ...master('Wildcard', 0), count: 0 }],
  ];
  for (const [fe, mst] of fes) {
    maps.putMaster(fe, mst);
    maps.putSlot(fe, 1, 9);
  }
  const dump = dumpMaps(m);
  const read = dump.services.filter((e) => e.slot === 0).map((e) => [serviceAddrKey(e.fe), e.master!.type, e.master!.flags, e.master!.revNatId]);
  t.same(
    read.sort(),
    fes.map(([fe, mst]) => [serviceAddrKey(fe), mst.type, mst.flags, mst.revNatId]).sort(),
    'every key and master reads back as written',
  );
  t.same(
    dump.services.map((e) => serviceAddrKey(e.fe)).filter((k, i, all) => all.indexOf(k) === i).sort(),
    ['0.0.0.0:30080/TCP', '0.0.0.0:30080/TCP/internal', '10.96.0.10:0/ANY', '10.96.0.10:80/TCP', '192.0.2.10:80/TCP', '198.51.100.7:80/UDP', '[::]:30080/TCP', '[::]:30080/TCP/internal'],
    'slots under the same keys',
  );
  const ext = dump.services.find((e) => serviceAddrKey(e.fe) === '10.96.0.10:80/TCP')!;
  t.notOk('scope' in ext.fe, 'an external key reads back with no scope field: the model\'s objects and keys exactly');

  // The bytes: the external key is the key of a build before scopes (pad 0); the internal one has 1 after proto.
  const key4 = (scope: number) => lb4_key.encode({ address: 0, dport: 30080, backendSlot: 0, proto: 6, scope }).toString('hex');
  t.ok(m.lb4_services.lookup(Buffer.from(key4(LbScope.LB_SCOPE_EXT), 'hex')), 'external entry at scope 0');
  const internal = m.lb4_services.lookup(Buffer.from(key4(LbScope.LB_SCOPE_INT), 'hex'));
  t.equal(internal && lb_service.decode(internal).revNatIndex, 3, 'internal entry at scope 1');
  const key6 = lb6_key.encode({ address: Buffer.alloc(16), dport: 30080, backendSlot: 0, proto: 6, scope: LbScope.LB_SCOPE_INT });
  t.equal(lb_service.decode(m.lb6_services.lookup(key6)!).type, LbSvcType.LB_SVC_NODEPORT, 'IPv6: the NodePort type number');
  const lbKey = lb4_key.encode({ address: 0xc6336407, dport: 80, backendSlot: 0, proto: 17, scope: 0 });
  t.equal(lb_service.decode(m.lb4_services.lookup(lbKey)!).type, LbSvcType.LB_SVC_LOADBALANCER);

  maps.deleteMaster(fes[2]![0]);
  maps.deleteSlot(fes[2]![0], 1);
  t.notOk(dumpMaps(m).services.some((e) => e.fe.scope === 'internal' && e.fe.family === 4), 'deletes find the internal entry by its scope');
  t.ok(dumpMaps(m).services.some((e) => serviceAddrKey(e.fe) === '0.0.0.0:30080/TCP'), 'and leave the external one');
});

t.test('a key with a scope no lbctl build writes is not read (nothing would key it)', async (t) => {
  const m = memMaps();
  m.lb4_services.update(lb4_key.encode({ address: 0, dport: 30080, backendSlot: 0, proto: 6, scope: 7 }), lb_service.encode({ backendId: 0, count: 0, qcount: 0, revNatIndex: 1, type: 2, flags: 0, affinityTimeout: 0 }));
  t.same(dumpMaps(m).services, []);
});

t.test('SCTP keys and backends carry protocol 132 and read back as SCTP', async (t) => {
  const m = memMaps();
  const maps = new KernelLbMaps(m);
  const fe: ServiceAddr = { address: '10.96.0.20', family: 4, port: 3868, protocol: 'SCTP' };
  const fe6: ServiceAddr = { address: '::', family: 6, port: 30868, protocol: 'SCTP' };
  maps.putMaster(fe, master('ClusterIP', 1));
  maps.putMaster(fe6, master('NodePort', 2));
  maps.putBackend(7, { address: '10.244.1.7', family: 4, port: 3868, protocol: 'SCTP', state: 'active' });
  t.ok(m.lb4_services.lookup(lb4_key.encode({ address: 0x0a600014, dport: 3868, backendSlot: 0, proto: 132, scope: 0 })), 'the key\'s proto byte is IPPROTO_SCTP');
  const dump = dumpMaps(m);
  t.same(dump.services.map((e) => serviceAddrKey(e.fe)).sort(), ['10.96.0.20:3868/SCTP', '[::]:30868/SCTP']);
  t.same(dump.backends, [{ id: 7, backend: { address: '10.244.1.7', family: 4, port: 3868, protocol: 'SCTP', state: 'active' } }]);
});

t.test('lb_np_ports: filled from the services maps as they are, then each frontend\'s port marked before the frontend is written', async (t) => {
  const m = memMaps();
  const ports = new MemMap('lb_np_ports', 4, 8, 1024);
  const word = (port: number): bigint => u64.decode(ports.lookup(u32.encode(port >>> 6)) ?? Buffer.alloc(8));
  const marked = (port: number): boolean => ((word(port) >> BigInt(port & 63)) & 1n) === 1n;
  const maps = new KernelLbMaps(m);
  // What an earlier agent left: two frontends, and a stale bit of a port none has now.
  maps.putMaster({ address: '192.0.2.10', family: 4, port: 80, protocol: 'TCP' }, master('LoadBalancer', 1));
  maps.putSlot({ address: '192.0.2.10', family: 4, port: 80, protocol: 'TCP' }, 1, 5);
  maps.putMaster({ address: 'fd00::10', family: 6, port: 8443, protocol: 'UDP' }, master('ExternalIP', 2));
  ports.update(u32.encode(443 >>> 6), u64.encode(1n << BigInt(443 & 63)));
  const fp = new FrontendPorts(ports);
  t.notOk(fp.filled, 'not trusted before it is filled');
  maps.useFrontendPorts(fp);
  t.ok(fp.filled);
  t.equal(ports.entries().length, 1024, 'every word written');
  t.ok(marked(80) && marked(8443), 'the ports the maps hold, both families');
  t.notOk(marked(443), 'an earlier agent\'s stale bit cleared');
  t.notOk(marked(81) || marked(0), 'nothing else');

  maps.putMaster({ address: '10.96.0.1', family: 4, port: 443, protocol: 'TCP' }, master('ClusterIP', 3));
  t.ok(marked(443) && fp.has(443), 'a frontend written one by one: its port marked');
  // Batches through BPF_MAP_UPDATE_BATCH (a map that has it): every port marked before the one write of the batch.
  const order: string[] = [];
  const svc6 = m.lb6_services as MemMap;
  const batching = Object.assign(svc6, {
    batchUpdate(keys: Buffer, values: Buffer, count: number): number {
      order.push(`batch of ${count}, port 53 ${marked(53) ? 'marked' : 'not marked'}, port 5353 ${marked(5353) ? 'marked' : 'not marked'}`);
      for (let i = 0; i < count; i++) svc6.update(keys.subarray(i * svc6.keySize, (i + 1) * svc6.keySize), values.subarray(i * svc6.valueSize, (i + 1) * svc6.valueSize));
      return count;
    },
  });
  m.lb6_services = batching;
  const fes: ServiceAddr[] = [{ address: 'fd00::20', family: 6, port: 53, protocol: 'UDP' }, { address: 'fd00::21', family: 6, port: 5353, protocol: 'UDP' }];
  maps.putBatch!({ kind: 'put-master', family: 6, ids: [], backends: [], entries: [], slots: [], fes, masters: [master('LoadBalancer', 4), master('LoadBalancer', 5)] }, 0, 2);
  t.same(order, ['batch of 2, port 53 marked, port 5353 marked'], 'a batch of frontends: their ports marked before the batch is written');
  t.ok(marked(80), 'the others kept');
  t.throws(() => new FrontendPorts(new MemMap('lb_np_ports', 4, 8, 512)), /1024/, 'a map of another size refused, named');
});
