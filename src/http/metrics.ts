// Prometheus metrics. Where kube-proxy has a metric for the same thing we use
// its name, help text and buckets (pkg/proxy/metrics/metrics.go), so its
// dashboards and alerts keep working; the rest are lbctl_*. One Registry per
// AgentMetrics, never prom-client's global one.
import type { MeshStatus, Outcome } from '../mesh/mesh.js';
import http from 'node:http';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics, exponentialBuckets, linearBuckets } from 'prom-client';
import { closeServer, listen, type RunningServer } from './http.js';
import type { AgentView } from './view.js';

import { DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT } from '../base/defaults.js';
export { DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT };
/** kube-proxy's default --metrics-bind-address is 127.0.0.1:10249. */

/** kube-proxy's sync buckets: 1 ms doubling 15 times (to about 16 s). */
const SYNC_BUCKETS = exponentialBuckets(0.001, 2, 15);
/** kube-proxy's network programming buckets (component-base MergeBuckets starts with a 0 bucket). */
const PROGRAMMING_BUCKETS = [0, ...linearBuckets(0.25, 0.25, 2), ...linearBuckets(1, 1, 59), ...linearBuckets(60, 5, 12), ...linearBuckets(120, 30, 7)];

/** How often the event loop delay histogram (nodejs_eventloop_lag_*) takes a sample, ms. */
const EVENT_LOOP_SAMPLE_MS = 100;

export interface AgentMetricsOptions {
  /** Read at scrape time for lbctl_datapath_events_total. */
  readonly view?: Pick<AgentView, 'datapathCounters'>;
  /** prom-client's process_* and nodejs_* metrics (default true). */
  readonly defaultMetrics?: boolean;
  /** Epoch ms; injected by tests. */
  readonly now?: () => number;
}

export class AgentMetrics {
  readonly registry = new Registry();
  private readonly now: () => number;

  private readonly syncDuration: Histogram;
  private readonly syncFullDuration: Histogram;
  private readonly syncPartialDuration: Histogram;
  private readonly syncLast: Gauge;
  private readonly syncLastQueued: Gauge;
  private readonly programming: Histogram;
  private readonly serviceChanges: Counter;
  private readonly endpointChanges: Counter;
  private readonly healthz: Counter<'code'>;
  private readonly livez: Counter<'code'>;
  private readonly eventLoopStalls: Counter;
  private readonly eventLoopLastStall: Gauge;

  private readonly syncs: Counter<'type' | 'result'>;
  private readonly services: Gauge;
  private readonly frontends: Gauge;
  private readonly backends: Gauge;
  private readonly mapErrors: Counter<'map'>;
  private readonly mapPressure: Gauge<'map_name'>;
  private readonly notProgrammed: Gauge<'map_name'>;
  private readonly datapathFeature: Gauge<'feature' | 'required'>;
  private readonly notProgrammedMaps = new Set<string>();
  private readonly events: Counter<'kind' | 'type'>;
  private readonly skippedObjects: Counter<'kind' | 'reason'>;
  private readonly meshRtt: Histogram<'path'>;
  private readonly meshErrors: Counter<'path' | 'reason'>;
  private readonly meshPeerRtt: Histogram<'peer' | 'path'>;
  /** The peers with series of their own, and when that set was last taken from the mesh. */
  private meshPeers = { names: new Set<string>(), at: -Infinity };
  private mesh: { status: () => MeshStatus; peerSeries: number } | undefined;
  private readonly probeResults: Counter<'service' | 'result'>;
  private readonly probeDuration: Histogram<'kind'>;
  private readonly probeAllFailed: Gauge<'policy'>;
  private readonly probeAllFailedTotal: Counter<'policy'>;
  private readonly probeBackends: Gauge<'state'>;
  /** Services with probe-result series: only services with a readiness probe, removed with it. */
  private probedServices = new Set<string>();

