// The grpc probe's client over @grpc/grpc-js (issue 17, part 2), against
// real grpc-js servers on loopback: kubelet's results through grpcExecutor,
// the deadline at the timeout, cancellation by the prober's signal.
import t from 'tap';
import net from 'node:net';
import grpc from '@grpc/grpc-js';
import { GrpcJsHealthClient, grpcTarget } from '../../src/probes/grpc-health.js';
import { grpcExecutor } from '../../src/probes/probe-exec.js';
import { PROBE_DEFAULTS, type ProbeTarget } from '../../src/model/probe.js';

type Mode = 'serving' | 'not-serving' | 'hang' | 'garbage';

const raw = {
  path: '/grpc.health.v1.Health/Check',
  requestStream: false,
  responseStream: false,
  requestSerialize: (v: Buffer) => v,
  requestDeserialize: (b: Buffer) => b,
  responseSerialize: (v: Buffer) => v,
  responseDeserialize: (b: Buffer) => b,
};

async function server(t: { teardown(fn: () => void): void }, mode: () => Mode, withHealth = true): Promise<{ port: number; services: string[] }> {
  const s = new grpc.Server();
  const services: string[] = [];
  if (withHealth) {
    s.addService({ Check: raw } as never, {
      Check: (call: grpc.ServerUnaryCall<Buffer, Buffer>, cb: grpc.sendUnaryData<Buffer>) => {
        const req = call.request;
        const name = req.length > 2 ? req.subarray(2).toString('utf8') : '';
        services.push(name);
        if (name === 'nope') return cb({ code: grpc.status.NOT_FOUND, details: 'unknown service' });
        const m = mode();
        if (m === 'hang') return;
        if (m === 'garbage') return cb(null, Buffer.from([0xff, 0xff]));
        cb(null, Buffer.from([0x08, m === 'serving' ? 1 : 2]));
      },
    });
  }
  const port = await new Promise<number>((resolve, reject) => s.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
  t.teardown(() => void s.forceShutdown());
  return { port, services };
}

const target = (port: number, service = ''): ProbeTarget => ({ address: '127.0.0.1', port, spec: { ...PROBE_DEFAULTS, handler: { kind: 'grpc', port, service } } });
const client = new GrpcJsHealthClient();
const exec = grpcExecutor(client);
const run = (port: number, service = '', timeoutMs = 1000, signal: AbortSignal = AbortSignal.timeout(timeoutMs + 500)) => exec(target(port, service), { timeoutMs, signal });

t.test('targets are literal addresses, never names to resolve', async (t) => {
  t.equal(grpcTarget('10.0.0.1', 50051), 'ipv4:10.0.0.1:50051');
  t.equal(grpcTarget('fd00::1', 50051), 'ipv6:[fd00::1]:50051');
});

t.test('SERVING is success, NOT_SERVING a failure with its status, the service name is sent', async (t) => {
  let mode: Mode = 'serving';
  const s = await server(t, () => mode);
  t.same(await run(s.port, 'lbctl.test'), { ok: true, detail: 'service healthy' });
  mode = 'not-serving';
  t.same(await run(s.port), { ok: false, reason: 'service unhealthy (responded with "NOT_SERVING")' });
  t.same(s.services, ['lbctl.test', '']);
  t.match(await run(s.port, 'nope'), { ok: false, reason: /^error: health rpc probe failed: unknown service/ }, 'NOT_FOUND, as grpc-go reports it');
  mode = 'garbage';
  t.match(await run(s.port), { ok: false, reason: /not a grpc.health.v1.HealthCheckResponse/ });
});

t.test('a server without the health service: UNIMPLEMENTED, in kubelet words', async (t) => {
  const s = await server(t, () => 'serving', false);
  t.match(await run(s.port), { ok: false, reason: /^error: this server does not implement the grpc health protocol/ });
});

t.test('nothing listening: UNAVAILABLE, "failed to connect"', async (t) => {
  const l = net.createServer();
  await new Promise<void>((r) => l.listen(0, '127.0.0.1', () => r()));
  const port = (l.address() as net.AddressInfo).port;
  await new Promise<void>((r) => l.close(() => r()));
  const t0 = Date.now();
  t.match(await run(port), { ok: false, reason: new RegExp(`^error: failed to connect service at "127.0.0.1:${port}"`) });
  t.ok(Date.now() - t0 < 1000, 'at once, not at the deadline');
});

t.test('no answer: the deadline ends the call at the timeout', async (t) => {
  const s = await server(t, () => 'hang');
  const t0 = Date.now();
  t.same(await run(s.port, '', 300), { ok: false, reason: 'timeout: health rpc did not complete within 0.3s' });
  const took = Date.now() - t0;
  t.ok(took >= 250 && took < 1000, `ended at the deadline (${took} ms)`);
});

t.test("the prober's signal cancels the call", async (t) => {
  const s = await server(t, () => 'hang');
  const ac = new AbortController();
  setTimeout(() => ac.abort(), 100);
  const t0 = Date.now();
  await t.rejects(client.check('127.0.0.1', s.port, '', { timeoutMs: 5000, signal: ac.signal }), { code: grpc.status.CANCELLED });
  t.ok(Date.now() - t0 < 1000, 'cancelled long before the deadline');
  const aborted = AbortSignal.abort();
  await t.rejects(client.check('127.0.0.1', s.port, '', { timeoutMs: 5000, signal: aborted }), { code: grpc.status.CANCELLED }, 'aborted before: no call');
});
