// The benchmark's kube-proxy emulation (bench/kube-proxy.ts): chain names and
// rule text as kube-proxy's own tests expect them (pkg/proxy/iptables and
// pkg/proxy/nftables proxier_test.go: TestOverallIPTablesRules,
// TestOverallNFTablesRules, whose services use pod CIDR 10.0.0.0/8), rule
// order, and what the incremental variants contain.
import t from 'tap';
import {
  base32,
  iptablesEndpointChain,
  iptablesRestoreAdd,
  iptablesRestoreFull,
  iptablesServiceChain,
  nftablesAdd,
  nftablesEndpointChain,
  nftablesFull,
  nftablesServiceChain,
  type BenchService,
} from '../../bench/kube-proxy.js';

const opts = { clusterCIDR: '10.0.0.0/8' };

function svc(ns: string, name: string, clusterIP: string, eps: string[], portName = 'p80'): BenchService {
  return { namespace: ns, name, portName, clusterIP, port: 80, endpoints: eps.map((ip) => ({ ip, port: 80 })) };
}

// The services of kube-proxy's TestOverall*Rules that are plain ClusterIP ones (svc1) or have two endpoints (svc4).
const svc1 = svc('ns1', 'svc1', '172.30.0.41', ['10.180.0.1']);
const svc4 = svc('ns4', 'svc4', '172.30.0.44', ['10.180.0.4', '10.180.0.5']);
const three = svc('ns7', 'svc7', '172.30.0.47', ['10.180.0.7', '10.180.0.8', '10.180.0.9']);

/** Splits restore text into tables: name -> lines (without the `*name` and `COMMIT` lines). */
function tables(text: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  let cur: string[] | undefined;
  for (const line of text.split('\n')) {
    if (line.startsWith('*')) out.set(line.slice(1), (cur = []));
    else if (line === 'COMMIT') cur = undefined;
    else if (line !== '') cur!.push(line);
  }
  return out;
}
const chainRules = (lines: string[], chain: string): string[] => lines.filter((l) => l.startsWith(`-A ${chain} `));
const declared = (lines: string[]): string[] => lines.filter((l) => l.startsWith(':')).map((l) => l.slice(1).split(' ')[0]!);

t.test('base32 is RFC 4648 with padding (Go base32.StdEncoding)', async (t) => {
  const enc = (s: string): string => base32(Buffer.from(s));
  t.same(['', 'f', 'fo', 'foo', 'foob', 'fooba', 'foobar'].map(enc), ['', 'MY======', 'MZXQ====', 'MZXW6===', 'MZXW6YQ=', 'MZXW6YTB', 'MZXW6YTBOI======']);
});

t.test('chain names are the hashes kube-proxy\'s tests expect', async (t) => {
  t.equal(iptablesServiceChain(svc1), 'KUBE-SVC-XPGD46QRK7WJZT7O');
  t.equal(iptablesEndpointChain(svc1, svc1.endpoints[0]!), 'KUBE-SEP-SXIVWICOYRO3J4NJ');
  t.equal(iptablesServiceChain(svc4), 'KUBE-SVC-4SW47YFZTEDKD3PK');
  t.same(svc4.endpoints.map((ep) => iptablesEndpointChain(svc4, ep)), ['KUBE-SEP-UKSFD7AGPMPPLUHC', 'KUBE-SEP-C6EBXVWJJZMIWKLZ']);
  t.equal(iptablesServiceChain(svc('ns2', 'svc2', '172.30.0.42', [])), 'KUBE-SVC-GNZBNJ2PO5MGZ6GT');
  t.equal(nftablesServiceChain(svc1), 'service-ULMVA6XW-ns1/svc1/tcp/p80');
  t.equal(nftablesEndpointChain(svc1, svc1.endpoints[0]!), 'endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80');
  t.equal(nftablesServiceChain(svc4), 'service-LAUZTJTB-ns4/svc4/tcp/p80');
  t.same(svc4.endpoints.map((ep) => nftablesEndpointChain(svc4, ep)), [
    'endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80',
    'endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80',
  ]);
});

