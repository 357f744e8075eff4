// The test API server (test/helpers/fake-apiserver.ts) serves each list and
// watch as a kube-apiserver of the version it stands for would: from the
// watch cache or read through to etcd, by the request's parameters and that
// release's feature gates (k8s.io/apiserver pkg/storage/cacher). The tests
// of the Kubernetes source count on it, so the table is checked here, one
// request at a time: this is also the table docs/kubernetes.md reasons from.
import { get as httpGet, ServerResponse } from 'node:http';
import { gunzipSync } from 'node:zlib';
import t from 'tap';
import { FakeApiServer, GZIP_THRESHOLD_BYTES, STREAM_WRITE_BYTES as STREAM_CHUNK, type RequestKind, type ServerVersion } from '../helpers/fake-apiserver.js';

const VERSIONS: readonly ServerVersion[] = ['1.26', '1.30', '1.31', '1.32', '1.33', '1.34'];
const PATH = '/api/v1/services';

const service = (i: number) => ({
  apiVersion: 'v1',
  kind: 'Service',
  metadata: { name: `svc-${String(i).padStart(4, '0')}`, namespace: 'default' },
  spec: { type: 'ClusterIP', clusterIP: `10.96.${i >> 8}.${i & 255}`, ports: [{ port: 80, protocol: 'TCP' }] },
});

async function server(version: ServerVersion, n = 3): Promise<FakeApiServer> {
  const api = new FakeApiServer({ version });
  await api.start();
  for (let i = 0; i < n; i++) api.put(service(i) as never);
  return api;
}

async function get(api: FakeApiServer, query: string): Promise<{ kind: RequestKind | undefined; status: number; body: Record<string, unknown> | string }> {
  const res = await fetch(`${api.url}${PATH}?${query}`, { headers: { authorization: 'Bearer fake-token' } });
  const text = await res.text();
  let body: Record<string, unknown> | string = text;
  try {
    body = JSON.parse(text) as Record<string, unknown>;
  } catch {
    // a watch: JSON lines
  }
  return { kind: api.requests.at(-1)!.kind, status: res.status, body };
}

/** A watch's first event (a body of one JSON line is already parsed). */
const firstEvent = (body: Record<string, unknown> | string): unknown => (typeof body === 'string' ? JSON.parse(body.split('\n')[0]!) : body);

t.test('where each list is served from, by release', async (t) => {
  type Row = { query: (rv: number, token: string) => string; what: string; want: Record<ServerVersion, RequestKind> };
  const all = (kind: RequestKind): Record<ServerVersion, RequestKind> => Object.fromEntries(VERSIONS.map((v) => [v, kind])) as Record<ServerVersion, RequestKind>;
  const rows: Row[] = [
    { what: 'resourceVersion=0 (with a limit, which the cache ignores)', query: () => 'resourceVersion=0&limit=2', want: all('list-cache') },
    { what: 'resourceVersion=N, no limit (not older than N)', query: (rv) => `resourceVersion=${rv}`, want: all('list-cache') },
    {
      what: 'no resourceVersion (a consistent list), paged',
      query: () => 'limit=2',
      want: { '1.26': 'list-storage', '1.30': 'list-storage', '1.31': 'list-cache', '1.32': 'list-cache', '1.33': 'list-cache', '1.34': 'list-cache' },
    },
    {
      what: 'a continue token',
      query: (_rv, token) => `limit=2&continue=${token}`,
      want: { '1.26': 'list-storage', '1.30': 'list-storage', '1.31': 'list-storage', '1.32': 'list-storage', '1.33': 'list-storage', '1.34': 'list-cache' },
    },
    {
      what: 'resourceVersion=N with a limit (exact)',
      query: (rv) => `resourceVersion=${rv}&limit=2`,
      want: { '1.26': 'list-storage', '1.30': 'list-storage', '1.31': 'list-storage', '1.32': 'list-storage', '1.33': 'list-storage', '1.34': 'list-cache' },
    },
    {
      what: 'resourceVersionMatch=Exact',
      query: (rv) => `resourceVersion=${rv}&resourceVersionMatch=Exact`,
      want: { '1.26': 'list-storage', '1.30': 'list-storage', '1.31': 'list-storage', '1.32': 'list-storage', '1.33': 'list-storage', '1.34': 'list-cache' },
    },
  ];
  for (const version of VERSIONS) {
    const api = await server(version);
    t.teardown(() => api.stop());
    const first = await get(api, 'limit=2');
    const token = encodeURIComponent(String((first.body as { metadata: { continue: string } }).metadata.continue));
    for (const row of rows) {
      const r = await get(api, row.query(api.resourceVersion, token));
      t.equal(r.status, 200, `${version}: ${row.what}: 200`);
      t.equal(r.kind, row.want[version], `${version}: ${row.what}: ${row.want[version]}`);
    }
  }
});

