// A small cluster of network namespaces for the tc datapath's end-to-end
// tests (issue 14), built beside a Sandbox (which owns the run id, cgroup,
// bpf root, run dir and teardown):
//
//   ext  (external client)  ext0 10.250.0.2/24 fd00:250::2/64; routes to the
//                            external and LB IPs via node 1 only, no default route
//   n1   (node 1: the agent) n1e 10.250.0.1 fd00:250::1  (to ext)
//                            n1b 10.251.0.1 fd00:251::1  (to node 2)
//                            n1p 10.252.1.1 fd00:252:1::1 (to pod 1)
//   p1   (pod on node 1)     eth0 10.252.1.2 fd00:252:1::2, default via n1
//   n2   (node 2, no agent)  n2a 10.251.0.2 fd00:251::2 (to node 1)
//                            n2p 10.252.2.1 fd00:252:2::1 (to pod 2)
//                            no route back to ext: only SNAT brings replies home
//   p2   (pod on node 2)     eth0 10.252.2.2 fd00:252:2::2, default via n2
//
// Every namespace is named `${runId}-<role>`, so a crashed run's sweep
// removes them, and the sandbox's teardown removes them in any case.
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { AgentSlot } from './sandbox/agent.js';
import { run, SLOW, type ExecResult } from './sandbox/run.js';
import { removeNetns } from './sandbox/topology.js';
import type { Sandbox } from './sandbox.js';

export const EXT = { v4: '10.250.0.2', v6: 'fd00:250::2' };
export const NODE1 = { v4: '10.250.0.1', v6: 'fd00:250::1' };
export const NODE1_TO_N2 = { v4: '10.251.0.1', v6: 'fd00:251::1' };
export const POD1 = { v4: '10.252.1.2', v6: 'fd00:252:1::2' };
export const POD2 = { v4: '10.252.2.2', v6: 'fd00:252:2::2' };
/** External and LoadBalancer IPs: routed by the client to node 1, held by nobody. */
export const EXTERNAL_IP = { v4: '10.250.9.1', v6: 'fd00:250:9::1' };
export const LB_IP = { v4: '10.250.9.2', v6: 'fd00:250:9::2' };

export interface Lab {
  readonly ext: string;
  readonly n1: string;
  readonly p1: string;
  readonly n2: string;
  readonly p2: string;
  /** The agent of node 1, in its namespace (nsenter), on its own cgroup and bpf root. */
  readonly agent: AgentSlot;
  /** A command in the external client's namespace. */
  inExt(cmd: readonly string[], timeoutMs?: number): Promise<ExecResult>;
  /** A command in a namespace of the lab. */
  inNs(ns: string, cmd: readonly string[], timeoutMs?: number): Promise<ExecResult>;
}

function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

function sysctl(ns: string, key: string, value: string): void {
  execFileSync('ip', ['netns', 'exec', ns, 'sysctl', '-qw', `${key}=${value}`], { stdio: ['ignore', 'ignore', 'pipe'] });
}

/** A veth pair between two namespaces, up, with addresses. */
function wire(a: { ns: string; dev: string; v4: string; v6: string }, b: { ns: string; dev: string; v4: string; v6: string }, prefix4 = 24, prefix6 = 64): void {
  ip('link', 'add', a.dev, 'netns', a.ns, 'type', 'veth', 'peer', 'name', b.dev, 'netns', b.ns);
  for (const end of [a, b]) {
    ip('-n', end.ns, 'addr', 'add', `${end.v4}/${prefix4}`, 'dev', end.dev);
    ip('-n', end.ns, 'addr', 'add', `${end.v6}/${prefix6}`, 'dev', end.dev, 'nodad');
    ip('-n', end.ns, 'link', 'set', end.dev, 'up');
  }
}