  constructor(opts: AgentMetricsOptions = {}) {
    this.now = opts.now ?? Date.now;
    const registers = [this.registry];
    // kube-proxy's
    this.syncDuration = new Histogram({ name: 'kubeproxy_sync_proxy_rules_duration_seconds', help: 'SyncProxyRules latency in seconds', buckets: SYNC_BUCKETS, registers });
    this.syncFullDuration = new Histogram({ name: 'kubeproxy_sync_full_proxy_rules_duration_seconds', help: 'SyncProxyRules latency in seconds for full resyncs', buckets: SYNC_BUCKETS, registers });
    this.syncPartialDuration = new Histogram({ name: 'kubeproxy_sync_partial_proxy_rules_duration_seconds', help: 'SyncProxyRules latency in seconds for partial resyncs', buckets: SYNC_BUCKETS, registers });
    this.syncLast = new Gauge({ name: 'kubeproxy_sync_proxy_rules_last_timestamp_seconds', help: 'The last time proxy rules were successfully synced', registers });
    this.syncLastQueued = new Gauge({ name: 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds', help: 'The last time a sync of proxy rules was queued', registers });
    this.programming = new Histogram({ name: 'kubeproxy_network_programming_duration_seconds', help: 'In Cluster Network Programming Latency in seconds', buckets: PROGRAMMING_BUCKETS, registers });
    this.serviceChanges = new Counter({ name: 'kubeproxy_sync_proxy_rules_service_changes_total', help: 'Cumulative proxy rules Service changes', registers });
    this.endpointChanges = new Counter({ name: 'kubeproxy_sync_proxy_rules_endpoint_changes_total', help: 'Cumulative proxy rules Endpoint changes', registers });
    this.healthz = new Counter({ name: 'kubeproxy_proxy_healthz_total', help: 'Cumulative proxy healthz HTTP status', labelNames: ['code'], registers });
    this.livez = new Counter({ name: 'kubeproxy_proxy_livez_total', help: 'Cumulative proxy livez HTTP status', labelNames: ['code'], registers });
    // The eventloop check's stalls (src/http/health.ts), counted whether or not they failed /livez.
    this.eventLoopStalls = new Counter({ name: 'lbctl_event_loop_stalls_total', help: "Stalls of the event loop longer than the eventloop check's threshold (5 s); /livez fails while 3 fall within 60 s", registers });
    this.eventLoopLastStall = new Gauge({ name: 'lbctl_event_loop_last_stall_seconds', help: 'How long the last stall of the event loop longer than the threshold lasted', registers });
    // lbctl's
    this.syncs = new Counter({ name: 'lbctl_syncs_total', help: 'Syncs of the desired state into the maps, by type (full or partial) and result (success or error)', labelNames: ['type', 'result'], registers });
    this.services = new Gauge({ name: 'lbctl_services', help: 'Services programmed in the maps', registers });
    this.frontends = new Gauge({ name: 'lbctl_frontends', help: 'Frontends (address:port/protocol) programmed in the maps', registers });
    this.backends = new Gauge({ name: 'lbctl_backends', help: 'Backends programmed in the maps', registers });
    this.mapErrors = new Counter({ name: 'lbctl_map_operation_errors_total', help: 'Failed BPF map operations, by map', labelNames: ['map'], registers });
    this.mapPressure = new Gauge({ name: 'lbctl_bpf_map_pressure', help: 'Fill of each BPF map the agent writes: entries in use / max_entries (1 is full)', labelNames: ['map_name'], registers });
    this.notProgrammed = new Gauge({ name: 'lbctl_frontends_not_programmed', help: 'Frontends the last sync left out of the maps for want of room, by the map that had none', labelNames: ['map_name'], registers });
    this.datapathFeature = new Gauge({ name: 'lbctl_datapath_feature', help: 'Kernel features probed at start: 1 present, 0 absent (required="true": the agent does not start without it)', labelNames: ['feature', 'required'], registers });
    this.events = new Counter({ name: 'lbctl_source_events_total', help: 'Objects added, updated or deleted in the source, by kind and type', labelNames: ['kind', 'type'], registers });
    this.skippedObjects = new Counter({ name: 'lbctl_skipped_objects_total', help: 'Objects left out of the desired state, by kind and reason', labelNames: ['kind', 'reason'], registers });
    const view = opts.view;
    const datapath: Counter<'reason'> = new Counter({
      name: 'lbctl_datapath_events_total',
      help: "The datapath's counters (lb_metrics, summed over CPUs), by reason",
      labelNames: ['reason'],
      registers,
      collect() {
        if (!view) return;
        let counters: Record<string, bigint>;
        try {
          counters = view.datapathCounters();
        } catch {
          return; // unreadable maps: keep the last values rather than fail the scrape
        }
        datapath.reset();
        for (const [reason, v] of Object.entries(counters)) datapath.inc({ reason }, Number(v));
      },
    });
    // The health mesh (src/mesh/mesh.ts): node counts and probe results.
    // RTTs are one histogram per path for every peer together; per-peer
    // series exist only for the first --health-mesh-peer-metrics peers (by
    // name), so a 5,000-node cluster does not make 5,000 series per node.
    const mesh = (): typeof this.mesh => this.mesh;
    const meshNodes: Gauge<'state'> = new Gauge({
      name: 'lbctl_health_mesh_nodes',
      help: 'Nodes of the health mesh by state: reachable (ICMP and HTTP answered at an address), unreachable, pending (not probed yet)',
      labelNames: ['state'],
      registers,
      collect() {
        const m = mesh();
        if (!m) return;
        const st = m.status();
        meshNodes.set({ state: 'reachable' }, st.reachable);
        meshNodes.set({ state: 'unreachable' }, st.unreachable);
        meshNodes.set({ state: 'pending' }, st.total - st.reachable - st.unreachable);
      },
    });
    this.meshRtt = new Histogram({ name: 'lbctl_health_mesh_rtt_seconds', help: 'RTT of the health mesh probes that succeeded, by path (icmp, http)', labelNames: ['path'], buckets: exponentialBuckets(0.0001, 2, 16), registers });
    this.meshPeerRtt = new Histogram({ name: 'lbctl_health_mesh_peer_rtt_seconds', help: 'RTT of the successful mesh probes to each of the first --health-mesh-peer-metrics peers by name, by path', labelNames: ['peer', 'path'], buckets: exponentialBuckets(0.0001, 2, 16), registers });
    this.meshErrors = new Counter({ name: 'lbctl_health_mesh_probe_errors_total', help: 'Health mesh probes that failed, by path and reason (timeout, refused, unreachable, …)', labelNames: ['path', 'reason'], registers });
    // Readiness probes in standalone mode (issue 17): results per service
    // (bounded by the services that carry a probe), latency per handler.
    this.probeResults = new Counter({ name: 'lbctl_probe_results_total', help: 'Readiness probe results of backends, by service (namespace/name; only services with a readiness probe) and result (success, failure); a probe shared by several services counts for each', labelNames: ['service', 'result'], registers });
    this.probeDuration = new Histogram({ name: 'lbctl_probe_duration_seconds', help: 'How long readiness probes took, by handler (httpGet, tcpSocket, grpc); a timed-out probe counts at its timeout', labelNames: ['kind'], buckets: exponentialBuckets(0.0005, 2, 14), registers });
    this.probeBackends = new Gauge({ name: 'lbctl_probe_backends', help: 'Probed backends (one per address, port and probe) by state: unknown (not yet decided), healthy, quarantined', labelNames: ['state'], registers });
    this.probeAllFailed = new Gauge({ name: 'lbctl_probe_all_failed_services', help: 'Services whose every backend is quarantined by its readiness probe, by the --probe-all-failed policy applied (open: all served, closed: none)', labelNames: ['policy'], registers });
    this.probeAllFailedTotal = new Counter({ name: 'lbctl_probe_all_failed_total', help: 'Times a service had every backend quarantined by its readiness probe, by the --probe-all-failed policy applied', labelNames: ['policy'], registers });
    // Node's metrics, with the event loop delay sampled every
    // EVENT_LOOP_SAMPLE_MS instead of prom-client's 10 ms: a timer that wakes
    // an idle agent 100 times a second cost it 7-8 ms of CPU a second
    // (measured at 10,000 services, docs/benchmarks.md), on every node, for a
    // metric. A stall at least as long as the period always shows up in the
    // histogram (short by up to one period: the sample that waited on it may
    // have fallen due after it began); a shorter one only when a sample
    // falls due inside it.
    if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: this.registry, eventLoopMonitoringPrecision: EVENT_LOOP_SAMPLE_MS });
  }