t.test('resourceVersion 0 is the whole collection in one answer, whatever the limit; a consistent list from the cache pages', async (t) => {
  const api = await server('1.34', 5);
  t.teardown(() => api.stop());
  const zero = (await get(api, 'resourceVersion=0&limit=2')).body as { items: unknown[]; metadata: { continue?: string } };
  t.equal(zero.items.length, 5);
  t.notOk(zero.metadata.continue);
  const consistent = (await get(api, 'limit=2')).body as { items: unknown[]; metadata: { continue?: string } };
  t.equal(consistent.items.length, 2);
  t.ok(consistent.metadata.continue, 'a continue token');
});

t.test('a cache behind etcd: 504 Too large resource version for what it has not reached; a consistent list falls back to etcd', async (t) => {
  const api = await server('1.31');
  t.teardown(() => api.stop());
  api.cacheBehind = 2;
  const ahead = await get(api, `resourceVersion=${api.resourceVersion}`);
  t.equal(ahead.status, 504);
  t.equal(ahead.kind, 'list-cache');
  t.match(ahead.body, {
    kind: 'Status',
    code: 504,
    reason: 'Timeout',
    message: `Timeout: Too large resource version: ${api.resourceVersion}, current: ${api.resourceVersion - 2}`,
    details: { causes: [{ reason: 'ResourceVersionTooLarge', message: 'Too large resource version' }] },
  });
  t.equal((await get(api, `resourceVersion=${api.resourceVersion - 2}`)).status, 200, 'a version it has reached is served');
  t.equal((await get(api, 'resourceVersion=0')).kind, 'list-cache', '"0" is served as the cache is');
  const consistent = await get(api, 'limit=2');
  t.same([consistent.status, consistent.kind], [200, 'list-storage'], "1.31+: a consistent read the cache cannot catch up with falls back to etcd (delegator.go's fallback)");
});

t.test('compaction: an exact version or a continue token older than it is 410 Expired', async (t) => {
  const api = await server('1.30');
  t.teardown(() => api.stop());
  const first = await get(api, 'limit=2');
  const token = encodeURIComponent(String((first.body as { metadata: { continue: string } }).metadata.continue));
  const old = api.resourceVersion;
  api.put(service(9) as never);
  api.compact();
  t.match((await get(api, `resourceVersion=${old}&limit=2`)).body, { code: 410, reason: 'Expired', message: /^too old resource version/ });
  t.match((await get(api, `limit=2&continue=${token}`)).body, { code: 410, reason: 'Expired', message: /continue parameter is too old/ });
  t.equal((await get(api, `resourceVersion=${old}`)).status, 200, 'a list not older than it is served from the cache');
});

t.test('watch-list: initial events, then the annotated bookmark; refused with 422 by servers without it', async (t) => {
  const watchList = 'watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1';
  for (const version of VERSIONS) {
    const api = await server(version);
    t.teardown(() => api.stop());
    const r = await get(api, watchList);
    if (version === '1.32' || version === '1.34') {
      t.equal(r.kind, 'watch-list', `${version}: a watch-list`);
      const events = (r.body as string).trim().split('\n').map((l) => JSON.parse(l) as { type: string; object: { metadata: Record<string, unknown> } });
      t.same(events.map((e) => e.type), ['ADDED', 'ADDED', 'ADDED', 'BOOKMARK'], `${version}: the objects, then a bookmark`);
      t.same(events[3]!.object.metadata, { resourceVersion: String(api.resourceVersion), annotations: { 'k8s.io/initial-events-end': 'true' } }, `${version}: annotated k8s.io/initial-events-end`);
      continue;
    }
    t.equal(r.status, 422, `${version}: 422`);
    t.equal(r.kind, 'invalid');
    const detail = version === '1.26' ? 'resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch' : 'sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled';
    t.match(r.body, { kind: 'Status', code: 422, reason: 'Invalid', message: `ListOptions.meta.k8s.io "" is invalid: ${detail}`, details: { group: 'meta.k8s.io', kind: 'ListOptions' } }, `${version}: ${detail}`);
  }
  const api = await server('1.34');
  t.teardown(() => api.stop());
  t.match((await get(api, 'watch=true&sendInitialEvents=true&timeoutSeconds=1')).body, { code: 422, message: /sendInitialEvents requires setting resourceVersionMatch to NotOlderThan/ }, 'sendInitialEvents needs NotOlderThan');
  api.cacheBehind = 1;
  const lagging = await get(api, watchList);
  t.match(firstEvent(lagging.body), { type: 'ERROR', object: { code: 504, details: { causes: [{ reason: 'ResourceVersionTooLarge' }] } } }, 'a consistent watch-list on a cache behind etcd: an ERROR event, 504 Too large resource version');
});

