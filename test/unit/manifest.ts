// parseManifests: a file's text → its objects, each with where it was found,
// and a problem for everything that cannot be read. Pure; never throws.
import t from 'tap';
import { parseManifests, shapeProblem } from '../../src/sources/manifest.js';
import { MAX_DEPTH, MAX_STRING_CHARS, MAX_VALUES_PER_OBJECT } from '../../src/sources/limits.js';

const where = (r: ReturnType<typeof parseManifests>): string[] => r.entries.map((e) => ('reason' in e ? `${e.where}: ${e.category}` : e.where));

t.test('documents are counted as YAML counts them: leading comments and directives belong to the first', async (t) => {
  t.same(where(parseManifests('a: 1\n---\nb: 2\n', 'yaml')), ['document 0', 'document 1']);
  t.same(where(parseManifests('---\na: 1\n---\nb: 2\n', 'yaml')), ['document 0', 'document 1'], 'a leading --- starts document 0');
  t.same(where(parseManifests('# a comment\n%YAML 1.2\n---\na: 1\n', 'yaml')), ['document 0'], 'comments and directives before the first --- are not a document');
  t.same(where(parseManifests('a: 1\n---\n---\nb: 2\n', 'yaml')), ['document 0', 'document 2'], 'an empty document counts, and yields nothing');
  t.same(where(parseManifests('--- {a: 1}\n--- [1]\n', 'yaml')), ['document 0', 'document 1'], 'content on the marker line');
  t.same(where(parseManifests('a: |\n  ---\n  x\n', 'yaml')), ['document 0'], 'an indented --- inside a block scalar is content');
  t.same(where(parseManifests('a: 1\r\n---\r\nb: 2\r\n', 'yaml')), ['document 0', 'document 1'], 'CRLF line ends');
});

t.test('a broken document costs only itself, and its error names the line in the file', async (t) => {
  const r = parseManifests('a: 1\n---\nb: [1\n---\nc: 3\n', 'yaml');
  t.same(where(r), ['document 0', 'document 1: parse', 'document 2']);
  t.ok(r.broken, 'the file is marked broken: what document 1 held is unknown');
  const problem = r.entries[1] as { reason: string };
  t.match(problem.reason, /^YAML error: .* at line \d+, column \d+$/);
  t.match(problem.reason, / at line (4|5),/, 'the line counts from the top of the file, not the document');
});

t.test('List items are objects of their own; JSON goes through JSON.parse', async (t) => {
  const list = { apiVersion: 'v1', kind: 'List', items: [{ kind: 'Service' }, { kind: 'EndpointSlice' }] };
  t.same(where(parseManifests(JSON.stringify(list), 'json')), ['document 0, item 0', 'document 0, item 1']);
  const bad = parseManifests('{"kind": "Service",', 'json');
  t.ok(bad.broken);
  t.match((bad.entries[0] as { reason: string }).reason, /^not JSON: /);
});

t.test('shapes beyond the limits are named with where in the object they are', async (t) => {
  t.equal(shapeProblem({ a: [1, 'x', { b: null }] }), undefined);
  let deep: unknown = 1;
  for (let i = 0; i < MAX_DEPTH + 5; i++) deep = { a: deep };
  t.match(shapeProblem(deep), `nested deeper than ${MAX_DEPTH} levels (at a.a.a`);
  t.match(shapeProblem({ spec: { x: 'x'.repeat(MAX_STRING_CHARS + 1) } }), `a string of ${MAX_STRING_CHARS + 1} characters at spec.x`);
  // A graph of shared values: 2^40 values if walked as a tree; the walk stops at the limit.
  let shared: unknown = ['lol', 'lol'];
  for (let i = 0; i < 40; i++) shared = [shared, shared];
  // (Walked as a tree it would not end within the test's timeout.)
  t.match(shapeProblem({ spec: { ports: shared } }), `more than ${MAX_VALUES_PER_OBJECT} values with aliases expanded`);
  t.match(shapeProblem({ x: new Array(MAX_VALUES_PER_OBJECT + 1).fill(0) }), `more than ${MAX_VALUES_PER_OBJECT} values`, 'a wide list is refused before its items are visited');
});

t.test('what no manifest is: never an exception', async (t) => {
  for (const text of ['', '\0\0\0', '\uFFFF\uD800', '- - - -', ':::', '&a [*a]', '*nothing', '!!binary AAAA', '%YAML 9.9\n---\na', 'a: !!js/function "x"']) {
    t.doesNotThrow(() => parseManifests(text, 'yaml'), JSON.stringify(text));
    t.doesNotThrow(() => parseManifests(text, 'json'), JSON.stringify(text));
  }
});
