// The lbctl.io/readiness-probe annotation: a kubelet Probe object (JSON or
// YAML text) that tells lbctl how to probe a Service's backends in
// standalone mode (issue 17). Pure: no I/O.
//
// kubelet's semantics, kept field for field (k8s.io/kubernetes):
//   - defaults (pkg/apis/core/v1/defaults.go, SetDefaults_Probe): a field
//     that is absent or 0 takes its default: timeoutSeconds 1, periodSeconds
//     10, successThreshold 1, failureThreshold 3; initialDelaySeconds 0.
//     That is where the documented "minimum value is 1" comes from: the API
//     validation (validation.go, validateProbe) only refuses negatives, and a
//     0 is defaulted before it. lbctl does the same: 0 means the default.
//   - exactly one handler (validateHandler: "must specify a handler type",
//     "may not specify more than 1 handler type").
//   - httpGet (SetDefaults_HTTPGetAction, validateHTTPGetAction): path
//     defaults to "/", scheme to HTTP and must be HTTP or HTTPS; port is a
//     number 1-65535 or an IANA service name; header names are HTTP tokens.
//   - tcpSocket: port by number or name. grpc: port by number only (the API
//     type is int32), service optional.
//   - successThreshold may exceed 1 for readiness probes (it must be 1 for
//     liveness and startup probes only); terminationGracePeriodSeconds must
//     not be set on a readiness probe ("must not be set for readinessProbes"),
//     so lbctl refuses it too.
// Where lbctl differs, it says so in the reason:
//   - exec is refused: lbctl runs no commands.
//   - host (httpGet, tcpSocket) is refused: kubelet connects to `host`
//     instead of the pod IP, which for lbctl would probe something other
//     than the backend; a Host header goes in httpHeaders, as with kubelet.
//   - unknown fields are refused (the API server drops them with a
//     warning): a typo such as `periodSecond` would otherwise be silently
//     replaced by a default.
//   - sizes are bounded (the text, headers, path, service name) and the
//     durations are capped where a timer can hold them.
// Named ports stay names here: they resolve against the Service's
// EndpointSlice port names when the probe is aimed (resolvePort).
import yaml from 'js-yaml';
import { show, type Validated } from './validated.js';

export const READINESS_PROBE_ANNOTATION = 'lbctl.io/readiness-probe';

/** The annotation's text: a probe is a few hundred characters; more is refused before it is parsed. */
export const MAX_PROBE_TEXT = 16 * 1024;
/** YAML values the parser may build for one probe (an alias bomb stops here, not in memory). */
export const MAX_PROBE_VALUES = 1000;
export const MAX_PROBE_DEPTH = 8;
export const MAX_HTTP_HEADERS = 32;
export const MAX_HEADER_NAME = 256;
export const MAX_HEADER_VALUE = 4096;
export const MAX_PATH = 2048;
export const MAX_GRPC_SERVICE = 1024;
/**
 * Durations in seconds at most: a timer holds 2^31-1 ms (24.8 days), so
 * nothing longer can be scheduled; kubelet's int32 allows more but no
 * probe needs it.
 */
export const MAX_SECONDS = 2_147_483;
/** Thresholds at most (kubelet: int32). */
export const MAX_THRESHOLD = 2_147_483_647;

export const PROBE_DEFAULTS = Object.freeze({
  initialDelaySeconds: 0,
  periodSeconds: 10,
  timeoutSeconds: 1,
  successThreshold: 1,
  failureThreshold: 3,
});

/** A port by number, or by the name of an EndpointSlice port. */
export type PortRef = number | string;

export interface HttpHeader {
  readonly name: string;
  readonly value: string;
}

export type ProbeHandler =
  | { readonly kind: 'httpGet'; readonly path: string; readonly port: PortRef; readonly scheme: 'HTTP' | 'HTTPS'; readonly httpHeaders: readonly HttpHeader[] }
  | { readonly kind: 'tcpSocket'; readonly port: PortRef }
  | { readonly kind: 'grpc'; readonly port: number; readonly service: string };

/** A validated probe with every default applied. */
export interface ProbeSpec {
  readonly handler: ProbeHandler;
  readonly initialDelaySeconds: number;
  readonly periodSeconds: number;
  readonly timeoutSeconds: number;
  readonly successThreshold: number;
  readonly failureThreshold: number;
}

