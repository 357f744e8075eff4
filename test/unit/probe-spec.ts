// The lbctl.io/readiness-probe annotation (src/model/probe.ts): kubelet's
// defaults and validation, lbctl's refusals with their reasons, hostile
// sizes, named ports, and the probe identity that lets services share a
// worker.
import t from 'tap';
import {
  MAX_HTTP_HEADERS,
  MAX_PROBE_TEXT,
  parseProbeAnnotation,
  probeKey,
  resolvePort,
  validateProbe,
  type ProbeSpec,
} from '../../src/model/probe.js';

const ok = (text: string): ProbeSpec => {
  const r = parseProbeAnnotation(text);
  if (!r.ok) throw new Error(`expected a probe, got: ${r.reason}`);
  return r.value;
};
const reason = (input: unknown): string => {
  const r = typeof input === 'string' ? parseProbeAnnotation(input) : validateProbe(input);
  if (r.ok) throw new Error(`expected a refusal of ${JSON.stringify(input)}`);
  return r.reason;
};

t.test("kubelet's defaults: period 10, timeout 1, success 1, failure 3, initial delay 0; httpGet path / and scheme HTTP", async (t) => {
  const p = ok('{"httpGet": {"port": 8080}}');
  t.same(p, {
    handler: { kind: 'httpGet', path: '/', port: 8080, scheme: 'HTTP', httpHeaders: [] },
    initialDelaySeconds: 0,
    periodSeconds: 10,
    timeoutSeconds: 1,
    successThreshold: 1,
    failureThreshold: 3,
  });
});

t.test('0 is "not set" and takes the default, as SetDefaults_Probe does; negatives are refused', async (t) => {
  const p = ok('tcpSocket: {port: 80}\nperiodSeconds: 0\ntimeoutSeconds: 0\nsuccessThreshold: 0\nfailureThreshold: 0');
  t.match(p, { periodSeconds: 10, timeoutSeconds: 1, successThreshold: 1, failureThreshold: 3 });
  for (const f of ['initialDelaySeconds', 'periodSeconds', 'timeoutSeconds', 'successThreshold', 'failureThreshold']) {
    t.equal(reason({ tcpSocket: { port: 80 }, [f]: -1 }), `readiness-probe: ${f} -1 must be greater than or equal to 0`);
    t.match(reason({ tcpSocket: { port: 80 }, [f]: 1.5 }), `${f} 1.5 is not an integer`);
    t.match(reason({ tcpSocket: { port: 80 }, [f]: '5' }), `${f} "5" is not an integer`);
  }
  t.match(reason({ tcpSocket: { port: 80 }, periodSeconds: 3_000_000 }), 'periodSeconds 3000000 is more than 2147483');
});

t.test('a readiness probe may ask for more than one success (only liveness and startup must say 1)', async (t) => {
  const p = ok(JSON.stringify({ grpc: { port: 9000, service: 'api' }, successThreshold: 3, failureThreshold: 5, periodSeconds: 2, timeoutSeconds: 2, initialDelaySeconds: 7 }));
  t.same(p, { handler: { kind: 'grpc', port: 9000, service: 'api' }, initialDelaySeconds: 7, periodSeconds: 2, timeoutSeconds: 2, successThreshold: 3, failureThreshold: 5 });
});

t.test('handlers: httpGet with everything, tcpSocket by name, grpc by number; YAML and JSON alike', async (t) => {
  const yaml = ok(`
httpGet:
  path: healthz
  port: http-alt
  scheme: HTTPS
  httpHeaders:
    - name: Host
      value: example.com
    - {name: X-Probe, value: "1"}
`);
  t.same(yaml.handler, { kind: 'httpGet', path: '/healthz', port: 'http-alt', scheme: 'HTTPS', httpHeaders: [{ name: 'Host', value: 'example.com' }, { name: 'X-Probe', value: '1' }] });
  t.same(ok('{"tcpSocket":{"port":"metrics"}}').handler, { kind: 'tcpSocket', port: 'metrics' });
  t.same(ok('grpc: {port: 50051}').handler, { kind: 'grpc', port: 50051, service: '' });
});

