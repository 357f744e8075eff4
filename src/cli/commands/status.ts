// `lbctl status [--brief]`: the agent's health, read from its API socket.
// --brief prints OK or the failing checks, one per line, like
// `cilium status --brief`. Both forms fail (exit 1) when anything fails or
// the agent cannot be reached.
import { apiGet, type AgentStatus, type GroupStatus } from '../../http/api.js';
import { formatDuration } from '../../http/health.js';
import { sctpLine } from '../../datapath/sctp.js';
import { LbError } from '../../base/errors.js';

/** Every failing check once (livez and readyz share some), then /healthz's verdict. */
export function failingChecks(s: AgentStatus): string[] {
  const out = new Map<string, string>();
  for (const c of [...s.livez.checks, ...s.readyz.checks]) {
    if (!c.ok && !out.has(c.name)) out.set(c.name, `${c.name}: ${c.message ?? 'failed'}`);
  }
  if (!s.healthz.healthy) out.set('healthz', `healthz: ${s.healthz.reason ?? 'unhealthy'}`);
  return [...out.values()];
}

export function formatBrief(s: AgentStatus): { text: string; exitCode: number } {
  const failing = failingChecks(s);
  return failing.length === 0 ? { text: 'OK\n', exitCode: 0 } : { text: failing.map((l) => `${l}\n`).join(''), exitCode: 1 };
}

function ago(s: AgentStatus, at: string | undefined): string {
  if (at === undefined) return 'never';
  return `${formatDuration(Date.parse(s.time) - Date.parse(at))} ago`;
}

function groupLines(g: GroupStatus): string {
  return g.checks.map((c) => (c.ok ? `  [+]${c.name} ok${c.message ? ` (${c.message})` : ''}\n` : `  [-]${c.name} failed: ${c.message ?? 'no reason given'}\n`)).join('');
}

