// A Kubernetes list read one item at a time (src/sources/list-stream.ts):
// the same items, metadata and errors as parsing the whole body, however
// the bytes are split, and memory of one item for a list of any length.
import { deepStrictEqual } from 'node:assert/strict';
import v8 from 'node:v8';
import vm from 'node:vm';
import fc from 'fast-check';
import t from 'tap';
import { readList } from '../../src/sources/list-stream.js';

/** `text` as a stream of chunks of the given sizes (the last size repeats). */
async function* chunks(text: string | Buffer, sizes: readonly number[]): AsyncIterable<Buffer> {
  const buf = Buffer.isBuffer(text) ? text : Buffer.from(text);
  for (let at = 0, i = 0; at < buf.length; i++) {
    const n = Math.max(1, sizes[Math.min(i, sizes.length - 1)]!);
    yield buf.subarray(at, at + n);
    at += n;
  }
}

async function read(text: string | Buffer, sizes: readonly number[] = [1 << 16], max = 1 << 20): Promise<{ items: unknown[]; meta: unknown }> {
  const items: unknown[] = [];
  const meta = await readList(chunks(text, sizes), max, (item) => items.push(item));
  return { items, meta };
}

const tricky = {
  metadata: { name: 'a"b}c]', namespace: 'x\\y', annotations: { '{': '[', u: 'zoné ✓ 🚀', esc: '\\"\\\\', nl: 'a\nb' } },
  spec: { ports: [{ port: 80 }, { port: 443 }], empty: {}, none: [], n: -1.5e3, t: true, f: false, z: null },
};

t.test('a list: its items in order, its version and continue token, whatever the chunks', async (t) => {
  const list = { kind: 'ServiceList', apiVersion: 'v1', metadata: { resourceVersion: '1234', continue: 'tok' }, items: [tricky, null, 7, 'x', [], {}, { metadata: null }] };
  const text = JSON.stringify(list);
  for (const sizes of [[1], [2], [3], [7], [64], [text.length]]) {
    const r = await read(text, sizes);
    t.same(r.items, list.items, `chunks of ${sizes[0]} bytes: the items`);
    t.same(r.meta, { resourceVersion: '1234', continue: 'tok' }, `chunks of ${sizes[0]} bytes: the metadata`);
  }
  const spaced = `\n {\n "items" : [ ${JSON.stringify(tricky)} , 7 , null ] ,\n "metadata" : { "resourceVersion" : "9" } , "kind" : "List"\n }\n `;
  t.same(await read(spaced, [1]), { items: [tricky, 7, null], meta: { resourceVersion: '9' } }, 'whitespace anywhere, metadata after the items');
  t.same(await read('{"kind":"List","items":null,"metadata":{}}'), { items: [], meta: { resourceVersion: '' } }, 'null items: an empty list');
  t.same(await read('{"items":[]}'), { items: [], meta: { resourceVersion: '' } }, 'no metadata');
  t.same(await read('{"metadata":{"resourceVersion":"5","continue":""}}'), { items: [], meta: { resourceVersion: '5' } }, 'no items, an empty continue token: none');
});

t.test('what is not a list, or not all of one, is an error', async (t) => {
  const cases: Array<[string, RegExp]> = [
    ['[]', /not a JSON object/],
    ['"list"', /not a JSON object/],
    ['{"items":{}}', /items are not an array/],
    ['{"items":7}', /items are not an array/],
    ['{"items":[{"a":1}', /ended before the list did/],
    ['{"items":[{"a":1},]}', /item 1 of the list is not JSON/],
    ['{"items":[{"a":}]}', /item 0 of the list is not JSON/],
    ['{"items":[1] 2}', /where ',' or '}' belongs/],
    ['{"items":[1 2]}', /where ',' or '\]' belongs/],
    ['{"items":[]} x', /more after its end/],
    ['{items:[]}', /where a member name belongs/],
    ['{"items" []}', /where ':' belongs/],
    ['{"metadata":{"resourceVersion":}}', /metadata is not JSON/],
    ['', /ended before the list did/],
  ];
  for (const [text, err] of cases) await t.rejects(read(text, [3]), err, JSON.stringify(text));
  await t.rejects(read(`{"items":[${JSON.stringify({ big: 'x'.repeat(2000) })}]}`, [100], 1000), /item 0 of the list longer than 1000 bytes/, 'an item past the bound');
  await t.rejects(read(`{"kind":"${'k'.repeat(2 << 20)}","items":[]}`, [4096]), /the list's "kind" longer than/, 'a member past its bound, even one skipped');
});

t.test('any JSON list, split anywhere: the items JSON.parse gives', async (t) => {
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.jsonValue({ maxDepth: 4 }), { maxLength: 8 }),
      fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 20 }),
      fc.string(),
      async (items, sizes, rv) => {
        const text = JSON.stringify({ kind: 'List', metadata: { resourceVersion: rv }, items });
        const r = await read(text, sizes);
        deepStrictEqual(r.items, JSON.parse(text).items);
        deepStrictEqual(r.meta, { resourceVersion: rv });
      },
    ),
    { numRuns: 300, seed: 18 },
  );
  t.pass('300 lists, each split at random');
});

t.test("a list of 200,000 items costs one item's memory, not the list's", async (t) => {
  const item = (i: number): string => JSON.stringify({ metadata: { name: `svc-${i}`, namespace: 'default', resourceVersion: String(i) }, spec: { clusterIP: '10.96.0.1', ports: [{ port: 80 }] }, pad: 'p'.repeat(400) });
  const n = 200_000;
  async function* body(): AsyncIterable<Buffer> {
    yield Buffer.from('{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[');
    for (let i = 0; i < n; i += 1000) {
      const part: string[] = [];
      for (let j = i; j < i + 1000; j++) part.push(item(j));
      yield Buffer.from((i > 0 ? ',' : '') + part.join(','));
    }
    yield Buffer.from(']}');
  }
  const bytes = n * (item(0).length + 1);
  // What the heap holds, garbage collected first.
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc') as () => void;
  const live = (): number => {
    gc();
    return process.memoryUsage().heapUsed;
  };
  const before = live();
  let peak = before;
  let count = 0;
  const meta = await readList(body(), 1 << 20, () => {
    if (++count % 10_000 === 0) peak = Math.max(peak, live());
  });
  t.equal(count, n);
  t.same(meta, { resourceVersion: '7' });
  const grewMiB = (peak - before) / 2 ** 20;
  t.ok(grewMiB < 8, `the live heap grew ${grewMiB.toFixed(1)} MiB at most while ${(bytes / 2 ** 20).toFixed(0)} MiB of list went through`);
});
