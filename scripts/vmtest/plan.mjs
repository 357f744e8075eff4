#!/usr/bin/env node
// Which test files one kernel of the matrix runs: expands the groups of a
// row of scripts/vmtest/kernels into tap paths, one per line.
//
//   all        every group below
//   kernel     test/native and test/bpf: the addon, BPF_PROG_TEST_RUN units,
//              the real datapath object (the verifier runs on every kernel
//              anyway, before the suites)
//   native     test/native alone
//   bpf        test/bpf alone
//   bpf-unit   the BPF_PROG_TEST_RUN unit suites, the verifier's own test and
//              the tc object's instruction budget: what every kernel must
//              run even where make test runs no more
//   e2e        every end-to-end file (in a guest, but the host-only ones below)
//   e2e:K/N    the K-th of N parts of those (but the long tc scenarios below),
//              balanced by the seconds each
//              file took in a guest (scripts/vmtest/e2e-seconds), counting
//              what each part's row runs besides (its test/native and
//              test/bpf files, by the same table): make test
//              splits the slow end-to-end files between the 5.10 and 6.1
//              guests so they run side by side within its budget, while
//              make vmtest runs them all on both.
//
// A file missing from e2e-seconds still runs (weighted as the slowest), so
// a new test is never left out of a split.
//
// Usage: node scripts/vmtest/plan.mjs [--host] GROUP...   (--host: the host row, where the host-only files run too)
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
// End-to-end files that test the agent's control plane and nothing the
// kernel does: on the host only, where they take seconds instead of the
// guest's minutes under TCG. hostile-input.ts: how the agent reads its input
// (2,000 files, 16 MiB parses); kubernetes-nodes.ts: the wait for this
// node's Node against the fake API server (three agents, multi-second graces);
// health-mesh.ts: timing against the mesh's period (sub-second margins) and
// 1,000 simulated peers; what the kernel gives it (ping and raw ICMP sockets,
// their errors) is test/native/icmp.ts, which the guests run.
// kubernetes-apiserver.ts: which requests the reflector makes and when (the
// fake API server's cache and storage, backoff across an outage), 282 s of a
// guest's budget for no kernel behaviour; the maps it reads are written by
// the same code kubernetes.ts runs in the guests. agent-start.ts: ports taken
// and signals at each stage of a start; kubelet-probes.ts: the DaemonSet's
// probes over 315 s of probe time, evaluated as the kubelet does.
const HOST_ONLY = new Set([
  'test/e2e/hostile-input.ts',
  'test/e2e/kubernetes-nodes.ts',
  'test/e2e/health-mesh.ts',
  'test/e2e/kubernetes-apiserver.ts',
  'test/e2e/agent-start.ts',
  'test/e2e/kubelet-probes.ts',
]);
// The tc datapath's long scenarios (a thousand services, restarts and an
// upgrade under load, SNAT ports waiting out TIME_WAIT, policy changes, a
// device re-made, 60 s of new connections at kube-proxy's rate, upgrades
// that carry the flows into new maps): in make test on the host, in the guests by make vmtest
// only (e2e, all), not in make test's guest split (e2e:K/N), which would
// outgrow its budget under TCG. The guests of make test still run the tc
// datapath end to end (nodeport.ts, nodeport-icmp.ts, nodeport-from-node.ts,
// nodeport-flows.ts, nodeport-networks.ts, nodeport-switch.ts, sctp.ts)
// and every BPF_PROG_TEST_RUN unit.
const VMTEST_ONLY_IN_GUESTS = new Set([
  'test/e2e/nodeport-devices.ts',
  'test/e2e/nodeport-policy.ts',
  'test/e2e/nodeport-restart.ts',
  'test/e2e/nodeport-scale.ts',
  'test/e2e/nodeport-snat.ts',
  'test/e2e/nodeport-snat-reuse.ts',
  'test/e2e/nodeport-sustained.ts',
  'test/e2e/nodeport-upgrade.ts',
]);

// End-to-end files of the agent's own behaviour, where the kernel's part is
// what other files already prove in the guests: backend probes (probes.ts:
// the agent's TCP/HTTP/gRPC/exec checks and the maps they change, 237 s of
// the 5.10 guest), drift and `lbctl status` (status-drift.ts), `lbctl
// version` (version.ts), malformed manifests (bad-input.ts: how the agent
// reads its files; full maps, the kernel's part, are map-full.ts's), `make demo` (demo.ts: the socket path that
// tcp-clusterip.ts, udp.ts and dns.ts run) and the Kubernetes source against
// the fake API server (kubernetes.ts: the maps it writes are the file
// source's). make test runs them on the host and make vmtest in every guest;
// make test's guest split leaves them out, to make room within its 80
// minutes for the real cluster (test/cluster, about 12 minutes).
const VMTEST_ONLY_AGENT = new Set([
  'test/e2e/bad-input.ts',
  'test/e2e/demo.ts',
  'test/e2e/kubernetes.ts',
  'test/e2e/probes.ts',
  'test/e2e/status-drift.ts',
  'test/e2e/version.ts',
]);

let onHost = false;