t.test('iptables: the nat rules are kube-proxy\'s, line for line', async (t) => {
  const nat = tables(iptablesRestoreFull([svc1, svc4], opts)).get('nat')!;
  t.same(chainRules(nat, 'KUBE-SERVICES'), [
    '-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O',
    '-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK',
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS',
  ]);
  t.same(chainRules(nat, 'KUBE-SVC-4SW47YFZTEDKD3PK'), [
    '-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ',
    '-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.4:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC',
    '-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.5:80" -j KUBE-SEP-C6EBXVWJJZMIWKLZ',
  ]);
  t.same(chainRules(nat, 'KUBE-SEP-SXIVWICOYRO3J4NJ'), [
    '-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ',
    '-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80',
  ]);
  t.same(chainRules(nat, 'KUBE-MARK-MASQ'), ['-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000']);
  t.same(chainRules(nat, 'KUBE-POSTROUTING'), [
    '-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN',
    '-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000',
    '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully',
  ]);
  // the service portals and postrouting jumps from the built-in chains (EnsureRule)
  t.ok(nat.includes('-I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'));
  t.ok(nat.includes('-I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'));
  t.ok(nat.includes('-I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING'));
  // every chain is declared before any rule; every jump target is declared
  const firstRule = nat.findIndex((l) => !l.startsWith(':'));
  t.ok(nat.slice(firstRule).every((l) => !l.startsWith(':')), 'chain lines first');
  const chains = new Set(declared(nat));
  const builtin = new Set(['OUTPUT', 'PREROUTING', 'POSTROUTING', 'KUBE-MARK-MASQ', 'MARK', 'MASQUERADE', 'RETURN', 'DNAT']);
  for (const l of nat) {
    const j = / -j (\S+)/.exec(l)?.[1];
    if (j && !builtin.has(j)) t.ok(chains.has(j), `${j} is declared`);
  }
});

t.test('iptables: the filter table kube-proxy writes', async (t) => {
  const filter = tables(iptablesRestoreFull([svc1, svc('ns6', 'svc6', '172.30.0.46', [])], opts)).get('filter')!;
  t.same(declared(filter), ['KUBE-SERVICES', 'KUBE-EXTERNAL-SERVICES', 'KUBE-FORWARD', 'KUBE-NODEPORTS', 'KUBE-PROXY-FIREWALL', 'KUBE-FIREWALL']);
  t.same(
    filter.filter((l) => l.startsWith('-A')),
    [
      '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP',
      '-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT',
      '-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP',
      '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT',
      '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT',
    ],
  );
  // kube-proxy prepends these one by one, so the last one ends up first in its chain
  const jumps = filter.filter((l) => l.startsWith('-I'));
  t.equal(jumps.length, 11);
  t.ok(jumps.includes('-I OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'));
  t.equal(jumps.at(-1), '-I OUTPUT -j KUBE-FIREWALL');
});

t.test('iptables: rule order (services in the order given, nodeports last, probabilities 1/3, 1/2, none)', async (t) => {
  const nat = tables(iptablesRestoreFull([three, svc1, svc4], opts)).get('nat')!;
  const services = chainRules(nat, 'KUBE-SERVICES');
  t.match(services[0], /ns7\/svc7:p80 cluster IP.* -j KUBE-SVC-/);
  t.match(services[1], /ns1\/svc1:p80 cluster IP/);
  t.match(services[2], /ns4\/svc4:p80 cluster IP/);
  t.match(services.at(-1), /kubernetes service nodeports; NOTE: this must be the last rule in this chain/);
  const jumps = chainRules(nat, iptablesServiceChain(three)).slice(1);
  t.same(
    jumps.map((l) => / --probability (\S+)/.exec(l)?.[1] ?? 'none'),
    ['0.3333333333', '0.5000000000', 'none'],
  );
  t.same(
    jumps.map((l) => / -j (\S+)$/.exec(l)?.[1]),
    three.endpoints.map((ep) => iptablesEndpointChain(three, ep)),
  );
  // kube-proxy writes each service's rules together: its KUBE-SERVICES rule, then its chains
  const i7 = nat.indexOf(services[0]!);
  t.ok(nat[i7 + 1]!.startsWith(`-A ${iptablesServiceChain(three)} `));
  t.ok(nat.indexOf(services[1]!) > nat.lastIndexOf(nat.find((l) => l.includes('-j DNAT --to-destination 10.180.0.9:80'))!));
});

