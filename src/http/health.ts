// Health checks and the health port, after Kubernetes and etcd. /livez proves
// the process works (the event loop runs, the programs are attached, a map
// takes a write); /readyz that what the agent knows is in the maps; /healthz
// answers as kube-proxy's does. Every check is synchronous and fast: none asks
// the API server or anything else outside this node. A full map never fails
// /livez (a restart would not make room): readiness and the pressure metric
// report it. Nor does one long stall of the event loop (a restart would do
// the same work again): only a loop that keeps stalling (EventLoopMonitor).
// The DaemonSet's startup and liveness probes read /livez, its readiness
// probe /readyz (docs/health.md, "Which probe reads which check"): a check
// belongs in livez only if a restart cures what fails it. The HTTP plumbing
// shared with the other servers is in http.ts.
import http from 'node:http';
import { systemClock, type Clock } from '../base/clock.js';
import { closeServer, listen, send, type RunningServer } from './http.js';
import type { AgentMetrics } from './metrics.js';
import type { AgentView, CheckOutcome } from './view.js';

export type CheckGroup = 'livez' | 'readyz';

export interface Check {
  readonly name: string;
  run(): CheckOutcome;
}

export interface CheckResult {
  readonly name: string;
  readonly ok: boolean;
  readonly message?: string;
  /** Skipped with ?exclude=: counted as passing, as Kubernetes does. */
  readonly excluded?: boolean;
}

export interface GroupResult {
  readonly ok: boolean;
  readonly checks: readonly CheckResult[];
  /** ?exclude= names that match no check. */
  readonly unknownExcludes: readonly string[];
}

/** kube-proxy's /healthz, plus the reason it is not healthy (for the local API). */
export interface HealthzReport {
  readonly healthy: boolean;
  readonly lastUpdated: string;
  readonly currentTime: string;
  readonly nodeEligible: boolean;
  readonly reason?: string;
}

/** Go's zero time, which kube-proxy reports when it has never synced. */
const ZERO_TIME = '0001-01-01T00:00:00Z';

import { DEFAULT_HEALTH_PORT } from '../base/defaults.js';
export { DEFAULT_HEALTH_PORT };
export const DEFAULT_EVENT_LOOP_THRESHOLD_MS = 5_000;
/** How long a stall counts against the eventloop check, and how many fail it (EventLoopMonitor). */
export const DEFAULT_EVENT_LOOP_WINDOW_MS = 60_000;
export const DEFAULT_EVENT_LOOP_STALLS = 3;
/** kube-proxy's: 2 × its default syncPeriod of 30 s. */
export const DEFAULT_HEALTH_TIMEOUT_MS = 60_000;

const rfc3339 = (epochMs: number): string => new Date(epochMs).toISOString();