  /** One readiness probe's result, for each service the probe serves. */
  probeResult(services: Iterable<string>, ok: boolean, kind: string, latencyMs: number): void {
    const result = ok ? 'success' : 'failure';
    for (const service of services) this.probeResults.inc({ service, result });
    this.probeDuration.observe({ kind }, latencyMs / 1000);
  }

  /** The services that carry a readiness probe now: the series of the others go. */
  setProbedServices(services: ReadonlySet<string>): void {
    for (const old of this.probedServices) {
      if (services.has(old)) continue;
      for (const result of ['success', 'failure']) this.probeResults.remove({ service: old, result });
    }
    this.probedServices = new Set(services);
  }

  setProbeBackends(counts: { unknown: number; healthy: number; quarantined: number }): void {
    for (const [state, n] of Object.entries(counts)) this.probeBackends.set({ state }, n);
  }

  /** How many services have every backend quarantined now, under the policy in force. */
  setProbeAllFailed(policy: 'open' | 'closed', services: number): void {
    this.probeAllFailed.set({ policy }, services);
  }

  /** A service just had every backend quarantined. */
  probeAllFailedEvent(policy: 'open' | 'closed'): void {
    this.probeAllFailedTotal.inc({ policy });
  }

  /** The health mesh whose state the gauges read at scrape time. */
  setMesh(status: () => MeshStatus, peerSeries: number): void {
    this.mesh = { status, peerSeries };
  }

