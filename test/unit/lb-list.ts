import t from 'tap';
import { formatLbList, lbList } from '../../src/cli/commands/lb-list.js';
import type { MapsDump, MasterEntry } from '../../src/datapath/lbmaps.js';
import { LbSvcFlags } from '../../src/datapath/abi.gen.js';

const master = (count: number, revNatId: number, qcount = 0) => ({ count, qcount, revNatId, type: 'ClusterIP' as const, flags: 0, affinityTimeout: 0 });

const dump: MapsDump = {
  services: [
    { fe: { address: 'fd00::a', family: 6, port: 80, protocol: 'TCP' }, slot: 0, master: master(1, 3) },
    { fe: { address: 'fd00::a', family: 6, port: 80, protocol: 'TCP' }, slot: 1, backendId: 4 },
    { fe: { address: '10.96.0.10', family: 4, port: 53, protocol: 'UDP' }, slot: 2, backendId: 13 },
    { fe: { address: '10.96.0.10', family: 4, port: 53, protocol: 'UDP' }, slot: 0, master: master(1, 7, 1) },
    { fe: { address: '10.96.0.10', family: 4, port: 53, protocol: 'UDP' }, slot: 1, backendId: 12 },
    { fe: { address: '10.96.0.10', family: 4, port: 53, protocol: 'UDP' }, slot: 3, backendId: 14 },
    { fe: { address: '10.96.0.10', family: 4, port: 0, protocol: 'ANY' }, slot: 0, master: { ...master(0, 0), type: 'Wildcard' } },
    { fe: { address: '10.96.0.9', family: 4, port: 80, protocol: 'TCP' }, slot: 0, master: master(0, 2) },
  ],
  backends: [
    { id: 12, backend: { address: '10.244.1.5', family: 4, port: 53, protocol: 'UDP', state: 'active' } },
    { id: 13, backend: { address: '10.244.1.6', family: 4, port: 53, protocol: 'UDP', state: 'terminating' } },
    { id: 4, backend: { address: 'fd00::244:2', family: 6, port: 8080, protocol: 'TCP', state: 'active' } },
  ],
  revNat: [],
};

t.test('JSON shape: frontends sorted, wildcards hidden, slots in order, states shown', async (t) => {
  t.same(lbList(dump), [
    { frontend: '10.96.0.9:80/TCP', revNatId: 2, type: 'ClusterIP', scope: 'external', flags: [], backends: [] },
    {
      frontend: '10.96.0.10:53/UDP',
      revNatId: 7,
      type: 'ClusterIP',
      scope: 'external',
      flags: [],
      backends: [
        { address: '10.244.1.5:53', id: 12, slot: 1, state: 'active' },
        { address: '10.244.1.6:53', id: 13, slot: 2, state: 'terminating' },
        { address: '<missing>', id: 14, slot: 3, state: 'orphaned' },
      ],
    },
    { frontend: '[fd00::a]:80/TCP', revNatId: 3, type: 'ClusterIP', scope: 'external', flags: [], backends: [{ address: '[fd00::244:2]:8080', id: 4, slot: 1, state: 'active' }] },
  ]);
});

t.test('text output uses cilium bpf lb list columns', async (t) => {
  const out = formatLbList(lbList(dump));
  t.equal(
    out,
    [
      'SERVICE ADDRESS     BACKEND ADDRESS (REVNAT_ID) (SLOT)',
      '10.96.0.9:80/TCP    0.0.0.0:0 (2) (0) [ClusterIP]',
      '10.96.0.10:53/UDP   0.0.0.0:0 (7) (0) [ClusterIP]',
      '                    10.244.1.5:53 (7) (1)',
      '                    10.244.1.6:53 (7) (2) [terminating]',
      '                    <missing> (7) (3) [orphaned]',
      '[fd00::a]:80/TCP    [::]:0 (3) (0) [ClusterIP]',
      '                    [fd00::244:2]:8080 (3) (1)',
      '',
    ].join('\n'),
  );
});

// North-south entries: a NodePort surrogate and its internal twin
// (externalTrafficPolicy Local), a LoadBalancer IP with source ranges, an
// external IP, and an IPv6 surrogate.
const F = LbSvcFlags;
const m = (type: MasterEntry['type'], count: number, revNatId: number, flags = 0): MasterEntry => ({ count, qcount: 0, revNatId, type, flags, affinityTimeout: 0 });
const np = { address: '0.0.0.0', family: 4, port: 30080, protocol: 'TCP' } as const;
const npInt = { ...np, scope: 'internal' } as const;
const np6 = { address: '::', family: 6, port: 30080, protocol: 'TCP' } as const;
const northSouth: MapsDump = {
  services: [
    { fe: npInt, slot: 0, master: m('NodePort', 2, 11) },
    { fe: npInt, slot: 1, backendId: 1 },
    { fe: npInt, slot: 2, backendId: 2 },
    { fe: np, slot: 0, master: m('NodePort', 1, 10, F.LB_SVC_F_LOCAL_EXTERNAL | F.LB_SVC_F_TWO_SCOPES) },
    { fe: np, slot: 1, backendId: 1 },
    { fe: { address: '198.51.100.7', family: 4, port: 80, protocol: 'TCP' }, slot: 0, master: m('LoadBalancer', 0, 12, F.LB_SVC_F_SRC_RANGE | F.LB_SVC_F_AFFINITY) },
    { fe: { address: '192.0.2.10', family: 4, port: 80, protocol: 'TCP' }, slot: 0, master: m('ExternalIP', 0, 13, 0x40) },
    { fe: np6, slot: 0, master: m('NodePort', 0, 14) },
    // A ClusterIP entry at 0.0.0.0 is not a NodePort surrogate (nothing writes one; listed as it is).
    { fe: { address: '0.0.0.0', family: 4, port: 80, protocol: 'UDP' }, slot: 0, master: m('ClusterIP', 0, 15) },
  ],
  backends: [
    { id: 1, backend: { address: '10.244.1.5', family: 4, port: 8080, protocol: 'TCP', state: 'active' } },
    { id: 2, backend: { address: '10.244.2.5', family: 4, port: 8080, protocol: 'TCP', state: 'active' } },
  ],
  revNat: [],
};

