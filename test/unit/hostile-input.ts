// Hostile input, as a class: property-based tests (fast-check) that drive the
// file source and the Kubernetes source with random and mutated manifests —
// wrong types, truncation, absurd sizes, unicode, binary, alias and nesting
// bombs, duplicate identities, objects claiming another service's address —
// and assert, for every case: no exception escapes, a sentinel service stays
// in the desired state unchanged, and every rejection names where it came
// from. Memory is bounded where it can be measured alone: the agent's own
// peak RSS under the same generators and the worst file of each limit
// (test/e2e/hostile-input.ts); this process's peak is mostly fast-check's
// generated cases.
//
// The seed is fixed so that CI is repeatable; LBCTL_FUZZ_SEED=N picks
// another, LBCTL_FUZZ_RUNS=K multiplies the number of cases.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import t from 'tap';
import { DesiredModel, sameFrontend } from '../../src/model/desired.js';
import { validateEndpointSlice, validateNode, validateService } from '../../src/model/k8s.js';
import type { FrontendKey } from '../../src/lb/types.js';
import type { Frontend } from '../../src/model/types.js';
import { FileSource } from '../../src/sources/file.js';
import { KubernetesSource } from '../../src/sources/kubernetes.js';
import {
  MAX_DEPTH,
  MAX_FILE_BYTES,
  MAX_OBJECTS_PER_FILE,
  MAX_STRING_CHARS,
  MAX_VALUES_PER_OBJECT,
  MAX_WATCH_EVENT_BYTES,
} from '../../src/sources/limits.js';
import type { Problem, SourceEvent } from '../../src/sources/source.js';
import { FakeApiServer } from '../helpers/fake-apiserver.js';
import { asYaml, hostileFile, junk, mutated, SENTINEL, SENTINEL_KEY, service, slice } from '../helpers/hostile.js';

const SEED = Number(process.env.LBCTL_FUZZ_SEED ?? 20261125);
const RUNS = Number(process.env.LBCTL_FUZZ_RUNS ?? 1);

const SENTINEL_KEY_ = SENTINEL_KEY as FrontendKey;
const CATEGORIES = new Set(['invalid', 'limit', 'parse', 'read', 'duplicate', 'error']);

/** Feeds a source's events into a model, as the agent does. */
function feed(model: DesiredModel): (e?: SourceEvent) => void {
  return (e) => {
    if (!e) return;
    if (e.kind === 'Service') model.setService(e.id, e.object);
    else if (e.kind === 'EndpointSlice') model.setSlice(e.id, e.object);
    else model.setNode(e.object);
  };
}

// ------------------------------------------------------------ checks

/** Whether a problem names where it came from (`from`), says why, and is counted under a known category. */
function checkProblem(p: Problem, from: (p: Problem) => boolean): string | undefined {
  if (typeof p.where !== 'string' || p.where === '' || !from(p)) return `${JSON.stringify(p.where)} (kind ${p.kind}) does not name where the input came from`;
  if (typeof p.reason !== 'string' || p.reason.length === 0) return `no reason: ${JSON.stringify(p)}`;
  if (p.reason.length > 2000) return `a reason of ${p.reason.length} characters (it must not echo the input)`;
  if (!CATEGORIES.has(p.category)) return `unknown category ${JSON.stringify(p.category)}`;
  return undefined;
}

function sentinelProblem(model: DesiredModel, sentinel: Frontend): string | undefined {
  const now = model.frontends.get(SENTINEL_KEY_);
  if (!now) return 'the sentinel frontend is gone';
  if (!sameFrontend(now, sentinel)) return `the sentinel changed: ${JSON.stringify(now)}`;
  return undefined;
}