  /** Every mesh probe's result. */
  meshProbe(path: 'icmp' | 'http', outcome: Outcome, peer?: string): void {
    if (!outcome.ok) {
      this.meshErrors.inc({ path, reason: outcome.error });
      return;
    }
    this.meshRtt.observe({ path }, outcome.rttMs / 1000);
    if (peer === undefined || !this.mesh || this.mesh.peerSeries === 0) return;
    // The first N peers by name, taken anew every 10 s (nodes come and go).
    const now = this.now();
    if (now - this.meshPeers.at > 10_000) {
      const names = new Set(this.mesh.status().nodes.slice(0, this.mesh.peerSeries).map((n) => n.name));
      for (const old of this.meshPeers.names) if (!names.has(old)) for (const p of ['icmp', 'http']) this.meshPeerRtt.remove({ peer: old, path: p });
      this.meshPeers = { names, at: now };
    }
    if (this.meshPeers.names.has(peer)) this.meshPeerRtt.observe({ peer, path }, outcome.rttMs / 1000);
  }

  /** After every sync, successful or not (kube-proxy observes both). */
  observeSync(seconds: number, o: { full: boolean; ok: boolean }): void {
    this.syncDuration.observe(seconds);
    (o.full ? this.syncFullDuration : this.syncPartialDuration).observe(seconds);
    this.syncs.inc({ type: o.full ? 'full' : 'partial', result: o.ok ? 'success' : 'error' });
    if (o.ok) this.syncLast.set(this.now() / 1000);
  }

  /** Once per changed object in a successful sync: seconds from its change to the maps being written. */
  networkProgramming(seconds: number): void {
    if (Number.isFinite(seconds) && seconds >= 0) this.programming.observe(seconds);
  }

  /** When a sync is requested (a change arrived). */
  queued(epochMs: number = this.now()): void {
    this.syncLastQueued.set(epochMs / 1000);
  }

  setCounts(c: { services: number; frontends: number; backends: number }): void {
    this.services.set(c.services);
    this.frontends.set(c.frontends);
    this.backends.set(c.backends);
  }

