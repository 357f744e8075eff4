// The probe executors (src/probes/probe-exec.ts) against real servers on
// loopback: HTTP and HTTPS (a self-signed certificate: no check, as
// kubelet), status codes, headers, redirects to the same host only, a
// bounded body, the abort signal; TCP handshakes; the gRPC mapping and the
// health protocol's codec.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import t from 'tap';
import {
  decodeHealthCheckResponse,
  encodeHealthCheckRequest,
  grpcExecutor,
  httpGetExecutor,
  probeHeaders,
  tcpSocketExecutor,
  USER_AGENT,
  type GrpcHealthClient,
} from '../../src/probes/probe-exec.js';
import type { ProbeOutcome } from '../../src/probes/prober.js';
import { PROBE_DEFAULTS, type HttpHeader, type ProbeTarget } from '../../src/model/probe.js';

const LOOPBACK = '127.0.0.1';

const httpTarget = (port: number, p: string, scheme: 'HTTP' | 'HTTPS' = 'HTTP', httpHeaders: HttpHeader[] = []): ProbeTarget => ({
  address: LOOPBACK,
  port,
  spec: { ...PROBE_DEFAULTS, handler: { kind: 'httpGet', path: p, port, scheme, httpHeaders } },
});
const tcpTarget = (port: number): ProbeTarget => ({ address: LOOPBACK, port, spec: { ...PROBE_DEFAULTS, handler: { kind: 'tcpSocket', port } } });
const run = (e: typeof httpGetExecutor, tg: ProbeTarget, signal = AbortSignal.timeout(5000)): Promise<ProbeOutcome> => e(tg, { timeoutMs: 5000, signal });

const listen = (server: net.Server): Promise<number> =>
  new Promise((resolve) => server.listen(0, LOOPBACK, () => resolve((server.address() as net.AddressInfo).port)));

/** The test server's routes; it records each request's headers. */
function handler(seen: http.IncomingHttpHeaders[], hung: http.ServerResponse[]): http.RequestListener {
  return (req, res) => {
    seen.push(req.headers);
    const url = req.url ?? '/';
    const m = /^\/status\/(\d+)$/.exec(url);
    if (m) return void res.writeHead(Number(m[1])).end('x');
    if (url === '/ok') return void res.end('fine');
    if (url === '/same') return void res.writeHead(302, { location: '/ok' }).end();
    if (url === '/same-to-fail') return void res.writeHead(301, { location: `http://${LOOPBACK}:${(req.socket.localPort ?? 0)}/status/503` }).end();
    if (url === '/elsewhere') return void res.writeHead(302, { location: 'http://probe-target.invalid/' }).end();
    if (url.startsWith('/loop')) return void res.writeHead(302, { location: `/loop${url.length}` }).end();
    if (url === '/big') {
      res.writeHead(200);
      // A megabyte, slowly: the probe must not wait for all of it.
      const chunk = Buffer.alloc(16 * 1024, 'a');
      let sent = 0;
      const more = (): void => {
        if (res.destroyed || sent >= 64) return void res.end();
        sent++;
        res.write(chunk);
        setTimeout(more, 50);
      };
      return more();
    }
    if (url === '/hang') return void hung.push(res);
    res.writeHead(404).end();
  };
}

t.test('httpGet over HTTP: 200-399 succeed, others fail with the status; headers as kubelet sends them', async (t) => {
  const seen: http.IncomingHttpHeaders[] = [];
  const hung: http.ServerResponse[] = [];
  const server = http.createServer(handler(seen, hung));
  const port = await listen(server);
  t.teardown(() => {
    for (const r of hung) r.destroy();
    server.close();
  });
  t.same(await run(httpGetExecutor, httpTarget(port, '/ok')), { ok: true });
  t.same(await run(httpGetExecutor, httpTarget(port, '/status/204')), { ok: true });
  t.match(await run(httpGetExecutor, httpTarget(port, '/status/399')), { ok: true, detail: /Probe terminated redirects/ });
  t.same(await run(httpGetExecutor, httpTarget(port, '/status/400')), { ok: false, reason: 'HTTP probe failed with statuscode: 400' });
  t.same(await run(httpGetExecutor, httpTarget(port, '/status/503')), { ok: false, reason: 'HTTP probe failed with statuscode: 503' });
  t.same(await run(httpGetExecutor, httpTarget(port, '/status/404')), { ok: false, reason: 'HTTP probe failed with statuscode: 404' });
  t.match(await run(httpGetExecutor, httpTarget(port, '/status/302')), { ok: true, detail: 'Probe terminated redirects (302)' }, 'a redirect without a Location is not followed: success');

  seen.length = 0;
  t.same(await run(httpGetExecutor, httpTarget(port, '//probe-target.invalid/ok')), { ok: true }, 'a path that names a host still asks the backend (kubelet replaces the host)');
  t.same(await run(httpGetExecutor, httpTarget(port, 'http://probe-target.invalid:1/ok')), { ok: true });
  t.equal(seen.length, 2);
  seen.length = 0;
  await run(httpGetExecutor, httpTarget(port, '/ok'));
  t.match(seen[0], { host: `${LOOPBACK}:${port}`, 'user-agent': USER_AGENT, accept: '*/*' }, 'defaults: Host is the backend, kube-probe User-Agent, Accept */*');
  t.notOk(seen[0]?.connection === 'keep-alive', 'no keep-alive');
  seen.length = 0;
  await run(httpGetExecutor, httpTarget(port, '/ok', 'HTTP', [{ name: 'Host', value: 'api.example.com' }, { name: 'User-Agent', value: 'mine' }, { name: 'Accept', value: '' }, { name: 'X-Probe', value: '1' }]));
  t.match(seen[0], { host: 'api.example.com', 'user-agent': 'mine', 'x-probe': '1' }, 'httpHeaders: Host sets the Host, User-Agent replaces the default');
  t.notOk('accept' in seen[0]!, 'an empty Accept removes it');
});

