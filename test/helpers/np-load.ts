// bench/np-load.c and bench/server.c for the tests and benchmarks that load a
// NodePort with new connections (test/e2e/nodeport-sustained.ts,
// bench/nodeport-e2e.ts): built with cc where the caller says, run in a
// namespace through the caller's exec (which records the pid for teardown),
// their JSON line parsed.
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { how, ROOT, type ExecResult } from './sandbox/run.js';

export type CloseStyle = 'rst' | 'fin' | 'server';

/**
 * When a connection of a sustained run has failed: not done in 2.5 s, a
 * client that retries its SYN once (after the kernel's 1 s initial RTO) and
 * then gives up. The test and the benchmark judge every mode by it.
 */
export const SUSTAINED_TIMEOUT_MS = 2500;

export interface NpLoadOptions {
  readonly addr: string;
  readonly port: number;
  /** How long the counted window runs (or `count` connections). */
  readonly seconds?: number;
  readonly count?: number;
  /** Open loop: connections started a second, on a fixed schedule. */
  readonly rate?: number;
  /** Closed loop: connections in flight (np-load's default 32). */
  readonly concurrency?: number;
  /** Connections before the counted window (np-load's default: 200 closed loop, 0 open loop). */
  readonly warmup?: number;
  /** A connection not done within this fails as a timeout (np-load's default 1,000). */
  readonly timeoutMs?: number;
  readonly close?: CloseStyle;
  /** Stop starting connections once this many failed (a path that drops everything; np-load -f). */
  readonly maxFailed?: number;
  /** Pin np-load to this CPU (taskset). */
  readonly cpu?: number;
}

/** np-load's JSON line (bench/np-load.c says what each field is). */
export interface NpLoadResult {
  completed: number;
  failed: number;
  seconds: number;
  rps: number;
  started: number;
  rate?: number;
  max_lag_ms?: number;
  /** It stopped after maxFailed failures. */
  stopped?: boolean;
  concurrency?: number;
  close: CloseStyle;
  timeout_ms: number;
  max_in_flight: number;
  timeout: number;
  reset: number;
  refused: number;
  other: number;
  timeouts: { connect: number; reply: number; close: number };
  errors: Record<string, number>;
  p50_us: number;
  p90_us: number;
  p99_us: number;
  max_us: number;
  per_second: Record<'started' | 'completed' | 'timeout' | 'reset' | 'refused' | 'other', number[]>;
}

export interface LoadTools {
  readonly load: string;
  readonly server: string;
}

/** Builds np-load and the server into `dir` (a test's run dir, or build/bench). */
export function buildLoadTools(dir: string): LoadTools {
  mkdirSync(dir, { recursive: true });
  const tools = { load: path.join(dir, 'np-load'), server: path.join(dir, 'server') };
  for (const [src, out] of [['np-load.c', tools.load], ['server.c', tools.server]] as const) {
    execFileSync('cc', ['-O2', '-Wall', '-Wextra', '-o', out, path.join(ROOT, 'bench', src)], { stdio: ['ignore', 'inherit', 'inherit'] });
  }
  return tools;
}

/** np-load's command line for `opts`. */
export function npLoadArgs(bin: string, o: NpLoadOptions): string[] {
  const args = [bin, '-a', o.addr, '-p', String(o.port)];
  if (o.seconds !== undefined) args.push('-d', String(o.seconds));
  if (o.count !== undefined) args.push('-n', String(o.count));
  if (o.rate !== undefined) args.push('-r', String(o.rate));
  if (o.concurrency !== undefined) args.push('-c', String(o.concurrency));
  if (o.warmup !== undefined) args.push('-w', String(o.warmup));
  if (o.timeoutMs !== undefined) args.push('-t', String(o.timeoutMs));
  if (o.close !== undefined) args.push('-m', o.close);
  if (o.maxFailed !== undefined) args.push('-f', String(o.maxFailed));
  return o.cpu === undefined ? args : ['taskset', '-c', String(o.cpu), ...args];
}

/**
 * Runs np-load through `exec` (a namespace's, e.g. lab.inExt) and parses its
 * line. The deadline covers the window, a warm-up, the drain and a margin.
 */
export async function npLoad(exec: (cmd: readonly string[], timeoutMs: number) => Promise<ExecResult>, bin: string, o: NpLoadOptions): Promise<NpLoadResult> {
  const windowMs = (o.seconds ?? 0) * 1000 + (o.count && o.rate ? (o.count / o.rate) * 1000 : 0);
  const r = await exec(npLoadArgs(bin, o), windowMs + 10 * (o.timeoutMs ?? 1000) + 60_000);
  if (r.code !== 0) throw new Error(`np-load ${o.addr}:${o.port} failed ${how(r)}: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!) as NpLoadResult;
}

/** Failures by kind, for messages: "12 timeout (connect 12), 3 reset". */
export function failureSummary(r: NpLoadResult): string {
  const parts: string[] = [];
  if (r.timeout) parts.push(`${r.timeout} timeout (connect ${r.timeouts.connect}, reply ${r.timeouts.reply}, close ${r.timeouts.close})`);
  if (r.reset) parts.push(`${r.reset} reset`);
  if (r.refused) parts.push(`${r.refused} refused`);
  if (r.other) parts.push(`${r.other} other ${JSON.stringify(r.errors)}`);
  return parts.length ? parts.join(', ') : 'none';
}

/** Each second of the window: "s: started/completed, failures by kind", one line a second. */
export function perSecondLines(r: NpLoadResult): string[] {
  const ps = r.per_second;
  return ps.started.map((started, i) => {
    const f = (['timeout', 'reset', 'refused', 'other'] as const).filter((k) => ps[k][i]).map((k) => `${ps[k][i]} ${k}`);
    return `${String(i).padStart(3)} s: ${started} started, ${ps.completed[i]} completed${f.length ? `, ${f.join(', ')}` : ''}`;
  });
}
