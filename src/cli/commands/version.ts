// `lbctl version [-o json] [--client]`: this lbctl's versions beside the
// running agent's, as `kubectl version` and `cilium version` show client and
// server: what a bug report needs. The first line is the one lbctl has
// always printed; then one row per version, CLIENT and AGENT side by side
// (the agent's from its API socket, GET /v1/version, read at its start), an
// agent value that differs from the client's marked with *. BPF objects are
// named by their build id: the SHA-256 of the file (12 hex digits here, all
// of it in JSON). An agent that cannot be reached is said in one line and
// is not a failure (exit 0); a client whose addon does not load is (exit 1).
import path from 'node:path';
import { AgentUnreachableError, apiGet, type AgentStatus } from '../../http/api.js';
import { COMPAT_OBJECT, DEFAULT_OBJECT } from '../../datapath/loader.js';
import { PROBE_OBJECT } from '../../datapath/features.js';
import { l3ObjectFor, NODEPORT_OBJECT } from '../../datapath/nodeport.js';
import { SOCK_DESTROY_OBJECT } from '../../datapath/terminate.js';
import { LbError } from '../../base/errors.js';
import { collectVersions, type Versions } from '../../base/version.js';

/**
 * The BPF objects an agent with these options loads (or may: the socket
 * object's compat build on kernels before 5.18, sock_destroy.bpf.o on 6.5+):
 * the built ones beside this lbctl, or --bpf-object and --tc-object (with
 * the layer-3 tc object beside it) instead.
 */
export function runtimeObjects(opts: { bpfObject?: string; tcObject?: string; nodeport?: boolean } = {}): string[] {
  const sock = opts.bpfObject !== undefined ? [path.resolve(opts.bpfObject)] : [DEFAULT_OBJECT, COMPAT_OBJECT];
  const tc = opts.tcObject !== undefined ? path.resolve(opts.tcObject) : NODEPORT_OBJECT;
  return [...sock, ...(opts.nodeport === false ? [] : [tc, l3ObjectFor(tc)]), SOCK_DESTROY_OBJECT, PROBE_OBJECT];
}

/** What `lbctl version -o json` prints. */
export interface VersionReport {
  readonly client: Versions;
  /** Absent with --client; null when the agent could not be asked. */
  readonly agent?: Versions | null;
  /** Why the agent's versions are missing or partial. */
  readonly agentError?: string;
  readonly apiSocket?: string;
}

/** The first line, unchanged since lbctl's first release: `lbctl 0.1.0 (libbpf 1.1, node v24.22.3)`. */
export function versionLine(v: Versions): string {
  return `lbctl ${v.lbctl} (libbpf ${v.libbpf}, node ${v.node})`;
}

const shortCommit = (c: string): string => (/^[0-9a-f]{40}(-dirty)?$/.test(c) ? c.slice(0, 12) + c.slice(40) : c);
const shortId = (o: Versions['objects'][number] | undefined): string => (o === undefined ? '-' : o.sha256 === null ? `(${o.error ?? 'unreadable'})` : o.sha256.slice(0, 12));

/** The rows of the table: [name, client, agent] (agent undefined: no agent column). */
function rows(client: Versions, agent: Partial<Versions> | undefined): Array<[string, string, string | undefined]> {
  const a = <K extends keyof Versions>(k: K, f: (v: NonNullable<Versions[K]>) => string = String): string | undefined =>
    agent === undefined ? undefined : agent[k] === undefined ? '-' : f(agent[k] as NonNullable<Versions[K]>);
  const out: Array<[string, string, string | undefined]> = [
    ['lbctl', client.lbctl, a('lbctl')],
    ['commit', shortCommit(client.commit), a('commit', shortCommit)],
    ['node', client.node, a('node')],
    ['v8', client.v8, a('v8')],
    ['libbpf', client.libbpf, a('libbpf')],
    ['kernel', client.kernel, a('kernel')],
  ];
  // Objects by file name: the client's in its order, then any only the agent has.
  const names = [...new Set([...client.objects.map((o) => o.name), ...(agent?.objects ?? []).map((o) => o.name)])];
  for (const n of names) {
    out.push([n, shortId(client.objects.find((o) => o.name === n)), agent === undefined ? undefined : agent.objects === undefined ? '-' : shortId(agent.objects.find((o) => o.name === n))]);
  }
  return out;
}

export function formatVersion(r: VersionReport): string {
  // An AGENT column only when the agent answered (null: it could not be asked).
  const agent = r.agent ?? undefined;
  const table = rows(r.client, agent);
  const hasAgent = agent !== undefined;
  const w0 = Math.max(...table.map(([k]) => k.length)) + 3;
  const w1 = Math.max('CLIENT'.length, ...table.map(([, c]) => c.length)) + 3;
  let differs = false;
  const line = (k: string, c: string, a: string | undefined): string => {
    if (!hasAgent || a === undefined) return `${k.padEnd(w0)}${c}\n`;
    const mark = a !== '-' && c !== '-' && a !== c ? ' *' : '';
    if (mark) differs = true;
    return `${k.padEnd(w0)}${c.padEnd(w1)}${a}${mark}\n`;
  };
  let text = `${versionLine(r.client)}\n\n`;
  text += hasAgent ? `${''.padEnd(w0)}${'CLIENT'.padEnd(w1)}AGENT\n` : `${''.padEnd(w0)}CLIENT\n`;
  for (const [k, c, a] of table) text += line(k, c, hasAgent ? a : undefined);
  if (differs) text += `* the agent's differs from this lbctl's\n`;
  if (r.agentError !== undefined) text += `agent: ${r.agentError.replace(/^cannot reach the agent: /, 'not reachable: ')}\n`;
  return text;
}

/** The agent's versions from its API; an agent older than GET /v1/version gives its version from /v1/status. */
export async function agentVersions(apiSocket: string): Promise<{ agent: Versions | null; agentError?: string }> {
  try {
    return { agent: await apiGet<Versions>(apiSocket, '/v1/version', { timeoutMs: 3000 }) };
  } catch (err) {
    if (err instanceof AgentUnreachableError) return { agent: null, agentError: err.message };
    if (err instanceof LbError && err.code === 'EAPI' && /HTTP 404/.test(err.message)) {
      try {
        const s = await apiGet<AgentStatus>(apiSocket, '/v1/status', { timeoutMs: 3000 });
        return { agent: { lbctl: s.version } as Versions, agentError: `the agent (lbctl ${s.version}) serves no /v1/version: it predates it` };
      } catch (err2) {
        return { agent: null, agentError: err2 instanceof Error ? err2.message : String(err2) };
      }
    }
    return { agent: null, agentError: err instanceof Error ? err.message : String(err) };
  }
}

export async function versionCommand(opts: { output: string; client?: boolean; apiSocket: string }, write: (s: string) => void = (s) => void process.stdout.write(s)): Promise<void> {
  let libbpf: string;
  let addonError: string | undefined;
  try {
    libbpf = (await import('../../native/bpf.js')).libbpfVersion();
  } catch (err) {
    addonError = err instanceof Error ? err.message : String(err);
    libbpf = 'unavailable';
  }
  const client = collectVersions({ libbpf, objects: runtimeObjects() });
  const report: VersionReport = opts.client ? { client } : { client, ...(await agentVersions(opts.apiSocket)), apiSocket: opts.apiSocket };
  write(opts.output === 'json' ? JSON.stringify(report, null, 2) + '\n' : formatVersion(report));
  if (addonError !== undefined) throw new LbError(`the native addon does not load: ${addonError}`, 'ENOADDON');
}