t.test('redirects: followed to the same host (10 requests at most), never elsewhere (whose 3xx is success, as kubelet)', async (t) => {
  const seen: http.IncomingHttpHeaders[] = [];
  const server = http.createServer(handler(seen, []));
  const port = await listen(server);
  t.teardown(() => server.close());
  seen.length = 0;
  t.same(await run(httpGetExecutor, httpTarget(port, '/same')), { ok: true });
  t.equal(seen.length, 2, 'the redirect was followed');
  t.same(await run(httpGetExecutor, httpTarget(port, '/same-to-fail')), { ok: false, reason: 'HTTP probe failed with statuscode: 503' }, 'and its target decides');
  seen.length = 0;
  t.match(await run(httpGetExecutor, httpTarget(port, '/elsewhere')), { ok: true, detail: 'Probe terminated redirects (302 to probe-target.invalid)' });
  t.equal(seen.length, 1, 'not followed to another host');
  seen.length = 0;
  t.match(await run(httpGetExecutor, httpTarget(port, '/loop')), { ok: false, reason: /stopped after 10 redirects/ });
  t.equal(seen.length, 10, 'ten requests, as Go\'s client makes');
});

t.test('httpGet reads 10 KiB of the body at most, and stops at the signal', async (t) => {
  const hung: http.ServerResponse[] = [];
  const server = http.createServer(handler([], hung));
  const port = await listen(server);
  t.teardown(() => {
    for (const r of hung) r.destroy();
    server.close();
  });
  const started = Date.now();
  t.same(await run(httpGetExecutor, httpTarget(port, '/big')), { ok: true });
  t.ok(Date.now() - started < 1000, 'a megabyte sent over 3 s is not waited for');
  const ac = new AbortController();
  const pending = run(httpGetExecutor, httpTarget(port, '/hang'), ac.signal);
  setTimeout(() => ac.abort(), 50);
  t.match(await pending, { ok: false, reason: /ABORT_ERR|aborted/i }, 'a server that never answers: the signal ends it');
});

