// `lbctl cleanup --kube-proxy` against the real tools, in a network namespace
// of its own: kube-proxy's iptables mode (legacy and nft backends, IPv4 and
// IPv6) and nftables mode (ip and ip6 tables) loaded beside the host's own
// rules, kubelet's chains and another nft table. After the cleanup the
// namespace's rules must be byte for byte (counters included) those of a
// control namespace that was given the same host rules and never saw
// kube-proxy; a second run removes nothing and exits 0.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import t from 'tap';
import { nftablesFull, iptablesRestoreFull, type BenchService } from '../../bench/kube-proxy.js';
import { CLI_TIMEOUT_MS, how, LBCTL, run, sweepLeftovers } from '../helpers/sandbox.js';
import { removeNetns } from '../helpers/sandbox/topology.js';

// Named like the sandbox's, so a later run's sweepLeftovers() removes them if this process dies first.
const NS = `lbctl-test-${process.pid}-kpc`;
const CONTROL = `lbctl-test-${process.pid}-kpc-control`;

const SERVICES: BenchService[] = [
  { namespace: 'default', name: 'web', portName: 'http', clusterIP: '10.96.0.10', port: 80, nodePort: 30080, endpoints: [{ ip: '10.244.1.2', port: 8080 }, { ip: '10.244.2.3', port: 8080 }] },
  { namespace: 'kube-system', name: 'dns', portName: 'dns-tcp', clusterIP: '10.96.0.53', port: 53, endpoints: [] },
  { namespace: 'default', name: 'api', portName: '', clusterIP: '10.96.0.1', port: 443, endpoints: [{ ip: '10.0.0.5', port: 6443 }] },
];
const KP_OPTS = { clusterCIDR: '10.244.0.0/16' };

/**
 * The host's rules before kube-proxy starts (loaded with --counters, so the
 * comparison covers rule counters too; POLICIES sets the chains'): its own chains, kubelet's KUBE-FIREWALL,
 * KUBE-MARK-DROP and canaries (kubelet's, which kube-proxy's cleanup leaves),
 * a chain named like kube-proxy's but not one of them.
 */
const hostBefore = (v6: boolean): string => {
  const net = v6 ? 'fd00:1::/64' : '10.1.0.0/16';
  const lo = v6 ? '::1/128' : '127.0.0.0/8';
  const firewall = v6
    ? '' // kubelet's localnet rule is IPv4 only
    : `[0:0] -A KUBE-FIREWALL ! -s ${lo} -d ${lo} -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n`;
  return `*mangle
:KUBE-KUBELET-CANARY - [0:0]
[3:180] -A PREROUTING -p tcp -m tcp --dport 443 -j MARK --set-xmark 0x1/0xffffffff
COMMIT
*filter
:KUBE-FIREWALL - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:MYKUBE-INPUT - [0:0]
:KUBEX - [0:0]
[0:0] -A INPUT -j KUBE-FIREWALL
[5:300] -A INPUT -i lo -j ACCEPT
[9:540] -A INPUT -j MYKUBE-INPUT
[2:120] -A FORWARD -s ${net} -j KUBEX
[0:0] -A OUTPUT -j KUBE-FIREWALL
[4:256] -A OUTPUT -p udp -m udp --dport 53 -j ACCEPT
${firewall}[1:60] -A MYKUBE-INPUT -p tcp -m tcp --dport 22 -j ACCEPT
[0:0] -A KUBEX -m comment --comment "not kube-proxy's" -j RETURN
COMMIT
*nat
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-MARK-DROP - [0:0]
:MYNAT - [0:0]
[0:0] -A KUBE-MARK-DROP -j MARK --set-xmark 0x8000/0x8000
[6:360] -A PREROUTING -p tcp -m tcp --dport 8080 -j MYNAT
[8:480] -A POSTROUTING -s ${net} ! -d ${net} -j MASQUERADE
[0:0] -A MYNAT -p tcp -j DNAT --to-destination ${v6 ? '[fd00::1]:80' : '10.0.0.1:80'}
COMMIT
`;
};

/**
 * The built-in chains' policies and their counters, set last in both
 * namespaces: every legacy commit (kube-proxy's load here) zeroes the policy
 * counters of its table, so the cleanup must restate them.
 */
const POLICIES = `*mangle
:PREROUTING ACCEPT [11:2200]
:OUTPUT ACCEPT [6:360]
COMMIT
*filter
:INPUT ACCEPT [100:6000]
:FORWARD DROP [7:420]
:OUTPUT ACCEPT [90:5400]
COMMIT
*nat
:PREROUTING ACCEPT [12:720]
:POSTROUTING ACCEPT [3:180]
COMMIT
`;