t.test('refusals name the field', async (t) => {
  t.equal(reason('{"httpGet": {"port": 70000}}'), 'readiness-probe: httpGet.port 70000 is not a port: must be between 1 and 65535');
  t.equal(reason({ tcpSocket: { port: 0 } }), 'readiness-probe: tcpSocket.port 0 is not a port: must be between 1 and 65535');
  t.match(reason({ httpGet: {} }), 'httpGet.port is required');
  t.match(reason({ httpGet: { port: 'Http' } }), 'httpGet.port "Http" is not a port number or name');
  t.match(reason({ httpGet: { port: '8080' } }), 'httpGet.port "8080" is not a port number or name', 'a number in a string is a name, and not a valid one (as the API says)');
  t.match(reason({ httpGet: { port: 'a-very-long-port-name' } }), 'is not a port number or name');
  t.match(reason({ grpc: { port: 'grpc' } }), 'grpc.port "grpc" is not a port number (grpc takes numbers only, as kubelet)');
  t.match(reason({ httpGet: { port: 80, scheme: 'https' } }), 'httpGet.scheme "https" is not supported: HTTP or HTTPS');
  t.match(reason({ httpGet: { port: 80, httpHeaders: [{ name: 'Bad Header', value: 'x' }] } }), 'httpGet.httpHeaders[0].name "Bad Header" is not a valid HTTP header name');
  t.match(reason({ httpGet: { port: 80, httpHeaders: [{ name: 'X_Under', value: 'x' }] } }), 'letters, digits and \'-\' only', 'the API refuses what RFC 7230 allows beyond [-A-Za-z0-9]');
  t.match(reason({ httpGet: { port: 80, httpHeaders: [{ name: 'X', value: 'a\r\nInjected: 1' }] } }), 'httpGet.httpHeaders[0].value holds control characters');
  t.match(reason({ httpGet: { port: 80, path: '/a b' } }), 'httpGet.path "/a b" holds spaces or control characters');
  t.match(reason({ httpGet: { port: 80, timeout: 3 } }), 'httpGet: unknown field "timeout"');
  t.match(reason({ tcpSocket: { port: 80 }, periodSecond: 3 }), 'unknown field "periodSecond"');
  t.match(reason({}), 'must specify a handler type');
  t.match(reason({ httpGet: { port: 80 }, tcpSocket: { port: 80 } }), 'may not specify more than 1 handler type (httpGet, tcpSocket)');
  t.match(reason('[1, 2]'), 'a list of 2 is not a probe object');
  t.match(reason('{"httpGet": '), 'not JSON');
  t.match(reason('httpGet: [unclosed'), 'not YAML');
  t.match(reason(''), 'the annotation is empty');
  t.match(reason(42), 'is not a probe object');
});

t.test('exec, host and terminationGracePeriodSeconds are refused, each with its reason', async (t) => {
  t.match(reason({ exec: { command: ['cat', '/tmp/ok'] } }), 'exec is not supported: lbctl runs no commands');
  t.match(reason({ httpGet: { port: 80, host: 'db.example.com' } }), 'httpGet.host is not supported: lbctl probes each backend at its own address');
  t.match(reason({ tcpSocket: { port: 80, host: '10.0.0.1' } }), 'tcpSocket.host is not supported');
  t.match(reason({ tcpSocket: { port: 80 }, terminationGracePeriodSeconds: 30 }), 'terminationGracePeriodSeconds must not be set for readiness probes');
  t.ok(ok('{"httpGet": {"port": 80, "host": ""}}'), 'an empty host is no host (kubelet: the pod IP)');
});