/** Builds the lab; everything is removed at the sandbox's teardown. Servers: backend.py on both pods (HTTP 8080, UDP 9000 with the peer named). */
export async function makeLab(sb: Sandbox): Promise<Lab> {
  const ns = (role: string): string => `${sb.runId}-${role}`;
  const lab = { ext: ns('ext'), n1: ns('n1'), p1: ns('p1'), n2: ns('n2'), p2: ns('p2') };
  const all = Object.values(lab);
  sb.addCleanup(() => all.forEach(removeNetns));
  for (const n of all) {
    ip('netns', 'add', n);
    ip('-n', n, 'link', 'set', 'lo', 'up');
  }
  wire({ ns: lab.ext, dev: 'ext0', ...EXT }, { ns: lab.n1, dev: 'n1e', ...NODE1 });
  wire({ ns: lab.n1, dev: 'n1b', ...NODE1_TO_N2 }, { ns: lab.n2, dev: 'n2a', v4: '10.251.0.2', v6: 'fd00:251::2' });
  wire({ ns: lab.n1, dev: 'n1p', v4: '10.252.1.1', v6: 'fd00:252:1::1' }, { ns: lab.p1, dev: 'eth0', ...POD1 });
  wire({ ns: lab.n2, dev: 'n2p', v4: '10.252.2.1', v6: 'fd00:252:2::1' }, { ns: lab.p2, dev: 'eth0', ...POD2 });
  for (const n of [lab.n1, lab.n2]) {
    sysctl(n, 'net.ipv4.ip_forward', '1');
    sysctl(n, 'net.ipv6.conf.all.forwarding', '1');
    // Replies of SNATed flows come back to the node's own address from a
    // pod subnet it routes elsewhere: no reverse-path filtering.
    sysctl(n, 'net.ipv4.conf.all.rp_filter', '0');
    sysctl(n, 'net.ipv4.conf.default.rp_filter', '0');
  }
  ip('-n', lab.p1, 'route', 'add', 'default', 'via', '10.252.1.1');
  ip('-n', lab.p1, '-6', 'route', 'add', 'default', 'via', 'fd00:252:1::1');
  ip('-n', lab.p2, 'route', 'add', 'default', 'via', '10.252.2.1');
  ip('-n', lab.p2, '-6', 'route', 'add', 'default', 'via', 'fd00:252:2::1');
  ip('-n', lab.n1, 'route', 'add', '10.252.2.0/24', 'via', '10.251.0.2');
  ip('-n', lab.n1, '-6', 'route', 'add', 'fd00:252:2::/64', 'via', 'fd00:251::2');
  // the client reaches node 1's external and LB IPs through node 1, nothing else
  for (const a of [EXTERNAL_IP, LB_IP]) {
    ip('-n', lab.ext, 'route', 'add', `${a.v4}/32`, 'via', NODE1.v4);
    ip('-n', lab.ext, '-6', 'route', 'add', `${a.v6}/128`, 'via', NODE1.v6);
  }
  const servers = (p: { v4: string; v6: string }) => [{ v4: p.v4, v6: p.v6 }];
  await sb.startBackendsIn(lab.p1, servers(POD1), ['--udp-peer']);
  await sb.startBackendsIn(lab.p2, servers(POD2), ['--udp-peer']);

  const agent = new AgentSlot({
    runDir: sb.runDir,
    cgroup: sb.cgroup,
    bpfRoot: sb.bpfRoot,
    apiSocket: path.join(sb.runDir, 'n1.sock'),
    sourceArgs: ['--source', `file:${sb.manifestDir}`],
    netns: lab.n1,
  });
  sb.addCleanup(() => agent.killNow());
  const inNs = (n: string, cmd: readonly string[], timeoutMs = 20_000): Promise<ExecResult> => run('ip', ['netns', 'exec', n, ...cmd], timeoutMs * SLOW);
  return { ...lab, agent, inNs, inExt: (cmd, timeoutMs) => inNs(lab.ext, cmd, timeoutMs) };
}

/** curl from the external client: the body (the backend's own address) and the X-Client header (the address it saw). */
export async function extGet(lab: Lab, host: string, port: number, timeoutS = 3): Promise<{ ok: boolean; server: string; client: string; error: string }> {
  const url = host.includes(':') ? `http://[${host}]:${port}/` : `http://${host}:${port}/`;
  const r = await lab.inExt(['curl', '-sS', '-D', '-', '--max-time', String(timeoutS * SLOW), url], (timeoutS + 5) * 1000);
  if (r.code !== 0) return { ok: false, server: '', client: '', error: r.stderr.trim() };
  const client = /^x-client:\s*(\S+)/im.exec(r.stdout)?.[1] ?? '';
  const server = r.stdout.split(/\r?\n\r?\n/)[1]?.trim() ?? '';
  return { ok: true, server, client, error: '' };
}
