// kube-proxy, emulated for the benchmark: the rules kube-proxy writes for N
// ClusterIP services (TCP, one port each), as the text its iptables proxier
// hands to `iptables-restore` and the transaction its nftables proxier hands
// to `nft -f -`. Pure functions: the benchmark loads the text with the real
// tools (iptables-legacy-restore, iptables-nft-restore, nft) and times that.
//
// Followed from kubernetes/kubernetes pkg/proxy/iptables/proxier.go and
// pkg/proxy/nftables/proxier.go (1.28+ iptables layout, 1.31+ nftables
// layout as of the current tree), checked against the expected rule dumps of
// their proxier_test.go (chain names, hashes, rule text and order), with
// kube-proxy's defaults: masqueradeBit 14 (mark 0x4000), masqueradeAll off,
// local-traffic detection by cluster CIDR (`--cluster-cidr`), iptables
// nodePortAddresses unset (all local addresses) and localhostNodePorts on,
// conntrack TCP "be liberal" off, no session affinity, traffic policies
// Cluster, all endpoints ready.
//
// NodePorts (BenchService.nodePort, for bench/nodeport-e2e.ts; eTP Cluster):
// iptables gets kube-proxy's `-A KUBE-NODEPORTS ... --dport NP -j KUBE-EXT-<hash>`
// rule (in the service's turn, so KUBE-NODEPORTS is walked in service order)
// and the KUBE-EXT chain (KUBE-MARK-MASQ, then the KUBE-SVC chain);
// nftables the `service-nodeports` element `tcp . NP : goto external-<hash>`
// and the external chain (jump mark-for-masquerade, goto the service chain).
// Without nodePort the output is what it was.
//
// Written as kube-proxy writes it:
//  - iptables: a full sync (filter and nat tables, `*filter ... COMMIT *nat
//    ... COMMIT`, for `iptables-restore --noflush --counters`): the top-level
//    chains (filter KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-FORWARD,
//    KUBE-NODEPORTS, KUBE-PROXY-FIREWALL, KUBE-FIREWALL; nat KUBE-SERVICES,
//    KUBE-NODEPORTS, KUBE-POSTROUTING, KUBE-MARK-MASQ), per service
//    KUBE-SVC-<16 chars of base32(sha256)> and per endpoint KUBE-SEP-<...>,
//    rules interleaved per service as kube-proxy writes them, the masquerade
//    rule for off-cluster sources, `-m statistic --mode random --probability`
//    1/n, 1/(n-1), ... (%0.10f), the nodeports rule last in KUBE-SERVICES,
//    KUBE-POSTROUTING with `MASQUERADE --random-fully`, KUBE-FORWARD's rules,
//    KUBE-FIREWALL's localnet rule, and kube-proxy's "large cluster mode"
//    (more than 1,000 endpoints in all: no comments on the KUBE-SVC -> KUBE-SEP
//    jumps and in the KUBE-SEP chains).
//  - iptables partial sync (MinimizeIPTablesRestore, on by default since 1.27):
//    the filter table and the nat top-level chains rewritten in full, every
//    service's KUBE-SERVICES rule, and only the changed (added) service's
//    KUBE-SVC/KUBE-SEP chains.
//  - nftables: the first sync's transaction of the `ip kube-proxy` table
//    (setupNFTables: table, base chains (added and deleted once, then added
//    with their hooks and flushed), the jump chains and their jump rules, the
//    mark-for-masquerade and masquerading chains, the cluster-ips set and
//    cluster-ips-check chain, nodeport-ips, the no-endpoint-services /
//    no-endpoint-nodeports / firewall-ips / service-ips / service-nodeports
//    verdict maps, reject-chain, the services dispatch rules), then per
//    service the endpoint chains and the service chain (each added and
//    flushed), the cluster-ips and service-ips elements, the service chain's
//    masquerade rule and `numgen random mod N vmap { ... }`, and per endpoint
//    the hairpin masquerade rule and `dnat to`.
//  - nftables partial sync: only what kube-proxy's element storage and
//    skipServiceUpdate leave in the transaction for one added service: its
//    chains (added, flushed, filled) and its new set/map elements.
//
// Simplifications (what the emulation leaves out):
//  - Only what these services need: ClusterIP, TCP, one port, endpoints all
//    ready and reachable, Cluster traffic policies, no session affinity, no
//    NodePort/ExternalIP/LoadBalancer (so no KUBE-EXT/KUBE-SVL/KUBE-FW chains,
//    no external/local/firewall/affinity chains or sets, no nodeport map
//    elements); a service without endpoints gets kube-proxy's REJECT rule /
//    no-endpoint-services element. IPv4 only (kube-proxy runs a second, IPv6
//    proxier in dual-stack clusters).
//  - Services are written in the order given (kube-proxy walks a Go map, so
//    its order is random); endpoints in the order given; the added service
//    comes last in the partial iptables sync.
//  - iptables: the jump rules from the built-in chains (filter INPUT, FORWARD,
//    OUTPUT; nat PREROUTING, OUTPUT, POSTROUTING), which kube-proxy installs on
//    a full sync with `iptables -C`/`-I` (EnsureRule, Prepend) before the
//    restore, are written into the full text as `-I` lines instead (same
//    order, same result in a fresh netns; loading the full text twice into
//    one netns would duplicate them). The partial sync has none, like
//    kube-proxy's.
//  - Not written: the KUBE-PROXY-CANARY / KUBE-KUBELET-CANARY chains (the
//    monitor's canaries, in mangle/nat/filter, not on any packet path); the
//    `-m nfacct` counters kube-proxy adds to the KUBE-FORWARD INVALID drop
//    rule when nfacct is available; the `route_localnet` and
//    `nf_conntrack_tcp_be_liberal` sysctls.
//  - Not timed or emulated: the reads kube-proxy does around its writes
//    (iptables: `iptables-save -t nat` to find stale chains, on every sync
//    below 1,000 endpoints, at most once per syncPeriod above; nftables:
//    `nft list chains`, `nft list sets` every sync and the elements of its six
//    sets/maps on a full sync), the deletion of stale chains, conntrack
//    cleanup, and kube-proxy's own Go CPU time to build the text.
//  - The nftables full transaction is the first sync of a kube-proxy process
//    into a netns without the table (a restart's full sync would skip
//    unchanged endpoint chains and only diff the set/map elements).
//  - nftables nodePortAddresses: kube-proxy's nftables default is "primary"
//    (the node IP in the nodeport-ips set); with `nodeIP` unset here the
//    emulation writes the all-local-addresses variant (`fib daddr type local
//    ...`), with it the primary one. The "drop traffic to unallocated
//    ClusterIPs" rule (from the ServiceCIDR objects, 1.33+) is written only
//    when `serviceCIDR` is given. Neither is on the path of a connection to a
//    ClusterIP that exists.
//  - The mark is written 0x4000 (as in kube-proxy's tests; kube-proxy
//    itself formats it with %#08x, the same value).
import { createHash } from 'node:crypto';