t.test('iptables: large cluster mode (more than 1,000 endpoints) drops the per-endpoint comments', async (t) => {
  const many: BenchService[] = [];
  for (let i = 0; i < 334; i++) many.push(svc('ns', `s${i}`, `172.30.${i >> 8}.${i & 255}`, ['10.1.0.1', '10.1.0.2', '10.1.0.3']));
  const nat = tables(iptablesRestoreFull(many, opts)).get('nat')!;
  const s = many[5]!;
  const svcRules = chainRules(nat, iptablesServiceChain(s));
  t.match(svcRules[0], /--comment "ns\/s5:p80 cluster IP"/, 'the masquerade rule keeps its comment');
  t.same(svcRules[1], `-A ${iptablesServiceChain(s)} -m statistic --mode random --probability 0.3333333333 -j ${iptablesEndpointChain(s, s.endpoints[0]!)}`);
  t.same(chainRules(nat, iptablesEndpointChain(s, s.endpoints[0]!)), [
    `-A ${iptablesEndpointChain(s, s.endpoints[0]!)} -s 10.1.0.1 -j KUBE-MARK-MASQ`,
    `-A ${iptablesEndpointChain(s, s.endpoints[0]!)} -m tcp -p tcp -j DNAT --to-destination 10.1.0.1:80`,
  ]);
  const small = tables(iptablesRestoreFull(many.slice(0, 333), opts)).get('nat')!; // 999 endpoints
  t.match(chainRules(small, iptablesServiceChain(s))[1], /--comment "ns\/s5:p80 -> 10.1.0.1:80"/);
});

t.test('iptables: the partial sync has only the new service\'s chains, and KUBE-SERVICES in full', async (t) => {
  const existing = [svc1, svc4];
  const full = tables(iptablesRestoreFull(existing, opts));
  const add = tables(iptablesRestoreAdd(existing, three, opts));
  const nat = add.get('nat')!;
  const top = ['KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-POSTROUTING', 'KUBE-MARK-MASQ'];
  t.same(declared(nat), [...top, iptablesServiceChain(three), ...three.endpoints.map((ep) => iptablesEndpointChain(three, ep))]);
  const services = chainRules(nat, 'KUBE-SERVICES');
  t.equal(services.length, 4, 'every service, then the nodeports rule');
  t.same(services.slice(0, 2), chainRules(full.get('nat')!, 'KUBE-SERVICES').slice(0, 2));
  t.match(services[2], /ns7\/svc7:p80 cluster IP/);
  t.match(services[3], /must be the last rule/);
  const chainsWritten = new Set(nat.filter((l) => l.startsWith('-A ')).map((l) => l.split(' ')[1]));
  t.same([...chainsWritten].sort(), [...top.filter((c) => c !== 'KUBE-NODEPORTS'), ...declared(nat).slice(4)].sort());
  t.notOk(nat.some((l) => l.includes(iptablesServiceChain(svc1)) && !l.startsWith('-A KUBE-SERVICES ')), 'no old service chain');
  t.notOk(nat.some((l) => l.startsWith('-I')) || add.get('filter')!.some((l) => l.startsWith('-I')), 'no jump rules on a partial sync');
  t.same(add.get('filter'), full.get('filter')!.filter((l) => !l.startsWith('-I')), 'the filter table is rewritten as on a full sync');
});

