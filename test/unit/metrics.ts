import t from 'tap';
import { register as globalRegistry } from 'prom-client';
import { AgentMetrics, startMetricsServer } from '../../src/http/metrics.js';
import { FakeView } from '../fakes/fake-view.js';

/** The exposition's `# TYPE name type` lines. */
function types(text: string): Map<string, string> {
  return new Map([...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => [m[1]!, m[2]!]));
}

t.test('kube-proxy names, types and help texts, so its dashboards keep working', async (t) => {
  const m = new AgentMetrics({ defaultMetrics: false });
  const text = await m.registry.metrics();
  const ty = types(text);
  const want: Record<string, string> = {
    kubeproxy_sync_proxy_rules_duration_seconds: 'histogram',
    kubeproxy_sync_full_proxy_rules_duration_seconds: 'histogram',
    kubeproxy_sync_partial_proxy_rules_duration_seconds: 'histogram',
    kubeproxy_network_programming_duration_seconds: 'histogram',
    kubeproxy_sync_proxy_rules_last_timestamp_seconds: 'gauge',
    kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds: 'gauge',
    kubeproxy_sync_proxy_rules_service_changes_total: 'counter',
    kubeproxy_sync_proxy_rules_endpoint_changes_total: 'counter',
    kubeproxy_proxy_healthz_total: 'counter',
    kubeproxy_proxy_livez_total: 'counter',
    lbctl_services: 'gauge',
    lbctl_frontends: 'gauge',
    lbctl_backends: 'gauge',
    lbctl_syncs_total: 'counter',
    lbctl_map_operation_errors_total: 'counter',
    lbctl_source_events_total: 'counter',
    lbctl_skipped_objects_total: 'counter',
    lbctl_datapath_events_total: 'counter',
  };
  for (const [name, type] of Object.entries(want)) t.equal(ty.get(name), type, name);
  t.match(text, '# HELP kubeproxy_sync_proxy_rules_duration_seconds SyncProxyRules latency in seconds\n');
  t.match(text, '# HELP kubeproxy_network_programming_duration_seconds In Cluster Network Programming Latency in seconds\n');
  t.match(text, '# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds The last time proxy rules were successfully synced\n');
  // kube-proxy's buckets: 1 ms × 2^0..14 for syncs; 0, 0.25, 0.5, 1..59, 60..115 by 5, 120..300 by 30 for programming.
  const les = (name: string) => [...text.matchAll(new RegExp(`^${name}_bucket\\{le="([^"]+)"\\}`, 'gm'))].map((x) => x[1]);
  t.equal(les('kubeproxy_sync_proxy_rules_duration_seconds').length, 16);
  t.same(les('kubeproxy_sync_proxy_rules_duration_seconds').slice(0, 3), ['0.001', '0.002', '0.004']);
  t.equal(les('kubeproxy_sync_proxy_rules_duration_seconds')[14], '16.384');
  const prog = les('kubeproxy_network_programming_duration_seconds');
  t.same(prog.slice(0, 5), ['0', '0.25', '0.5', '1', '2']);
  t.ok(prog.includes('59') && prog.includes('60') && prog.includes('115') && prog.includes('120') && prog.includes('300'));
  t.equal(prog.at(-1), '+Inf');
  t.equal(prog.length, 1 + 2 + 59 + 12 + 7 + 1);
  t.notOk(text.includes('process_cpu_seconds_total'), 'default metrics can be left out');
});

t.test('the series a kube-proxy dashboard queries exist after one sync', async (t) => {
  const m = new AgentMetrics();
  m.observeSync(0.012, { full: true, ok: true });
  m.networkProgramming(0.8);
  const text = await m.registry.metrics();
  // kubernetes-mixin's proxy dashboard and the usual keep-lists.
  for (const series of [
    'kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.016"}',
    'kubeproxy_sync_proxy_rules_duration_seconds_count',
    'kubeproxy_sync_proxy_rules_duration_seconds_sum',
    'kubeproxy_network_programming_duration_seconds_bucket{le="1"}',
    'kubeproxy_network_programming_duration_seconds_count',
    'kubeproxy_network_programming_duration_seconds_sum',
    'kubeproxy_sync_proxy_rules_last_timestamp_seconds',
    'process_resident_memory_bytes',
    'process_cpu_seconds_total',
  ]) {
    t.ok(text.split('\n').some((l) => l.startsWith(`${series} `)), series);
  }
});