export interface BenchService {
  namespace: string;
  name: string;
  portName: string;
  clusterIP: string;
  port: number;
  endpoints: ReadonlyArray<{ ip: string; port: number }>;
  /**
   * A NodePort (type NodePort or LoadBalancer, externalTrafficPolicy
   * Cluster): iptables writes the KUBE-NODEPORTS rule and the KUBE-EXT chain,
   * nftables the service-nodeports element and the external chain (used by
   * bench/nodeport-e2e.ts; the ClusterIP bench leaves it unset).
   */
  nodePort?: number;
}

export interface KubeProxyOptions {
  /** e.g. 10.244.0.0/16: kube-proxy's --cluster-cidr, for the masquerade rule of off-cluster sources. */
  clusterCIDR: string;
  /** nftables: the node IP for nodePortAddresses "primary" (kube-proxy's nftables default); unset: all local addresses. */
  nodeIP?: string;
  /** nftables: the ServiceCIDR (1.33+), for the cluster-ips-check "drop traffic to unallocated ClusterIPs" rule; unset: no such rule. */
  serviceCIDR?: string;
}

type Endpoint = BenchService['endpoints'][number];

const PROTO = 'tcp';
const MARK = '0x4000';
/** kube-proxy's largeClusterEndpointsThreshold: above it, the per-endpoint comments are dropped. */
const LARGE_CLUSTER_ENDPOINTS = 1000;

// ---- names ---------------------------------------------------------------

