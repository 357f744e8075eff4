// The probe executors (issue 17): what kubelet's pkg/probe/{http,tcp,grpc}
// do, aimed at a backend's address. Each is bounded by the AbortSignal the
// prober gives it (fired at the probe's timeout), and the prober counts a
// probe that outlives it as a failure whatever the executor does.
//
// httpGet, as kubelet's (pkg/probe/http/http.go, request.go):
//   - GET scheme://address:port/path; no keep-alive (a new connection per
//     probe); HTTPS without any certificate check (InsecureSkipVerify);
//   - headers from httpHeaders; a Host header there sets the request's
//     Host; User-Agent defaults to kube-probe/… and Accept to */*, an empty
//     Accept given removes it;
//   - 200-399 is success, anything else failure ("HTTP probe failed with
//     statuscode: N"); the body is read up to 10 KiB (kubelet's
//     maxRespBodyLength), the rest is not waited for;
//   - redirects are followed to the same host only, 10 at most ("stopped
//     after 10 redirects"); a redirect elsewhere is not followed and its
//     3xx counts as success (kubelet: a Warning event, a Success result).
// tcpSocket (pkg/probe/tcp/tcp.go): a completed handshake is success; the
// connection is closed at once.
// grpc (pkg/probe/grpc/grpc.go): grpc.health.v1.Health/Check in plaintext;
// SERVING is success, any other status or error a failure with kubelet's
// messages. The gRPC client itself is injected (GrpcHealthClient; the agent's
// is grpc-health.ts, over @grpc/grpc-js): without one a grpc probe is a
// prober error (thrown away: the backend stays unknown, served as its
// endpoint says).
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import type { ProbeTarget } from '../model/probe.js';
import type { Executor, Executors, ProbeOutcome } from './prober.js';

/** kubelet reads at most this much of a probe's response body. */
export const MAX_BODY_BYTES = 10 * 1024;
export const MAX_REDIRECTS = 10;
/** kubelet sends kube-probe/<major>.<minor>; lbctl says who it is. */
export const USER_AGENT = 'kube-probe/lbctl';

const hostPort = (address: string, port: number): string => (address.includes(':') ? `[${address}]:${port}` : `${address}:${port}`);

const errText = (err: unknown): string => {
  const e = err as NodeJS.ErrnoException;
  return e?.code ? `${e.code}${e.message && !e.message.includes(e.code) ? `: ${e.message}` : ''}` : (e?.message ?? String(err));
};

interface Answer {
  readonly status: number;
  readonly location?: string;
  /** The body broke off before its end or the 10 KiB we read. */
  readonly bodyError?: string;
}

function get(url: URL, headers: Record<string, string>, signal: AbortSignal): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const mod = url.protocol === 'https:' ? https : http;
    const req = mod.request(url, { method: 'GET', headers, agent: false, signal, rejectUnauthorized: false });
    req.on('error', reject);
    req.on('response', (res) => {
      const status = res.statusCode ?? 0;
      const location = typeof res.headers.location === 'string' ? res.headers.location : undefined;
      let read = 0;
      let settled = false;
      const done = (bodyError?: string): void => {
        if (settled) return;
        settled = true;
        // No keep-alive: the connection goes with the probe, read to the end or not.
        res.destroy();
        resolve({ status, ...(location !== undefined ? { location } : {}), ...(bodyError !== undefined ? { bodyError } : {}) });
      };
      res.on('data', (chunk: Buffer) => {
        read += chunk.length;
        if (read >= MAX_BODY_BYTES) done();
      });
      res.on('end', () => done());
      res.on('error', (err) => done(errText(err)));
      res.on('aborted', () => done('the response broke off'));
    });
    req.end();
  });
}

/** The request headers kubelet would send (newProbeRequest). */
export function probeHeaders(given: ReadonlyArray<{ readonly name: string; readonly value: string }>): Record<string, string> {
  const headers: Record<string, string> = {};
  const names = new Map<string, string>(); // lower-case → the spelling first given
  for (const { name, value } of given) {
    const lower = name.toLowerCase();
    const key = names.get(lower) ?? name;
    names.set(lower, key);
    // Several values of one header: joined, as Go's Header.Add sends them on one line each; one line is the same to a server.
    headers[key] = headers[key] === undefined ? value : `${headers[key]}, ${value}`;
  }
  if (!names.has('user-agent')) headers['User-Agent'] = USER_AGENT;
  if (!names.has('accept')) headers['Accept'] = '*/*';
  else if (headers[names.get('accept')!] === '') delete headers[names.get('accept')!];
  return headers;
}