t.test('values after calls', async (t) => {
  let now = 1_700_000_000_000;
  const view = new FakeView();
  view.counters = { refused_no_backend: 3n, translated: 12345678901234n };
  const m = new AgentMetrics({ view, defaultMetrics: false, now: () => now });
  m.observeSync(0.003, { full: true, ok: true });
  now += 1000;
  m.observeSync(0.5, { full: false, ok: false });
  m.networkProgramming(1.5);
  m.networkProgramming(-2); // clock skew: dropped
  m.queued(now + 250);
  m.setCounts({ services: 3, frontends: 5, backends: 9 });
  m.mapError('lb4_services');
  m.mapError('lb4_services');
  m.mapError('lb6_backends');
  m.event('Service', 'add');
  m.event('EndpointSlice', 'update');
  m.event('EndpointSlice', 'update');
  m.skipped('Service', 'conflict');
  m.eventLoopStall(6200);
  m.eventLoopStall(5400);
  const text = await m.registry.metrics();
  const line = (s: string) => t.ok(text.split('\n').includes(s), s);
  line('kubeproxy_sync_proxy_rules_duration_seconds_count 2');
  line('kubeproxy_sync_proxy_rules_duration_seconds_sum 0.503');
  line('kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.004"} 1');
  line('kubeproxy_sync_full_proxy_rules_duration_seconds_count 1');
  line('kubeproxy_sync_partial_proxy_rules_duration_seconds_count 1');
  line('kubeproxy_sync_proxy_rules_last_timestamp_seconds 1700000000');
  line('kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds 1700000001.25');
  line('kubeproxy_network_programming_duration_seconds_count 1');
  line('kubeproxy_network_programming_duration_seconds_bucket{le="2"} 1');
  line('kubeproxy_network_programming_duration_seconds_bucket{le="1"} 0');
  line('kubeproxy_sync_proxy_rules_service_changes_total 1');
  line('kubeproxy_sync_proxy_rules_endpoint_changes_total 2');
  line('lbctl_syncs_total{type="full",result="success"} 1');
  line('lbctl_syncs_total{type="partial",result="error"} 1');
  line('lbctl_services 3');
  line('lbctl_frontends 5');
  line('lbctl_backends 9');
  line('lbctl_map_operation_errors_total{map="lb4_services"} 2');
  line('lbctl_map_operation_errors_total{map="lb6_backends"} 1');
  line('lbctl_source_events_total{kind="Service",type="add"} 1');
  line('lbctl_source_events_total{kind="EndpointSlice",type="update"} 2');
  line('lbctl_skipped_objects_total{kind="Service",reason="conflict"} 1');
  line('lbctl_event_loop_stalls_total 2');
  line('lbctl_event_loop_last_stall_seconds 5.4');
  line('lbctl_datapath_events_total{reason="refused_no_backend"} 3');
  line('lbctl_datapath_events_total{reason="translated"} 12345678901234');

  view.counters = { refused_no_backend: 4n, translated: 12345678901240n };
  const again = await m.registry.metrics();
  t.ok(again.includes('lbctl_datapath_events_total{reason="refused_no_backend"} 4\n'), 'read afresh at every scrape');
  view.throws = new Error('maps gone');
  const failing = await m.registry.metrics();
  t.ok(failing.includes('lbctl_datapath_events_total{reason="refused_no_backend"} 4\n'), 'an unreadable map keeps the last values');
});

t.test('each AgentMetrics has its own registry, never the global one', async (t) => {
  const a = new AgentMetrics();
  const b = new AgentMetrics();
  a.setCounts({ services: 1, frontends: 1, backends: 1 });
  t.not(a.registry, b.registry);
  t.equal(globalRegistry.getSingleMetric('lbctl_services'), undefined);
  t.ok((await b.registry.metrics()).includes('lbctl_services 0\n'));
});

