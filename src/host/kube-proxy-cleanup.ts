// `lbctl cleanup --kube-proxy`: removes what kube-proxy leaves in the host's
// packet filter when it is replaced by lbctl, and nothing else
// (docs/cleanup.md).
//
//  - iptables mode (legacy and nft backends, IPv4 and IPv6): kube-proxy's
//    chains in the filter, nat and mangle tables and every rule, in a chain
//    that stays, that jumps to one of them. Which chains are kube-proxy's is
//    read from kubernetes/kubernetes pkg/proxy/iptables (proxier.go,
//    cleanup.go: CleanupLeftovers) and pkg/proxy/ipvs (its iptables chains),
//    not guessed from the KUBE- prefix: kubelet's KUBE-FIREWALL (filter),
//    KUBE-KUBELET-CANARY and KUBE-MARK-DROP stay, as kube-proxy's own cleanup
//    leaves them, and so do other projects' KUBE-* chains (kube-router's
//    KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-* network policy chains).
//  - nftables mode: the `kube-proxy` tables of families ip and ip6, deleted
//    whole, as kube-proxy's nftables CleanupLeftovers does.
//
// The iptables side is kube-proxy's delete-then-flush-then-delete-chain
// sequence, written as one `iptables-restore --noflush` input per backend
// and family: for each table, `-D` of each jump rule (its iptables-save text),
// `:CHAIN - [0:0]` (flush) of each chain, then `-X` of each chain. Each table
// commits at once (legacy: one table replace, which keeps the counters of
// the rules it does not change; nft: one transaction), and the chains and
// rules it does not name are never rewritten, so rules iptables cannot
// represent (an nft rule in an iptables-nft table) are not touched either.
//
// planIptablesCleanup() is pure (an iptables-save dump in, the restore input
// and what it removes out); cleanupKubeProxy() runs the binaries.
import { spawnSync } from 'node:child_process';
import { accessSync, constants, readFileSync } from 'node:fs';
import path from 'node:path';

/** The tables kube-proxy writes to (its canary also lives in mangle). */
export const KUBE_PROXY_TABLES = ['filter', 'nat', 'mangle'] as const;

/**
 * kube-proxy's fixed chain names per table: the iptables mode's (current and
 * past releases) and the ipvs mode's iptables chains.
 */
const OWNED: Readonly<Record<string, ReadonlySet<string>>> = {
  nat: new Set([
    'KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-POSTROUTING', 'KUBE-MARK-MASQ', 'KUBE-PROXY-CANARY',
    // ipvs mode (KUBE-FIREWALL in nat is the ipvs mode's load-balancer
    // firewall of releases before 1.20; kubelet's KUBE-FIREWALL is in filter)
    'KUBE-NODE-PORT', 'KUBE-LOAD-BALANCER', 'KUBE-FIREWALL',
  ]),
  filter: new Set([
    'KUBE-SERVICES', 'KUBE-EXTERNAL-SERVICES', 'KUBE-FORWARD', 'KUBE-NODEPORTS', 'KUBE-PROXY-FIREWALL', 'KUBE-PROXY-CANARY',
    // ipvs mode
    'KUBE-NODE-PORT', 'KUBE-SOURCE-RANGES-FIREWALL', 'KUBE-IPVS-FILTER', 'KUBE-IPVS-OUT-FILTER',
  ]),
  mangle: new Set(['KUBE-PROXY-CANARY']),
};

/**
 * kube-proxy's per-service and per-endpoint chains (nat only): KUBE-SVC-
 * (cluster policy), KUBE-SVL- (local policy), KUBE-EXT- (external), KUBE-FW-
 * (load-balancer source ranges), KUBE-SEP- (endpoint), KUBE-XLB- (local
 * policy before 1.24), each followed by a 16-character hash.
 */
const SERVICE_CHAIN = /^KUBE-(SVC|SVL|EXT|FW|SEP|XLB)-[A-Z0-9]{16}$/;

/** Whether `chain` in `table` is one kube-proxy creates (and its own cleanup removes). */
export function isKubeProxyChain(table: string, chain: string): boolean {
  if (OWNED[table]?.has(chain)) return true;
  return table === 'nat' && SERVICE_CHAIN.test(chain);
}

/** One table of an iptables-save dump. */
export interface SavedTable {
  readonly name: string;
  /** Every chain the dump declares, built-in and user, in dump order. */
  readonly chains: string[];
  /** The built-in chains' lines (`:INPUT ACCEPT [packets:bytes]`), as saved. */
  readonly policies: string[];
  /** `-A` lines in dump order, with the chain they append to and their -j/-g target. */
  readonly rules: Array<{ chain: string; line: string; target: string | undefined }>;
}

