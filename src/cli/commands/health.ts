// `lbctl health status`: the health mesh as this node's agent sees it,
// shaped like `cilium-health status`. Exits 1 when a node is unreachable
// (or the agent cannot be asked), so scripts can test it.
import { apiGet } from '../../http/api.js';
import { LbError } from '../../base/errors.js';
import type { MeshAddressStatus, MeshNodeStatus, MeshStatus } from '../../mesh/mesh.js';

function rtt(ms: number | undefined): string {
  if (ms === undefined) return '';
  return ms < 1 ? `RTT=${Math.round(ms * 1000)}µs` : `RTT=${ms.toFixed(3)}ms`;
}

function pathLine(p: MeshAddressStatus['icmp'], verbose: boolean): string {
  if (p.status === 'ok') return `OK, ${rtt(p.rttMs)}`;
  if (p.status === 'pending') return 'not probed yet';
  const reason = p.detail && verbose ? `${p.status} (${p.detail})` : p.status;
  return p.lastSuccess ? `${reason}, last OK ${p.lastSuccess}` : reason;
}

function nodeLines(n: MeshNodeStatus, verbose: boolean): string {
  let out = `  ${n.name}${n.local ? ' (localhost)' : ''}: ${n.state}\n`;
  for (const a of n.addresses) {
    out += `    Host connectivity to ${a.address}:\n`;
    out += `      ICMP to stack:   ${pathLine(a.icmp, verbose)}\n`;
    out += `      HTTP to agent:   ${pathLine(a.http, verbose)}\n`;
    if (verbose && a.lastProbe) out += `      Last probe:      ${a.lastProbe}\n`;
  }
  return out;
}

export function formatHealth(s: MeshStatus, opts: { verbose?: boolean; brief?: boolean }): { text: string; exitCode: number } {
  const summary = `Cluster health: ${s.reachable}/${s.total} reachable (${s.probeTime})\n`;
  const exitCode = s.unreachable > 0 ? 1 : 0;
  const unreachable = s.nodes.filter((n) => n.state === 'unreachable');
  if (opts.brief) return { text: summary + unreachable.map((n) => nodeLines(n, false)).join(''), exitCode };
  let text = `Probe time:   ${s.probeTime}\n`;
  text += `Period:       ${s.periodMs / 1000} s, timeout ${s.timeoutMs / 1000} s, ${s.inFlight} probes in flight, ${s.queued} queued\n`;
  text += 'Nodes:\n';
  // Unreachable nodes first: what an operator looks for.
  const order = (n: MeshNodeStatus): number => (n.local ? 0 : n.state === 'unreachable' ? 1 : n.state === 'pending' ? 2 : 3);
  for (const n of [...s.nodes].sort((a, b) => order(a) - order(b) || a.name.localeCompare(b.name))) {
    if (!opts.verbose && !n.local && n.state === 'reachable' && s.total > 20) continue;
    text += nodeLines(n, opts.verbose ?? false);
  }
  if (!opts.verbose && s.total > 20) text += `  (${s.reachable - (s.nodes.find((n) => n.local)?.state === 'reachable' ? 1 : 0)} more reachable nodes: --verbose lists them)\n`;
  return { text: text + summary, exitCode };
}

export async function healthStatusCommand(opts: { output: string; verbose?: boolean; brief?: boolean; apiSocket: string }): Promise<void> {
  const s = await apiGet<MeshStatus>(opts.apiSocket, '/v1/health');
  const { text, exitCode } = opts.output === 'json' ? { text: JSON.stringify(s, null, 2) + '\n', exitCode: s.unreachable > 0 ? 1 : 0 } : formatHealth(s, opts);
  process.stdout.write(text);
  if (exitCode !== 0) throw new LbError(`${s.unreachable} of ${s.total} nodes unreachable`, 'EUNREACHABLE');
}
