// The model's side of readiness probes (issue 17, part 2): the annotation on
// a Service, what to probe, and quarantined backends as non-selectable
// slots, with fail open / fail closed when every backend is quarantined.
// Pure: no prober, no timers.
import t from 'tap';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { DesiredModel, serviceId } from '../../src/model/desired.js';
import { applyQuarantine } from '../../src/model/from-k8s.js';
import { validateEndpointSlice, validateService, type EndpointSlice, type Service } from '../../src/model/k8s.js';
import { READINESS_PROBE_ANNOTATION } from '../../src/model/probe.js';
import type { Backend } from '../../src/lb/types.js';
import { FileSource } from '../../src/sources/file.js';
import type { Problem } from '../../src/sources/source.js';
import { service, slice } from '../fakes/objects.js';

function svc(raw: unknown): Service {
  const v = validateService(raw);
  if (!v.ok) throw new Error(v.reason);
  return v.value;
}
function eps(raw: unknown): EndpointSlice {
  const v = validateEndpointSlice(raw);
  if (!v.ok) throw new Error(v.reason);
  return v.value;
}

const PROBE = '{"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1, "failureThreshold": 2}';

function withProbe(name: string, ip: string, probe: string | undefined, ns = 'default') {
  const raw = service(name, [ip], [{ name: 'http', port: 80, targetPort: 'http' }], {}, ns);
  if (probe !== undefined) (raw.metadata as { annotations?: Record<string, string> }).annotations = { [READINESS_PROBE_ANNOTATION]: probe };
  return raw;
}

const ADDRS = ['10.0.0.2', '10.0.0.3', '10.0.0.4'];

function model(allFailed?: 'open' | 'closed', probe: string | undefined = PROBE): DesiredModel {
  const m = new DesiredModel(allFailed ? { probeAllFailed: allFailed } : {});
  m.setService('default/web', svc(withProbe('web', '10.96.0.10', probe)));
  m.setSlice('default/web-a', eps(slice('web-a', 'web', 'IPv4', [{ name: 'http', port: 8080 }], ADDRS.map((a) => ({ addresses: [a] })))));
  m.flush();
  return m;
}

const FE = '10.96.0.10:80/TCP' as never;
const show = (m: DesiredModel) => {
  const fe = m.frontends.get(FE)!;
  return { backends: fe.backends.map((b) => `${b.address}:${b.state}`), terminating: fe.terminating.map((b) => `${b.address}:${b.state}`) };
};

t.test('the annotation: a valid probe is on the Service; an invalid one is a problem naming the annotation and field, and the service is still served', async (t) => {
  const ok = svc(withProbe('web', '10.96.0.10', PROBE));
  t.equal(ok.probe?.handler.kind, 'httpGet');
  t.equal(ok.probe?.periodSeconds, 1);
  t.equal(ok.probe?.timeoutSeconds, 1, "kubelet's default");
  t.equal(ok.probeProblem, undefined);

  const none = svc(withProbe('web', '10.96.0.10', undefined));
  t.equal(none.probe, undefined);
  t.equal(none.probeProblem, undefined);

  const bad = svc(withProbe('web', '10.96.0.10', '{"httpGet": {"port": 8080}, "periodSeconds": -1}'));
  t.equal(bad.probe, undefined);
  t.match(bad.probeProblem, /^Service default\/web: metadata\.annotations\[lbctl\.io\/readiness-probe\]: periodSeconds -1 must be greater than or equal to 0; the service is served/);
  const m = new DesiredModel();
  m.setService('default/web', bad);
  m.setSlice('default/web-a', eps(slice('web-a', 'web', 'IPv4', [{ name: 'http', port: 8080 }], [{ addresses: ['10.0.0.2'] }])));
  m.flush();
  t.same(show(m).backends, ['10.0.0.2:active'], 'served from its endpoint conditions');
  t.same(m.probeTargets().targets, [], 'and not probed');

  const notText = svc(withProbe('web', '10.96.0.10', 42 as never));
  t.match(notText.probeProblem, /is 42, not text/);
});