/** Splits a rule line as iptables-restore does: whitespace, with "..." quoting (\" inside). */
export function ruleWords(line: string): string[] {
  const words: string[] = [];
  let cur = '';
  let quoted = false;
  let any = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (quoted) {
      if (c === '\\' && line[i + 1] === '"') cur += line[++i];
      else if (c === '"') quoted = false;
      else cur += c;
    } else if (c === '"') {
      quoted = true;
      any = true;
    } else if (c === ' ' || c === '\t') {
      if (any) words.push(cur);
      cur = '';
      any = false;
    } else {
      cur += c;
      any = true;
    }
  }
  if (any) words.push(cur);
  return words;
}

/** Parses iptables-save (or -save -c) output: comments and counters are dropped. */
export function parseIptablesSave(dump: string): SavedTable[] {
  const tables: SavedTable[] = [];
  let cur: SavedTable | undefined;
  for (const raw of dump.split('\n')) {
    // `iptables-save -c` puts [packets:bytes] before each rule.
    const line = raw.trim().replace(/^\[\d+:\d+\]\s+/, '');
    if (line === '' || line.startsWith('#')) continue;
    if (line.startsWith('*')) {
      cur = { name: line.slice(1), chains: [], policies: [], rules: [] };
      tables.push(cur);
    } else if (line === 'COMMIT') {
      cur = undefined;
    } else if (cur && line.startsWith(':')) {
      const [name, policy] = line.slice(1).split(/\s+/);
      if (name) cur.chains.push(name);
      if (name && policy && policy !== '-') cur.policies.push(line);
    } else if (cur && line.startsWith('-A ')) {
      const words = ruleWords(line);
      const chain = words[1];
      if (!chain) continue;
      let target: string | undefined;
      for (let i = 2; i < words.length - 1; i++) {
        const w = words[i];
        if (w === '-j' || w === '--jump' || w === '-g' || w === '--goto') target = words[i + 1];
      }
      cur.rules.push({ chain, line, target });
    }
  }
  return tables;
}

/** What the cleanup removes from one table. */
export interface TablePlan {
  readonly table: string;
  /** kube-proxy's chains that exist, flushed and deleted. */
  readonly chains: string[];
  /** The rules inside them (gone with the flush). */
  readonly chainRules: number;
  /** Rules in chains that stay which jump (or go) to a removed chain, as iptables-save printed them. */
  readonly jumps: string[];
}

export interface IptablesPlan {
  /** Only the tables with something to remove. */
  readonly tables: TablePlan[];
  /** The input for `iptables-restore --noflush`; '' when there is nothing to do. */
  readonly script: string;
}

export interface PlanOptions {
  /**
   * Restate the built-in chains' policies with their saved counters (the
   * dump must come from `-save -c`). For the legacy backend: libiptc zeroes
   * the policy counters of every table it commits (rule counters it keeps);
   * iptables-nft keeps both, so there they are left alone. The packets a
   * policy counts between the save and the restore (milliseconds) are lost.
   */
  readonly restatePolicies?: boolean;
}

/**
 * The cleanup of one backend and family, from its iptables-save dump: for
 * each of filter, nat and mangle, delete the jump rules, flush and delete
 * kube-proxy's chains. Other tables (raw, security) are never named.
 */
export function planIptablesCleanup(dump: string, opts: PlanOptions = {}): IptablesPlan {
  const tables: TablePlan[] = [];
  const out: string[] = [];
  // In one order whatever the dump's (iptables-nft-save lists tables in creation order).
  const order = (name: string): number => (KUBE_PROXY_TABLES as readonly string[]).indexOf(name);
  const saved = parseIptablesSave(dump).filter((t) => order(t.name) >= 0).sort((a, b) => order(a.name) - order(b.name));
  for (const t of saved) {
    const chains = t.chains.filter((c) => isKubeProxyChain(t.name, c));
    if (chains.length === 0) continue;
    const removed = new Set(chains);
    const jumps = t.rules.filter((r) => !removed.has(r.chain) && r.target !== undefined && removed.has(r.target)).map((r) => r.line);
    const chainRules = t.rules.filter((r) => removed.has(r.chain)).length;
    tables.push({ table: t.name, chains, chainRules, jumps });
    out.push(`*${t.name}`);
    if (opts.restatePolicies) out.push(...t.policies);
    for (const j of jumps) out.push(`-D ${j.slice(3)}`);
    for (const c of chains) out.push(`:${c} - [0:0]`);
    for (const c of chains) out.push(`-X ${c}`);
    out.push('COMMIT');
  }
  return { tables, script: out.length > 0 ? `${out.join('\n')}\n` : '' };
}