function e2eFiles() {
  return readdirSync(path.join(root, 'test/e2e'))
    .filter((f) => f.endsWith('.ts'))
    .map((f) => `test/e2e/${f}`)
    .filter((f) => onHost || !HOST_ONLY.has(f))
    .sort();
}

function seconds() {
  const table = new Map();
  const text = readFileSync(path.join(root, 'scripts/vmtest/e2e-seconds'), 'utf8');
  for (const line of text.split('\n')) {
    const m = /^\s*(\S+)\s+(\d+)\s*$/.exec(line.replace(/#.*/, ''));
    if (m) table.set(m[1], Number(m[2]));
  }
  return table;
}

/**
 * Longest first onto the least loaded part: deterministic, within 4/3 of the
 * best split. `preload`: seconds each part's guest spends on its other
 * suites (test/native, test/bpf), so the guests end together.
 */
export function split(files, weights, parts, preload = []) {
  const unknown = Math.max(0, ...[...weights].filter(([f]) => f.startsWith('test/e2e/')).map(([, w]) => w));
  const bins = Array.from({ length: parts }, (_, k) => ({ load: preload[k] ?? 0, files: [] }));
  const byWeight = [...files].sort((a, b) => (weights.get(b) ?? unknown) - (weights.get(a) ?? unknown) || a.localeCompare(b));
  for (const f of byWeight) {
    const bin = bins.reduce((min, b) => (b.load < min.load ? b : min), bins[0]);
    bin.load += weights.get(f) ?? unknown;
    bin.files.push(f);
  }
  return bins.map((b) => ({ load: b.load, files: b.files.sort() }));
}

const BPF_UNIT = ['test/bpf/sock-unit.ts', 'test/bpf/sock-destroy.ts', 'test/bpf/nodeport-unit.ts', 'test/bpf/nodeport-nonlinear.ts', 'test/bpf/nodeport-budget.ts',
  'test/bpf/maglev.ts', 'test/bpf/sctp-csum.ts', 'test/bpf/verify-objects.ts'];

/** The paths a group other than an e2e split stands for. */
function paths(g) {
  if (g === 'all') return ['test/native', 'test/bpf', ...e2eFiles()];
  if (g === 'kernel') return ['test/native', 'test/bpf'];
  if (g === 'native') return ['test/native'];
  if (g === 'bpf') return ['test/bpf'];
  if (g === 'bpf-unit') return BPF_UNIT;
  if (g === 'e2e') return e2eFiles();
  return undefined;
}

/** The seconds a guest spends on `groups` but its e2e split: the files of test/native and test/bpf, by e2e-seconds. */
function otherSeconds(groups, weights) {
  let sum = 0;
  for (const p of groups.flatMap((g) => paths(g) ?? [])) {
    const files = p.endsWith('.ts') ? [p] : readdirSync(path.join(root, p)).filter((f) => f.endsWith('.ts')).map((f) => `${p}/${f}`);
    for (const f of files) sum += weights.get(f) ?? 0;
  }
  return sum;
}

/**
 * What the other parts of an N-way split run besides it, from the matrix's
 * column in use (VMTEST_PROFILE=test: MAKE-TEST, else VMTEST): each part's
 * head start in seconds.
 */
function preloads(n, weights) {
  const out = Array.from({ length: n }, () => 0);
  const column = process.env.VMTEST_PROFILE === 'test' ? 3 : 2;
  for (const line of readFileSync(path.join(root, 'scripts/vmtest/kernels'), 'utf8').split('\n')) {
    if (!line.trim() || line.startsWith('#')) continue;
    const groups = (line.trim().split(/\s+/)[column] ?? '').split(',');
    for (const g of groups) {
      const m = /^e2e:(\d+)\/(\d+)$/.exec(g);
      if (m && Number(m[2]) === n && Number(m[1]) <= n) out[Number(m[1]) - 1] = otherSeconds(groups.filter((x) => x !== g), weights);
    }
  }
  return out;
}

export function expand(groups, host = false) {
  onHost = host;
  const out = [];
  for (const g of groups) {
    const p = paths(g);
    if (p) {
      out.push(...p);
      continue;
    }
    const m = /^e2e:(\d+)\/(\d+)$/.exec(g);
    if (!m || Number(m[1]) < 1 || Number(m[1]) > Number(m[2])) throw new Error(`unknown suite group '${g}' (all, kernel, native, bpf, bpf-unit, e2e, e2e:K/N)`);
    const files = e2eFiles().filter((f) => onHost || (!VMTEST_ONLY_IN_GUESTS.has(f) && !VMTEST_ONLY_AGENT.has(f)));
    const weights = seconds();
    out.push(...split(files, weights, Number(m[2]), preloads(Number(m[2]), weights))[Number(m[1]) - 1].files);
  }
  return [...new Set(out)];
}

if (import.meta.url === `file://${process.argv[1]}`) {
  try {
    const args = process.argv.slice(2);
    console.log(expand(args.filter((a) => a !== '--host'), args.includes('--host')).join('\n'));
  } catch (err) {
    console.error(`plan: ${err.message}`);
    process.exit(2);
  }
}
