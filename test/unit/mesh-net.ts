// The health mesh's network side on loopback: the /hello listener (a worker
// thread) answering the HTTP probe, and how failures are named.
import net from 'node:net';
import t from 'tap';
import { classify, httpProbe, startHelloServer } from '../../src/mesh/mesh-net.js';

t.test('/hello answers the probe; other paths do not exist', async (t) => {
  const hello = await startHelloServer({ port: 0, host: '127.0.0.1', node: 'n1' });
  t.teardown(() => hello.close());
  const r = await httpProbe('127.0.0.1', hello.port, 1000);
  t.ok(r.ok && r.rttMs > 0 && r.rttMs < 1000, `ok, RTT ${r.ok ? r.rttMs.toFixed(2) : '-'} ms`);
  const other = await fetch(`http://127.0.0.1:${hello.port}/other`);
  t.equal(other.status, 404);
  await t.rejects(startHelloServer({ port: hello.port, host: '127.0.0.1', node: 'n1' }), { code: 'EADDRINUSE', message: /cannot listen on port/ }, 'a taken port is a clear error');
});

t.test('refused, a silent peer (timeout) and a wrong answer are named', async (t) => {
  // A port nothing listens on.
  const free = net.createServer();
  await new Promise<void>((r) => free.listen(0, '127.0.0.1', r));
  const port = (free.address() as net.AddressInfo).port;
  await new Promise<void>((r) => free.close(() => r()));
  t.match(await httpProbe('127.0.0.1', port, 1000), { ok: false, error: 'refused' });
  // A server that accepts and never answers: the probe ends at its timeout.
  const silent = net.createServer(() => {});
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
  t.teardown(() => silent.close());
  const start = Date.now();
  t.match(await httpProbe('127.0.0.1', (silent.address() as net.AddressInfo).port, 300), { ok: false, error: 'timeout' });
  t.ok(Date.now() - start < 1000, 'within its timeout');
  // A server that answers something else than 200.
  const wrong = net.createServer((s) => s.end('HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n'));
  await new Promise<void>((r) => wrong.listen(0, '127.0.0.1', r));
  t.teardown(() => wrong.close());
  t.match(await httpProbe('127.0.0.1', (wrong.address() as net.AddressInfo).port, 1000), { ok: false, error: 'http-503' });
});

t.test('errnos are named as the ICMP probe names them', async (t) => {
  t.equal(classify('ECONNREFUSED'), 'refused');
  t.equal(classify('EHOSTUNREACH'), 'unreachable');
  t.equal(classify('ENETUNREACH'), 'unreachable');
  t.equal(classify('EHOSTDOWN'), 'unreachable');
  t.equal(classify('ETIMEDOUT'), 'timeout');
  t.equal(classify('ECONNRESET'), 'ECONNRESET');
  t.equal(classify(undefined), 'error');
});
