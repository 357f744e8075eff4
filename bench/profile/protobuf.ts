// What reading Services and EndpointSlices in Kubernetes' protobuf encoding
// instead of JSON would save the agent, per object, on one CPU: each list
// item's JSON text through JSON.parse (as src/sources/list-stream.ts reads a
// list) against the same item's protobuf bytes through protobufjs, decoded
// with a schema cut down to the fields lbctl reads (the rest, managedFields
// and annotations among them, is skipped by its length). Two shapes of
// object: the bench's (bench/lbctl.ts) and representative ones, as a real
// server holds them (bench/compression.ts). Measured alternately, six passes
// each, nothing decoded kept; prints the sizes, the first pass and the
// median. Only the items' payloads: not the runtime.Unknown envelope, the
// list or watch framing, or turning the messages into the objects the
// validators read (docs/benchmarks.md, "Scale (issue 18)").
//   taskset -c 0 node --import=@tapjs/typescript/import bench/profile/protobuf.ts 10000 100000
// The field numbers are those of k8s.io/api's core/v1 and discovery/v1 and
// apimachinery's meta/v1 generated.proto, for the fields written here.
import protobuf from 'protobufjs';
import { representative } from '../compression.js';
import { serviceObject, sliceObject } from '../lbctl.js';
import { median } from '../report.js';
import { makeServices } from '../services.js';

const spec = `
message IntOrString { optional int64 type = 1; optional int32 intVal = 2; optional string strVal = 3; }
message ServicePort { optional string name = 1; optional string protocol = 2; optional int32 port = 3; optional IntOrString targetPort = 4; optional int32 nodePort = 5; optional string appProtocol = 6; }
message ServiceSpec {
  repeated ServicePort ports = 1; map<string, string> selector = 2; optional string clusterIP = 3; optional string type = 4;
  optional string sessionAffinity = 7; optional string ipFamilyPolicy = 17; repeated string clusterIPs = 18; repeated string ipFamilies = 19;
  optional string internalTrafficPolicy = 22;
}
message LoadBalancerStatus {}
message ServiceStatus { optional LoadBalancerStatus loadBalancer = 1; }
message Service { optional ObjectMeta metadata = 1; optional ServiceSpec spec = 2; optional ServiceStatus status = 3; }
message EndpointConditions { optional bool ready = 1; optional bool serving = 2; optional bool terminating = 3; }
message Endpoint { repeated string addresses = 1; optional EndpointConditions conditions = 2; optional string nodeName = 6; optional string zone = 7; }
message EndpointPort { optional string name = 1; optional string protocol = 2; optional int32 port = 3; }
message EndpointSlice { optional ObjectMeta metadata = 1; repeated Endpoint endpoints = 2; repeated EndpointPort ports = 3; optional string addressType = 4; }
`;
/** ObjectMeta as the server writes it: what bench/compression.ts's representative objects carry. */
const fullMeta = `
message Time { optional int64 seconds = 1; optional int32 nanos = 2; }
message FieldsV1 { optional bytes Raw = 1; }
message ManagedFieldsEntry { optional string manager = 1; optional string operation = 2; optional string apiVersion = 3; optional Time time = 4; optional string fieldsType = 6; optional FieldsV1 fieldsV1 = 7; }
message OwnerReference { optional string kind = 1; optional string name = 3; optional string uid = 4; optional string apiVersion = 5; optional bool controller = 6; optional bool blockOwnerDeletion = 7; }
message ObjectMeta {
  optional string name = 1; optional string generateName = 2; optional string namespace = 3; optional string uid = 5; optional string resourceVersion = 6;
  optional Time creationTimestamp = 8; map<string, string> labels = 11; map<string, string> annotations = 12;
  repeated OwnerReference ownerReferences = 13; repeated ManagedFieldsEntry managedFields = 17;
}
`;
/** ObjectMeta as the agent would read it. */
const readMeta = `message ObjectMeta { optional string name = 1; optional string namespace = 3; optional string resourceVersion = 6; map<string, string> labels = 11; }`;
const writer = protobuf.parse(`syntax = "proto2";\n${fullMeta}${spec}`).root;
const reader = protobuf.parse(`syntax = "proto2";\n${readMeta}${spec}`).root;

