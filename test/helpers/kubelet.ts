// The kubelet's probes of the agent's container, as deploy/base/daemonset.yaml
// sets them and as the kubelet's prober workers evaluate them
// (kubernetes pkg/kubelet/prober/worker.go, doProbe):
//   - one worker per probe, probing at once and then every periodSeconds
//     (a tick that comes while a probe runs is dropped, as time.Ticker drops it);
//   - an HTTP probe passes on a status from 200 to 399, and fails on any
//     other, on a refused connection or after timeoutSeconds;
//   - a result changes the probe's state only after failureThreshold (or
//     successThreshold) equal results in a row;
//   - liveness and readiness do not probe until the startup probe has
//     passed; the startup probe stops once it has;
//   - a startup or liveness probe that reaches its failure threshold
//     restarts the container: recorded here as a restart, and its worker holds.
// Time may be scaled down (`scale`): every period is divided by it, the
// thresholds and each probe's own timeout are kept, so the verdict is the one
// the kubelet would reach over the whole window, in a tenth of the time at 10.
// A probe's timeout scales with SLOW, as every wait of the sandbox does (an
// emulated guest answers as a real node would, ten times slower).
import { readFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { ROOT, SLOW } from './sandbox.js';

export type ProbeKind = 'startup' | 'liveness' | 'readiness';
export const PROBE_KINDS: readonly ProbeKind[] = ['startup', 'liveness', 'readiness'];

/** One probe's settings, with the API's defaults where the manifest leaves one out. */
export interface ProbeSettings {
  readonly path: string;
  readonly port: string | number;
  readonly periodSeconds: number;
  readonly timeoutSeconds: number;
  readonly failureThreshold: number;
  readonly successThreshold: number;
  readonly initialDelaySeconds: number;
}

interface RawProbe {
  httpGet?: { path?: string; port: string | number };
  periodSeconds?: number;
  timeoutSeconds?: number;
  failureThreshold?: number;
  successThreshold?: number;
  initialDelaySeconds?: number;
}

export const DAEMONSET = path.join(ROOT, 'deploy/base/daemonset.yaml');

/** The agent container's probes in deploy/base/daemonset.yaml, defaults filled in as the API server fills them. */
export function daemonSetProbes(file = DAEMONSET): Record<ProbeKind, ProbeSettings> {
  const ds = parseAllDocuments(readFileSync(file, 'utf8')).map((d) => d.toJS()).find((o) => o?.kind === 'DaemonSet') as
    | { spec: { template: { spec: { containers: Array<{ name: string } & Partial<Record<`${ProbeKind}Probe`, RawProbe>>> } } } }
    | undefined;
  const container = ds?.spec.template.spec.containers.find((c) => c.name === 'lbctl-agent');
  if (!container) throw new Error(`${file}: no lbctl-agent container in a DaemonSet`);
  const settings = (kind: ProbeKind): ProbeSettings => {
    const p = container[`${kind}Probe`];
    if (!p?.httpGet) throw new Error(`${file}: the lbctl-agent container has no httpGet ${kind}Probe`);
    return {
      path: p.httpGet.path ?? '/',
      port: p.httpGet.port,
      periodSeconds: p.periodSeconds ?? 10,
      timeoutSeconds: p.timeoutSeconds ?? 1,
      failureThreshold: p.failureThreshold ?? 3,
      successThreshold: p.successThreshold ?? 1,
      initialDelaySeconds: p.initialDelaySeconds ?? 0,
    };
  };
  return { startup: settings('startup'), liveness: settings('liveness'), readiness: settings('readiness') };
}

/**
 * The longest the kubelet can take to restart a container that never
 * starts, plus one liveness window after a start: the time over which a
 * probe verdict is worth having (seconds, unscaled).
 */
export function restartWindowSeconds(p: Record<ProbeKind, ProbeSettings>): number {
  return p.startup.initialDelaySeconds + p.startup.periodSeconds * p.startup.failureThreshold + p.liveness.periodSeconds * p.liveness.failureThreshold;
}

export interface ProbeResult {
  readonly kind: ProbeKind;
  /** ms since the kubelet started probing. */
  readonly at: number;
  readonly ok: boolean;
  /** The HTTP status, or why there was none (refused, timeout). */
  readonly detail: string;
  /** The first line of a failing answer's body. */
  readonly body?: string;
}

export interface Restart {
  readonly kind: 'startup' | 'liveness';
  readonly at: number;
  /** The failures in a row that decided it. */
  readonly failures: readonly ProbeResult[];
}

/** HTTP GET as the kubelet's prober does it: 200-399 passes; anything else, an error or the timeout fails. */
function httpProbe(port: number, probePath: string, timeoutMs: number): Promise<{ ok: boolean; detail: string; body?: string }> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: probePath, timeout: timeoutMs, headers: { 'User-Agent': 'kube-probe/1.34', Accept: '*/*' } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => {
        const status = res.statusCode ?? 0;
        const ok = status >= 200 && status < 400;
        resolve({ ok, detail: String(status), ...(ok ? {} : { body: body.split('\n').filter((l) => l.startsWith('[-]')).join(' ') || body.split('\n')[0] }) });
      });
      res.on('error', (err) => resolve({ ok: false, detail: err.message }));
    });
    req.on('timeout', () => req.destroy(new Error(`timeout (${timeoutMs} ms)`)));
    req.on('error', (err) => resolve({ ok: false, detail: (err as NodeJS.ErrnoException).code ?? err.message }));
  });
}