const B32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';

/** RFC 4648 base32 with padding, as Go's base32.StdEncoding.EncodeToString. */
export function base32(data: Uint8Array): string {
  let out = '';
  let value = 0;
  let bits = 0;
  for (const byte of data) {
    value = ((value << 8) | byte) & 0xfff;
    bits += 8;
    while (bits >= 5) {
      out += B32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += B32[(value << (5 - bits)) & 31];
  while (out.length % 8 !== 0) out += '=';
  return out;
}

/** The first `chars` characters of base32(sha256(s)) (chars <= 48, so no padding involved). */
function hashPrefix(s: string, chars: number): string {
  const digest = createHash('sha256').update(s).digest();
  return base32(digest.subarray(0, Math.ceil((chars * 5) / 8))).slice(0, chars);
}

/** proxy.ServicePortName.String(): "ns/name:port" (":port" only when the port has a name). */
function servicePortName(s: BenchService): string {
  return s.portName ? `${s.namespace}/${s.name}:${s.portName}` : `${s.namespace}/${s.name}`;
}

/** BaseEndpointInfo.String(): net.JoinHostPort (IPv4). */
const hostPort = (ep: Endpoint): string => `${ep.ip}:${ep.port}`;

/** iptables servicePortPolicyClusterChain: "KUBE-SVC-" + base32(sha256(svcPortName + protocol))[:16]. */
export function iptablesServiceChain(s: BenchService): string {
  return `KUBE-SVC-${hashPrefix(servicePortName(s) + PROTO, 16)}`;
}

/** iptables servicePortEndpointChainName: "KUBE-SEP-" + base32(sha256(svcPortName + protocol + "ip:port"))[:16]. */
export function iptablesEndpointChain(s: BenchService, ep: Endpoint): string {
  return `KUBE-SEP-${hashPrefix(servicePortName(s) + PROTO + hostPort(ep), 16)}`;
}

/** iptables servicePortPolicyExternalChainName: "KUBE-EXT-" + the same hash as KUBE-SVC. */
export function iptablesExternalChain(s: BenchService): string {
  return `KUBE-EXT-${hashPrefix(servicePortName(s) + PROTO, 16)}`;
}

/** knftables.NameLengthMax (256) less kube-proxy's chainNamePrefixLengthMax (16). */
const NFT_CHAIN_BASE_MAX = 256 - 16;

/** nftables hashAndTruncate: base32(sha256(name))[:8] + "-" + name, cut to 240 with "...". */
function hashAndTruncate(name: string): string {
  const out = `${hashPrefix(name, 8)}-${name}`;
  return out.length > NFT_CHAIN_BASE_MAX ? `${out.slice(0, NFT_CHAIN_BASE_MAX - 3)}...` : out;
}

/** nftables cluster policy chain: "service-" + hashAndTruncate("ns/name/tcp/port"). */
export function nftablesServiceChain(s: BenchService): string {
  return `service-${hashAndTruncate(`${s.namespace}/${s.name}/${PROTO}/${s.portName}`)}`;
}

/** nftables external chain: "external-" + hashAndTruncate("ns/name/tcp/port"). */
export function nftablesExternalChain(s: BenchService): string {
  return `external-${hashAndTruncate(`${s.namespace}/${s.name}/${PROTO}/${s.portName}`)}`;
}

/** nftables endpoint chain: "endpoint-" + hashAndTruncate("ns/name/tcp/port__ip/port"). */
export function nftablesEndpointChain(s: BenchService, ep: Endpoint): string {
  return `endpoint-${hashAndTruncate(`${s.namespace}/${s.name}/${PROTO}/${s.portName}__${ep.ip}/${ep.port}`)}`;
}

// ---- iptables ------------------------------------------------------------

/** iptablesJumpChains + iptablesKubeletJumpChains, in kube-proxy's order; each is EnsureRule(Prepend, ...). */
const IPT_JUMPS: ReadonlyArray<{ table: 'filter' | 'nat'; src: string; dst: string; comment: string; extra: string }> = [
  { table: 'filter', dst: 'KUBE-EXTERNAL-SERVICES', src: 'INPUT', comment: 'kubernetes externally-visible service portals', extra: '-m conntrack --ctstate NEW' },
  { table: 'filter', dst: 'KUBE-EXTERNAL-SERVICES', src: 'FORWARD', comment: 'kubernetes externally-visible service portals', extra: '-m conntrack --ctstate NEW' },
  { table: 'filter', dst: 'KUBE-NODEPORTS', src: 'INPUT', comment: 'kubernetes health check service ports', extra: '' },
  { table: 'filter', dst: 'KUBE-SERVICES', src: 'FORWARD', comment: 'kubernetes service portals', extra: '-m conntrack --ctstate NEW' },
  { table: 'filter', dst: 'KUBE-SERVICES', src: 'OUTPUT', comment: 'kubernetes service portals', extra: '-m conntrack --ctstate NEW' },
  { table: 'filter', dst: 'KUBE-FORWARD', src: 'FORWARD', comment: 'kubernetes forwarding rules', extra: '' },
  { table: 'filter', dst: 'KUBE-PROXY-FIREWALL', src: 'INPUT', comment: 'kubernetes load balancer firewall', extra: '-m conntrack --ctstate NEW' },
  { table: 'filter', dst: 'KUBE-PROXY-FIREWALL', src: 'OUTPUT', comment: 'kubernetes load balancer firewall', extra: '-m conntrack --ctstate NEW' },
  { table: 'filter', dst: 'KUBE-PROXY-FIREWALL', src: 'FORWARD', comment: 'kubernetes load balancer firewall', extra: '-m conntrack --ctstate NEW' },
  { table: 'nat', dst: 'KUBE-SERVICES', src: 'OUTPUT', comment: 'kubernetes service portals', extra: '' },
  { table: 'nat', dst: 'KUBE-SERVICES', src: 'PREROUTING', comment: 'kubernetes service portals', extra: '' },
  { table: 'nat', dst: 'KUBE-POSTROUTING', src: 'POSTROUTING', comment: 'kubernetes postrouting rules', extra: '' },
  // kubelet's firewall chain, which kube-proxy also ensures (no comment)
  { table: 'filter', dst: 'KUBE-FIREWALL', src: 'INPUT', comment: '', extra: '' },
  { table: 'filter', dst: 'KUBE-FIREWALL', src: 'OUTPUT', comment: '', extra: '' },
];

function jumpLines(table: 'filter' | 'nat'): string[] {
  const out: string[] = [];
  for (const j of IPT_JUMPS) {
    if (j.table !== table) continue;
    const parts = ['-I', j.src];
    if (j.extra) parts.push(j.extra);
    if (j.comment) parts.push(`-m comment --comment "${j.comment}"`);
    parts.push('-j', j.dst);
    out.push(parts.join(' '));
  }
  return out;
}

/** proxier.probability(n): fmt.Sprintf("%0.10f", 1.0/float64(n)). */
const probability = (n: number): string => (1 / n).toFixed(10);

function totalEndpoints(services: readonly BenchService[]): number {
  let n = 0;
  for (const s of services) n += s.endpoints.length;
  return n;
}

/** The filter table as every sync writes it (kube-proxy rewrites it in full on partial syncs too). */
function iptablesFilter(services: readonly BenchService[], withJumps: boolean): string[] {
  const lines = [
    '*filter',
    ':KUBE-SERVICES - [0:0]',
    ':KUBE-EXTERNAL-SERVICES - [0:0]',
    ':KUBE-FORWARD - [0:0]',
    ':KUBE-NODEPORTS - [0:0]',
    ':KUBE-PROXY-FIREWALL - [0:0]',
    // localhostNodePorts (default on, IPv4): the kubelet-duplicate anti-martian chain
    ':KUBE-FIREWALL - [0:0]',
  ];
  if (withJumps) lines.push(...jumpLines('filter'));
  lines.push(
    '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP',
  );
  for (const s of services) {
    if (s.endpoints.length > 0) continue;
    lines.push(`-A KUBE-SERVICES -m comment --comment "${servicePortName(s)} has no endpoints" -m ${PROTO} -p ${PROTO} -d ${s.clusterIP} --dport ${s.port} -j REJECT`);
  }
  lines.push(
    '-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP',
    `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark ${MARK}/${MARK} -j ACCEPT`,
    '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT',
    'COMMIT',
  );
  return lines;
}

/**
 * The nat table. `write(s)` says whether the service's own chains go in
 * (all of them on a full sync; only the changed ones on a partial sync);
 * KUBE-SERVICES always gets every service's rule.
 */
function iptablesNat(services: readonly BenchService[], opts: KubeProxyOptions, withJumps: boolean, write: (s: BenchService) => boolean): string[] {
  const large = totalEndpoints(services) > LARGE_CLUSTER_ENDPOINTS;
  const chains = ['*nat', ':KUBE-SERVICES - [0:0]', ':KUBE-NODEPORTS - [0:0]', ':KUBE-POSTROUTING - [0:0]', ':KUBE-MARK-MASQ - [0:0]'];
  const rules: string[] = withJumps ? jumpLines('nat') : [];
  rules.push(
    `-A KUBE-POSTROUTING -m mark ! --mark ${MARK}/${MARK} -j RETURN`,
    `-A KUBE-POSTROUTING -j MARK --xor-mark ${MARK}`,
    '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully',
    `-A KUBE-MARK-MASQ -j MARK --or-mark ${MARK}`,
  );
  const notLocal = `! -s ${opts.clusterCIDR}`;
  for (const s of services) {
    const n = s.endpoints.length;
    if (n === 0) continue; // REJECT in the filter table instead
    const spn = servicePortName(s);
    const svcChain = iptablesServiceChain(s);
    const match = `-m comment --comment "${spn} cluster IP" -m ${PROTO} -p ${PROTO} -d ${s.clusterIP} --dport ${s.port}`;
    rules.push(`-A KUBE-SERVICES ${match} -j ${svcChain}`);
    // "Capture nodeports": the KUBE-NODEPORTS rule, then (below) the KUBE-EXT chain
    const extChain = s.nodePort ? iptablesExternalChain(s) : '';
    if (s.nodePort) rules.push(`-A KUBE-NODEPORTS -m comment --comment ${spn} -m ${PROTO} -p ${PROTO} --dport ${s.nodePort} -j ${extChain}`);
    if (!write(s)) continue;
    if (s.nodePort) {
      // eTP Cluster: masquerade, then the cluster policy chain
      chains.push(`:${extChain} - [0:0]`);
      rules.push(`-A ${extChain} -m comment --comment "masquerade traffic for ${spn} external destinations" -j KUBE-MARK-MASQ`, `-A ${extChain} -j ${svcChain}`);
    }
    // internal traffic: masquerade off-cluster sources (LocalTrafficDetector by cluster CIDR)
    rules.push(`-A ${svcChain} ${match} ${notLocal} -j KUBE-MARK-MASQ`);
    chains.push(`:${svcChain} - [0:0]`);
    const sepChains = s.endpoints.map((ep) => iptablesEndpointChain(s, ep));
    // writeServiceToEndpointRules
    for (let i = 0; i < n; i++) {
      const ep = s.endpoints[i]!;
      let line = `-A ${svcChain}`;
      if (!large) line += ` -m comment --comment "${spn} -> ${hostPort(ep)}"`;
      if (i < n - 1) line += ` -m statistic --mode random --probability ${probability(n - i)}`;
      rules.push(`${line} -j ${sepChains[i]}`);
    }
    // the per-endpoint chains
    const comment = large ? '' : ` -m comment --comment ${spn}`;
    for (let i = 0; i < n; i++) {
      const ep = s.endpoints[i]!;
      const sep = sepChains[i]!;
      chains.push(`:${sep} - [0:0]`);
      rules.push(`-A ${sep}${comment} -s ${ep.ip} -j KUBE-MARK-MASQ`, `-A ${sep}${comment} -m ${PROTO} -p ${PROTO} -j DNAT --to-destination ${hostPort(ep)}`);
    }
  }
  // nodePortAddresses unset (all local addresses) and localhostNodePorts on: no "! -d 127.0.0.0/8"
  rules.push(
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS',
    'COMMIT',
  );
  return chains.concat(rules);
}

/** Full ruleset as kube-proxy's iptables-restore input for a full sync (filter and nat tables), services in the order given. */
export function iptablesRestoreFull(services: readonly BenchService[], opts: KubeProxyOptions): string {
  const lines = iptablesFilter(services, true).concat(iptablesNat(services, opts, true, () => true));
  return `${lines.join('\n')}\n`;
}

/**
 * What kube-proxy's partial sync (MinimizeIPTablesRestore) writes when
 * `added` is added to `existing`, for `iptables-restore --noflush`:
 * KUBE-SERVICES is rewritten in full, only the new service's chains are added.
 */
export function iptablesRestoreAdd(existing: readonly BenchService[], added: BenchService, opts: KubeProxyOptions): string {
  const all = existing.concat([added]);
  const lines = iptablesFilter(all, false).concat(iptablesNat(all, opts, false, (s) => s === added));
  return `${lines.join('\n')}\n`;
}

// ---- nftables ------------------------------------------------------------

const T = 'ip kube-proxy';

/** nftablesBaseChains: name, type, hook, priority (knftables writes the numeric value). */
const NFT_BASE_CHAINS: ReadonlyArray<readonly [string, string, string, number]> = [
  ['filter-prerouting-pre-dnat', 'filter', 'prerouting', -110],
  ['filter-output-pre-dnat', 'filter', 'output', -110],
  ['filter-input', 'filter', 'input', 0],
  ['filter-forward', 'filter', 'forward', 0],
  ['filter-output', 'filter', 'output', 0],
  ['nat-prerouting', 'nat', 'prerouting', -100],
  ['nat-output', 'nat', 'output', -100],
  ['nat-postrouting', 'nat', 'postrouting', 100],
];

/** nftablesJumpChains: dst, src, extra match. */
const NFT_JUMP_CHAINS: ReadonlyArray<readonly [string, string, string]> = [
  ['nodeport-endpoints-check', 'filter-input', 'ct state new'],
  ['service-endpoints-check', 'filter-input', 'ct state new'],
  ['service-endpoints-check', 'filter-forward', 'ct state new'],
  ['service-endpoints-check', 'filter-output', 'ct state new'],
  ['firewall-check', 'filter-prerouting-pre-dnat', 'ct state new'],
  ['firewall-check', 'filter-output-pre-dnat', 'ct state new'],
  ['services', 'nat-output', ''],
  ['services', 'nat-prerouting', ''],
  ['masquerading', 'nat-postrouting', ''],
  ['cluster-ips-check', 'filter-forward', 'ct state new'],
  ['cluster-ips-check', 'filter-output', 'ct state new'],
];

/** setupNFTables, on a kube-proxy process's first sync (proxier.flushed false). */
function nftSetup(opts: KubeProxyOptions): string[] {
  const out: string[] = [`add table ${T} { comment "rules for kube-proxy" ; }`];
  for (const [name] of NFT_BASE_CHAINS) out.push(`add chain ${T} ${name}`, `delete chain ${T} ${name}`);
  for (const [name, type, hook, prio] of NFT_BASE_CHAINS) {
    out.push(`add chain ${T} ${name} { type ${type} hook ${hook} priority ${prio} ; }`, `flush chain ${T} ${name}`);
  }
  const created = new Set<string>();
  const ensureChain = (name: string): void => {
    if (created.has(name)) return;
    created.add(name);
    out.push(`add chain ${T} ${name}`, `flush chain ${T} ${name}`);
  };
  for (const [dst, src, extra] of NFT_JUMP_CHAINS) {
    ensureChain(dst);
    out.push(`add rule ${T} ${src} ${extra ? `${extra} ` : ''}jump ${dst}`);
  }
  for (const c of ['services', 'cluster-ips-check', 'masquerading', 'mark-for-masquerade']) ensureChain(c);
  out.push(
    `add rule ${T} mark-for-masquerade mark set mark or ${MARK}`,
    `add rule ${T} masquerading mark and ${MARK} == 0 return`,
    `add rule ${T} masquerading mark set mark xor ${MARK}`,
    `add rule ${T} masquerading masquerade fully-random`,
    `add set ${T} cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }`,
    `add rule ${T} cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"`,
  );
  if (opts.serviceCIDR) out.push(`add rule ${T} cluster-ips-check ip daddr { ${opts.serviceCIDR} } drop comment "Drop traffic to unallocated ClusterIPs"`);
  out.push(`add set ${T} nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }`);
  const matchAll = !opts.nodeIP;
  if (matchAll) out.push(`delete set ${T} nodeport-ips`);
  else out.push(`flush set ${T} nodeport-ips`, `add element ${T} nodeport-ips { ${opts.nodeIP} }`);
  out.push(
    `add map ${T} no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }`,
    `add map ${T} no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }`,
    `add chain ${T} reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }`,
    `flush chain ${T} reject-chain`,
    `add rule ${T} reject-chain reject`,
    `add rule ${T} service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services`,
    matchAll
      ? `add rule ${T} nodeport-endpoints-check ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports`
      : `add rule ${T} nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports`,
    `add map ${T} firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }`,
  );
  ensureChain('firewall-check'); // already created above: no-op, as in kube-proxy
  out.push(
    `add rule ${T} firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips`,
    `add map ${T} service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }`,
    `add map ${T} service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }`,
    `add rule ${T} services ip daddr . meta l4proto . th dport vmap @service-ips`,
    matchAll
      ? `add rule ${T} services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports`
      : `add rule ${T} services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports`,
  );
  return out;
}

/** One service's share of the syncProxyRules transaction (new service: nothing of it exists yet). */
function nftService(out: string[], s: BenchService, opts: KubeProxyOptions, clusterIPs: Set<string>): void {
  const n = s.endpoints.length;
  const svcChain = nftablesServiceChain(s);
  const epChains = s.endpoints.map((ep) => nftablesEndpointChain(s, ep));
  // ensureChain: the endpoint chains first, then the cluster policy chain
  for (const c of epChains) out.push(`add chain ${T} ${c}`, `flush chain ${T} ${c}`);
  if (n > 0) out.push(`add chain ${T} ${svcChain}`, `flush chain ${T} ${svcChain}`);
  const extChain = s.nodePort && n > 0 ? nftablesExternalChain(s) : '';
  if (extChain) out.push(`add chain ${T} ${extChain}`, `flush chain ${T} ${extChain}`);
  if (!clusterIPs.has(s.clusterIP)) {
    clusterIPs.add(s.clusterIP);
    out.push(`add element ${T} cluster-ips { ${s.clusterIP} }`);
  }
  const key = `${s.clusterIP} . ${PROTO} . ${s.port}`;
  if (n === 0) {
    out.push(`add element ${T} no-endpoint-services { ${key} comment "${servicePortName(s)}" : goto reject-chain }`);
    return;
  }
  out.push(
    `add element ${T} service-ips { ${key} : goto ${svcChain} }`,
    `add rule ${T} ${svcChain} ip daddr ${s.clusterIP} ip saddr != ${opts.clusterCIDR} jump mark-for-masquerade`,
    `add rule ${T} ${svcChain} numgen random mod ${n} vmap { ${epChains.map((c, i) => `${i} : goto ${c}`).join(' , ')} }`,
  );
  if (extChain) {
    // "Capture nodeports", then the external chain (eTP Cluster): masquerade, then the cluster policy chain
    out.push(
      `add element ${T} service-nodeports { ${PROTO} . ${s.nodePort} : goto ${extChain} }`,
      `add rule ${T} ${extChain} jump mark-for-masquerade`,
      `add rule ${T} ${extChain} goto ${svcChain}`,
    );
  }
  for (let i = 0; i < n; i++) {
    const ep = s.endpoints[i]!;
    out.push(`add rule ${T} ${epChains[i]} ip saddr ${ep.ip} jump mark-for-masquerade`, `add rule ${T} ${epChains[i]} meta l4proto ${PROTO} dnat to ${hostPort(ep)}`);
  }
}

/** Full `nft -f` input for kube-proxy's nftables mode: its first full sync's transaction. */
export function nftablesFull(services: readonly BenchService[], opts: KubeProxyOptions): string {
  const out = nftSetup(opts);
  const clusterIPs = new Set<string>();
  for (const s of services) nftService(out, s, opts, clusterIPs);
  return `${out.join('\n')}\n`;
}

/** The incremental transaction kube-proxy's nftables proxier sends when one service is added (new chains, new map elements only). */
export function nftablesAdd(added: BenchService, opts: KubeProxyOptions): string {
  const out: string[] = [];
  nftService(out, added, opts, new Set());
  return `${out.join('\n')}\n`;
}