t.test('restart(): watches from before get 410; lists are served as before', async (t) => {
  const api = await server('1.34');
  t.teardown(() => api.stop());
  const before = api.resourceVersion;
  api.restart();
  api.put(service(7) as never);
  const watch = await get(api, `watch=true&resourceVersion=${before - 1}&timeoutSeconds=1`);
  t.match(firstEvent(watch.body), { type: 'ERROR', object: { code: 410, reason: 'Expired' } });
  t.equal((await get(api, `resourceVersion=${before - 1}`)).status, 200);
  t.same(api.requestKinds({ since: api.requests.length - 2 }), { watch: 1, 'list-cache': 1 });
});

t.test('etcd without progress notifications: consistent lists from etcd, watch-lists answered with an ERROR event (500)', async (t) => {
  const api = new FakeApiServer({ version: '1.34', features: { etcdProgressNotify: false } });
  await api.start();
  t.teardown(() => api.stop());
  api.put(service(0) as never);
  t.equal((await get(api, 'limit=2')).kind, 'list-storage');
  t.equal((await get(api, 'resourceVersion=0')).kind, 'list-cache');
  const r = await get(api, 'watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1');
  t.match(firstEvent(r.body), { type: 'ERROR', object: { code: 500, reason: 'InternalError', message: /required storage feature RequestWatchProgress is disabled/ } });
});

t.test('streaming list encoding (1.33+): the bytes a whole encoding gives (before 1.33), sent as items are encoded', async (t) => {
  const n = 2_000; // about 300 KB: several writes
  // The server's writes of the answer before its end, counted where it makes them.
  const arrivals = async (version: ServerVersion): Promise<{ text: string; writes: number }> => {
    const api = await server(version, n);
    const write = ServerResponse.prototype.write;
    let writes = 0;
    ServerResponse.prototype.write = function (this: ServerResponse, ...args: Parameters<typeof write>) {
      writes++;
      return write.apply(this, args);
    } as typeof write;
    try {
      // Uncompressed (fetch asks for gzip unless told): the writes counted are the list's own.
      const res = await fetch(`${api.url}${PATH}?resourceVersion=0`, { headers: { authorization: 'Bearer fake-token', 'accept-encoding': 'identity' } });
      const parts: Buffer[] = [];
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) parts.push(Buffer.from(chunk));
      return { text: Buffer.concat(parts).toString(), writes };
    } finally {
      ServerResponse.prototype.write = write;
      await api.stop();
    }
  };
  const streamed = await arrivals('1.34');
  const whole = await arrivals('1.32');
  t.equal(streamed.text, whole.text, 'byte for byte the list a whole encoding gives');
  const list = JSON.parse(streamed.text) as { kind: string; items: Array<{ metadata: { name: string } }>; metadata: { resourceVersion: string } };
  t.equal(list.kind, 'ServiceList');
  t.equal(list.items.length, n);
  t.equal(list.items[n - 1]!.metadata.name, `svc-${String(n - 1).padStart(4, '0')}`);
  t.ok(streamed.writes >= Math.floor(streamed.text.length / (64 * 1024)), `streamed: written ${streamed.writes} times as the buffer filled (${streamed.text.length} bytes)`);
  t.equal(whole.writes, 0, 'before 1.33: no write before the one end() that carries the whole list');
});

t.test('streaming list encoding: what is encoded is sent before the next item is encoded', async (t) => {
  // The first item fills a write; the second cannot be encoded. A server that
  // encodes the whole list first sends none of it; one that streams has sent
  // the first item when it fails on the second, and the body ends there.
  const api = await server('1.34', 0);
  t.teardown(() => api.stop());
  const big = 'x'.repeat(100_000);
  api.rawListItems.set('Service', [big, { toJSON: () => { throw new Error('unencodable'); } }]);
  // Uncompressed: a compressing server holds the start until it passes 128 KiB.
  const res = await fetch(`${api.url}${PATH}?resourceVersion=0`, { headers: { authorization: 'Bearer fake-token', 'accept-encoding': 'identity' } });
  t.equal(res.status, 200);
  const parts: Buffer[] = [];
  let ended: unknown;
  try {
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) parts.push(Buffer.from(chunk));
  } catch (err) {
    ended = err;
  }
  const text = Buffer.concat(parts).toString();
  t.ok(ended, 'the body ends in an error: truncated');
  t.match(text, /^\{"kind":"ServiceList","apiVersion":"v1","metadata":\{"resourceVersion":"\d+"\},"items":\["x+"$/, 'the list up to the first item, sent');
  t.equal(text.length - text.indexOf('"x'), big.length + 2, 'all of the first item');
});

/** GET with exactly these headers; the raw body (not inflated) and the answer's content-encoding. */
function raw(api: FakeApiServer, query: string, headers: Record<string, string>): Promise<{ status: number; encoding: string | undefined; body: Buffer }> {
  return new Promise((resolve, reject) => {
    httpGet(`${api.url}${PATH}?${query}`, { headers: { authorization: 'Bearer fake-token', ...headers } }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (d: Buffer) => parts.push(d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, encoding: res.headers['content-encoding'], body: Buffer.concat(parts) }));
      res.on('error', reject);
    }).on('error', reject);
  });
}