const WHAT = 'readiness-probe';
const fail = <T>(reason: string): Validated<T> => ({ ok: false, reason: `${WHAT}: ${reason}` });

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Thrown from the YAML listener: the text builds more values than a probe has. */
class TooManyValues extends Error {}

/**
 * The annotation's text → a probe. JSON is read by JSON.parse, anything
 * else as YAML (core schema: no custom tags), bounded in size, depth and
 * values built.
 */
export function parseProbeAnnotation(text: unknown): Validated<ProbeSpec> {
  if (typeof text !== 'string') return fail(`the annotation is ${show(text)}, not text`);
  if (text.length > MAX_PROBE_TEXT) return fail(`the annotation has ${text.length} characters, more than the ${MAX_PROBE_TEXT} lbctl reads`);
  if (text.trim() === '') return fail('the annotation is empty');
  let value: unknown;
  const trimmed = text.trimStart();
  if (trimmed.startsWith('{')) {
    try {
      value = JSON.parse(text);
    } catch (err) {
      return fail(`not JSON: ${(err as Error).message}`);
    }
  } else {
    let values = 0;
    try {
      value = yaml.load(text, {
        schema: yaml.CORE_SCHEMA,
        maxDepth: MAX_PROBE_DEPTH,
        maxTotalMergeKeys: 64,
        listener: (event) => {
          if (event === 'open' && ++values > MAX_PROBE_VALUES) throw new TooManyValues();
        },
      });
    } catch (err) {
      if (err instanceof TooManyValues) return fail(`more than ${MAX_PROBE_VALUES} YAML values: not a probe`);
      return fail(`not YAML: ${((err as Error).message ?? String(err)).split('\n')[0]}`);
    }
  }
  return validateProbe(value);
}

const PROBE_FIELDS = new Set(['exec', 'httpGet', 'tcpSocket', 'grpc', 'initialDelaySeconds', 'periodSeconds', 'timeoutSeconds', 'successThreshold', 'failureThreshold', 'terminationGracePeriodSeconds']);
const HANDLERS = ['exec', 'httpGet', 'tcpSocket', 'grpc'] as const;

/** A probe object (already parsed) → a probe with kubelet's defaults, or the first reason it cannot be used. */
export function validateProbe(obj: unknown): Validated<ProbeSpec> {
  if (!isObject(obj)) return fail(`${show(obj)} is not a probe object`);
  const unknown = firstUnknown(obj, PROBE_FIELDS);
  if (unknown !== undefined) return fail(`unknown field ${show(unknown)}`);
  const present = HANDLERS.filter((h) => obj[h] !== undefined && obj[h] !== null);
  if (present.length === 0) return fail('must specify a handler type: one of httpGet, tcpSocket or grpc');
  if (present.length > 1) return fail(`may not specify more than 1 handler type (${present.join(', ')})`);
  if (obj.terminationGracePeriodSeconds !== undefined && obj.terminationGracePeriodSeconds !== null) {
    return fail('terminationGracePeriodSeconds must not be set for readiness probes (as kubelet says): a failing backend is quarantined, never killed');
  }
  const kind = present[0]!;
  if (kind === 'exec') return fail('exec is not supported: lbctl runs no commands; use httpGet, tcpSocket or grpc');
  const handler = kind === 'httpGet' ? httpGet(obj.httpGet) : kind === 'tcpSocket' ? tcpSocket(obj.tcpSocket) : grpc(obj.grpc);
  if (!handler.ok) return handler;

  const nums: Record<keyof typeof PROBE_DEFAULTS, number> = { ...PROBE_DEFAULTS };
  for (const field of Object.keys(PROBE_DEFAULTS) as Array<keyof typeof PROBE_DEFAULTS>) {
    const v = obj[field];
    if (v === undefined || v === null) continue;
    if (typeof v !== 'number' || !Number.isInteger(v)) return fail(`${field} ${show(v)} is not an integer`);
    if (v < 0) return fail(`${field} ${v} must be greater than or equal to 0`);
    const max = field.endsWith('Seconds') ? MAX_SECONDS : MAX_THRESHOLD;
    if (v > max) return fail(`${field} ${v} is more than ${max}`);
    // kubelet: 0 is "not set" and takes the default (SetDefaults_Probe).
    if (v !== 0) nums[field] = v;
  }
  const value: ProbeSpec = {
    handler: handler.value,
    initialDelaySeconds: nums.initialDelaySeconds,
    periodSeconds: nums.periodSeconds,
    timeoutSeconds: nums.timeoutSeconds,
    successThreshold: nums.successThreshold,
    failureThreshold: nums.failureThreshold,
  };
  return { ok: true, value };
}

