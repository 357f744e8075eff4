// What gzip costs each end of a list (docs/kubernetes.md, "Compression"):
// for N Services, the JSON of the two lists the agent asks for (Services and
// EndpointSlices), compressed at level 1 (the API server's level) and
// inflated again, each streamed 64 KiB at a time as a server writes and an
// agent reads, on one CPU; CPU time and throughput (MiB of JSON a second).
// Two shapes of object: the bench's (bench/lbctl.ts: what the scale rows
// list) and representative ones, as a real server holds them: uid,
// resourceVersion, timestamps, kubectl's last-applied annotation and
// managedFields (about 1.3 KB a Service and 1.8 KB an EndpointSlice). Both
// are generated and repeat themselves, so they compress better than a real
// cluster's objects; the sizes on the wire are an upper bound on the saving.
// Node's zlib, not Go's compress/flate, which a kube-apiserver uses.
//   taskset -c 0 node --import=@tapjs/typescript/import bench/compression.ts 10000 100000
import { createGunzip, createGzip, gzipSync } from 'node:zlib';
import type { Transform } from 'node:stream';
import { serviceObject, sliceObject } from './lbctl.js';
import { makeServices } from './services.js';

type Obj = ReturnType<typeof serviceObject>;

/** `o` as a real server would hold it: what the API server and its writers add (bench/profile/protobuf.ts uses it too). */
export function representative(o: Obj, i: number): Obj {
  const m = o.metadata as { name: string; namespace: string };
  const isService = o.kind === 'Service';
  const spec = o.spec as { ports?: unknown; selector?: unknown } | undefined;
  const time = '2026-11-20T10:11:12Z';
  return {
    ...o,
    metadata: {
      ...m,
      uid: `3f1c2a4e-8b7d-4c1e-9a2b-${String(1e11 + i).slice(-12)}`,
      resourceVersion: String(5_000_000 + i),
      creationTimestamp: time,
      annotations: isService
        ? { 'kubectl.kubernetes.io/last-applied-configuration': `${JSON.stringify({ apiVersion: 'v1', kind: 'Service', metadata: m, spec: { ports: spec?.ports, selector: spec?.selector } })}\n` }
        : { 'endpoints.kubernetes.io/last-change-trigger-time': time },
      ...(isService
        ? {}
        : {
            generateName: `${m.name.slice(0, -5)}`,
            ownerReferences: [{ apiVersion: 'v1', kind: 'Service', name: m.name.slice(0, -6), uid: '3f1c2a4e-8b7d-4c1e-9a2b-000000000001', controller: true, blockOwnerDeletion: true }],
          }),
      managedFields: [
        isService
          ? {
              manager: 'kubectl-client-side-apply', operation: 'Update', apiVersion: 'v1', time, fieldsType: 'FieldsV1',
              fieldsV1: { 'f:metadata': { 'f:annotations': { '.': {}, 'f:kubectl.kubernetes.io/last-applied-configuration': {} } }, 'f:spec': { 'f:internalTrafficPolicy': {}, 'f:ports': { '.': {}, 'k:{"port":80,"protocol":"TCP"}': { '.': {}, 'f:name': {}, 'f:port': {}, 'f:protocol': {}, 'f:targetPort': {} } }, 'f:selector': {}, 'f:sessionAffinity': {}, 'f:type': {} } },
            }
          : {
              manager: 'kube-controller-manager', operation: 'Update', apiVersion: 'discovery.k8s.io/v1', time, fieldsType: 'FieldsV1',
              fieldsV1: { 'f:addressType': {}, 'f:endpoints': {}, 'f:metadata': { 'f:annotations': { '.': {}, 'f:endpoints.kubernetes.io/last-change-trigger-time': {} }, 'f:generateName': {}, 'f:labels': { '.': {}, 'f:endpointslice.kubernetes.io/managed-by': {}, 'f:kubernetes.io/service-name': {} }, 'f:ownerReferences': { '.': {}, 'k:{"uid":"3f1c2a4e-8b7d-4c1e-9a2b-000000000001"}': {} } }, 'f:ports': {} },
            },
      ],
    },
    ...(isService ? { spec: { ...spec, sessionAffinity: 'None', internalTrafficPolicy: 'Cluster', ipFamilyPolicy: 'SingleStack' }, status: { loadBalancer: {} } } : {}),
  } as Obj;
}

/** `input` through `z`, 64 KiB a write with its backpressure; the CPU it took (ms) and the bytes out. */
async function through(input: Buffer, z: Transform): Promise<{ cpuMs: number; bytes: number }> {
  let bytes = 0;
  z.on('data', (d: Buffer) => (bytes += d.length));
  const ended = new Promise((resolve) => z.on('end', resolve));
  const c0 = process.cpuUsage();
  for (let i = 0; i < input.length; i += 65_536) if (!z.write(input.subarray(i, i + 65_536))) await new Promise((r) => z.once('drain', r));
  z.end();
  await ended;
  const c = process.cpuUsage(c0);
  return { cpuMs: (c.user + c.system) / 1000, bytes };
}

const mib = (b: number): string => (b / 2 ** 20).toFixed(1);

// Run as a script only: bench/profile/protobuf.ts imports representative().
for (const n of import.meta.url === `file://${process.argv[1]}` ? process.argv.slice(2).map(Number) : []) {
  const services = makeServices(n).slice(0, n);
  for (const shape of ['bench', 'representative'] as const) {
    const objects = [...services.map(serviceObject), ...services.map(sliceObject)];
    const items = shape === 'bench' ? objects : objects.map(representative);
    const json = Buffer.from(JSON.stringify({ kind: 'List', apiVersion: 'v1', metadata: { resourceVersion: '1' }, items }));
    const zipped = await through(json, createGzip({ level: 1 }));
    const inflated = await through(gzipSync(json, { level: 1 }), createGunzip());
    const rate = (ms: number): string => (json.length / 2 ** 20 / (ms / 1000)).toFixed(0);
    console.log(
      `${n} Services, ${shape} objects: ${mib(json.length)} MiB of JSON (${Math.round(json.length / (2 * n))} B an object) -> ${mib(zipped.bytes)} MiB gzipped (${(json.length / zipped.bytes).toFixed(1)}x); ` +
        `gzip -1 ${zipped.cpuMs.toFixed(0)} ms of CPU (${rate(zipped.cpuMs)} MiB/s), gunzip ${inflated.cpuMs.toFixed(0)} ms (${rate(inflated.cpuMs)} MiB/s of JSON)`,
    );
  }
}