export const httpGetExecutor: Executor = async (target: ProbeTarget, { signal }): Promise<ProbeOutcome> => {
  const h = target.spec.handler;
  if (h.kind !== 'httpGet') return { ok: false, reason: `not an httpGet probe (${h.kind})`, error: true };
  const headers = probeHeaders(h.httpHeaders);
  // As kubelet's formatURL: the path is parsed as a URL, then its scheme and
  // host are replaced by the probe's: a path such as //elsewhere/x or
  // http://elsewhere/x still asks the backend for /x.
  let url: URL;
  try {
    const rel = new URL(h.path, 'http://backend.invalid');
    url = new URL(`${h.scheme.toLowerCase()}://${hostPort(target.address, target.port)}`);
    url.pathname = rel.pathname;
    url.search = rel.search;
  } catch (err) {
    return { ok: false, reason: `bad URL: ${errText(err)}` };
  }
  const origin = url.hostname;
  for (let redirects = 0; ; redirects++) {
    let answer: Answer;
    try {
      answer = await get(url, headers, signal);
    } catch (err) {
      return { ok: false, reason: `Get "${url.href}": ${errText(err)}` };
    }
    const { status, location } = answer;
    if (status >= 300 && status < 400 && location !== undefined && [301, 302, 303, 307, 308].includes(status)) {
      let next: URL;
      try {
        next = new URL(location, url);
      } catch {
        return { ok: false, reason: `Get "${url.href}": bad redirect location ${JSON.stringify(location.slice(0, 200))}` };
      }
      if (next.hostname === origin && (next.protocol === 'http:' || next.protocol === 'https:')) {
        // Go's CheckRedirect refuses when `via` (the requests so far) holds 10.
        if (redirects + 1 >= MAX_REDIRECTS) return { ok: false, reason: `Get "${next.href}": stopped after ${MAX_REDIRECTS} redirects` };
        url = next;
        continue;
      }
      return { ok: true, detail: `Probe terminated redirects (${status} to ${next.host})` };
    }
    if (answer.bodyError !== undefined) return { ok: false, reason: `reading the response of ${url.href}: ${answer.bodyError}`, error: true };
    if (status >= 200 && status < 400) return status >= 300 ? { ok: true, detail: `Probe terminated redirects (${status})` } : { ok: true };
    return { ok: false, reason: `HTTP probe failed with statuscode: ${status}` };
  }
};

export const tcpSocketExecutor: Executor = (target: ProbeTarget, { signal }): Promise<ProbeOutcome> =>
  new Promise((resolve) => {
    const where = `dial tcp ${hostPort(target.address, target.port)}`;
    if (signal.aborted) return resolve({ ok: false, reason: `${where}: aborted` });
    const sock = net.connect({ host: target.address, port: target.port });
    const finish = (o: ProbeOutcome): void => {
      signal.removeEventListener('abort', onAbort);
      sock.destroy();
      resolve(o);
    };
    const onAbort = (): void => finish({ ok: false, reason: `${where}: i/o timeout` });
    signal.addEventListener('abort', onAbort, { once: true });
    sock.once('connect', () => finish({ ok: true }));
    sock.once('error', (err) => finish({ ok: false, reason: `${where}: ${errText(err)}` }));
  });

/** grpc.health.v1.HealthCheckResponse.ServingStatus. */
export type GrpcServingStatus = 'UNKNOWN' | 'SERVING' | 'NOT_SERVING' | 'SERVICE_UNKNOWN';
const SERVING_STATUS: readonly GrpcServingStatus[] = ['UNKNOWN', 'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN'];

/** A gRPC error as clients report it: its status code and message. */
export interface GrpcError {
  readonly code: number;
  readonly details?: string;
  readonly message?: string;
}
export const GRPC_DEADLINE_EXCEEDED = 4;
export const GRPC_UNIMPLEMENTED = 12;
export const GRPC_UNAVAILABLE = 14;