t.test('hostile input: sizes are refused before they cost anything', async (t) => {
  t.match(reason('#'.repeat(MAX_PROBE_TEXT + 1)), `the annotation has ${MAX_PROBE_TEXT + 1} characters, more than the ${MAX_PROBE_TEXT}`);
  const headers = Array.from({ length: MAX_HTTP_HEADERS + 1 }, (_, i) => ({ name: `X-${i}`, value: 'v' }));
  t.match(reason({ httpGet: { port: 80, httpHeaders: headers } }), `httpGet.httpHeaders has ${MAX_HTTP_HEADERS + 1} headers, more than ${MAX_HTTP_HEADERS}`);
  t.match(reason({ httpGet: { port: 80, httpHeaders: [{ name: 'X', value: 'v'.repeat(5000) }] } }), 'httpGet.httpHeaders[0].value has 5000 characters, more than 4096');
  t.match(reason({ httpGet: { port: 80, path: '/' + 'a'.repeat(3000) } }), 'httpGet.path has 3001 characters');
  t.match(reason({ grpc: { port: 1, service: 's'.repeat(2000) } }), 'grpc.service has 2000 characters');
  // A billion-laughs alias bomb within the size limit: stopped by the value count.
  const bomb = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]'];
  for (let i = 1; i < 8; i++) bomb.push(`${String.fromCharCode(97 + i)}: &${String.fromCharCode(97 + i)} [${Array(10).fill(`*${String.fromCharCode(96 + i)}`).join(',')}]`);
  const started = Date.now();
  bomb.push('httpGet: {port: 80, httpHeaders: *h}');
  const r = parseProbeAnnotation(bomb.join('\n'));
  t.notOk(r.ok, 'refused');
  t.match(!r.ok && r.reason, /unknown field "a"|httpHeaders/, 'without expanding the aliases');
  t.ok(Date.now() - started < 1000, 'quickly');
  // Many small values within the size limit: stopped by the value count.
  t.match(reason('[' + '1,'.repeat(2000) + '1]'), 'more than 1000 YAML values: not a probe');
  // Deep nesting.
  t.match(reason('a: ' + '['.repeat(50) + ']'.repeat(50)), 'not YAML');
  // A huge JSON number or a long string in a field stays short in the reason.
  const long = reason({ httpGet: { port: 'x'.repeat(10_000) } });
  t.ok(long.length < 300, `the reason stays short (${long.length} characters)`);
});

t.test('named ports resolve against the EndpointSlice port names; numbers stay numbers', async (t) => {
  const ports = [{ name: 'http', port: 8080 }, { name: 'metrics', port: 9090 }];
  t.equal(resolvePort('metrics', ports), 9090);
  t.equal(resolvePort(8443, ports), 8443);
  t.equal(resolvePort('grpc', ports), undefined, 'an unknown name resolves to nothing (the probe cannot run)');
});

t.test('probe identity: the same probe however it is spelled, a different one for any difference that matters', async (t) => {
  const a = ok('{"httpGet": {"port": "http", "path": "/healthz"}, "periodSeconds": 10}');
  const b = ok('httpGet:\n  path: healthz\n  port: 8080\n  scheme: HTTP\nfailureThreshold: 3\ntimeoutSeconds: 0');
  t.equal(probeKey({ address: '10.0.0.1', port: 8080, spec: a }), probeKey({ address: '10.0.0.1', port: 8080, spec: b }), 'name resolved to the same number, defaults written or not');
  t.not(probeKey({ address: '10.0.0.1', port: 8080, spec: a }), probeKey({ address: '10.0.0.2', port: 8080, spec: a }), 'another backend');
  t.not(probeKey({ address: '10.0.0.1', port: 8080, spec: a }), probeKey({ address: '10.0.0.1', port: 8081, spec: a }), 'another port');
  const c = ok('{"httpGet": {"port": 8080, "path": "/healthz"}, "periodSeconds": 5}');
  t.not(probeKey({ address: '10.0.0.1', port: 8080, spec: a }), probeKey({ address: '10.0.0.1', port: 8080, spec: c }), 'another period');
  const d = ok('{"httpGet": {"port": 8080, "path": "/healthz", "httpHeaders": [{"name": "Host", "value": "x"}]}}');
  t.not(probeKey({ address: '10.0.0.1', port: 8080, spec: a }), probeKey({ address: '10.0.0.1', port: 8080, spec: d }), 'another header');
  const e = ok('{"tcpSocket": {"port": 8080}}');
  t.not(probeKey({ address: '10.0.0.1', port: 8080, spec: a }), probeKey({ address: '10.0.0.1', port: 8080, spec: e }), 'another handler');
});