// ---- the runner ------------------------------------------------------------

export interface ExecResult {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs a binary (already resolved to a path) with optional stdin. Injected in tests. */
export type Exec = (file: string, args: readonly string[], input?: string) => ExecResult;

const realExec: Exec = (file, args, input) => {
  const r = spawnSync(file, args, { input, encoding: 'utf8', maxBuffer: 1 << 30, timeout: 120_000 });
  if (r.error) return { code: null, stdout: '', stderr: r.error.message };
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
};

/** The binary's path: $PATH first, then /usr/sbin and /sbin (a non-login root shell may lack them). */
export function findBinary(name: string, pathEnv = process.env.PATH ?? ''): string | undefined {
  for (const dir of [...pathEnv.split(':').filter(Boolean), '/usr/sbin', '/sbin']) {
    const p = path.join(dir, name);
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      /* next */
    }
  }
  return undefined;
}

export interface BackendResult {
  /** e.g. "iptables legacy IPv4" or "nftables". */
  readonly what: string;
  /** Not run: the binary is missing or could not read the rules. */
  readonly skipped?: string;
  readonly error?: string;
  readonly tables: TablePlan[];
}

export interface NftResult {
  readonly skipped?: string;
  readonly errors: string[];
  readonly removed: Array<{ family: string; chains: number; sets: number; maps: number }>;
}

export interface KubeProxyCleanupReport {
  readonly iptables: BackendResult[];
  readonly nftables: NftResult;
  /** What the ipvs mode left that this cleanup does not remove (docs/cleanup.md). */
  readonly ipvsNotes: string[];
}

export interface CleanupDeps {
  exec?: Exec;
  which?: (name: string) => string | undefined;
  /** For the ipvs notes; the real /sys and /proc by default. */
  readFile?: (p: string) => string | undefined;
}

const firstLine = (s: string): string => s.trim().split('\n')[0] ?? '';

const BACKENDS = [
  { backend: 'legacy', family: 'IPv4', bin: 'iptables-legacy' },
  { backend: 'legacy', family: 'IPv6', bin: 'ip6tables-legacy' },
  { backend: 'nft', family: 'IPv4', bin: 'iptables-nft' },
  { backend: 'nft', family: 'IPv6', bin: 'ip6tables-nft' },
] as const;

function cleanupIptables(exec: Exec, which: (n: string) => string | undefined): BackendResult[] {
  return BACKENDS.map(({ backend, family, bin }) => {
    const what = `iptables ${backend} ${family}`;
    const save = which(`${bin}-save`);
    const restore = which(`${bin}-restore`);
    if (!save || !restore) return { what, skipped: `${!save ? `${bin}-save` : `${bin}-restore`} not found`, tables: [] };
    // A full save lists only the tables that exist (naming one with -t would
    // create it with the legacy backend).
    const dump = exec(save, ['--counters']);
    if (dump.code !== 0) return { what, skipped: `${bin}-save failed: ${firstLine(dump.stderr) || `exit ${dump.code}`}`, tables: [] };
    const plan = planIptablesCleanup(dump.stdout, { restatePolicies: backend === 'legacy' });
    if (plan.script === '') return { what, tables: [] };
    const r = exec(restore, ['--noflush', '--counters'], plan.script);
    if (r.code !== 0) return { what, error: `${bin}-restore failed: ${r.stderr.trim() || `exit ${r.code}`}`, tables: plan.tables };
    return { what, tables: plan.tables };
  });
}

/** Counts the chains, sets and maps of `nft -t list table` output. */
export function countNftTable(listing: string): { chains: number; sets: number; maps: number } {
  let chains = 0;
  let sets = 0;
  let maps = 0;
  for (const l of listing.split('\n')) {
    const w = l.trim().split(/\s+/)[0];
    if (w === 'chain') chains++;
    else if (w === 'set') sets++;
    else if (w === 'map') maps++;
  }
  return { chains, sets, maps };
}