/**
 * One grpc.health.v1.Health/Check call in plaintext to address:port,
 * cancelled by `signal`: resolves the serving status, or rejects with a
 * GrpcError. Implemented over @grpc/grpc-js in grpc-health.ts;
 * encodeHealthCheckRequest/decodeHealthCheckResponse are its codec.
 */
export interface GrpcHealthClient {
  check(address: string, port: number, service: string, opts: { readonly timeoutMs: number; readonly signal: AbortSignal }): Promise<GrpcServingStatus>;
}

/** The grpc executor over a client (the agent's: GrpcJsHealthClient); without one, a grpc probe is a prober error (thrown away). */
export function grpcExecutor(client: GrpcHealthClient | undefined): Executor {
  return async (target, { timeoutMs, signal }) => {
    const h = target.spec.handler;
    if (h.kind !== 'grpc') return { ok: false, reason: `not a grpc probe (${h.kind})`, error: true };
    if (client === undefined) return { ok: false, reason: 'grpc probes need a gRPC client, which this build of lbctl does not have', error: true };
    const addr = hostPort(target.address, target.port);
    let status: GrpcServingStatus;
    try {
      status = await client.check(target.address, target.port, h.service, { timeoutMs, signal });
    } catch (err) {
      const e = err as GrpcError;
      const msg = e?.details ?? e?.message ?? String(err);
      if (e?.code === GRPC_UNIMPLEMENTED) return { ok: false, reason: `error: this server does not implement the grpc health protocol (grpc.health.v1.Health): ${msg}` };
      if (e?.code === GRPC_DEADLINE_EXCEEDED) return { ok: false, reason: `timeout: health rpc did not complete within ${timeoutMs / 1000}s` };
      if (e?.code === GRPC_UNAVAILABLE) return { ok: false, reason: `error: failed to connect service at "${addr}": ${msg}` };
      return { ok: false, reason: `error: health rpc probe failed: ${msg}` };
    }
    if (status !== 'SERVING') return { ok: false, reason: `service unhealthy (responded with "${status}")` };
    return { ok: true, detail: 'service healthy' };
  };
}

/** HealthCheckRequest { string service = 1; } in protobuf wire format. */
export function encodeHealthCheckRequest(service: string): Buffer {
  const bytes = Buffer.from(service, 'utf8');
  if (bytes.length === 0) return Buffer.alloc(0);
  const len: number[] = [];
  let n = bytes.length;
  while (n > 0x7f) {
    len.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  len.push(n);
  return Buffer.concat([Buffer.from([0x0a, ...len]), bytes]);
}

/** HealthCheckResponse { ServingStatus status = 1; } from protobuf wire format; unknown fields skipped; undefined if malformed. */
export function decodeHealthCheckResponse(buf: Uint8Array): GrpcServingStatus | undefined {
  let i = 0;
  let status = 0;
  const varint = (): number | undefined => {
    let v = 0;
    for (let shift = 0; shift < 35; shift += 7) {
      if (i >= buf.length) return undefined;
      const b = buf[i++]!;
      v += (b & 0x7f) * 2 ** shift;
      if ((b & 0x80) === 0) return v;
    }
    return undefined;
  };
  while (i < buf.length) {
    const tag = varint();
    if (tag === undefined) return undefined;
    const field = Math.floor(tag / 8);
    const wire = tag & 7;
    if (wire === 0) {
      const v = varint();
      if (v === undefined) return undefined;
      if (field === 1) status = v;
    } else if (wire === 2) {
      const len = varint();
      if (len === undefined || i + len > buf.length) return undefined;
      i += len;
    } else if (wire === 1) i += 8;
    else if (wire === 5) i += 4;
    else return undefined;
    if (i > buf.length) return undefined;
  }
  // An unknown enum value is not SERVING: report it as UNKNOWN.
  return SERVING_STATUS[status] ?? 'UNKNOWN';
}

/** The executors the agent uses: node's http, https and net, and the gRPC client when there is one. */
export function defaultExecutors(grpc?: GrpcHealthClient): Executors {
  return { httpGet: httpGetExecutor, tcpSocket: tcpSocketExecutor, grpc: grpcExecutor(grpc) };
}
