// The floor of "first list request → every frontend in the kernel": the
// least any agent in Node.js must do to carry a cluster's Services and
// EndpointSlices from the API server into the datapath's maps, run by the
// bench beside lbctl's cold sync on the same machine, CPU and API server.
// The same two lists lbctl's first lists are (resourceVersion 0, the same
// label selectors, asked for at once), each answer read whole and parsed in
// one JSON.parse; each Service joined to its EndpointSlices by the
// service-name label; and the entries lbctl writes for them (per service
// port a master entry and one slot per endpoint, a wildcard entry per
// cluster IP, a rev-NAT entry, a backend per distinct address and port)
// encoded with the same generated codecs and written with one batch update
// per map. No validation, no model, no ids kept, no plan, no bookkeeping of
// what was written, no bound on memory: what is left is the transport, the
// parse, the join and the kernel's inserts.
//   node --import=@tapjs/typescript/import bench/cold-floor.ts URL TOKEN PIN N
// Loads the maps (sized as the agent's for N services: agentSizes) under
// PIN, prints "ready", lists and writes at once, prints
// "done {listMs, encodeMs, kernelMs, entries}" and exits; PIN is removed.
import http from 'node:http';
import { rmSync } from 'node:fs';
import { BpfObject } from '../src/native/bpf.js';
import { DEFAULT_OBJECT, DEFAULT_SIZES, mapMaxEntries } from '../src/datapath/loader.js';
import { agentSizes } from './lbctl.js';
import { lb4_backend, lb4_key, lb4_reverse_nat, lb_service, LbScope, LbSvcType } from '../src/datapath/abi.gen.js';
import { SERVICE_LABEL_SELECTOR, SLICE_LABEL_SELECTOR } from '../src/sources/kubernetes.js';
import { ipv4ToUint } from '../src/lb/addr.js';

const [url, token, pin, count] = process.argv.slice(2) as [string, string, string, string];
const n = Number(count);
const PROTO: Record<string, number> = { TCP: 6, UDP: 17, SCTP: 132 };

interface Port { name?: string; port?: number; protocol?: string; targetPort?: number | string }
interface Svc { metadata: { name: string; namespace: string }; spec: { clusterIP?: string; ports?: Port[] } }
interface Slice {
  metadata: { namespace: string; labels?: Record<string, string> };
  ports?: Port[];
  endpoints?: Array<{ addresses: string[] }>;
}

/** GET `path` with lbctl's first-list query; the whole answer's items. */
function list<T>(path: string, selector: string): Promise<T[]> {
  const q = new URLSearchParams({ labelSelector: selector, resourceVersion: '0', limit: '500' });
  return new Promise((resolve, reject) => {
    http
      .get(`${url}${path}?${q}`, { headers: { authorization: `Bearer ${token}` } }, (res) => {
        if (res.statusCode !== 200) return reject(new Error(`cold-floor: ${path} answered ${res.statusCode}`));
        const parts: Buffer[] = [];
        res.on('data', (d: Buffer) => parts.push(d));
        res.on('end', () => {
          const body = JSON.parse(Buffer.concat(parts).toString('utf8')) as { items: T[]; metadata?: { continue?: string } };
          if (body.metadata?.continue) return reject(new Error(`cold-floor: ${path} came back paged; the floor reads one answer`));
          resolve(body.items);
        });
        res.on('error', reject);
      })
      .on('error', reject);
  });
}