function cleanupNftables(exec: Exec, which: (n: string) => string | undefined): NftResult {
  const nft = which('nft');
  if (!nft) return { skipped: 'nft not found', errors: [], removed: [] };
  const list = exec(nft, ['list', 'tables']);
  if (list.code !== 0) return { skipped: `nft list tables failed: ${firstLine(list.stderr) || `exit ${list.code}`}`, errors: [], removed: [] };
  const present = new Set(list.stdout.split('\n').map((l) => l.trim()));
  const result: NftResult = { errors: [], removed: [] };
  for (const family of ['ip', 'ip6']) {
    if (!present.has(`table ${family} kube-proxy`)) continue;
    const listing = exec(nft, ['-t', 'list', 'table', family, 'kube-proxy']);
    const counts = countNftTable(listing.code === 0 ? listing.stdout : '');
    const del = exec(nft, ['delete', 'table', family, 'kube-proxy']);
    // Gone in between (kube-proxy's own cleanup, say): nothing left to remove.
    if (del.code !== 0 && !/No such file or directory/.test(del.stderr)) {
      result.errors.push(`nft delete table ${family} kube-proxy failed: ${del.stderr.trim() || `exit ${del.code}`}`);
    } else if (del.code === 0) {
      result.removed.push({ family, ...counts });
    }
  }
  return result;
}

const realRead = (p: string): string | undefined => {
  try {
    return readFileSync(p, 'utf8');
  } catch {
    return undefined;
  }
};

/**
 * The ipvs mode's leftovers outside iptables, reported and left in place:
 * the kube-ipvs0 dummy device (it holds every ClusterIP as a local address)
 * and IPVS virtual services. Removing them needs ipvsadm (or IPVS netlink)
 * and ipset; `kube-proxy --cleanup` does all of it.
 */
function ipvsNotes(read: (p: string) => string | undefined): string[] {
  const notes: string[] = [];
  if (read('/sys/class/net/kube-ipvs0/ifindex') !== undefined) {
    notes.push('the kube-ipvs0 device (kube-proxy ipvs mode) remains: `ip link delete kube-ipvs0` once its IPVS services are gone');
  }
  const ipvs = read('/proc/net/ip_vs');
  const services = ipvs?.split('\n').filter((l) => /^(TCP|UDP|SCTP|FWM)\s/.test(l)).length ?? 0;
  if (services > 0) notes.push(`${services} IPVS virtual services remain (kube-proxy ipvs mode?): \`ipvsadm --clear\` or \`kube-proxy --cleanup\` removes them and its KUBE-* ipsets`);
  return notes;
}

/** Removes kube-proxy's iptables chains and nftables tables; never throws for a missing tool. */
export function cleanupKubeProxy(deps: CleanupDeps = {}): KubeProxyCleanupReport {
  const exec = deps.exec ?? realExec;
  const which = deps.which ?? ((n: string) => findBinary(n));
  return {
    iptables: cleanupIptables(exec, which),
    nftables: cleanupNftables(exec, which),
    ipvsNotes: ipvsNotes(deps.readFile ?? realRead),
  };
}

const plural = (n: number, one: string, many = `${one}s`): string => `${n} ${n === 1 ? one : many}`;

/** The report as `lbctl cleanup --kube-proxy` prints it, one line per backend. */
export function formatReport(r: KubeProxyCleanupReport): string[] {
  const lines: string[] = [];
  for (const b of r.iptables) {
    if (b.skipped) {
      lines.push(`kube-proxy ${b.what}: skipped (${b.skipped})`);
      continue;
    }
    const parts = b.tables.map((t) => `${t.table}: ${plural(t.chains.length, 'chain')} (${plural(t.chainRules, 'rule')}), ${plural(t.jumps.length, 'jump rule')}`);
    if (b.error) lines.push(`kube-proxy ${b.what}: NOT removed: ${parts.join('; ')}: ${b.error}`);
    else lines.push(`kube-proxy ${b.what}: ${parts.length > 0 ? `removed ${parts.join('; ')}` : 'nothing to remove'}`);
  }
  const n = r.nftables;
  if (n.skipped) lines.push(`kube-proxy nftables: skipped (${n.skipped})`);
  else {
    const parts = n.removed.map((t) => `table ${t.family} kube-proxy (${plural(t.chains, 'chain')}, ${plural(t.sets, 'set')}, ${plural(t.maps, 'map')})`);
    lines.push(`kube-proxy nftables: ${parts.length > 0 ? `removed ${parts.join(', ')}` : 'nothing to remove'}`);
    for (const e of n.errors) lines.push(`kube-proxy nftables: ${e}`);
  }
  for (const note of r.ipvsNotes) lines.push(`kube-proxy ipvs: not removed: ${note}`);
  return lines;
}

/** Whether any removal failed (a missing tool is not a failure). */
export const reportFailed = (r: KubeProxyCleanupReport): boolean => r.iptables.some((b) => b.error !== undefined) || r.nftables.errors.length > 0;