t.test('file source: random and mutated manifests, bombs and binary never stop it; the sentinel stays', async (t) => {
  const dir = mkdtempSync(path.join(tmpdir(), 'lbctl-fuzz-file-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(path.join(dir, 'm-sentinel.yaml'), asYaml(SENTINEL));
  const problems: Problem[] = [];
  const model = new DesiredModel();
  // No re-read on its own: each case reloads explicitly.
  const src = new FileSource({ dir, debounceMs: 600_000, onProblem: (p) => problems.push(p) });
  t.teardown(() => src.stop());
  await src.start(feed(model));
  model.flush();
  const sentinel = model.frontends.get(SENTINEL_KEY_)!;
  t.ok(sentinel, 'the sentinel is in the desired state');
  t.same(problems, [], 'the sentinel file is clean');

  let cases = 0;
  let rejected = 0;
  await fc.assert(
    fc.asyncProperty(hostileFile, async ({ name, text }) => {
      cases++;
      problems.length = 0;
      const file = path.join(dir, name);
      writeFileSync(file, text);
      await src.reload(); // an exception here fails the property
      model.flush();
      const bad = sentinelProblem(model, sentinel) ?? problems.map((p) => checkProblem(p, (x) => x.where.startsWith(dir))).find((x) => x !== undefined);
      rejected += problems.length > 0 ? 1 : 0;
      rmSync(file);
      await src.reload();
      model.flush();
      if (bad) throw new Error(bad);
      const after = sentinelProblem(model, sentinel);
      if (after) throw new Error(`after removing the file: ${after}`);
    }),
    { seed: SEED, numRuns: 1500 * RUNS, includeErrorInReport: true },
  );
  t.ok(cases >= 1500 * RUNS, `${cases} cases`);
  t.ok(rejected > cases / 4, `most cases are rejected with a named problem (${rejected} of ${cases})`);
  t.equal(src.status().complete, true, 'every file removed: the source is complete again');
});

t.test('file source: each limit is named when it is hit, and the last good version of the file stays', async (t) => {
  const dir = mkdtempSync(path.join(tmpdir(), 'lbctl-limits-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const problems: Problem[] = [];
  const model = new DesiredModel();
  const src = new FileSource({ dir, debounceMs: 600_000, onProblem: (p) => problems.push(p) });
  t.teardown(() => src.stop());
  writeFileSync(path.join(dir, 'web.yaml'), asYaml(SENTINEL));
  await src.start(feed(model));
  model.flush();
  const sentinel = model.frontends.get(SENTINEL_KEY_)!;

  const levels = 30;
  const laughs = ['a0: &a0 [lol, lol]', ...Array.from({ length: levels - 1 }, (_, i) => `a${i + 1}: &a${i + 1} [*a${i}, *a${i}]`)];
  const cases: Array<[string, string | Buffer, RegExp, string?]> = [
    ['an alias bomb', `${asYaml([SENTINEL[0]])}  x:\n${laughs.map((l) => `    ${l}`).join('\n')}\n`, new RegExp(`more than ${MAX_VALUES_PER_OBJECT} values with aliases expanded`)],
    ['YAML nested too deep', `${asYaml([SENTINEL[0]])}  x: ${'['.repeat(10_000)}${']'.repeat(10_000)}\n`, /YAML error: nesting exceeded maxDepth/],
    ['JSON nested too deep', JSON.stringify({ ...SENTINEL[0], x: JSON.parse('{"a":'.repeat(1000) + '1' + '}'.repeat(1000)) }), new RegExp(`nested deeper than ${MAX_DEPTH} levels`), 'z.json'],
    ['a huge string', asYaml([{ ...SENTINEL[0], x: 'x'.repeat(MAX_STRING_CHARS + 1) }]), new RegExp(`a string of ${MAX_STRING_CHARS + 1} characters at x`)],
    ['a file over the size limit', Buffer.alloc(MAX_FILE_BYTES + 1, 0x20), new RegExp(`${MAX_FILE_BYTES + 1} bytes, larger than the ${MAX_FILE_BYTES}`)],
    ['too many documents', '{}\n---\n'.repeat(MAX_OBJECTS_PER_FILE + 1), new RegExp(`more than ${MAX_OBJECTS_PER_FILE} YAML documents`)],
    ['a merge-key bomb', `b: &b {${Array.from({ length: 100 }, (_, i) => `k${i}: ${i}`).join(', ')}}\nitems:\n${'  - {<<: *b}\n'.repeat(200)}`, /merge keys exceeded maxTotalMergeKeys/],
    ['not UTF-8 at all', Buffer.from([0xff, 0xfe, 0x00, 0x01, 0x9b, 0x1b, 0x5b]), /YAML error|not a Kubernetes object/],
    ['a duplicate of the sentinel in a later file', asYaml([service('sentinel', '10.96.0.99')]), /Service default\/sentinel is also defined in .*web\.yaml; the one in .*web\.yaml is used/],
  ];
  for (const [what, content, expect, name = 'z.yaml'] of cases) {
    problems.length = 0;
    for (const f of ['z.yaml', 'z.json']) rmSync(path.join(dir, f), { force: true });
    const file = path.join(dir, name);
    // The file turns bad: web.yaml's sentinel and z.yaml's last good read stay.
    const good = service('other', '10.96.0.20');
    writeFileSync(file, name.endsWith('.json') ? JSON.stringify(good) : asYaml([good]));
    await src.reload();
    model.flush();
    t.ok(model.frontends.has('10.96.0.20:80/TCP' as FrontendKey), `${what}: z.yaml's good version is in force`);
    problems.length = 0;
    writeFileSync(file, content);
    await src.reload();
    model.flush();
    t.ok(problems.some((p) => expect.test(p.reason) && p.where.startsWith(file)), `${what}: reported naming the limit and the file (${problems.map((p) => `${p.where}: ${p.reason}`).join('; ').slice(0, 300)})`);
    t.notOk(sentinelProblem(model, sentinel), `${what}: the sentinel is unchanged`);
  }
  // A FIFO named like a manifest would block a reader forever.
  for (const f of ['z.yaml', 'z.json']) rmSync(path.join(dir, f), { force: true });
  execFileSync('mkfifo', [path.join(dir, 'fifo.yaml')]);
  problems.length = 0;
  await src.reload();
  t.ok(problems.some((p) => p.where.endsWith('fifo.yaml') && /not a regular file/.test(p.reason)), 'a FIFO is refused, not read');
  t.notOk(sentinelProblem(model, sentinel), 'the sentinel is unchanged');
});

t.test('validators: any value at all gives a result, never an exception; a rejection names the kind', async (t) => {
  let n = 0;
  const anyObject = fc.oneof(fc.anything({ maxDepth: 4 }), mutated);
  fc.assert(
    fc.property(anyObject, (o) => {
      n++;
      for (const [kind, validate] of [['Service', validateService], ['EndpointSlice', validateEndpointSlice], ['Node', validateNode]] as const) {
        const v = validate(o);
        if (!v.ok && !(typeof v.reason === 'string' && v.reason.startsWith(kind))) throw new Error(`${kind}: reason ${JSON.stringify(v.reason)} does not name the kind`);
      }
    }),
    { seed: SEED, numRuns: 3000 * RUNS, includeErrorInReport: true },
  );
  t.ok(n >= 3000 * RUNS, `${n} values through the three validators`);
});

t.test('Kubernetes source: hostile watch events and lines are reported, the watch recovers, the sentinel stays', async (t) => {
  const api = new FakeApiServer();
  await api.start();
  t.teardown(() => api.stop());
  api.put(SENTINEL[0] as never);
  api.put(SENTINEL[1] as never);
  api.put({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1' } });
  // Items no API server would list: the list must still complete.
  api.rawListItems.set('Service', [null, 7, 'x', [], { metadata: null }, { metadata: { name: { a: 1 } } }]);
  const problems: Problem[] = [];
  const watchErrors: string[] = [];
  const model = new DesiredModel();
  const src = new KubernetesSource({
    kubeconfig: api.kubeconfig,
    nodeName: 'n1',
    backoffMinMs: 5,
    backoffMaxMs: 20,
    onProblem: (p) => problems.push(p),
    onWatchError: (_kind, err) => watchErrors.push((err as Error).message),
  });
  t.teardown(() => src.stop());
  const seen = new Set<string>();
  const on = feed(model);
  await src.start((e) => {
    if (e?.object) seen.add(`${e.kind} ${e.id}`);
    on(e);
  });
  const until = async (what: string, ok: () => boolean): Promise<void> => {
    for (let i = 0; i < 1000 && !ok(); i++) await new Promise((r) => setTimeout(r, 10));
    if (!ok()) throw new Error(`timed out waiting for ${what}`);
  };
  await until('the first list', () => src.status().synced && api.openWatches >= 3);
  model.flush();
  const sentinel = model.frontends.get(SENTINEL_KEY_)!;
  t.ok(sentinel, 'the sentinel is in the desired state');
  t.equal(problems.filter((p) => p.kind === 'Service').length, 6, 'each item of the list that is not an object is reported');

  // Objects that are not the sentinel (the API server is the authority on
  // identity: an event naming the sentinel is its owner's update).
  const notSentinel = mutated.filter((o) => {
    const m = (o as { metadata?: { name?: unknown } } | null)?.metadata;
    return !(typeof m === 'object' && m !== null && (m.name === 'sentinel' || m.name === 'sentinel-1'));
  });
  const line = fc.oneof(
    { weight: 6, arbitrary: fc.tuple(fc.constantFrom('ADDED', 'MODIFIED'), notSentinel).map(([type, object]) => JSON.stringify({ type, object }) + '\n') },
    { weight: 1, arbitrary: fc.tuple(junk, junk).map(([type, object]) => JSON.stringify({ type, object }) + '\n') },
    { weight: 1, arbitrary: fc.string({ unit: 'binary', maxLength: 200 }).map((s) => s.replace(/\n/g, '') + '\n') },
    { weight: 1, arbitrary: fc.constantFrom('{"type":"ADDED"}\n', '[]\n', 'null\n', '{"type":"ADDED","object":null}\n', '{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":{}}}}\n') },
  );
  let n = 0;
  await fc.assert(
    fc.asyncProperty(fc.constantFrom('Service', 'EndpointSlice'), line, async (kind, text) => {
      n++;
      problems.length = 0;
      await until(`a ${kind} watch`, () => api.openWatches >= 3);
      api.sendRaw(kind, text);
      // A canary through the same watch: the source is alive and caught up.
      const canary = `canary-${n}`;
      if (kind === 'Service') api.put(service(canary, '10.96.1.1') as never);
      else api.put(slice(canary, 'web', ['10.244.1.1']) as never);
      await until(`the canary ${canary}`, () => seen.has(`${kind} default/${canary}`));
      model.flush();
      const bad = sentinelProblem(model, sentinel) ?? problems.map((p) => checkProblem(p, (x) => x.kind === kind)).find((x) => x !== undefined);
      if (bad) throw new Error(bad);
    }),
    { seed: SEED, numRuns: 300 * RUNS, includeErrorInReport: true },
  );
  t.ok(n >= 300 * RUNS, `${n} hostile watch lines`);
  t.ok(watchErrors.some((m) => /not JSON/.test(m)), 'a line that is not JSON ends the watch, which is started again');

  // A line longer than any object: refused without reading it whole.
  watchErrors.length = 0;
  api.sendRaw('Service', Buffer.alloc(MAX_WATCH_EVENT_BYTES + 1024 * 1024, 0x61));
  api.put(service('after-the-long-line', '10.96.1.2') as never);
  await until('the object after the long line', () => seen.has('Service default/after-the-long-line'));
  t.ok(watchErrors.some((m) => m.includes(`longer than ${MAX_WATCH_EVENT_BYTES} bytes`)), `the long line is named: ${watchErrors.join('; ').slice(0, 200)}`);
  model.flush();
  t.notOk(sentinelProblem(model, sentinel), 'the sentinel is unchanged');
});