/** The objects are this file's own, as JSON and as protobuf messages. */
type Json = Record<string, any>;
const time = (t: string | undefined): Json | undefined => (t === undefined ? undefined : { seconds: Math.floor(Date.parse(t) / 1000) });

/** The protobuf message's fields of a Service or EndpointSlice given as JSON. */
function message(o: Json): Json {
  const m = o.metadata as Json;
  const metadata = {
    ...m,
    creationTimestamp: time(m.creationTimestamp),
    managedFields: (m.managedFields as Json[] | undefined)?.map((f) => ({ ...f, time: time(f.time), fieldsV1: { Raw: Buffer.from(JSON.stringify(f.fieldsV1)) } })),
  };
  if (o.kind !== 'Service') return { ...o, metadata };
  const ports = (o.spec.ports as Json[]).map((p) => ({ ...p, targetPort: typeof p.targetPort === 'number' ? { type: 0, intVal: p.targetPort } : { type: 1, strVal: p.targetPort } }));
  return { ...o, metadata, spec: { ...o.spec, ports } };
}

const cpuMs = (): number => {
  const c = process.cpuUsage();
  return (c.user + c.system) / 1000;
};
const mib = (b: number): string => (b / 2 ** 20).toFixed(1);

for (const n of process.argv.slice(2).map(Number)) {
  const services = makeServices(n).slice(0, n);
  for (const shape of ['bench', 'representative'] as const) {
    const objects = [...services.map(serviceObject), ...services.map(sliceObject)].map((o, i) => (shape === 'bench' ? o : representative(o, i))) as Json[];
    const json = objects.map((o) => JSON.stringify(o));
    const pb = objects.map((o) => {
      const kind = o.kind as 'Service' | 'EndpointSlice';
      return { type: reader.lookupType(kind), bytes: writer.lookupType(kind).encode(message(o)).finish() };
    });
    objects.length = 0;
    // What the agent needs came through: read back from the first Service and slice.
    const svc = pb[0]!.type.decode(pb[0]!.bytes) as unknown as Json;
    const slice = pb[n]!.type.decode(pb[n]!.bytes) as unknown as Json;
    const got = [svc.metadata.name, svc.spec.clusterIP, svc.spec.ports[0].port, svc.spec.ports[0].targetPort.intVal, slice.metadata.labels['kubernetes.io/service-name'], slice.endpoints[0].addresses[0]];
    const want = ['svc-0', '10.96.0.10', 80, 8080, 'svc-0', '10.244.0.2'];
    if (JSON.stringify(got) !== JSON.stringify(want)) throw new Error(`decoded ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);

    let sink = 0;
    const times = { json: [] as number[], protobuf: [] as number[] };
    const viaJson = (): void => {
      const t0 = cpuMs();
      for (const text of json) sink += ((JSON.parse(text) as Json).metadata.name as string).length;
      times.json.push(cpuMs() - t0);
    };
    const viaProtobuf = (): void => {
      const t0 = cpuMs();
      for (const { type, bytes } of pb) sink += ((type.decode(bytes) as unknown as Json).metadata.name as string).length;
      times.protobuf.push(cpuMs() - t0);
    };
    for (let pass = 0; pass < 6; pass++) {
      if (pass % 2 === 0) (viaProtobuf(), viaJson());
      else (viaJson(), viaProtobuf());
    }
    if (sink === 0) throw new Error('nothing decoded');
    const bytes = (xs: ReadonlyArray<{ length: number }>): number => xs.reduce((a, x) => a + x.length, 0);
    const per = (ms: number): string => `${((ms * 1000) / (2 * n)).toFixed(2)} µs an object`;
    console.log(
      `${n} Services and ${n} EndpointSlices, ${shape} objects: ${mib(bytes(json))} MiB of JSON, ${mib(bytes(pb.map((p) => p.bytes)))} MiB of protobuf; ` +
        `first pass JSON.parse ${times.json[0]!.toFixed(0)} ms, protobuf ${times.protobuf[0]!.toFixed(0)} ms; ` +
        `median of 6: JSON.parse ${median(times.json).toFixed(0)} ms (${per(median(times.json))}), protobuf ${median(times.protobuf).toFixed(0)} ms (${per(median(times.protobuf))})`,
    );
  }
}