/** The host's rules after kube-proxy started: appended after its jumps, and one inserted before them. */
const hostAfter = (v6: boolean): string => `*filter
[2:100] -A INPUT -p icmp${v6 ? 'v6' : ''} -j ACCEPT
[0:0] -A FORWARD -m comment --comment "after kube-proxy" -j ACCEPT
COMMIT
*nat
[1:60] -I PREROUTING 1 -p tcp -m tcp --dport 9999 -j ACCEPT
[0:0] -A POSTROUTING -p udp -j ACCEPT
COMMIT
`;

/**
 * What kube-proxy writes (bench/kube-proxy.ts's IPv4 iptables mode, which
 * writes its jump rules as -I) and its canaries, without its KUBE-FIREWALL
 * lines (kubelet's chain, already there: kube-proxy only ensures it), and a
 * jump of the host's own chain into a kube-proxy chain, which goes too.
 */
function kubeProxyV4(): string {
  const text = iptablesRestoreFull(SERVICES, KP_OPTS)
    .split('\n')
    .filter((l) => !l.includes('KUBE-FIREWALL'))
    .join('\n');
  // The nat table comes last: the host's jump goes before its COMMIT.
  const natEnd = text.lastIndexOf('COMMIT');
  const withJump = `${text.slice(0, natEnd)}-A MYNAT -s 10.9.0.0/16 -j KUBE-MARK-MASQ\n${text.slice(natEnd)}`;
  return `*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n${withJump
    .replace('*filter\n', '*filter\n:KUBE-PROXY-CANARY - [0:0]\n')
    .replace('*nat\n', '*nat\n:KUBE-PROXY-CANARY - [0:0]\n')}`;
}

/** kube-proxy's IPv6 proxier (iptables mode): one service, local traffic policy too. */
const KUBE_PROXY_V6 = `*mangle
:KUBE-PROXY-CANARY - [0:0]
COMMIT
*filter
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-I INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-I INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-I INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-I OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
COMMIT
*nat
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-CDGGSHYLG3RE2FKL - [0:0]
:KUBE-SVL-CDGGSHYLG3RE2FKL - [0:0]
:KUBE-SEP-6ZNAHJ4JOF4RCIBE - [0:0]
-I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-SERVICES -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d fd00:10:96::a --dport 80 -j KUBE-SVC-CDGGSHYLG3RE2FKL
-A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d fd00:10:96::a --dport 80 ! -s fd00:10:244::/56 -j KUBE-MARK-MASQ
-A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> [fd00:10:244:1::2]:8080" -j KUBE-SEP-6ZNAHJ4JOF4RCIBE
-A KUBE-SVL-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> [fd00:10:244:1::2]:8080" -j KUBE-SEP-6ZNAHJ4JOF4RCIBE
-A KUBE-SEP-6ZNAHJ4JOF4RCIBE -m comment --comment default/web:http -s fd00:10:244:1::2 -j KUBE-MARK-MASQ
-A KUBE-SEP-6ZNAHJ4JOF4RCIBE -m comment --comment default/web:http -m tcp -p tcp -j DNAT --to-destination [fd00:10:244:1::2]:8080
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
COMMIT
`;

/** kube-proxy's nftables mode, IPv6 proxier: the table's skeleton and one service (an IPv6 endpoint chain has dots for colons, as kube-proxy names it). */
const KUBE_PROXY_NFT_V6 = `add table ip6 kube-proxy { comment "rules for kube-proxy" ; }
add chain ip6 kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip6 kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip6 kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip6 kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip6 kube-proxy services
add chain ip6 kube-proxy masquerading
add chain ip6 kube-proxy mark-for-masquerade
add chain ip6 kube-proxy service-endpoints-check
add rule ip6 kube-proxy nat-output jump services
add rule ip6 kube-proxy nat-prerouting jump services
add rule ip6 kube-proxy nat-postrouting jump masquerading
add rule ip6 kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip6 kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip6 kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip6 kube-proxy masquerading mark set mark xor 0x4000
add rule ip6 kube-proxy masquerading masquerade fully-random
add set ip6 kube-proxy cluster-ips { type ipv6_addr ; comment "Active ClusterIPs" ; }
add map ip6 kube-proxy no-endpoint-services { type ipv6_addr . inet_proto . inet_service : verdict ; }
add map ip6 kube-proxy service-ips { type ipv6_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add rule ip6 kube-proxy service-endpoints-check ip6 daddr . meta l4proto . th dport vmap @no-endpoint-services
add rule ip6 kube-proxy services ip6 daddr . meta l4proto . th dport vmap @service-ips
add chain ip6 kube-proxy endpoint-5OJB2KTY-default/web/tcp/http__fd00.10.244.1..2/8080
add chain ip6 kube-proxy service-SUSTUHLJ-default/web/tcp/http
add element ip6 kube-proxy cluster-ips { fd00:10:96::a }
add element ip6 kube-proxy service-ips { fd00:10:96::a . tcp . 80 : goto service-SUSTUHLJ-default/web/tcp/http }
add rule ip6 kube-proxy service-SUSTUHLJ-default/web/tcp/http ip6 daddr fd00:10:96::a ip6 saddr != fd00:10:244::/56 jump mark-for-masquerade
add rule ip6 kube-proxy service-SUSTUHLJ-default/web/tcp/http numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-default/web/tcp/http__fd00.10.244.1..2/8080 }
add rule ip6 kube-proxy endpoint-5OJB2KTY-default/web/tcp/http__fd00.10.244.1..2/8080 ip6 saddr fd00:10:244:1::2 jump mark-for-masquerade
add rule ip6 kube-proxy endpoint-5OJB2KTY-default/web/tcp/http__fd00.10.244.1..2/8080 meta l4proto tcp dnat to [fd00:10:244:1::2]:8080
`;