function firstUnknown(obj: Record<string, unknown>, known: ReadonlySet<string>): string | undefined {
  for (const k of Object.keys(obj)) if (!known.has(k)) return k;
  return undefined;
}

/** IANA_SVC_NAME (k8s.io/apimachinery validation.IsValidPortName): 1-15 of [a-z0-9-], a letter at least, no hyphen at either end or doubled. */
export function isPortName(v: string): boolean {
  return v.length >= 1 && v.length <= 15 && /^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/.test(v) && /[a-z]/.test(v) && !v.includes('--');
}

function port(v: unknown, field: string, namesAllowed: boolean): Validated<PortRef> {
  if (v === undefined || v === null) return fail(`${field} is required`);
  if (typeof v === 'number') {
    if (Number.isInteger(v) && v >= 1 && v <= 65535) return { ok: true, value: v };
    return fail(`${field} ${show(v)} is not a port: must be between 1 and 65535`);
  }
  if (typeof v === 'string' && namesAllowed) {
    if (isPortName(v)) return { ok: true, value: v };
    return fail(`${field} ${show(v)} is not a port number or name (a name is 1-15 lower-case letters, digits and '-', with a letter)`);
  }
  return fail(`${field} ${show(v)} is not a port${namesAllowed ? ' number or name' : ' number (grpc takes numbers only, as kubelet)'}`);
}

function noHost(obj: Record<string, unknown>, where: string): Validated<never> | undefined {
  if (obj.host === undefined || obj.host === null || obj.host === '') return undefined;
  return fail(`${where}.host is not supported: lbctl probes each backend at its own address (kubelet would connect to ${show(obj.host)} instead); set a Host header in httpHeaders`);
}

/** k8s.io/apimachinery's IsHTTPHeaderName: "[-A-Za-z0-9]+", a stricter subset of RFC 7230's tokens. */
const HEADER_NAME = /^[-A-Za-z0-9]+$/;

function httpGet(v: unknown): Validated<ProbeHandler> {
  if (!isObject(v)) return fail(`httpGet ${show(v)} is not an object`);
  const unknown = firstUnknown(v, new Set(['path', 'port', 'host', 'scheme', 'httpHeaders']));
  if (unknown !== undefined) return fail(`httpGet: unknown field ${show(unknown)}`);
  const h = noHost(v, 'httpGet');
  if (h) return h;
  const p = port(v.port, 'httpGet.port', true);
  if (!p.ok) return p;
  const path = v.path ?? '/';
  if (typeof path !== 'string') return fail(`httpGet.path ${show(path)} is not text`);
  if (path.length > MAX_PATH) return fail(`httpGet.path has ${path.length} characters, more than ${MAX_PATH}`);
  // Control characters would split the request line (Node refuses them anyway).
  if (/[\u0000-\u0020\u007f]/.test(path)) return fail(`httpGet.path ${show(path)} holds spaces or control characters`);
  const normalizedPath = path === '' ? '/' : path.startsWith('/') ? path : `/${path}`;
  const scheme = v.scheme ?? 'HTTP';
  if (scheme !== 'HTTP' && scheme !== 'HTTPS') return fail(`httpGet.scheme ${show(scheme)} is not supported: HTTP or HTTPS`);
  const raw = v.httpHeaders ?? [];
  if (!Array.isArray(raw)) return fail(`httpGet.httpHeaders ${show(raw)} is not a list`);
  if (raw.length > MAX_HTTP_HEADERS) return fail(`httpGet.httpHeaders has ${raw.length} headers, more than ${MAX_HTTP_HEADERS}`);
  const httpHeaders: HttpHeader[] = [];
  for (const [i, hdr] of raw.entries()) {
    const where = `httpGet.httpHeaders[${i}]`;
    if (!isObject(hdr)) return fail(`${where} ${show(hdr)} is not an object`);
    const u = firstUnknown(hdr, new Set(['name', 'value']));
    if (u !== undefined) return fail(`${where}: unknown field ${show(u)}`);
    const { name, value = '' } = hdr;
    if (typeof name !== 'string' || name.length === 0) return fail(`${where}.name is required`);
    if (name.length > MAX_HEADER_NAME) return fail(`${where}.name has ${name.length} characters, more than ${MAX_HEADER_NAME}`);
    if (!HEADER_NAME.test(name)) return fail(`${where}.name ${show(name)} is not a valid HTTP header name: letters, digits and '-' only (as the API says)`);
    if (typeof value !== 'string') return fail(`${where}.value ${show(value)} is not text`);
    if (value.length > MAX_HEADER_VALUE) return fail(`${where}.value has ${value.length} characters, more than ${MAX_HEADER_VALUE}`);
    if (/[\u0000-\u0008\u000a-\u001f\u007f]/.test(value)) return fail(`${where}.value holds control characters`);
    httpHeaders.push({ name, value });
  }
  return { ok: true, value: { kind: 'httpGet', path: normalizedPath, port: p.value, scheme, httpHeaders } };
}

