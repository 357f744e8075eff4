// scripts/vmtest/plan.mjs: which test files each kernel runs. Files that
// can only run where the host cannot (SCTP: the host kernel has no sctp
// module, so test/e2e/sctp.ts SKIPs there) must be in make test's guests.
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const SCRIPT = path.join(ROOT, 'scripts/vmtest/plan.mjs');

function plan(...groups: string[]): string[] {
  const r = spawnSync(process.execPath, [SCRIPT, ...groups], { encoding: 'utf8', env: { ...process.env, VMTEST_PROFILE: 'test' } });
  if (r.status !== 0) throw new Error(`plan.mjs ${groups.join(' ')}: ${r.stderr}`);
  return r.stdout.split('\n').filter(Boolean);
}

/** make test's column of scripts/vmtest/kernels: each guest row's groups. */
function makeTestRows(): Map<string, string[]> {
  const rows = new Map<string, string[]>();
  for (const line of readFileSync(path.join(ROOT, 'scripts/vmtest/kernels'), 'utf8').split('\n')) {
    if (!line.trim() || line.startsWith('#')) continue;
    const [name, source, , test] = line.trim().split(/\s+/);
    if (source !== 'host') rows.set(name!, test!.split(','));
  }
  return rows;
}

/** The seconds scripts/vmtest/e2e-seconds gives what `files` (paths from plan.mjs) run. */
function seconds(files: readonly string[]): number {
  const w = new Map<string, number>();
  for (const line of readFileSync(path.join(ROOT, 'scripts/vmtest/e2e-seconds'), 'utf8').split('\n')) {
    const m = /^\s*(\S+)\s+(\d+)\s*$/.exec(line.replace(/#.*/, ''));
    if (m) w.set(m[1]!, Number(m[2]));
  }
  let sum = 0;
  for (const p of files) {
    if (p.endsWith('.ts')) sum += w.get(p) ?? 0;
    else for (const f of readdirSync(path.join(ROOT, p))) if (f.endsWith('.ts')) sum += w.get(`${p}/${f}`) ?? 0;
  }
  return sum;
}

t.test('make test runs the SCTP suites in a guest', async (t) => {
  const guests = [...makeTestRows().values()].map((groups) => plan(...groups));
  t.equal(guests.flat().filter((f) => f === 'test/e2e/sctp.ts').length, 1, 'test/e2e/sctp.ts: in exactly one part of the 5.10/6.1 split');
  t.ok(guests.every((files) => files.includes('test/bpf') || files.includes('test/bpf/sctp-csum.ts')), 'test/bpf/sctp-csum.ts: on every guest');
});

t.test("make test's guests: the addon's suites on the lowest kernel, the units everywhere, and the split balanced with what else each runs", async (t) => {
  const rows = makeTestRows();
  const [lowest] = rows.keys();
  const runs = new Map([...rows].map(([name, groups]) => [name, plan(...groups)]));
  t.ok(runs.get(lowest!)!.includes('test/native'), `test/native on ${lowest}, the lowest kernel`);
  for (const [name, files] of runs) {
    for (const unit of ['test/bpf/nodeport-unit.ts', 'test/bpf/nodeport-budget.ts', 'test/bpf/verify-objects.ts', 'test/bpf/maglev.ts']) {
      t.ok(files.includes('test/bpf') || files.includes(unit), `${unit} on ${name}`);
    }
  }
  t.equal([...runs.values()].filter((f) => f.includes('test/bpf') || f.includes('test/bpf/datapath.ts')).length >= 1, true, 'test/bpf/datapath.ts on a guest');
  const split = [...runs].filter(([name]) => rows.get(name)!.some((g) => /^e2e:\d+\/\d+$/.test(g)));
  const loads = split.map(([, files]) => seconds(files));
  t.ok(Math.max(...loads) <= 1.15 * Math.min(...loads), `the split's guests, by e2e-seconds: ${loads.join(' s, ')} s (within 15% of each other)`);
});

t.test('make test splits the kernel-facing e2e files between its guests; make vmtest runs the agent-side ones there too', async (t) => {
  const parts = [plan('e2e:1/2'), plan('e2e:2/2')];
  const everywhere = plan('e2e');
  for (const f of everywhere) {
    const n = parts.filter((p) => p.includes(f)).length;
    t.ok(n <= 1, `${f}: in at most one part of the split`);
  }
  for (const f of ['test/e2e/probes.ts', 'test/e2e/kubernetes.ts', 'test/e2e/demo.ts', 'test/e2e/status-drift.ts', 'test/e2e/version.ts']) {
    t.ok(everywhere.includes(f), `${f}: in make vmtest's guests`);
    t.notOk(parts.some((p) => p.includes(f)), `${f}: not in make test's guest split (the host runs it)`);
  }
  for (const f of ['test/e2e/nodeport.ts', 'test/e2e/tcp-clusterip.ts', 'test/e2e/udp.ts', 'test/e2e/dns.ts', 'test/e2e/ipv6.ts', 'test/e2e/sctp.ts']) {
    t.equal(parts.filter((p) => p.includes(f)).length, 1, `${f}: in make test's guests`);
  }
});