  /** After every sync: each map's entries in use / max_entries (Reconciler.pressure). */
  setMapPressure(maps: ReadonlyArray<{ readonly map: string; readonly entries: number; readonly maxEntries: number }>): void {
    for (const m of maps) if (m.maxEntries > 0) this.mapPressure.set({ map_name: m.map }, m.entries / m.maxEntries);
  }

  /** After every sync: frontends left out for want of room, by map (maps no longer named drop to 0). */
  setNotProgrammed(byMap: Readonly<Record<string, number>>): void {
    for (const map_name of this.notProgrammedMaps) this.notProgrammed.set({ map_name }, 0);
    for (const [map_name, n] of Object.entries(byMap)) {
      this.notProgrammed.set({ map_name }, n);
      this.notProgrammedMaps.add(map_name);
    }
  }

  /** Once, after the start's feature probe (src/datapath/features.ts). */
  setFeatures(results: ReadonlyArray<{ readonly name: string; readonly required: boolean; readonly available: boolean }>): void {
    for (const r of results) this.datapathFeature.set({ feature: r.name, required: String(r.required) }, r.available ? 1 : 0);
  }

  mapError(map: string): void {
    this.mapErrors.inc({ map });
  }

  /** kind: Service or EndpointSlice; type: add, update or delete. Also counts kube-proxy's *_changes_total. */
  event(kind: string, type: string): void {
    this.events.inc({ kind, type });
    if (kind === 'Service') this.serviceChanges.inc();
    else if (kind === 'EndpointSlice' || kind === 'Endpoints') this.endpointChanges.inc();
  }

  skipped(kind: string, reason: string, count = 1): void {
    this.skippedObjects.inc({ kind, reason }, count);
  }

  /** Called by the health server. */
  healthzResponse(code: number): void {
    this.healthz.inc({ code: String(code) });
  }

  livezResponse(code: number): void {
    this.livez.inc({ code: String(code) });
  }

  /** A stall of the event loop past the eventloop check's threshold. */
  eventLoopStall(lagMs: number): void {
    this.eventLoopStalls.inc();
    this.eventLoopLastStall.set(lagMs / 1000);
  }
}

export interface MetricsServerOptions {
  readonly metrics: AgentMetrics;
  readonly port?: number;
  readonly host?: string;
}

/**
 * What /proxyMode answers. kube-proxy's metrics server names its mode there
 * (iptables, ipvs, nftables); Kubernetes' e2e suite ("[sig-network]
 * Networking should check kube-proxy urls") and tools that ask a node which
 * proxy it runs read it.
 */
export const PROXY_MODE = 'lbctl';

/** The metrics port: /metrics, /healthz as a plain `ok` and /proxyMode, like kube-proxy's metrics server. */
export async function startMetricsServer(opts: MetricsServerOptions): Promise<RunningServer> {
  const { registry } = opts.metrics;
  const server = http.createServer((req, res) => {
    const path = new URL(req.url ?? '/', 'http://localhost').pathname;
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { Allow: 'GET, HEAD', 'Content-Type': 'text/plain; charset=utf-8' }).end('method not allowed\n');
      return;
    }
    if (path === '/metrics') {
      registry.metrics().then(
        (text) => res.writeHead(200, { 'Content-Type': registry.contentType }).end(text),
        (err: unknown) => res.writeHead(500, { 'Content-Type': 'text/plain; charset=utf-8' }).end(`collecting metrics failed: ${err instanceof Error ? err.message : String(err)}\n`),
      );
      return;
    }
    if (path === '/healthz') {
      res.writeHead(200, { 'Content-Type': 'text/plain; charset=utf-8' }).end('ok');
      return;
    }
    if (path === '/proxyMode') {
      res.writeHead(200, { 'Content-Type': 'text/plain; charset=utf-8' }).end(PROXY_MODE);
      return;
    }
    res.writeHead(404, { 'Content-Type': 'text/plain; charset=utf-8' }).end('not found: try /metrics\n');
  });
  const port = await listen(server, opts.port ?? DEFAULT_METRICS_PORT, opts.host ?? DEFAULT_METRICS_HOST);
  return { port, close: () => closeServer(server) };
}