export function formatDuration(ms: number): string {
  if (ms < 1000) return `${Math.max(0, Math.round(ms))}ms`;
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${Math.round(ms / 100) / 10}s`;
  const d = Math.floor(s / 86_400), h = Math.floor((s % 86_400) / 3600), m = Math.floor((s % 3600) / 60);
  if (d > 0) return `${d}d${h}h`;
  if (h > 0) return `${h}h${m}m`;
  return `${m}m${s % 60}s`;
}

export interface EventLoopMonitorOptions {
  /** A tick later than this is a stall (default 5 s). */
  readonly thresholdMs: number;
  /** How long a stall counts (default 60 s). */
  readonly windowMs?: number;
  /** Stalls within the window that fail the check (default 3). */
  readonly stallsToFail?: number;
  /** Tick period (default threshold / 5, between 10 ms and 1 s). */
  readonly intervalMs?: number;
  /** Monotonic time and timers; injected by tests. */
  readonly clock?: Clock;
  /** Called with each stall's length and the stalls now in the window (this one included). */
  readonly onStall?: (lagMs: number, recent: number) => void;
}

/**
 * Measures how late a repeating timer fires, and decides whether the loop
 * is one a restart may cure. A loop blocked right now fails (a probe that
 * gets to ask is the rare one queued behind the block: the others time
 * out). A loop that stalled `stallsToFail` times within the window fails:
 * it keeps stalling (a leak the collector fights, a wedge that comes back).
 * One stall passes, however long: a cold sync of 100,000 services blocks
 * the loop for seconds (docs/benchmarks.md), and a restart would only do it
 * again. The stall is still reported (the message of a passing check, the
 * onStall hook: metrics and the log).
 */
export class EventLoopMonitor {
  private readonly intervalMs: number;
  private readonly windowMs: number;
  private readonly stallsToFail: number;
  private readonly clock: Clock;
  private timer: unknown;
  private lastTick: number;
  /** Stalls within the window, oldest first. */
  private stalls: Array<{ lagMs: number; at: number }> = [];

  constructor(private readonly opts: EventLoopMonitorOptions) {
    this.intervalMs = opts.intervalMs ?? Math.min(1000, Math.max(10, opts.thresholdMs / 5));
    this.windowMs = opts.windowMs ?? DEFAULT_EVENT_LOOP_WINDOW_MS;
    this.stallsToFail = opts.stallsToFail ?? DEFAULT_EVENT_LOOP_STALLS;
    this.clock = opts.clock ?? systemClock;
    this.lastTick = this.clock.now();
    this.timer = this.clock.setTimeout(() => this.tick(), this.intervalMs);
  }

  private tick(): void {
    const now = this.clock.now();
    const lag = now - this.lastTick - this.intervalMs;
    this.lastTick = now;
    this.timer = this.clock.setTimeout(() => this.tick(), this.intervalMs);
    if (lag > this.opts.thresholdMs) {
      this.stalls.push({ lagMs: lag, at: now });
      this.prune(now);
      this.opts.onStall?.(lag, this.stalls.length);
    }
  }

  private prune(now: number): void {
    while (this.stalls.length > 0 && now - this.stalls[0]!.at > this.windowMs) this.stalls.shift();
  }

  check(): CheckOutcome {
    const now = this.clock.now();
    const threshold = formatDuration(this.opts.thresholdMs);
    const overdue = now - this.lastTick - this.intervalMs;
    if (overdue > this.opts.thresholdMs) return { ok: false, message: `event loop blocked for ${formatDuration(overdue)} (threshold ${threshold})` };
    this.prune(now);
    const n = this.stalls.length;
    if (n === 0) return { ok: true };
    const last = this.stalls[n - 1]!;
    const longest = Math.max(...this.stalls.map((s) => s.lagMs));
    const window = formatDuration(this.windowMs);
    if (n >= this.stallsToFail) {
      return {
        ok: false,
        message: `event loop blocked ${n} times in the last ${window}, for up to ${formatDuration(longest)}, the last ${formatDuration(now - last.at)} ago (threshold ${threshold})`,
      };
    }
    return {
      ok: true,
      message: `event loop blocked ${n === 1 ? 'once' : `${n} times`} in the last ${window}, for ${formatDuration(n === 1 ? last.lagMs : longest)}${n === 1 ? '' : ' at most'}, ${formatDuration(now - last.at)} ago; fails at ${this.stallsToFail}`,
    };
  }

  stop(): void {
    this.clock.clearTimeout(this.timer);
  }
}

export interface HealthOptions {
  readonly view: AgentView;
  /** A stall of the event loop longer than this counts against /livez (default 5 s): EventLoopMonitor. */
  readonly eventLoopThresholdMs?: number;
  readonly eventLoopWindowMs?: number;
  readonly eventLoopStalls?: number;
  /** Each stall: its length, and the stalls within the window (metrics and the log). */
  readonly onEventLoopStall?: (lagMs: number, recent: number) => void;
  /** /healthz fails when a change has waited longer than this for the maps (default 60 s: kube-proxy's 2 × syncPeriod). */
  readonly healthTimeoutMs?: number;
  /** Epoch ms; injected by tests. */
  readonly now?: () => number;
}

/** A throwing view method is a failed check, never a failed request. */
function guarded(run: () => CheckOutcome): () => CheckOutcome {
  return () => {
    try {
      return run();
    } catch (err) {
      return { ok: false, message: err instanceof Error ? err.message : String(err) };
    }
  };
}

/** The checks, their groups and /healthz's verdict; shared by the health port and the local API. */
export class Health {
  readonly livez: readonly Check[];
  readonly readyz: readonly Check[];
  readonly healthTimeoutMs: number;
  private readonly monitor: EventLoopMonitor;
  private readonly now: () => number;

  constructor(private readonly opts: HealthOptions) {
    const { view } = opts;
    this.now = opts.now ?? Date.now;
    this.healthTimeoutMs = opts.healthTimeoutMs ?? DEFAULT_HEALTH_TIMEOUT_MS;
    this.monitor = new EventLoopMonitor({
      thresholdMs: opts.eventLoopThresholdMs ?? DEFAULT_EVENT_LOOP_THRESHOLD_MS,
      ...(opts.eventLoopWindowMs !== undefined ? { windowMs: opts.eventLoopWindowMs } : {}),
      ...(opts.eventLoopStalls !== undefined ? { stallsToFail: opts.eventLoopStalls } : {}),
      ...(opts.onEventLoopStall ? { onStall: opts.onEventLoopStall } : {}),
    });
    const check = (name: string, run: () => CheckOutcome): Check => ({ name, run: guarded(run) });
    const ping = check('ping', () => ({ ok: true }));
    const datapath = check('datapath', () => view.datapathAttached());
    this.livez = [ping, check('eventloop', () => this.monitor.check()), datapath, check('canary', () => view.canaryWrite())];
    this.readyz = [
      ping,
      datapath,
      check('source-synced', () => {
        if (view.sourceSynced()) return { ok: true };
        // What the source says it is waiting on (a list the API server refuses, and why).
        const notes = view.source().notes;
        return { ok: false, message: `the source has not delivered its initial state yet${notes.length > 0 ? `: ${notes.join('; ')}` : ''}` };
      }),
      check('synced', () => this.synced()),
    ];
  }

  /**
   * Ready once the maps hold what the agent intends. A change that arrived a
   * moment ago, after a successful sync, does not count against it until it
   * has waited longer than healthTimeoutMs (otherwise every event would flap
   * readiness).
   */
  private synced(): CheckOutcome {
    const { view } = this.opts;
    if (view.desiredApplied()) return { ok: true };
    const s = view.sync();
    if (s.lastError !== undefined) return { ok: false, message: `the last sync failed: ${s.lastError}` };
    if (s.notProgrammed !== undefined) {
      const { count, first } = s.notProgrammed;
      const named = first.map((n) => `${n.frontend} (${n.map})`).join(', ');
      return { ok: false, message: `${count} frontend${count === 1 ? '' : 's'} not programmed for want of room: ${named}${count > first.length ? `, …` : ''}` };
    }
    if (s.lastSuccess === undefined) return { ok: false, message: 'no sync has succeeded yet' };
    if (s.oldestPending !== undefined) {
      const age = this.now() - s.oldestPending;
      if (age >= this.healthTimeoutMs) return { ok: false, message: `a change has waited ${formatDuration(age)} for the maps (timeout ${formatDuration(this.healthTimeoutMs)})` };
      return { ok: true, message: `a change is being applied (${formatDuration(age)})` };
    }
    return { ok: false, message: 'the desired state is not in the maps' };
  }

  checks(group: CheckGroup): readonly Check[] {
    return group === 'livez' ? this.livez : this.readyz;
  }

  run(group: CheckGroup, exclude: Iterable<string> = []): GroupResult {
    const excluded = new Set(exclude);
    const checks: CheckResult[] = [];
    for (const c of this.checks(group)) {
      if (excluded.delete(c.name)) {
        checks.push({ name: c.name, ok: true, excluded: true });
        continue;
      }
      const r = c.run();
      checks.push({ name: c.name, ok: r.ok, ...(r.message !== undefined ? { message: r.message } : {}) });
    }
    return { ok: checks.every((c) => c.ok), checks, unknownExcludes: [...excluded] };
  }

  runOne(group: CheckGroup, name: string): CheckResult | undefined {
    const c = this.checks(group).find((x) => x.name === name);
    if (!c) return undefined;
    const r = c.run();
    return { name, ok: r.ok, ...(r.message !== undefined ? { message: r.message } : {}) };
  }

  /**
   * kube-proxy's rule: unhealthy when a change has been waiting for the maps
   * longer than healthTimeoutMs, or when this node is being deleted. Like
   * kube-proxy, lastUpdated is the current time while healthy and the last
   * successful sync otherwise.
   */
  healthz(now: number = this.now()): HealthzReport {
    const { view } = this.opts;
    let nodeEligible = true;
    let reason: string | undefined;
    try {
      nodeEligible = !view.nodeDeleting();
    } catch {
      // An unknown node state never makes the node ineligible.
    }
    const s = view.sync();
    if (s.oldestPending !== undefined && now - s.oldestPending >= this.healthTimeoutMs) {
      reason = `a change has waited ${formatDuration(now - s.oldestPending)} for the maps (timeout ${formatDuration(this.healthTimeoutMs)})`;
      if (s.lastError !== undefined) reason += `; the last sync failed: ${s.lastError}`;
    }
    if (!nodeEligible) reason = reason ? `${reason}; the node is being deleted` : 'the node is being deleted';
    const healthy = reason === undefined;
    return {
      healthy,
      lastUpdated: healthy ? rfc3339(now) : s.lastSuccess !== undefined ? rfc3339(s.lastSuccess) : ZERO_TIME,
      currentTime: rfc3339(now),
      nodeEligible,
      ...(reason !== undefined ? { reason } : {}),
    };
  }

  close(): void {
    this.monitor.stop();
  }
}

const oneLine = (s: string): string => s.replace(/\s*\n\s*/g, ' ');

/**
 * Kubernetes' healthz text: `ok`, or with ?verbose or on failure one
 * `[+]`/`[-]` line per check. A passing check with something to say (a
 * stall of the event loop that was not enough to fail it, a change being
 * applied) says it in parentheses, as lbctl status does.
 */
export function formatGroup(group: CheckGroup, r: GroupResult, verbose: boolean): { status: number; body: string } {
  if (r.ok && !verbose) return { status: 200, body: 'ok' };
  let body = '';
  for (const c of r.checks) {
    if (c.excluded) body += `[+]${c.name} excluded: ok\n`;
    else if (c.ok) body += `[+]${c.name} ok${c.message !== undefined ? ` (${oneLine(c.message)})` : ''}\n`;
    else body += `[-]${c.name} failed: ${oneLine(c.message ?? 'no reason given')}\n`;
  }
  if (r.unknownExcludes.length > 0) {
    body += `warn: some health checks cannot be excluded: no matches for ${r.unknownExcludes.map((n) => JSON.stringify(n)).join(',')}\n`;
  }
  body += `${group} check ${r.ok ? 'passed' : 'failed'}\n`;
  return { status: r.ok ? 200 : 500, body };
}

export interface HealthServerOptions extends Partial<HealthOptions> {
  /** Checks shared with the local API; without it the server builds (and closes) its own from `view`. */
  readonly health?: Health;
  readonly port?: number;
  readonly host?: string;
  /** Counts answers in kubeproxy_proxy_healthz_total / kubeproxy_proxy_livez_total. */
  readonly metrics?: AgentMetrics;
}

export type { RunningServer };

/** The health port: /livez, /readyz (and /<group>/<check>), /healthz. */
export function healthHandler(health: Health, metrics?: AgentMetrics): http.RequestListener {
  return (req, res) => {
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('Allow', 'GET, HEAD');
      return send(res, 405, 'method not allowed\n');
    }
    const url = new URL(req.url ?? '/', 'http://localhost');
    const parts = url.pathname.split('/').filter((p) => p !== '');
    const [group, name, ...rest] = parts;

    if (group === 'healthz' && parts.length === 1) {
      const h = health.healthz();
      const status = h.healthy ? 200 : 503;
      metrics?.healthzResponse(status);
      return send(res, status, JSON.stringify({ lastUpdated: h.lastUpdated, currentTime: h.currentTime, nodeEligible: h.nodeEligible }), 'application/json');
    }
    if ((group === 'livez' || group === 'readyz') && rest.length === 0) {
      if (name === undefined) {
        const exclude = url.searchParams.getAll('exclude').flatMap((v) => v.split(',')).filter((v) => v !== '');
        const { status, body } = formatGroup(group, health.run(group, exclude), url.searchParams.has('verbose'));
        if (group === 'livez') metrics?.livezResponse(status);
        return send(res, status, body);
      }
      const r = health.runOne(group, name);
      if (!r) return send(res, 404, `no ${group} check named ${JSON.stringify(name)}\n`);
      return r.ok ? send(res, 200, 'ok') : send(res, 500, `internal server error: ${oneLine(r.message ?? 'no reason given')}\n`);
    }
    send(res, 404, 'not found: try /livez, /readyz or /healthz\n');
  };
}

export async function startHealthServer(opts: HealthServerOptions): Promise<RunningServer> {
  let owned: Health | undefined;
  const health =
    opts.health ??
    (owned = (() => {
      if (!opts.view) throw new TypeError('startHealthServer needs a view or a health');
      return new Health({ ...opts, view: opts.view });
    })());
  const server = http.createServer(healthHandler(health, opts.metrics));
  try {
    const port = await listen(server, opts.port ?? DEFAULT_HEALTH_PORT, opts.host ?? '0.0.0.0');
    return {
      port,
      close: async () => {
        await closeServer(server);
        owned?.close();
      },
    };
  } catch (err) {
    owned?.close();
    throw err;
  }
}
