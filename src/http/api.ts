// The agent's local API: HTTP over a unix socket (mode 0600), read only.
// The socket is made in a private directory (0700) and renamed into place
// with its mode already set, so no other user can reach it, not even for the
// moment between listen() and chmod().
// `lbctl status` and `lbctl service list` are its clients.
//   GET /v1/status    every check with its result, syncs, counts, uptime, version
//   GET /v1/services  desired versus realized per frontend (FrontendStatus[])
//   GET /v1/version   the agent's versions, read at its start (lbctl version)
import http from 'node:http';
import net from 'node:net';
import { chmod, lstat, mkdir, mkdtemp, rename, rmdir, unlink } from 'node:fs/promises';
import path from 'node:path';
import type { MeshStatus } from '../mesh/mesh.js';
import { LbError } from '../base/errors.js';
import { Health, type CheckResult, type HealthOptions } from './health.js';
import { closeServer } from './http.js';
import type { AgentView, KernelStatus } from './view.js';
import type { Versions } from '../base/version.js';

import { DEFAULT_API_SOCKET } from '../base/defaults.js';
export { DEFAULT_API_SOCKET };

export interface GroupStatus {
  readonly ok: boolean;
  readonly checks: readonly CheckResult[];
}

/** The body of GET /v1/status. Times are RFC 3339. */
export interface AgentStatus {
  readonly version: string;
  readonly time: string;
  readonly startedAt: string;
  readonly uptimeSeconds: number;
  readonly livez: GroupStatus;
  readonly readyz: GroupStatus;
  readonly healthz: { readonly healthy: boolean; readonly nodeEligible: boolean; readonly lastUpdated: string; readonly reason?: string };
  readonly sync: {
    readonly count: number;
    readonly inProgress: boolean;
    readonly lastAttempt?: string;
    readonly lastSuccess?: string;
    readonly lastError?: string;
    readonly oldestPending?: string;
  };
  readonly counts: { readonly services: number; readonly frontends: number; readonly backends: number };
  /** Each map the agent writes: entries in use and max_entries (absent from older agents). */
  readonly maps?: ReadonlyArray<{ readonly map: string; readonly entries: number; readonly maxEntries: number }>;
  /** The source and its notes (absent from older agents). */
  readonly source?: { readonly name: string; readonly notes: readonly string[] };
  /** The kernel as probed at start (absent from older agents). */
  readonly kernel?: KernelStatus;
}

const rfc3339 = (ms: number): string => new Date(ms).toISOString();

export function agentStatus(view: AgentView, health: Health, version: string, now: number = Date.now()): AgentStatus {
  const group = (g: 'livez' | 'readyz'): GroupStatus => {
    const r = health.run(g);
    return { ok: r.ok, checks: r.checks };
  };
  const h = health.healthz(now); // one clock reading for the whole report
  const s = view.sync();
  const kernel = view.kernel();
  const opt = <K extends string>(k: K, ms: number | undefined): { [P in K]?: string } => (ms === undefined ? {} : ({ [k]: rfc3339(ms) } as { [P in K]: string }));
  return {
    version,
    time: rfc3339(now),
    startedAt: rfc3339(view.startedAt),
    uptimeSeconds: Math.max(0, Math.round((now - view.startedAt) / 100) / 10),
    livez: group('livez'),
    readyz: group('readyz'),
    healthz: { healthy: h.healthy, nodeEligible: h.nodeEligible, lastUpdated: h.lastUpdated, ...(h.reason !== undefined ? { reason: h.reason } : {}) },
    sync: {
      count: s.count,
      inProgress: s.inProgress,
      ...opt('lastAttempt', s.lastAttempt),
      ...opt('lastSuccess', s.lastSuccess),
      ...(s.lastError !== undefined ? { lastError: s.lastError } : {}),
      ...opt('oldestPending', s.oldestPending),
    },
    counts: { ...view.counts() },
    maps: view.mapPressure().map((m) => ({ map: m.map, entries: m.entries, maxEntries: m.maxEntries })),
    source: view.source(),
    ...(kernel ? { kernel } : {}),
  };
}

export interface ApiServerOptions extends Partial<Omit<HealthOptions, 'view'>> {
  readonly view: AgentView;
  readonly socketPath?: string;
  readonly version: string;
  /** Checks shared with the health port; without it the server builds (and closes) its own. */
  readonly health?: Health;
  /** The health mesh (`lbctl health status`); absent when --health-mesh-port is 0. */
  readonly mesh?: { status(): MeshStatus };
  /** What GET /v1/version answers (`lbctl version`). */
  readonly versions?: Versions;
}

export interface RunningApiServer {
  readonly socketPath: string;
  close(): Promise<void>;
}

/** Whether something accepts connections on the socket. */
function answers(socketPath: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ path: socketPath });
    s.setTimeout(1000);
    s.once('connect', () => (s.destroy(), resolve(true)));
    s.once('timeout', () => (s.destroy(), resolve(true)));
    s.once('error', () => resolve(false));
  });
}