export function formatStatus(s: AgentStatus): { text: string; exitCode: number } {
  const row = (k: string, v: string): string => `${`${k}:`.padEnd(13)}${v}\n`;
  const plural = (n: number, what: string): string => `${n} ${what}${n === 1 ? '' : 's'}`;
  let text = row('Agent', `lbctl ${s.version}, up ${formatDuration(s.uptimeSeconds * 1000)} (since ${s.startedAt})`);
  if (s.source) text += row('Source', s.source.name) + s.source.notes.map((n) => `  note: ${n}\n`).join('');
  if (s.kernel) {
    const k = s.kernel;
    const required = k.features.filter((f) => f.required);
    const missing = required.filter((f) => !f.available).map((f) => f.name);
    const optional = k.features.filter((f) => !f.required).map((f) => `${f.name} ${f.available ? 'yes' : 'no'}`);
    text += row('Kernel', `${k.release}: ${missing.length === 0 ? `${required.length}/${required.length} required features` : `MISSING ${missing.join(', ')}`}; ${optional.join(', ')}`);
    text += row('Datapath', `${k.object === 'compat' ? 'sock_compat.bpf.o (refused connects: EPERM)' : k.object === 'standard' ? 'sock.bpf.o (refused connects: ECONNREFUSED)' : k.object}; stale UDP sockets: ${k.udpTermination}`);
    const np = k.nodePort;
    if (np) {
      const devices =
        (np.devices ?? [])
          .map((d) => `${d.name}${d.role === 'tunnel' ? (d.l3 ? ' [tunnel, layer 3]' : ' [tunnel]') : ''}${d.xdp ? ' [XDP]' : ''} (${d.addresses.join(' ') || 'no address'}${d.snat && d.snat.length > 0 ? `; SNAT ${d.snat.join(' ')}` : ''})`)
          .join(', ') || 'none';
      const line =
        np.state === 'off' ? 'off (--no-nodeport)'
        : np.state === 'failed' ? `FAILED: ${np.error ?? 'unknown error'}`
        : `nodeport.bpf.o at tc (${np.mode}${np.modeReason ? `; ${np.modeReason}` : ''}) on ${devices}; NodePorts on ${(np.nodeAddresses ?? []).join(', ') || 'no address'}` +
          (np.acceleration ? `; XDP acceleration ${np.acceleration} on ${(np.devices ?? []).filter((d) => d.xdp).map((d) => d.name).join(', ') || 'no device'}` : '') +
          (np.forwarding && np.forwarding !== 'snat' ? `; remote backends by ${np.forwarding === 'dsr' ? 'DSR' : 'DSR (TCP) and SNAT (UDP)'} (--nodeport-mode ${np.forwarding})` : '') +
          (np.maglev ? `; Maglev: ${np.maglev.tables} table${np.maglev.tables === 1 ? '' : 's'} of ${np.maglev.m} slots, ${(np.maglev.bytes / 1024).toFixed(0)} KiB` : '');
      text += row('NodePort', line) + [...(np.waiting ?? []), ...(np.problems ?? [])].map((w) => `  note: ${w}\n`).join('');
      if (np.traffic && np.traffic.length > 0) {
        text += row('Flows', np.traffic.map((m) => `${m.map} ${m.entries}/${m.maxEntries}${m.maxEntries > 0 ? ` (${Math.floor((100 * m.entries) / m.maxEntries)}%)` : ''}`).join(', '));
      }
    }
    if (k.sctp) text += row('SCTP', sctpLine(k.sctp));
  }
  text += row('Liveness', s.livez.ok ? 'ok' : 'FAILED') + groupLines(s.livez);
  text += row('Readiness', s.readyz.ok ? 'ok' : 'FAILED') + groupLines(s.readyz);
  const eligible = s.healthz.nodeEligible ? 'node eligible' : 'node not eligible';
  text += row('Healthz', s.healthz.healthy ? `ok (${eligible})` : `FAILED: ${s.healthz.reason ?? 'unhealthy'} (${eligible})`);
  const sy = s.sync;
  text += row('Syncs', `${sy.count}, last success ${ago(s, sy.lastSuccess)}, last attempt ${ago(s, sy.lastAttempt)}${sy.inProgress ? ', one in progress' : ''}`);
  text += row('Pending', sy.oldestPending === undefined ? 'none' : `a change has waited ${formatDuration(Date.parse(s.time) - Date.parse(sy.oldestPending))}`);
  if (sy.lastError !== undefined) text += row('Last error', sy.lastError);
  text += row('Programmed', `${plural(s.counts.services, 'service')}, ${plural(s.counts.frontends, 'frontend')}, ${plural(s.counts.backends, 'backend')}`);
  if (s.maps && s.maps.length > 0) {
    const fill = (m: NonNullable<AgentStatus['maps']>[number]): string =>
      `${m.map} ${m.entries}/${m.maxEntries}${m.maxEntries > 0 ? ` (${Math.floor((100 * m.entries) / m.maxEntries)}%${m.entries >= m.maxEntries ? ', FULL' : ''})` : ''}`;
    text += row('Maps', s.maps.map(fill).join(', '));
  }
  return { text, exitCode: failingChecks(s).length === 0 ? 0 : 1 };
}

export interface StatusOptions {
  readonly brief?: boolean;
  readonly apiSocket: string;
}

/** Prints the status; rejects (so lbctl exits 1) when a check fails or the agent is unreachable. */
export async function statusCommand(opts: StatusOptions, write: (s: string) => void = (s) => void process.stdout.write(s)): Promise<void> {
  const status = await apiGet<AgentStatus>(opts.apiSocket, '/v1/status');
  const { text, exitCode } = opts.brief ? formatBrief(status) : formatStatus(status);
  write(text);
  if (exitCode !== 0) {
    const n = failingChecks(status).length;
    throw new LbError(`the agent is unhealthy: ${n} check${n === 1 ? '' : 's'} failing`, 'EUNHEALTHY');
  }
}