t.test('the file source reports an invalid probe with its file and document, once per read, and sends the service', async (t) => {
  const dir = mkdtempSync(path.join(tmpdir(), 'lbctl-probe-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const problems: Problem[] = [];
  const src = new FileSource({ dir, debounceMs: 10, onProblem: (p) => problems.push(p) });
  t.teardown(() => src.stop());
  const raw = withProbe('web', '10.96.0.10', 'tcpSocket: {port: 0}');
  writeFileSync(path.join(dir, 'a.yaml'), JSON.stringify(raw));
  const got: Service[] = [];
  await src.start((e) => {
    if (e?.kind === 'Service' && e.object) got.push(e.object);
  });
  t.equal(got.length, 1, 'the service is sent');
  t.equal(got[0]!.probe, undefined);
  t.match(problems, [{ where: `${path.join(dir, 'a.yaml')}: document 0`, category: 'invalid', kind: 'Service', object: 'Service default/web', reason: /readiness-probe\]: tcpSocket\.port 0 is not a port/ }]);
  t.equal(problems.length, 1);
});

t.test('probe targets: every endpoint address, the named port resolved against its own slice, shared backends listed per service', async (t) => {
  const m = model();
  m.setService('default/api', svc(withProbe('api', '10.96.0.11', '{"tcpSocket": {"port": 9000}}')));
  m.setSlice('default/api-a', eps(slice('api-a', 'api', 'IPv4', [{ name: 'http', port: 8080 }], [{ addresses: ['10.0.0.2'] }])));
  m.setService('default/plain', svc(withProbe('plain', '10.96.0.12', undefined)));
  m.setSlice('default/plain-a', eps(slice('plain-a', 'plain', 'IPv4', [{ name: 'http', port: 8080 }], [{ addresses: ['10.0.0.9'] }])));
  m.setService('default/named', svc(withProbe('named', '10.96.0.13', '{"httpGet": {"port": "admin"}}')));
  m.setSlice('default/named-a', eps(slice('named-a', 'named', 'IPv4', [{ name: 'http', port: 8080 }], [{ addresses: ['10.0.0.7'] }])));
  m.flush();
  const { targets, unresolved } = m.probeTargets();
  t.same(
    targets.map((x) => `${x.service} ${x.target.address}:${x.target.port} ${x.target.spec.handler.kind}`),
    ['default/api 10.0.0.2:9000 tcpSocket', 'default/web 10.0.0.2:8080 httpGet', 'default/web 10.0.0.3:8080 httpGet', 'default/web 10.0.0.4:8080 httpGet'],
  );
  t.match(unresolved, [{ service: 'default/named', detail: /port "admin" names no port of EndpointSlice default\/named-a/ }]);
  t.ok(m.hasProbe('default/web'));
  t.notOk(m.hasProbe('default/plain'));
  m.setService('default/api', svc(withProbe('api', '10.96.0.11', undefined)));
  m.flush();
  t.notOk(m.probeTargets().targets.some((x) => x.service === 'default/api'), 'a probe removed from the Service: no target');
});

t.test('a quarantined backend becomes a non-selectable slot, as a terminating one; it returns when released', async (t) => {
  const m = model();
  t.same(show(m), { backends: ['10.0.0.2:active', '10.0.0.3:active', '10.0.0.4:active'], terminating: [] });
  t.ok(m.setQuarantined(new Map([[serviceId('default', 'web'), new Set(['10.0.0.3'])]])));
  const { changed } = m.flush();
  t.same([...changed], [FE], 'the frontend changed');
  t.same(show(m), { backends: ['10.0.0.2:active', '10.0.0.4:active'], terminating: ['10.0.0.3:quarantined'] });
  t.same([...m.allFailedServices], []);

  t.notOk(m.setQuarantined(new Map([[serviceId('default', 'web'), new Set(['10.0.0.3'])]])), 'the same set: nothing to recompute');
  t.same([...m.flush().changed], []);

  t.ok(m.setQuarantined(new Map()));
  m.flush();
  t.same(show(m), { backends: ['10.0.0.2:active', '10.0.0.3:active', '10.0.0.4:active'], terminating: [] }, 'released');
});

t.test('quarantine sits beside terminating endpoints in one sorted non-selectable region', async (t) => {
  const m = new DesiredModel();
  m.setService('default/web', svc(withProbe('web', '10.96.0.10', PROBE)));
  m.setSlice('default/web-a', eps(slice('web-a', 'web', 'IPv4', [{ name: 'http', port: 8080 }], [{ addresses: ['10.0.0.2'] }, { addresses: ['10.0.0.3'] }, { addresses: ['10.0.0.1'], ready: false, serving: true, terminating: true }])));
  m.setQuarantined(new Map([['default/web', new Set(['10.0.0.3'])]]));
  m.flush();
  t.same(show(m), { backends: ['10.0.0.2:active'], terminating: ['10.0.0.1:terminating', '10.0.0.3:quarantined'] });
});

t.test('every backend quarantined: fail open serves them all, fail closed none; both are reported', async (t) => {
  const all = new Map([['default/web', new Set(ADDRS)]]);
  const open = model('open');
  open.setQuarantined(all);
  open.flush();
  t.same(show(open), { backends: ['10.0.0.2:active', '10.0.0.3:active', '10.0.0.4:active'], terminating: [] }, 'open: as if unprobed');
  t.same([...open.allFailedServices], ['default/web']);
  t.equal(open.allFailedPolicy, 'open');

  const closed = model('closed');
  closed.setQuarantined(all);
  closed.flush();
  t.same(show(closed), { backends: [], terminating: ['10.0.0.2:quarantined', '10.0.0.3:quarantined', '10.0.0.4:quarantined'] }, 'closed: nothing selectable, established flows keep theirs');
  t.same([...closed.allFailedServices], ['default/web']);

  closed.setQuarantined(new Map([['default/web', new Set(['10.0.0.2', '10.0.0.3'])]]));
  closed.flush();
  t.same(show(closed).backends, ['10.0.0.4:active']);
  t.same([...closed.allFailedServices], [], 'one backend back: not all failed');

  t.same(model().allFailedPolicy, 'open', 'open is the default');
});

t.test('verdicts count only while the service has its probe; a service gone leaves nothing behind', async (t) => {
  const m = model('closed');
  m.setQuarantined(new Map([['default/web', new Set(ADDRS)]]));
  m.flush();
  t.same(show(m).backends, []);
  m.setService('default/web', svc(withProbe('web', '10.96.0.10', undefined)));
  m.flush();
  t.same(show(m).backends.length, 3, 'the annotation removed: endpoint conditions alone');
  t.same([...m.allFailedServices], []);
  m.setService('default/web', undefined);
  m.flush();
  t.equal(m.frontends.size, 0);
});

t.test('applyQuarantine is pure and keeps the selection when nothing it holds is quarantined', async (t) => {
  const b = (address: string, state: Backend['state'] = 'active'): Backend => ({ address, family: 4, port: 80, protocol: 'TCP', state });
  const chosen = { backends: [b('10.0.0.1'), b('10.0.0.2')], terminating: [] };
  const same = applyQuarantine(chosen, { addresses: new Set(['10.9.9.9']), allFailed: 'closed' });
  t.equal(same.backends, chosen.backends, 'the same array: no copy');
  t.equal(same.allFailed, false);
  const q = applyQuarantine(chosen, { addresses: new Set(['10.0.0.1']), allFailed: 'closed' });
  t.same(q.backends.map((x) => x.address), ['10.0.0.2']);
  t.same(q.terminating, [b('10.0.0.1', 'quarantined')]);
  t.same(chosen.backends.map((x) => x.state), ['active', 'active'], 'the input is not changed');
  const empty = applyQuarantine({ backends: [], terminating: [] }, { addresses: new Set(['10.0.0.1']), allFailed: 'closed' });
  t.equal(empty.allFailed, false, 'a frontend without backends has not "all failed"');
});