/** Another nft table with sets and chains, and one named kube-proxy in a family kube-proxy never uses. */
const HOST_NFT = `table inet myfw {
  set allowed { type ipv4_addr ; elements = { 10.0.0.1, 10.0.0.2 } ; }
  set ports { type inet_service ; flags interval ; elements = { 8000-8100 } ; }
  chain input { type filter hook input priority 10 ; policy accept ; ip saddr @allowed tcp dport @ports counter packets 4 bytes 240 accept ; }
  chain kube-services { counter packets 0 bytes 0 ; }
}
table inet kube-proxy {
  chain keep { comment "family inet: not one of kube-proxy's tables" ; }
}
`;

/** [tool, family] of each iptables backend; legacy and nft share one namespace. */
const BACKENDS = [
  ['iptables-legacy', 4],
  ['ip6tables-legacy', 6],
  ['iptables-nft', 4],
  ['ip6tables-nft', 6],
] as const;

function inNs(ns: string, cmd: string, args: readonly string[], input?: string): string {
  return execFileSync('ip', ['netns', 'exec', ns, cmd, ...args], { input, encoding: 'utf8', stdio: ['pipe', 'pipe', 'pipe'] });
}

/** Every backend's rules as the save tools print them (counters on), and the nft ruleset: headers and timestamps dropped. */
function dumps(ns: string): Record<string, string> {
  const strip = (s: string): string => s.split('\n').filter((l) => !l.startsWith('#')).join('\n');
  const out: Record<string, string> = {};
  for (const [tool] of BACKENDS) out[tool] = strip(inNs(ns, `${tool}-save`, ['-c']));
  // iptables-nft registers a built-in chain when a rule first needs it
  // (kube-proxy's jump from nat OUTPUT) and never removes it; empty, it is
  // iptables-legacy's always-present built-in chain, and iptables-nft-save
  // prints it either way. The cleanup leaves it, so the comparison skips it.
  out.nft = inNs(ns, 'nft', ['list', 'ruleset']).replace(/\n\tchain [A-Z]+ \{\n\t\ttype \w+ hook \w+ priority [^;]+; policy accept;\n\t\}\n/g, '');
  return out;
}

function loadHost(ns: string, phase: 'before' | 'after'): void {
  for (const [tool, family] of BACKENDS) {
    inNs(ns, `${tool}-restore`, ['--noflush', '--counters'], phase === 'before' ? hostBefore(family === 6) : hostAfter(family === 6));
    if (phase === 'after') inNs(ns, `${tool}-restore`, ['--noflush', '--counters'], POLICIES);
  }
  if (phase === 'before') inNs(ns, 'nft', ['-f', '-'], HOST_NFT);
}

function loadKubeProxy(ns: string): void {
  for (const [tool, family] of BACKENDS) inNs(ns, `${tool}-restore`, ['--noflush'], family === 4 ? kubeProxyV4() : KUBE_PROXY_V6);
  inNs(ns, 'nft', ['-f', '-'], nftablesFull(SERVICES, KP_OPTS));
  inNs(ns, 'nft', ['-f', '-'], KUBE_PROXY_NFT_V6);
}

/** kubelet's chains, which stay (as kube-proxy's own cleanup leaves them). */
const KUBELET = new Set(['KUBE-FIREWALL', 'KUBE-KUBELET-CANARY', 'KUBE-MARK-DROP']);

const tools = ['ip', 'nft', ...BACKENDS.flatMap(([tool]) => [`${tool}-save`, `${tool}-restore`])];
const missing = tools.filter((x) => !['/usr/sbin', '/sbin', '/usr/bin', '/bin'].some((d) => existsSync(`${d}/${x}`)));