/** The kubelet's three probe workers against one container's health port. */
export class Kubelet {
  readonly results: ProbeResult[] = [];
  readonly restarts: Restart[] = [];
  /** The startup probe has passed (the container is "started"). */
  started = false;
  /** The readiness the kubelet reports (false until the readiness probe passes). */
  ready = false;
  /** When readiness last changed, ms since start, with its new value. */
  readonly readiness: Array<{ at: number; ready: boolean }> = [];
  private stopped = false;
  private readonly t0 = performance.now();
  private readonly workers: Array<Promise<void>>;

  constructor(
    readonly probes: Record<ProbeKind, ProbeSettings>,
    private readonly port: () => number | undefined,
    readonly scale = 1,
  ) {
    this.workers = PROBE_KINDS.map((kind) => this.worker(kind));
  }

  now(): number {
    return performance.now() - this.t0;
  }

  private async worker(kind: ProbeKind): Promise<void> {
    const p = this.probes[kind];
    const periodMs = (p.periodSeconds * 1000) / this.scale;
    let last: boolean | undefined;
    let run: ProbeResult[] = [];
    let next = (p.initialDelaySeconds * 1000) / this.scale;
    for (;;) {
      await this.sleepUntil(next);
      if (this.stopped) return;
      // Ticks dropped while a probe ran: the next one is the first due after now.
      next += periodMs * Math.max(1, Math.ceil((this.now() - next) / periodMs));
      if (kind === 'startup' ? this.started : !this.started) continue;
      const port = this.port();
      const r = port === undefined ? { ok: false, detail: 'no port yet (connection refused)' } : await httpProbe(port, p.path, p.timeoutSeconds * 1000 * SLOW);
      if (this.stopped) return;
      const result: ProbeResult = { kind, at: Math.round(this.now()), ...r };
      this.results.push(result);
      if (last === result.ok) run.push(result);
      else run = [result];
      last = result.ok;
      if (result.ok ? run.length < p.successThreshold : run.length < p.failureThreshold) continue;
      if (kind === 'startup') {
        if (result.ok) this.started = true;
        else return this.restart('startup', run);
      } else if (kind === 'liveness') {
        if (!result.ok) return this.restart('liveness', run);
      } else if (this.ready !== result.ok) {
        this.ready = result.ok;
        this.readiness.push({ at: result.at, ready: result.ok });
      }
    }
  }

  /** The container would be killed here: recorded, and the worker holds (as the kubelet's does until the new container). */
  private restart(kind: 'startup' | 'liveness', failures: readonly ProbeResult[]): void {
    this.restarts.push({ kind, at: Math.round(this.now()), failures: [...failures] });
  }

  private async sleepUntil(at: number): Promise<void> {
    while (!this.stopped && this.now() < at) await new Promise((r) => setTimeout(r, Math.min(100, Math.max(1, at - this.now()))));
  }

  /** Waits until `check` holds, probing on; the deadline is in real ms. */
  async until(check: () => boolean, timeoutMs: number): Promise<boolean> {
    const end = this.now() + timeoutMs;
    while (!check()) {
      if (this.now() > end || this.stopped) return false;
      await new Promise((r) => setTimeout(r, 20));
    }
    return true;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all(this.workers);
  }

  /** One line for each restart: which probe, when, and the failures that decided it. */
  describeRestarts(): string {
    return this.restarts
      .map((r) => `${r.kind} probe restarted the container at ${(r.at / 1000).toFixed(1)} s (scaled ×${this.scale}): ${r.failures.length} failures in a row, the last: ${r.failures.at(-1)?.detail} ${r.failures.at(-1)?.body ?? ''}`)
      .join('\n');
  }
}