/** Creates the directory; removes a socket left by an agent that died, refuses to touch anything else. */
async function prepareSocketPath(socketPath: string): Promise<void> {
  await mkdir(path.dirname(socketPath), { recursive: true, mode: 0o700 });
  let st;
  try {
    st = await lstat(socketPath);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  if (!st.isSocket()) throw new LbError(`${socketPath} exists and is not a socket: refusing to replace it`, 'EEXIST');
  if (await answers(socketPath)) throw new LbError(`${socketPath}: another agent is already serving its API there`, 'EADDRINUSE');
  await unlink(socketPath);
}

function sendJson(res: http.ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'Content-Type': 'application/json', 'Cache-Control': 'no-store' });
  res.end(JSON.stringify(body, null, 2) + '\n');
}

export function apiHandler(view: AgentView, health: Health, version: string, mesh?: { status(): MeshStatus }, versions?: Versions): http.RequestListener {
  return (req, res) => {
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('Allow', 'GET, HEAD');
      return sendJson(res, 405, { error: 'method not allowed' });
    }
    const p = new URL(req.url ?? '/', 'http://localhost').pathname;
    try {
      if (p === '/v1/status') return sendJson(res, 200, agentStatus(view, health, version));
      if (p === '/v1/services') return sendJson(res, 200, view.frontends());
      if (p === '/v1/health') {
        if (!mesh) return sendJson(res, 404, { error: 'the health mesh is off (--health-mesh-port 0)' });
        return sendJson(res, 200, mesh.status());
      }
      if (p === '/v1/version' && versions) return sendJson(res, 200, versions);
    } catch (err) {
      return sendJson(res, 500, { error: err instanceof Error ? err.message : String(err) });
    }
    sendJson(res, 404, { error: `no such endpoint: ${p} (try /v1/status, /v1/services, /v1/health or /v1/version)` });
  };
}

export async function startApiServer(opts: ApiServerOptions): Promise<RunningApiServer> {
  const socketPath = opts.socketPath ?? DEFAULT_API_SOCKET;
  await prepareSocketPath(socketPath);
  const owned = opts.health ? undefined : new Health(opts);
  const health = opts.health ?? owned!;
  const server = http.createServer(apiHandler(opts.view, health, opts.version, opts.mesh, opts.versions));
  // mkdtemp makes the directory 0700, beside the socket's path (one file
  // system, so the rename is atomic).
  const privateDir = await mkdtemp(path.join(path.dirname(socketPath), `.${path.basename(socketPath)}.`));
  const bound = path.join(privateDir, 'agent.sock');
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(bound, () => {
        server.off('error', reject);
        resolve();
      });
    });
    await chmod(bound, 0o600);
    await rename(bound, socketPath);
  } catch (err) {
    owned?.close();
    server.close();
    throw err;
  } finally {
    await unlink(bound).catch(() => undefined);
    await rmdir(privateDir).catch(() => undefined);
  }
  return {
    socketPath,
    close: async () => {
      await closeServer(server);
      owned?.close();
      await unlink(socketPath).catch(() => undefined); // libuv usually removed it already
    },
  };
}

/** The API cannot be reached: no socket, nobody listening, no permission, or no answer. */
export class AgentUnreachableError extends LbError {
  constructor(message: string, options?: ErrorOptions) {
    super(message, 'EUNREACHABLE', options);
  }
}

/** GET a JSON document from the agent's API socket. */
export function apiGet<T>(socketPath: string, urlPath: string, opts: { timeoutMs?: number } = {}): Promise<T> {
  const timeoutMs = opts.timeoutMs ?? 5000;
  return new Promise<T>((resolve, reject) => {
    const req = http.get({ socketPath, path: urlPath, headers: { Accept: 'application/json' }, timeout: timeoutMs }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('error', reject);
      res.on('end', () => {
        let parsed: unknown;
        try {
          parsed = JSON.parse(body);
        } catch {
          return reject(new LbError(`the agent answered ${urlPath} with something that is not JSON (HTTP ${res.statusCode})`, 'EPROTO'));
        }
        if (res.statusCode !== 200) {
          const msg = (parsed as { error?: unknown } | null)?.error;
          return reject(new LbError(`the agent answered ${urlPath} with HTTP ${res.statusCode}: ${typeof msg === 'string' ? msg : body.trim()}`, 'EAPI'));
        }
        resolve(parsed as T);
      });
    });
    req.on('timeout', () => req.destroy(new AgentUnreachableError(`the agent did not answer on ${socketPath} within ${timeoutMs / 1000} s`)));
    req.on('error', (err: NodeJS.ErrnoException) => {
      if (err instanceof LbError) return reject(err);
      const why: Record<string, string> = {
        ENOENT: `no API socket at ${socketPath}: is the agent running (lbctl agent)?`,
        ECONNREFUSED: `nothing is listening on ${socketPath}: the agent is not running (the socket is stale)`,
        EACCES: `permission denied on ${socketPath}: run as root`,
        EPERM: `permission denied on ${socketPath}: run as root`,
        ENOTSOCK: `${socketPath} is not a socket`,
      };
      reject(new AgentUnreachableError(`cannot reach the agent: ${why[err.code ?? ''] ?? `${socketPath}: ${err.message}`}`, { cause: err }));
    });
  });
}
