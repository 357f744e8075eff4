// 1,000 services (10.97.x.y:80, ten manifest files of a hundred), all on the
// same three backends: every one is programmed and every one answers.
import t from 'tap';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { createSandbox, HTTP_PORT } from '../helpers/sandbox.js';
import { serviceObject, sliceObject, yamlDocs } from '../helpers/manifests.js';

const SERVICES = 1000;
const PER_FILE = 100;

const vip = (i: number): string => `10.97.${(i + 1) >> 8}.${(i + 1) & 255}`;

interface ManyResult {
  total: number;
  ok: number;
  failedCount: number;
  failed: unknown[];
  bodies: Record<string, number>;
  peersWrong: unknown[];
}

t.test(`${SERVICES} services, every one reachable`, async (t) => {
  const manifests: Record<string, string> = {};
  const backends = ['10.244.1.1', '10.244.1.2', '10.244.1.3'];
  for (let f = 0; f < SERVICES / PER_FILE; f++) {
    const objects: object[] = [];
    for (let i = f * PER_FILE; i < (f + 1) * PER_FILE; i++) {
      const name = `svc-${i}`;
      objects.push(serviceObject({ name, clusterIPs: [vip(i)], ports: [{ name: 'http', port: 80 }] }));
      objects.push(sliceObject({ name: `${name}-v4`, service: name, family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: backends }));
    }
    manifests[`services-${String(f).padStart(2, '0')}.yaml`] = yamlDocs(objects);
  }

  // The manifests are in place before the agent starts: its first sync programs them all.
  const sb = await createSandbox(t, { backends: 3, manifests, agent: false });
  t.same(sb.backends.map((b) => b.v4), backends, 'the sandbox backends are the ones the manifests name');
  const sync = await sb.startAgent();
  t.equal(sync.frontends, SERVICES, `the first sync has ${SERVICES} frontends`);
  t.comment(`first sync: planned ${sync.planned}, applied ${sync.applied}, ${String(sync.durationMs)} ms`);

  const list = await sb.lbList();
  t.equal(list.length, SERVICES, `lbctl bpf lb list shows ${SERVICES} frontends`);
  t.ok(list.every((e) => e.backends.length === 3), 'each with three backends');

  const targets = path.join(sb.runDir, 'targets.txt');
  writeFileSync(targets, Array.from({ length: SERVICES }, (_, i) => `${vip(i)}:80\n`).join(''));
  const t0 = Date.now();
  const r = await sb.client<ManyResult>(['http-many', targets], 100_000);
  t.comment(`${r.ok} requests in ${Date.now() - t0} ms, by backend: ${JSON.stringify(r.bodies)}`);
  t.equal(r.total, SERVICES);
  t.equal(r.ok, SERVICES, `every service answered (failures: ${r.failedCount}, e.g. ${JSON.stringify(r.failed.slice(0, 3))})`);
  t.same(r.peersWrong, [], 'getpeername() on each connection is the service dialled');
  t.same(Object.keys(r.bodies).sort(), backends.map((b) => `${b}:${HTTP_PORT}`), 'answers came from all three backends and nothing else');
});