const obj = BpfObject.open(DEFAULT_OBJECT, { pinRoot: pin, maxEntries: mapMaxEntries({ ...DEFAULT_SIZES, ...agentSizes(n) }) });
try {
  await obj.load();
  const services = obj.map('lb4_services');
  const backends = obj.map('lb4_backends');
  const revNats = obj.map('lb4_reverse_nat');
  process.stdout.write('ready\n');

  const t0 = performance.now();
  const [svcs, slices] = await Promise.all([
    list<Svc>('/api/v1/services', SERVICE_LABEL_SELECTOR),
    list<Slice>('/apis/discovery.k8s.io/v1/endpointslices', SLICE_LABEL_SELECTOR),
  ]);
  const t1 = performance.now();

  const byService = new Map<string, Slice[]>();
  for (const s of slices) {
    const key = `${s.metadata.namespace}/${s.metadata.labels?.['kubernetes.io/service-name'] ?? ''}`;
    const had = byService.get(key);
    if (had) had.push(s);
    else byService.set(key, [s]);
  }
  // Sized for the bench's services (one port, a few endpoints); grown when not.
  let svcKeys: Buffer = Buffer.alloc(lb4_key.size * 6 * svcs.length + lb4_key.size);
  let svcVals: Buffer = Buffer.alloc(lb_service.size * 6 * svcs.length + lb_service.size);
  let beKeys: Buffer = Buffer.alloc(4 * 4 * svcs.length + 4);
  let beVals: Buffer = Buffer.alloc(lb4_backend.size * 4 * svcs.length + lb4_backend.size);
  let rnKeys: Buffer = Buffer.alloc(4 * svcs.length + 4);
  let rnVals: Buffer = Buffer.alloc(lb4_reverse_nat.size * svcs.length + lb4_reverse_nat.size);
  let ns = 0;
  let nb = 0;
  let nr = 0;
  const grow = (b: Buffer, need: number): Buffer => (need <= b.length ? b : Buffer.concat([b, Buffer.alloc(Math.max(need, b.length))]));
  const backendIds = new Map<string, number>();
  const wildcards = new Set<number>();
  const service = (address: number, dport: number, proto: number, slot: number, v: Parameters<typeof lb_service.encode>[0]): void => {
    svcKeys = grow(svcKeys, (ns + 1) * lb4_key.size);
    svcVals = grow(svcVals, (ns + 1) * lb_service.size);
    lb4_key.encode({ address, dport, backendSlot: slot, proto, scope: LbScope.LB_SCOPE_EXT }, svcKeys, ns * lb4_key.size);
    lb_service.encode(v, svcVals, ns * lb_service.size);
    ns++;
  };
  for (const svc of svcs) {
    const ip = svc.spec.clusterIP;
    if (!ip || ip === 'None' || ip.includes(':')) continue;
    const address = ipv4ToUint(ip);
    const own = byService.get(`${svc.metadata.namespace}/${svc.metadata.name}`) ?? [];
    for (const p of svc.spec.ports ?? []) {
      const proto = PROTO[p.protocol ?? 'TCP'] ?? 6;
      const ids: number[] = [];
      for (const slice of own) {
        const sp = slice.ports?.find((x) => (x.name ?? '') === (p.name ?? ''));
        if (!sp?.port) continue;
        for (const e of slice.endpoints ?? []) {
          const bkey = `${e.addresses[0]}:${sp.port}:${proto}`;
          let id = backendIds.get(bkey);
          if (id === undefined) {
            backendIds.set(bkey, (id = backendIds.size + 1));
            beKeys = grow(beKeys, (nb + 1) * 4);
            beVals = grow(beVals, (nb + 1) * lb4_backend.size);
            beKeys.writeUInt32LE(id, nb * 4);
            lb4_backend.encode({ address: ipv4ToUint(e.addresses[0]!), port: sp.port, proto, state: 0 }, beVals, nb * lb4_backend.size);
            nb++;
          }
          ids.push(id);
        }
      }
      const revNat = ++nr;
      rnKeys = grow(rnKeys, nr * 4);
      rnVals = grow(rnVals, nr * lb4_reverse_nat.size);
      rnKeys.writeUInt32LE(revNat, (nr - 1) * 4);
      lb4_reverse_nat.encode({ address, port: p.port ?? 0 }, rnVals, (nr - 1) * lb4_reverse_nat.size);
      ids.forEach((id, i) => service(address, p.port ?? 0, proto, i + 1, { backendId: id, count: 0, qcount: 0, revNatIndex: 0, type: 0, flags: 0, affinityTimeout: 0 }));
      service(address, p.port ?? 0, proto, 0, { backendId: 0, count: ids.length, qcount: 0, revNatIndex: revNat, type: LbSvcType.LB_SVC_CLUSTER_IP, flags: 0, affinityTimeout: 0 });
    }
    if (!wildcards.has(address)) {
      wildcards.add(address);
      service(address, 0, 0, 0, { backendId: 0, count: 0, qcount: 0, revNatIndex: 0, type: LbSvcType.LB_SVC_WILDCARD, flags: 0, affinityTimeout: 0 });
    }
  }
  const t2 = performance.now();
  // The order lbctl writes in: backends, rev-NAT, then the services map.
  if (nb) backends.batchUpdate(beKeys.subarray(0, nb * 4), beVals.subarray(0, nb * lb4_backend.size), nb);
  if (nr) revNats.batchUpdate(rnKeys.subarray(0, nr * 4), rnVals.subarray(0, nr * lb4_reverse_nat.size), nr);
  if (ns) services.batchUpdate(svcKeys.subarray(0, ns * lb4_key.size), svcVals.subarray(0, ns * lb_service.size), ns);
  const t3 = performance.now();
  const round = (x: number): number => Math.round(x * 100) / 100;
  process.stdout.write(`done ${JSON.stringify({ listMs: round(t1 - t0), encodeMs: round(t2 - t1), kernelMs: round(t3 - t2), entries: ns + nb + nr })}\n`);
} finally {
  obj.close();
  rmSync(pin, { recursive: true, force: true });
}