t.test('north-south JSON: type, scope and flags by name; a NodePort surrogate also at every node address of its family', async (t) => {
  const list = lbList(northSouth, [
    { address: '10.0.0.5', family: 4 },
    { address: '192.168.1.5', family: 4 },
    { address: 'fd00::5', family: 6 },
  ]);
  t.same(
    list.map((e) => [e.frontend, e.type, e.scope, e.flags.join(','), e.revNatId, e.backends.map((b) => b.slot).join(',')]),
    [
      ['0.0.0.0:80/UDP', 'ClusterIP', 'external', '', 15, ''],
      ['0.0.0.0:30080/TCP', 'NodePort', 'external', 'Local,two-scopes', 10, '1'],
      ['0.0.0.0:30080/TCP/internal', 'NodePort', 'internal', '', 11, '1,2'],
      ['10.0.0.5:30080/TCP', 'NodePort', 'external', 'Local,two-scopes', 10, '1'],
      ['10.0.0.5:30080/TCP/internal', 'NodePort', 'internal', '', 11, '1,2'],
      ['192.0.2.10:80/TCP', 'ExternalIP', 'external', '0x40', 13, ''],
      ['192.168.1.5:30080/TCP', 'NodePort', 'external', 'Local,two-scopes', 10, '1'],
      ['192.168.1.5:30080/TCP/internal', 'NodePort', 'internal', '', 11, '1,2'],
      ['198.51.100.7:80/TCP', 'LoadBalancer', 'external', 'sessionAffinity,sourceRanges', 12, ''],
      ['[::]:30080/TCP', 'NodePort', 'external', '', 14, ''],
      ['[fd00::5]:30080/TCP', 'NodePort', 'external', '', 14, ''],
    ],
  );
  t.equal(lbList(northSouth).length, 6, 'without node addresses: the entries as the maps hold them');
});

t.test('north-south text: the flags inthe brackets as Cilium writes them', async (t) => {
  const out = formatLbList(lbList(northSouth, [{ address: '10.0.0.5', family: 4 }]));
  t.equal(
    out,
    [
      'SERVICE ADDRESS               BACKEND ADDRESS (REVNAT_ID) (SLOT)',
      '0.0.0.0:80/UDP                0.0.0.0:0 (15) (0) [ClusterIP]',
      '0.0.0.0:30080/TCP             0.0.0.0:0 (10) (0) [NodePort, Local, two-scopes]',
      '                              10.244.1.5:8080 (10) (1)',
      '0.0.0.0:30080/TCP/internal    0.0.0.0:0 (11) (0) [NodePort]',
      '                              10.244.1.5:8080 (11) (1)',
      '                              10.244.2.5:8080 (11) (2)',
      '10.0.0.5:30080/TCP            0.0.0.0:0 (10) (0) [NodePort, Local, two-scopes]',
      '                              10.244.1.5:8080 (10) (1)',
      '10.0.0.5:30080/TCP/internal   0.0.0.0:0 (11) (0) [NodePort]',
      '                              10.244.1.5:8080 (11) (1)',
      '                              10.244.2.5:8080 (11) (2)',
      '192.0.2.10:80/TCP             0.0.0.0:0 (13) (0) [ExternalIP, 0x40]',
      '198.51.100.7:80/TCP           0.0.0.0:0 (12) (0) [LoadBalancer, sessionAffinity, sourceRanges]',
      '[::]:30080/TCP                [::]:0 (14) (0) [NodePort]',
      '',
    ].join('\n'),
  );
});

t.test('SCTP frontends and backends are listed with their protocol', async (t) => {
  const sctp: MapsDump = {
    services: [
      { fe: { address: '10.96.0.20', family: 4, port: 3868, protocol: 'SCTP' }, slot: 0, master: master(1, 9) },
      { fe: { address: '10.96.0.20', family: 4, port: 3868, protocol: 'SCTP' }, slot: 1, backendId: 21 },
    ],
    backends: [{ id: 21, backend: { address: '10.244.1.7', family: 4, port: 3868, protocol: 'SCTP', state: 'active' } }],
    revNat: [],
  };
  t.same(lbList(sctp), [
    { frontend: '10.96.0.20:3868/SCTP', revNatId: 9, type: 'ClusterIP', scope: 'external', flags: [], backends: [{ address: '10.244.1.7:3868', id: 21, slot: 1, state: 'active' }] },
  ]);
  t.match(formatLbList(lbList(sctp)), /^10\.96\.0\.20:3868\/SCTP +0\.0\.0\.0:0 \(9\) \(0\) \[ClusterIP\]\n +10\.244\.1\.7:3868 \(9\) \(1\)$/m);
});