t.test('httpGet over HTTPS: a self-signed certificate is not checked, as kubelet', async (t) => {
  const dir = mkdtempSync(path.join(tmpdir(), 'lbctl-probe-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  try {
    execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', path.join(dir, 'key.pem'), '-out', path.join(dir, 'cert.pem'), '-days', '1', '-subj', '/CN=backend.invalid'], { stdio: 'ignore' });
  } catch {
    t.fail('openssl is needed to make the test certificate');
    return;
  }
  const seen: http.IncomingHttpHeaders[] = [];
  const server = https.createServer({ key: readFileSync(path.join(dir, 'key.pem')), cert: readFileSync(path.join(dir, 'cert.pem')) }, handler(seen, []));
  const port = await listen(server);
  t.teardown(() => server.close());
  t.same(await run(httpGetExecutor, httpTarget(port, '/ok', 'HTTPS')), { ok: true });
  t.same(await run(httpGetExecutor, httpTarget(port, '/status/500', 'HTTPS')), { ok: false, reason: 'HTTP probe failed with statuscode: 500' });
  t.match(await run(httpGetExecutor, httpTarget(port, '/ok', 'HTTP')), { ok: false }, 'plain HTTP to a TLS port fails');
});

t.test('httpGet to a closed port fails with the error', async (t) => {
  const server = net.createServer();
  const port = await listen(server);
  await new Promise<void>((resolve) => server.close(() => resolve()));
  t.match(await run(httpGetExecutor, httpTarget(port, '/')), { ok: false, reason: /ECONNREFUSED/ });
});

t.test('tcpSocket: a completed handshake succeeds (and the connection is closed); a refused one fails', async (t) => {
  let accepted = 0;
  let closed = 0;
  const server = net.createServer((s) => {
    accepted++;
    s.on('close', () => closed++);
    s.resume();
  });
  const port = await listen(server);
  t.teardown(() => server.close());
  t.same(await run(tcpSocketExecutor, tcpTarget(port)), { ok: true });
  await new Promise((r) => setTimeout(r, 50));
  t.equal(accepted, 1);
  t.equal(closed, 1, 'the probe does not leave its connection open');
  const gone = net.createServer();
  const deadPort = await listen(gone);
  await new Promise<void>((resolve) => gone.close(() => resolve()));
  t.match(await run(tcpSocketExecutor, tcpTarget(deadPort)), { ok: false, reason: new RegExp(`dial tcp ${LOOPBACK}:${deadPort}: ECONNREFUSED`) });
  t.match(await run(tcpSocketExecutor, tcpTarget(port), AbortSignal.abort()), { ok: false, reason: /aborted/ }, 'an aborted signal: no connection at all');
});

t.test("grpc: kubelet's results and messages over an injected health client", async (t) => {
  const tg: ProbeTarget = { address: '10.0.0.1', port: 50051, spec: { ...PROBE_DEFAULTS, handler: { kind: 'grpc', port: 50051, service: 'api' } } };
  const answer = (fn: GrpcHealthClient['check']): GrpcHealthClient => ({ check: fn });
  const calls: string[] = [];
  const serving = grpcExecutor(answer(async (a, p, s) => (calls.push(`${a}:${p}/${s}`), 'SERVING')));
  t.same(await serving(tg, { timeoutMs: 1000, signal: AbortSignal.timeout(1000) }), { ok: true, detail: 'service healthy' });
  t.same(calls, ['10.0.0.1:50051/api']);
  const notServing = grpcExecutor(answer(async () => 'NOT_SERVING'));
  t.same(await notServing(tg, { timeoutMs: 1000, signal: AbortSignal.timeout(1000) }), { ok: false, reason: 'service unhealthy (responded with "NOT_SERVING")' });
  const fails = (code: number): Promise<ProbeOutcome> =>
    grpcExecutor(answer(async () => Promise.reject(Object.assign(new Error('m'), { code, details: 'd' }))))(tg, { timeoutMs: 2000, signal: AbortSignal.timeout(1000) });
  t.match(await fails(12), { ok: false, reason: 'error: this server does not implement the grpc health protocol (grpc.health.v1.Health): d' });
  t.match(await fails(4), { ok: false, reason: 'timeout: health rpc did not complete within 2s' });
  t.match(await fails(14), { ok: false, reason: 'error: failed to connect service at "10.0.0.1:50051": d' });
  t.match(await fails(13), { ok: false, reason: 'error: health rpc probe failed: d' });
  t.match(await grpcExecutor(undefined)(tg, { timeoutMs: 1000, signal: AbortSignal.timeout(1000) }), { ok: false, error: true }, 'no client: a prober error, thrown away');
});

t.test('the health protocol codec: HealthCheckRequest out, HealthCheckResponse in', async (t) => {
  t.same([...encodeHealthCheckRequest('')], [], 'the default service: an empty message');
  t.same([...encodeHealthCheckRequest('api')], [0x0a, 3, 0x61, 0x70, 0x69]);
  const long = encodeHealthCheckRequest('s'.repeat(300));
  t.same([...long.subarray(0, 3)], [0x0a, 0xac, 0x02], 'a varint length');
  t.equal(decodeHealthCheckResponse(Uint8Array.from([0x08, 1])), 'SERVING');
  t.equal(decodeHealthCheckResponse(Uint8Array.from([0x08, 2])), 'NOT_SERVING');
  t.equal(decodeHealthCheckResponse(Uint8Array.from([0x08, 3])), 'SERVICE_UNKNOWN');
  t.equal(decodeHealthCheckResponse(Uint8Array.from([])), 'UNKNOWN', 'status 0 is the default');
  t.equal(decodeHealthCheckResponse(Uint8Array.from([0x12, 2, 0x61, 0x62, 0x08, 1])), 'SERVING', 'unknown fields are skipped');
  t.equal(decodeHealthCheckResponse(Uint8Array.from([0x08, 9])), 'UNKNOWN', 'an unknown status is not SERVING');
  t.equal(decodeHealthCheckResponse(Uint8Array.from([0x08])), undefined, 'truncated');
  t.equal(decodeHealthCheckResponse(Uint8Array.from([0x12, 50, 1])), undefined, 'a length past the end');
});

t.test('probeHeaders: case-insensitive defaults, repeated names joined', async (t) => {
  t.same(probeHeaders([]), { 'User-Agent': USER_AGENT, Accept: '*/*' });
  t.same(probeHeaders([{ name: 'user-agent', value: 'x' }, { name: 'X-A', value: '1' }, { name: 'x-a', value: '2' }]), { 'user-agent': 'x', 'X-A': '1, 2', Accept: '*/*' });
});