// scripts/bootstrap.sh installs iptables and nftables: a machine without them did not bootstrap.
if (missing.length > 0) t.bailout(`missing: ${missing.join(', ')} (scripts/bootstrap.sh installs iptables and nftables)`);

t.test('cleanup --kube-proxy: kube-proxy gone from every backend, the rest byte-identical', async (t) => {
  sweepLeftovers();
  // The legacy backend needs the x_tables modules (built in on some kernels).
  if (!existsSync('/proc/net/ip_tables_names') || !existsSync('/proc/net/ip6_tables_names')) {
    try {
      execFileSync('modprobe', ['-a', 'ip_tables', 'ip6_tables', 'iptable_filter', 'iptable_nat', 'iptable_mangle', 'ip6table_filter', 'ip6table_nat', 'ip6table_mangle'], { stdio: 'ignore' });
    } catch {
      /* the restores below say what is missing */
    }
  }
  t.teardown(() => {
    removeNetns(NS);
    removeNetns(CONTROL);
  });
  for (const ns of [NS, CONTROL]) {
    removeNetns(ns);
    execFileSync('ip', ['netns', 'add', ns]);
  }

  loadHost(NS, 'before');
  loadKubeProxy(NS);
  loadHost(NS, 'after');
  loadHost(CONTROL, 'before');
  loadHost(CONTROL, 'after');

  const loaded = dumps(NS);
  const want = dumps(CONTROL);
  for (const [tool] of BACKENDS) t.match(loaded[tool], /^:KUBE-SERVICES /m, `${tool}: kube-proxy's rules loaded`);
  t.match(loaded.nft, /^table ip kube-proxy \{/m, 'nftables: ip kube-proxy loaded');
  t.match(loaded.nft, /^table ip6 kube-proxy \{/m, 'nftables: ip6 kube-proxy loaded');
  t.match(loaded['iptables-legacy'], /^\[1:60\] -A PREROUTING -p tcp -m tcp --dport 9999 -j ACCEPT\n\[0:0\] -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES\n\[6:360\] -A PREROUTING -p tcp/m,
    "a host rule before kube-proxy's jump and one after it");

  const cli = (): Promise<import('../helpers/sandbox.js').ExecResult> => run('ip', ['netns', 'exec', NS, LBCTL, 'cleanup', '--kube-proxy'], CLI_TIMEOUT_MS);
  const first = await cli();
  t.equal(first.code, 0, `lbctl cleanup --kube-proxy ${how(first)}: ${first.stderr}`);
  t.comment(first.stdout.trim());
  for (const backend of ['legacy', 'nft']) {
    t.match(first.stdout, new RegExp(`^kube-proxy iptables ${backend} IPv4: removed filter: 6 chains \\(4 rules\\), 9 jump rules; nat: 11 chains \\(21 rules\\), 4 jump rules; mangle: 1 chain \\(0 rules\\), 0 jump rules$`, 'm'), `${backend} IPv4 counts`);
    t.match(first.stdout, new RegExp(`^kube-proxy iptables ${backend} IPv6: removed filter: 6 chains \\(2 rules\\), 9 jump rules; nat: 8 chains \\(11 rules\\), 3 jump rules; mangle: 1 chain \\(0 rules\\), 0 jump rules$`, 'm'), `${backend} IPv6 counts`);
  }
  t.match(first.stdout, /^kube-proxy nftables: removed table ip kube-proxy \(22 chains, 1 set, 5 maps\), table ip6 kube-proxy \(10 chains, 1 set, 2 maps\)$/m, 'nftables counts');

  const after = dumps(NS);
  for (const key of Object.keys(want)) {
    if (key !== 'nft') {
      const left = [...after[key]!.matchAll(/^:(KUBE-\S+)|-[jg] (KUBE-\S+)/gm)].map((m) => m[1] ?? m[2]!).filter((c) => !KUBELET.has(c));
      t.same(left, [], `${key}: no kube-proxy chain or jump left (kubelet's stay)`);
    }
    t.equal(after[key], want[key], `${key}: the rest is byte-identical to the control namespace's, counters included`);
  }
  t.notMatch(after.nft, /^table ip6? kube-proxy /m, 'no kube-proxy nft table left');
  t.match(after.nft, /^table inet kube-proxy \{/m, 'inet kube-proxy (not a kube-proxy family) stays');

  const second = await cli();
  t.equal(second.code, 0, `the second run ${how(second)}: ${second.stderr}`);
  t.equal(second.stdout.match(/: nothing to remove$/gm)?.length, 5, 'the second run: nothing to remove, on every backend');
  t.same(dumps(NS), after, 'and changes nothing');
});
