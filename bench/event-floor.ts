// The floor of "event → map": the least any agent in Node.js must do to
// carry a watch event into the kernel, run by the bench beside lbctl's own
// figures on the same machine and CPU. One HTTP watch of EndpointSlices
// (what lbctl's source opens), each line parsed as JSON, and for the one
// slice the bench changes, its endpoint count written into the frontend's
// master entry in the pinned map, the field the bench's probe reads. No
// validation, no model, no plan: what is left is the transport, the event
// loop, the parse and one map write.
//   node --import=@tapjs/typescript/import bench/event-floor.ts URL TOKEN RV MAP KEYHEX SLICE
// Prints "watching" once the server has answered the watch.
import http from 'node:http';
import { openPinnedMap } from '../src/native/bpf.js';
import { lb_service } from '../src/datapath/abi.gen.js';

const [url, token, rv, mapPath, keyHex, slice] = process.argv.slice(2) as [string, string, string, string, string, string];
const map = openPinnedMap(mapPath);
const key = Buffer.from(keyHex, 'hex');
const current = map.lookup(key);
if (!current) throw new Error(`event-floor: no master entry for ${keyHex} in ${mapPath}`);
const master = lb_service.decode(current);

const path = `/apis/discovery.k8s.io/v1/endpointslices?watch=true&allowWatchBookmarks=true&resourceVersion=${rv}`;
http.get(`${url}${path}`, { headers: { authorization: `Bearer ${token}` } }, (res) => {
  if (res.statusCode !== 200) throw new Error(`event-floor: the watch answered ${res.statusCode}`);
  process.stdout.write('watching\n');
  let rest = '';
  res.setEncoding('utf8');
  res.on('data', (chunk: string) => {
    const lines = (rest + chunk).split('\n');
    rest = lines.pop()!;
    for (const line of lines) {
      if (!line) continue;
      const event = JSON.parse(line) as { object?: { metadata?: { name?: string }; endpoints?: unknown[] } };
      if (event.object?.metadata?.name !== slice) continue;
      map.update(key, lb_service.encode({ ...master, count: event.object.endpoints?.length ?? 0 }));
    }
  });
});
