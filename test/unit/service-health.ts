// healthCheckNodePort servers (src/http/service-health.ts) on loopback:
// kube-proxy's answer byte for byte, its 200/503 rule, a taken port reported
// by service and retried, and servers closed with their service.
import http from 'node:http';
import net from 'node:net';
import t from 'tap';
import { healthBody, ServiceHealthServers } from '../../src/http/service-health.js';

async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

function get(port: number, path = '/'): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path, agent: false }, (res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
    }).on('error', reject);
  });
}

t.test("kube-proxy's answer: 200 with a local endpoint and a healthy agent, else 503", async (t) => {
  let healthy = true;
  const servers = new ServiceHealthServers({ healthy: () => healthy, hosts: ['127.0.0.1'] });
  t.teardown(() => servers.close());
  const port = await freePort();
  t.same(await servers.sync([{ namespace: 'default', name: 'web', port, localEndpoints: 2 }]), []);
  const ok = await get(port, '/anything');
  t.equal(ok.status, 200);
  t.equal(ok.headers['content-type'], 'application/json');
  t.equal(ok.headers['x-content-type-options'], 'nosniff');
  t.equal(ok.headers['x-load-balancing-endpoint-weight'], '2');
  t.equal(ok.body, '{\n\t"service": {\n\t\t"namespace": "default",\n\t\t"name": "web"\n\t},\n\t"localEndpoints": 2,\n\t"serviceProxyHealthy": true\n}', 'the body, byte for byte');

  await servers.sync([{ namespace: 'default', name: 'web', port, localEndpoints: 0 }]);
  const none = await get(port);
  t.equal(none.status, 503, 'no local endpoint: 503');
  t.match(none.body, /"localEndpoints": 0,/);
  t.equal(none.headers['x-load-balancing-endpoint-weight'], '0');

  await servers.sync([{ namespace: 'default', name: 'web', port, localEndpoints: 1 }]);
  healthy = false;
  const sick = await get(port);
  t.equal(sick.status, 503, 'an unhealthy agent: 503 even with endpoints');
  t.equal(sick.body, healthBody({ namespace: 'default', name: 'web', localEndpoints: 1 }, false));
});

t.test('a taken port is reported by service and retried; the others are served; removal and port changes close', async (t) => {
  const servers = new ServiceHealthServers({ healthy: () => true, hosts: ['127.0.0.1'] });
  t.teardown(() => servers.close());
  const [p1, p2, p3] = [await freePort(), await freePort(), await freePort()];
  const squatter = net.createServer();
  await new Promise<void>((r) => squatter.listen(p2, '127.0.0.1', r));
  const problems = await servers.sync([
    { namespace: 'a', name: 'one', port: p1, localEndpoints: 1 },
    { namespace: 'b', name: 'two', port: p2, localEndpoints: 1 },
  ]);
  t.same(problems, [{ service: 'b/two', port: p2, reason: 'EADDRINUSE' }]);
  t.equal((await get(p1)).status, 200, 'the other service is served');
  await new Promise((r) => squatter.close(r));
  t.same(await servers.sync([
    { namespace: 'a', name: 'one', port: p1, localEndpoints: 1 },
    { namespace: 'b', name: 'two', port: p2, localEndpoints: 1 },
  ]), [], 'the next sync binds it');
  t.match((await get(p2)).body, /"name": "two"/);

  await servers.sync([{ namespace: 'a', name: 'one', port: p3, localEndpoints: 1 }]);
  t.equal((await get(p3)).status, 200, 'a changed port is served');
  await t.rejects(get(p1), { code: 'ECONNREFUSED' }, 'and the old one closed');
  await t.rejects(get(p2), { code: 'ECONNREFUSED' }, 'a removed service is closed');
  t.same([...servers.ports()], [['a/one', p3]]);
});