function tcpSocket(v: unknown): Validated<ProbeHandler> {
  if (!isObject(v)) return fail(`tcpSocket ${show(v)} is not an object`);
  const unknown = firstUnknown(v, new Set(['port', 'host']));
  if (unknown !== undefined) return fail(`tcpSocket: unknown field ${show(unknown)}`);
  const h = noHost(v, 'tcpSocket');
  if (h) return h;
  const p = port(v.port, 'tcpSocket.port', true);
  if (!p.ok) return p;
  return { ok: true, value: { kind: 'tcpSocket', port: p.value } };
}

function grpc(v: unknown): Validated<ProbeHandler> {
  if (!isObject(v)) return fail(`grpc ${show(v)} is not an object`);
  const unknown = firstUnknown(v, new Set(['port', 'service']));
  if (unknown !== undefined) return fail(`grpc: unknown field ${show(unknown)}`);
  const p = port(v.port, 'grpc.port', false);
  if (!p.ok) return p;
  const service = v.service ?? '';
  if (typeof service !== 'string') return fail(`grpc.service ${show(service)} is not text`);
  if (service.length > MAX_GRPC_SERVICE) return fail(`grpc.service has ${service.length} characters, more than ${MAX_GRPC_SERVICE}`);
  return { ok: true, value: { kind: 'grpc', port: p.value as number, service } };
}

/** The named port of an EndpointSlice (or the number itself): what a probe aims at. */
export function resolvePort(ref: PortRef, slicePorts: ReadonlyArray<{ readonly name: string; readonly port: number }>): number | undefined {
  if (typeof ref === 'number') return ref;
  return slicePorts.find((p) => p.name === ref)?.port;
}

/** One probe aimed at one backend: the spec with its port resolved to a number. */
export interface ProbeTarget {
  /** Canonical address text (Endpoint.address). */
  readonly address: string;
  readonly port: number;
  readonly spec: ProbeSpec;
}

/**
 * The probe's identity: canonical JSON (fixed key order) of the normalized
 * probe with its port resolved, and the address. Two services whose
 * annotations differ only in spelling (YAML or JSON, key order, defaults
 * written out or not, a port by name or by the number it resolves to)
 * share it, so a backend they share is probed once.
 */
export function probeKey(t: ProbeTarget): string {
  const s = t.spec;
  const h = s.handler;
  const handler =
    h.kind === 'httpGet'
      ? ['httpGet', h.scheme, h.path, h.httpHeaders.map((x) => [x.name, x.value])]
      : h.kind === 'tcpSocket'
        ? ['tcpSocket']
        : ['grpc', h.service];
  return JSON.stringify([t.address, t.port, handler, s.initialDelaySeconds, s.periodSeconds, s.timeoutSeconds, s.successThreshold, s.failureThreshold]);
}
