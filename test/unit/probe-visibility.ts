// What an operator sees of readiness probes (issue 17, part 2): the PROBES
// column of `lbctl service list`, quarantined slots in `lbctl bpf lb list`.
import t from 'tap';
import { formatLbList, lbList } from '../../src/cli/commands/lb-list.js';
import { formatServiceList, probeColumn } from '../../src/cli/commands/service-list.js';
import type { FrontendStatus } from '../../src/http/view.js';
import type { MapsDump } from '../../src/datapath/lbmaps.js';

const probed: FrontendStatus = {
  frontend: '10.96.0.20:80/TCP',
  service: 'default/web:http',
  desired: { backends: ['10.0.0.2:8080'], terminating: ['10.0.0.3:8080', '10.0.0.4:8080'], quarantined: ['10.0.0.3:8080'], revNatId: 1 },
  realized: { backends: ['10.0.0.2:8080'], terminating: ['10.0.0.3:8080', '10.0.0.4:8080'], revNatId: 1 },
  drift: false,
  details: [],
  probes: [
    { address: '10.0.0.2', state: 'healthy', consecutive: 7, last: { ok: true, reason: 'HTTP probe succeeded', at: '2026-11-26T08:00:00.000Z', latencyMs: 2 } },
    { address: '10.0.0.3', state: 'quarantined', consecutive: 3, last: { ok: false, reason: 'timeout: no answer within 1s', at: '2026-11-26T08:00:00.000Z', latencyMs: 1000 } },
    { address: '10.0.0.4', state: 'unknown', consecutive: 0 },
  ],
};
const plain: FrontendStatus = { frontend: '10.96.0.21:53/UDP', service: 'default/dns:dns', desired: { backends: ['10.0.0.9:53'], terminating: [], revNatId: 2 }, realized: { backends: ['10.0.0.9:53'], terminating: [], revNatId: 2 }, drift: false, details: [] };

t.test('service list: each backend with its state, results in a row and the last result; quarantined slots named so', async (t) => {
  t.equal(probeColumn(probed), '10.0.0.2 healthy 7x: ok (HTTP probe succeeded); 10.0.0.3 quarantined 3x: failed (timeout: no answer within 1s); 10.0.0.4 unknown');
  t.equal(probeColumn(plain), '-', 'a service without a probe');
  t.equal(probeColumn({ ...probed, probeAllFailed: 'closed', probes: [] }), 'ALL FAILED (fail closed)');
  const text = formatServiceList([probed, plain]);
  const [head, row] = text.split('\n');
  t.match(head, /^FRONTEND\s+SERVICE\s+BACKENDS \(desired\)\s+REALIZED\s+PROBES\s+STATUS$/);
  t.match(row, /10\.0\.0\.3:8080 \[quarantined\], 10\.0\.0\.4:8080 \[terminating\]/);
  t.notMatch(formatServiceList([plain]), /PROBES/, 'no column where nothing is probed');
});

t.test('bpf lb list: a quarantined backend in the non-selectable slots says so; in selectable ones (another frontend shares it) it is active', async (t) => {
  const fe = (address: string) => ({ address, family: 4 as const, port: 80, protocol: 'TCP' as const });
  const m = (count: number, qcount: number, revNatId: number) => ({ count, qcount, revNatId, type: 'ClusterIP' as const, flags: 0, affinityTimeout: 0 });
  const dump: MapsDump = {
    services: [
      { fe: fe('10.96.0.20'), slot: 0, master: m(1, 2, 1) },
      { fe: fe('10.96.0.20'), slot: 1, backendId: 1 },
      { fe: fe('10.96.0.20'), slot: 2, backendId: 2 },
      { fe: fe('10.96.0.20'), slot: 3, backendId: 3 },
      { fe: fe('10.96.0.21'), slot: 0, master: m(1, 0, 2) },
      { fe: fe('10.96.0.21'), slot: 1, backendId: 2 },
    ],
    backends: [
      { id: 1, backend: { ...fe('10.0.0.2'), port: 8080, state: 'active' } },
      { id: 2, backend: { ...fe('10.0.0.3'), port: 8080, state: 'quarantined' } },
      { id: 3, backend: { ...fe('10.0.0.4'), port: 8080, state: 'terminating' } },
    ],
    revNat: [],
  };
  const list = lbList(dump);
  t.same(list[0]!.backends.map((b) => b.state), ['active', 'quarantined', 'terminating']);
  t.same(list[1]!.backends.map((b) => b.state), ['active']);
  t.match(formatLbList(list), /10\.0\.0\.3:8080 \(1\) \(2\) \[quarantined\]/);
});