t.test('response compression: a list over 128 KiB is gzip for a client that accepts it, whole or streamed; small lists, watches and other clients get it plain', async (t) => {
  const big = 2_000; // about 300 KB
  for (const version of ['1.32', '1.34'] as const) {
    const api = await server(version, big);
    try {
      const plain = await raw(api, 'resourceVersion=0', {});
      t.equal(plain.encoding, undefined, `${version}: no Accept-Encoding: plain`);
      t.equal(api.requests.at(-1)!.contentEncoding, undefined);
      t.equal(api.requests.at(-1)!.bytesSent, plain.body.length, 'the bytes sent, counted');
      t.ok(plain.body.length > GZIP_THRESHOLD_BYTES, `the list is ${plain.body.length} bytes`);
      const zipped = await raw(api, 'resourceVersion=0', { 'accept-encoding': 'gzip, deflate' });
      t.equal(zipped.encoding, 'gzip', `${version}: Accept-Encoding gzip: compressed`);
      t.equal(api.requests.at(-1)!.contentEncoding, 'gzip', 'and recorded so');
      t.equal(api.requests.at(-1)!.bytesSent, zipped.body.length, 'the compressed bytes sent, counted');
      t.ok(zipped.body.length < plain.body.length / 4, `smaller: ${zipped.body.length} bytes`);
      t.equal(gunzipSync(zipped.body).toString(), plain.body.toString(), 'inflates to exactly the plain answer');
      const refused = await raw(api, 'resourceVersion=0', { 'accept-encoding': 'gzip;q=0, identity' });
      t.equal(refused.encoding, undefined, 'gzip;q=0: plain');
      const watch = await raw(api, 'watch=true&timeoutSeconds=1&resourceVersion=0', { 'accept-encoding': 'gzip' });
      t.equal(watch.encoding, undefined, 'a watch is never compressed');
      t.ok(watch.body.length > GZIP_THRESHOLD_BYTES, `even one of ${watch.body.length} bytes`);
    } finally {
      await api.stop();
    }
    const small = await server(version, 10);
    try {
      const r = await raw(small, 'resourceVersion=0', { 'accept-encoding': 'gzip' });
      t.equal(r.encoding, undefined, `${version}: a list under 128 KiB stays plain`);
      t.equal((JSON.parse(r.body.toString()) as { items: unknown[] }).items.length, 10);
    } finally {
      await small.stop();
    }
    const off = new FakeApiServer({ version, features: { responseCompression: false } });
    await off.start();
    try {
      for (let i = 0; i < big; i++) off.put(service(i) as never);
      t.equal((await raw(off, 'resourceVersion=0', { 'accept-encoding': 'gzip' })).encoding, undefined, `${version}: APIResponseCompression off: plain`);
    } finally {
      await off.stop();
    }
  }
});

t.test('response compression of a streamed list: the start is held until it passes the threshold, so an item that fails before then sends nothing', async (t) => {
  const api = await server('1.34', 0);
  t.teardown(() => api.stop());
  const failing = { toJSON: () => { throw new Error('unencodable'); } };
  api.rawListItems.set('Service', ['x'.repeat(STREAM_CHUNK), failing]);
  const ask = (encoding: string) =>
    fetch(`${api.url}${PATH}?resourceVersion=0`, { headers: { authorization: 'Bearer fake-token', 'accept-encoding': encoding } }).then(
      async (r) => ({ status: r.status, body: await r.text().catch(() => '(truncated)') }),
      (err: unknown) => ({ status: 0, body: String(err) }),
    );
  const held = await ask('gzip');
  t.equal(held.status, 0, 'accepting gzip: no answer at all (the server held the start)');
  t.notMatch(held.body, /xxxx/);
  const sent = await ask('identity');
  t.equal(sent.status, 200, 'not accepting it: the first write was sent as it filled');
});
