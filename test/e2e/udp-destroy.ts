// Stale connected UDP sockets: a client keeps one connected UDP socket to a
// service (as a DNS resolver does), so connect4 pinned it to one backend.
// When that backend is removed from the EndpointSlice, the agent destroys
// the socket: the client's next recv() fails with ECONNABORTED (a send()
// with EDESTADDRREQ, ECONNABORTED pending in SO_ERROR: the socket is
// disconnected), and the fresh socket it opens reaches a remaining backend. Run once with the
// mechanism this kernel gets (bpf_sock_destroy on 6.5+), once with the
// inet_diag fallback forced (LBCTL_UDP_DESTROY=inet-diag).
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import t, { type Test } from 'tap';
import { CLIENT_PY, createSandbox, SLOW, UDP_PORT, type LogLine, type Sandbox } from '../helpers/sandbox.js';
import { serviceWithBackends } from '../helpers/manifests.js';

const VIP = '10.96.0.53';
const PORT = 5353;

interface Event {
  socket: number;
  server?: string;
  error?: string;
  /** SO_ERROR read after the failure: what was pending on the socket. */
  soError?: string;
  phase?: string;
  at: number;
}
interface LongResult {
  sockets: Array<{ n: number; peer: string; cookie: string }>;
  events: Event[];
}
interface Progress {
  sockets: LongResult['sockets'];
  events: number;
  last: Event | null;
}

function manifest(addresses: readonly string[]): string {
  return serviceWithBackends({ name: 'dns', clusterIPs: [VIP], ports: [{ name: 'dns', port: PORT, protocol: 'UDP' }] }, [
    { name: 'dns-v4', family: 4, ports: [{ name: 'dns', port: UDP_PORT, protocol: 'UDP' }], addresses },
  ]);
}

/** client.py udp-long in the client's place, until stopped. */
function longClient(sb: Sandbox, tag: string): { progress(): Progress | undefined; stop(): Promise<LongResult> } {
  const stopFile = path.join(sb.runDir, `udp-long-${tag}.stop`);
  const progressFile = path.join(sb.runDir, `udp-long-${tag}.progress`);
  const done = sb.exec([sb.python, CLIENT_PY, 'udp-long', VIP, String(PORT), '--interval', '0.05', '--seconds', String(60 * SLOW), '--stop-file', stopFile, '--progress', progressFile], {
    timeoutMs: 90_000,
  });
  return {
    progress: () => {
      try {
        return JSON.parse(readFileSync(progressFile, 'utf8')) as Progress;
      } catch {
        return undefined;
      }
    },
    stop: async () => {
      if (existsSync(sb.runDir)) writeFileSync(stopFile, '');
      const r = await done;
      if (r.code !== 0) throw new Error(`client.py udp-long failed (${r.code ?? r.signal}): ${r.stderr}`);
      return JSON.parse(r.stdout) as LongResult;
    },
  };
}

async function staleSocketIsDestroyed(t: Test, force?: 'inet-diag'): Promise<void> {
  const sb = await createSandbox(t, { backends: 3, agent: false });
  const all = sb.backends.map((b) => b.v4);
  sb.writeManifest('dns.yaml', manifest(all));
  if (force) process.env['LBCTL_UDP_DESTROY'] = force;
  const started = sb.startAgent();
  delete process.env['LBCTL_UDP_DESTROY']; // the agent process already has it
  await started;
  const chosen = sb.agent!.logs.find((l) => typeof l.msg === 'string' && l.msg.startsWith('stale connected UDP sockets of removed backends:'));
  t.ok(chosen, 'the agent says how it destroys stale UDP sockets');
  const mechanism = chosen?.['mechanism'] as string;
  t.comment(`mechanism: ${mechanism} (${String(chosen?.['reason'])})`);
  if (force) t.equal(mechanism, force, `forced to ${force}`);
  else t.ok(['bpf-sock-destroy', 'inet-diag'].includes(mechanism), `this kernel has a mechanism (${mechanism})`);

  const client = longClient(sb, force ?? 'auto');
  let result: LongResult | undefined;
  t.teardown(async () => {
    if (!result) await client.stop().catch(() => undefined);
  });
  await sb.waitUntil(() => (client.progress()?.events ?? 0) >= 5 && client.progress()?.last?.server !== undefined, 'the client is answered');
  const pinned = client.progress()!.last!.server!;
  const pinnedIp = pinned.split(':')[0]!;
  t.ok(all.map((a) => `${a}:${UDP_PORT}`).includes(pinned), `the client's socket is pinned to backend ${pinned}`);

  const mark = sb.agent!.logs.length;
  sb.writeManifest('dns.yaml', manifest(all.filter((a) => a !== pinnedIp)));
  await sb.waitForSync();
  const line = (await sb.agent!.waitForLog((l) => l.msg === 'connected UDP sockets of removed backends destroyed', mark)) as LogLine & {
    destroyed: number;
    mechanism: string;
    netns: number;
    cookies: string[];
    errors: string[];
  };
  t.comment(`agent: ${JSON.stringify({ destroyed: line.destroyed, mechanism: line.mechanism, netns: line.netns, ms: line['ms'] })}`);
  t.equal(line.mechanism, mechanism, `destroyed with ${mechanism}`);
  t.same(line.errors, [], 'without errors');
  t.equal(line.netns, 1, 'in the one network namespace of the cgroup (the client netns)');
  t.equal(line.destroyed, 1, "exactly one socket destroyed: the client's");
  t.same(line.cookies, [client.progress()!.sockets[0]!.cookie], "it is the client's first socket (same SO_COOKIE)");

  await sb.waitUntil(() => (client.progress()?.sockets.length ?? 0) >= 2 && client.progress()?.last?.socket === 2 && client.progress()?.last?.server !== undefined, 'a fresh socket is answered');
  result = await client.stop();

  const first = result.events.filter((e) => e.socket === 1);
  const errors = first.filter((e) => e.error);
  // The destroyed socket is aborted and disconnected: a recv() fails with
  // ECONNABORTED, a send() with EDESTADDRREQ and ECONNABORTED left in SO_ERROR.
  t.equal(errors.length, 1, `the first socket failed once: ${JSON.stringify(errors)}`);
  const aborted = errors[0]?.error === 'ECONNABORTED' || (errors[0]?.error === 'EDESTADDRREQ' && errors[0]?.soError === 'ECONNABORTED');
  t.ok(aborted, `it was aborted (${errors[0]?.phase}: ${errors[0]?.error}${errors[0]?.soError ? `, SO_ERROR ${errors[0].soError}` : ''})`);
  t.ok(first.filter((e) => e.server).every((e) => e.server === pinned), `until then it was answered by ${pinned} only`);
  const second = result.events.filter((e) => e.socket === 2);
  t.ok(second.length > 0 && second.every((e) => e.server && e.server !== pinned), `the fresh socket is answered by a remaining backend (${second[0]?.server})`);
  t.equal(result.sockets[1]!.peer, `${VIP}:${PORT}`, 'and still sees the service address as its peer');
  const gap = second[0]!.at - errors[0]!.at;
  t.comment(`from ECONNABORTED to the first reply on the fresh socket: ${gap} ms`);
}

t.test('a connected UDP socket to a removed backend is destroyed (auto mechanism)', (t) => staleSocketIsDestroyed(t));

t.test('the same through the inet_diag fallback (LBCTL_UDP_DESTROY=inet-diag)', (t) => staleSocketIsDestroyed(t, 'inet-diag'));
