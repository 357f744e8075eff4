import t from 'tap';
import { formatLbList, lbList } from '../../src/cli/commands/lb-list.js';
import type { MapsDump } from '../../src/datapath/lbmaps.js';

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
    { frontend: '10.96.0.9:80/TCP', revNatId: 2, type: 'ClusterIP', backends: [] },
    {
      frontend: '10.96.0.10:53/UDP',
      revNatId: 7,
      type: 'ClusterIP',
      backends: [
        { address: '10.244.1.5:53', id: 12, slot: 1, state: 'active' },
        { address: '10.244.1.6:53', id: 13, slot: 2, state: 'terminating' },
        { address: '<missing>', id: 14, slot: 3, state: 'orphaned' },
      ],
    },
    { frontend: '[fd00::a]:80/TCP', revNatId: 3, type: 'ClusterIP', backends: [{ address: '[fd00::244:2]:8080', id: 4, slot: 1, state: 'active' }] },
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
