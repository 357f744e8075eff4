// What kube-proxy's REJECT rules do, at the socket: a service with no ready
// backend, and a service address on a port it does not serve, fail connect()
// and sendto() at once with ECONNREFUSED (no SYN retries, no timeout), and
// the datapath counts each refusal. Kernels without bpf_set_retval (before
// 5.18) refuse with EPERM instead (the compat object; docs/kernels.md).
import t from 'tap';
import { hasSetRetval } from '../../src/datapath/features.js';
import { createSandbox, HTTP_PORT, SLOW } from '../helpers/sandbox.js';
import { serviceWithBackends, yamlDocs, serviceObject, sliceObject } from '../helpers/manifests.js';

const EMPTY = '10.96.0.40';
const WEB = '10.96.0.10';

interface Refused {
  error: string | null;
  ms: number;
}

t.test('refused at once: no backends, or an unserved port', async (t) => {
  const sb = await createSandbox(t, { backends: 1 });
  sb.writeManifest(
    'web.yaml',
    serviceWithBackends({ name: 'web', clusterIPs: [WEB], ports: [{ name: 'http', port: 80 }] }, [
      { name: 'web-v4', family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: [sb.backends[0]!.v4] },
    ]),
  );
  // No ready endpoint: the only one is ready: false.
  sb.writeManifest(
    'empty.yaml',
    yamlDocs([
      serviceObject({
        name: 'empty',
        clusterIPs: [EMPTY],
        ports: [
          { name: 'http', port: 80 },
          { name: 'dns', port: 53, protocol: 'UDP' },
        ],
      }),
      sliceObject({
        name: 'empty-v4',
        service: 'empty',
        family: 4,
        ports: [
          { name: 'http', port: HTTP_PORT },
          { name: 'dns', port: 53, protocol: 'UDP' },
        ],
        addresses: [],
        notReady: [sb.backends[0]!.v4],
      }),
    ]),
  );
  await sb.waitUntil(async () => (await sb.lbList()).length === 3, 'three frontends in the maps');
  const m0 = await sb.metrics();

  // curl: exit 7 (couldn't connect), well under a second.
  const curl = await sb.exec(['curl', '-sS', '--max-time', String(5 * SLOW), '-o', '/dev/null', '-w', '%{time_total}', `http://${EMPTY}/`]);
  t.equal(curl.code, 7, `curl to a service without backends exits 7 (${curl.stderr.trim()})`);
  t.match(curl.stderr, /Connection refused|Couldn't connect/, 'curl reports the refusal');
  t.ok(Number(curl.stdout) < 0.5, `curl gave up after ${curl.stdout} s`);

  const cases: Array<[string, string, string]> = [
    ['TCP connect() to a service without backends', EMPTY, '80 --proto tcp'],
    ['UDP sendto() to a service without backends', EMPTY, '53 --proto udp'],
    ['TCP connect() to a service address on an unserved port', WEB, '81 --proto tcp'],
    ['UDP sendto() to a service address on an unserved port', WEB, '5353 --proto udp'],
  ];
  const errno = (await hasSetRetval()) ? 'ECONNREFUSED' : 'EPERM';
  for (const [what, host, rest] of cases) {
    const r = await sb.client<Refused>(['refused', host, ...rest.split(' ')]);
    t.equal(r.error, errno, `${what}: ${errno}`);
    t.ok(r.ms < 100, `${what}: in ${r.ms} ms`);
  }

  const m1 = await sb.metrics();
  t.ok(m1.no_backend! - m0.no_backend! >= 3, `no_backend went up by the three refusals (${m0.no_backend} -> ${m1.no_backend})`);
  t.ok(m1.no_service_port! - m0.no_service_port! >= 2, `no_service_port went up by the two refusals (${m0.no_service_port} -> ${m1.no_service_port})`);

  // The served port of the same address still works.
  const ok = await sb.exec(['curl', '-sS', '--max-time', String(5 * SLOW), `http://${WEB}/`]);
  t.equal(ok.code, 0, 'the served port of that address still answers');
});

t.test('an address that is no service is left alone', async (t) => {
  // Not refused by lbctl: the kernel routes it (and finds no route here).
  const sb = await createSandbox(t, { backends: 1 });
  const r = await sb.client<Refused>(['refused', '10.96.99.99', '80', '--proto', 'tcp']);
  t.equal(r.error, 'ENETUNREACH', 'connect() fails the kernel way, ENETUNREACH');
});