t.test('nftables: the full transaction', async (t) => {
  const text = nftablesFull([svc1, svc4], opts);
  const lines = text.trimEnd().split('\n');
  t.equal(lines[0], 'add table ip kube-proxy { comment "rules for kube-proxy" ; }');
  for (const l of [
    'add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }',
    'add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }',
    'add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }',
    'add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }',
    'add rule ip kube-proxy nat-output jump services',
    'add rule ip kube-proxy nat-prerouting jump services',
    'add rule ip kube-proxy nat-postrouting jump masquerading',
    'add rule ip kube-proxy filter-output ct state new jump service-endpoints-check',
    'add rule ip kube-proxy filter-output ct state new jump cluster-ips-check',
    'add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000',
    'add rule ip kube-proxy masquerading mark and 0x4000 == 0 return',
    'add rule ip kube-proxy masquerading mark set mark xor 0x4000',
    'add rule ip kube-proxy masquerading masquerade fully-random',
    'add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }',
    'add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"',
    'add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }',
    'add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }',
    'add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips',
    // svc1 and svc4 as in kube-proxy's TestOverallNFTablesRules
    'add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade',
    'add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }',
    'add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade',
    'add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80',
    'add element ip kube-proxy cluster-ips { 172.30.0.41 }',
    'add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }',
    'add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 , 1 : goto endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 }',
  ]) {
    t.ok(lines.includes(l), l);
  }
  // every chain is added (and flushed) before a rule goes into it
  const added = new Set<string>();
  for (const l of lines) {
    const m = /^add chain ip kube-proxy (\S+)/.exec(l);
    if (m) added.add(m[1]!);
    const r = /^add rule ip kube-proxy (\S+)/.exec(l);
    if (r) t.ok(added.has(r[1]!), `${r[1]} exists before its rules`);
  }
  // nodePortAddresses: all local addresses unless a node IP is given (kube-proxy's nftables default "primary")
  t.ok(lines.includes('delete set ip kube-proxy nodeport-ips'), 'all local addresses: no nodeport-ips set');
  t.ok(lines.includes('add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports'));
  t.notOk(text.includes('unallocated ClusterIPs'), 'no ServiceCIDR, no drop rule');
  const primary = nftablesFull([svc1], { ...opts, nodeIP: '192.168.0.2', serviceCIDR: '172.30.0.0/16' });
  t.ok(primary.includes('add element ip kube-proxy nodeport-ips { 192.168.0.2 }'));
  t.ok(primary.includes('add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports'));
  t.ok(primary.includes('add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"'));
});

t.test('nftables: the numgen vmap in endpoint order', async (t) => {
  const text = nftablesFull([three], opts);
  const chains = three.endpoints.map((ep) => nftablesEndpointChain(three, ep));
  t.ok(text.includes(`numgen random mod 3 vmap { 0 : goto ${chains[0]} , 1 : goto ${chains[1]} , 2 : goto ${chains[2]} }`));
});

t.test('nftables: the incremental transaction has only the new service\'s chains and elements', async (t) => {
  const lines = nftablesAdd(three, opts).trimEnd().split('\n');
  const svcChain = nftablesServiceChain(three);
  const eps = three.endpoints.map((ep) => nftablesEndpointChain(three, ep));
  const expected = [
    ...eps.flatMap((c) => [`add chain ip kube-proxy ${c}`, `flush chain ip kube-proxy ${c}`]),
    `add chain ip kube-proxy ${svcChain}`,
    `flush chain ip kube-proxy ${svcChain}`,
    'add element ip kube-proxy cluster-ips { 172.30.0.47 }',
    `add element ip kube-proxy service-ips { 172.30.0.47 . tcp . 80 : goto ${svcChain} }`,
    `add rule ip kube-proxy ${svcChain} ip daddr 172.30.0.47 ip saddr != 10.0.0.0/8 jump mark-for-masquerade`,
    `add rule ip kube-proxy ${svcChain} numgen random mod 3 vmap { 0 : goto ${eps[0]} , 1 : goto ${eps[1]} , 2 : goto ${eps[2]} }`,
    ...three.endpoints.flatMap((ep, i) => [
      `add rule ip kube-proxy ${eps[i]} ip saddr ${ep.ip} jump mark-for-masquerade`,
      `add rule ip kube-proxy ${eps[i]} meta l4proto tcp dnat to ${ep.ip}:80`,
    ]),
  ];
  t.same(lines, expected);
});