t.test('the metrics server', async (t) => {
  const m = new AgentMetrics({ defaultMetrics: false });
  m.setCounts({ services: 2, frontends: 3, backends: 4 });
  const srv = await startMetricsServer({ metrics: m, host: '127.0.0.1', port: 0 });
  t.teardown(() => srv.close());
  const base = `http://127.0.0.1:${srv.port}`;
  const res = await fetch(`${base}/metrics`);
  t.equal(res.status, 200);
  t.equal(res.headers.get('content-type'), 'text/plain; version=0.0.4; charset=utf-8');
  t.match(await res.text(), /^lbctl_backends 4$/m);
  const hz = await fetch(`${base}/healthz`);
  t.same([hz.status, await hz.text()], [200, 'ok']);
  // kube-proxy's /proxyMode: e2e.test's "Networking should check kube-proxy urls" asks it for a 200
  const pm = await fetch(`${base}/proxyMode`);
  t.same([pm.status, await pm.text()], [200, 'lbctl'], '/proxyMode names the proxy, as kube-proxy names its mode');
  const nf = await fetch(`${base}/nope`);
  t.equal(nf.status, 404);
  await nf.text();
});

t.test('map pressure and frontends not programmed, per map', async (t) => {
  const m = new AgentMetrics({ defaultMetrics: false });
  m.setMapPressure([
    { map: 'lb4_reverse_nat', entries: 4, maxEntries: 4 },
    { map: 'lb4_services', entries: 3, maxEntries: 12 },
  ]);
  m.setNotProgrammed({ lb4_reverse_nat: 36 });
  const text = await m.registry.metrics();
  const line = (s: string, src = text) => t.ok(src.split('\n').includes(s), s);
  line('# TYPE lbctl_bpf_map_pressure gauge');
  line('lbctl_bpf_map_pressure{map_name="lb4_reverse_nat"} 1');
  line('lbctl_bpf_map_pressure{map_name="lb4_services"} 0.25');
  line('lbctl_frontends_not_programmed{map_name="lb4_reverse_nat"} 36');
  m.setNotProgrammed({});
  line('lbctl_frontends_not_programmed{map_name="lb4_reverse_nat"} 0', await m.registry.metrics());
});

t.test('health mesh: nodes by state, RTT histograms by path, errors by reason, per-peer RTT only for the first N peers', async (t) => {
  const m = new AgentMetrics({ defaultMetrics: false });
  const peer = (name: string, rttMs: number) => ({ name, local: false, state: 'reachable' as const, addresses: [{ address: '10.0.0.1', icmp: { status: 'ok', rttMs }, http: { status: 'ok', rttMs: rttMs * 2 } }] });
  const nodes = [peer('a', 1), peer('b', 2), peer('c', 3)];
  m.setMesh(() => ({ probeTime: 'now', periodMs: 10_000, timeoutMs: 1000, port: 4240, inFlight: 0, queued: 0, nodes, reachable: 3, unreachable: 0, total: 4 }), 2);
  m.meshProbe('icmp', { ok: true, rttMs: 0.5 });
  m.meshProbe('http', { ok: false, error: 'timeout' });
  m.meshProbe('http', { ok: true, rttMs: 4 }, 'b');
  m.meshProbe('http', { ok: true, rttMs: 6 }, 'c');
  const text = await m.registry.metrics();
  t.match(text, /lbctl_health_mesh_nodes\{state="reachable"\} 3\n/);
  t.match(text, /lbctl_health_mesh_nodes\{state="pending"\} 1\n/);
  t.match(text, /lbctl_health_mesh_rtt_seconds_count\{path="icmp"\} 1\n/);
  t.match(text, /lbctl_health_mesh_rtt_seconds_count\{path="http"\} 2\n/, 'every peer in the aggregate');
  t.match(text, /lbctl_health_mesh_probe_errors_total\{path="http",reason="timeout"\} 1\n/);
  t.match(text, /lbctl_health_mesh_peer_rtt_seconds_sum\{peer="b",path="http"\} 0.004\n/, 'a histogram of its own for a peer among the first 2');
  t.notMatch(text, /peer="c"/, 'no series beyond the configured count');
});
