// `lbctl health status`'s text: cilium-health status's shape, the brief
// form, and the exit status scripts read.
import t from 'tap';
import { formatHealth } from '../../src/cli/commands/health.js';
import type { MeshStatus } from '../../src/mesh/mesh.js';

const ok = (rttMs: number) => ({ status: 'ok', rttMs, lastSuccess: '2026-11-26T08:00:00.000Z' });
const status = (over: Partial<MeshStatus> = {}): MeshStatus => ({
  probeTime: '2026-11-26T08:00:01.000Z', periodMs: 10_000, timeoutMs: 1000, port: 4240, inFlight: 0, queued: 0,
  nodes: [
    { name: 'a', local: true, state: 'reachable', addresses: [{ address: '10.0.0.1', icmp: ok(0.041), http: ok(0.612), lastProbe: '2026-11-26T08:00:00.000Z' }] },
    { name: 'b', local: false, state: 'reachable', addresses: [{ address: '10.0.0.2', icmp: ok(1.5), http: ok(2.25) }] },
    { name: 'c', local: false, state: 'unreachable', addresses: [{ address: 'fd00::3', icmp: { status: 'timeout', detail: 'no answer within 1000 ms', lastSuccess: '2026-11-26T07:59:50.000Z' }, http: { status: 'refused', detail: 'connect ECONNREFUSED' } }] },
  ],
  reachable: 2, unreachable: 1, total: 3, ...over,
});

t.test('every node, this one first, then the unreachable; RTTs in µs or ms; exit 1 with a node unreachable', async (t) => {
  const { text, exitCode } = formatHealth(status(), {});
  t.equal(exitCode, 1);
  t.equal(text, `Probe time:   2026-11-26T08:00:01.000Z
Period:       10 s, timeout 1 s, 0 probes in flight, 0 queued
Nodes:
  a (localhost): reachable
    Host connectivity to 10.0.0.1:
      ICMP to stack:   OK, RTT=41µs
      HTTP to agent:   OK, RTT=612µs
  c: unreachable
    Host connectivity to fd00::3:
      ICMP to stack:   timeout, last OK 2026-11-26T07:59:50.000Z
      HTTP to agent:   refused
  b: reachable
    Host connectivity to 10.0.0.2:
      ICMP to stack:   OK, RTT=1.500ms
      HTTP to agent:   OK, RTT=2.250ms
Cluster health: 2/3 reachable (2026-11-26T08:00:01.000Z)
`);
  t.match(formatHealth(status(), { verbose: true }).text, /timeout \(no answer within 1000 ms\), last OK .*\n.*refused \(connect ECONNREFUSED\)\n/, '--verbose: the errors in full');
});

t.test('--brief: the summary and the unreachable nodes', async (t) => {
  const { text } = formatHealth(status(), { brief: true });
  t.match(text, /^Cluster health: 2\/3 reachable \(.*\)\n {2}c: unreachable\n/);
  t.notMatch(text, / b: /);
  const all = status({ nodes: status().nodes.slice(0, 2), reachable: 2, unreachable: 0, total: 2 });
  t.same(formatHealth(all, { brief: true }), { text: 'Cluster health: 2/2 reachable (2026-11-26T08:00:01.000Z)\n', exitCode: 0 }, 'exit 0 when all are reachable');
});

t.test('past 20 nodes, the reachable ones are summed up unless --verbose', async (t) => {
  const nodes = Array.from({ length: 30 }, (_, i) => ({ name: `n${String(i).padStart(2, '0')}`, local: i === 0, state: 'reachable' as const, addresses: [{ address: `10.0.0.${i}`, icmp: ok(1), http: ok(1) }] }));
  const s = status({ nodes, reachable: 30, unreachable: 0, total: 30 });
  const { text } = formatHealth(s, {});
  t.match(text, /n00 \(localhost\)/);
  t.notMatch(text, /n01/);
  t.match(text, /\(29 more reachable nodes: --verbose lists them\)/);
  t.match(formatHealth(s, { verbose: true }).text, /n29: reachable/);
});
