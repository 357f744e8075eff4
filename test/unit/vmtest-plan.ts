// scripts/vmtest/plan.mjs: which test files each kernel runs. Files that
// can only run where the host cannot (SCTP: the host kernel has no sctp
// module, so test/e2e/sctp.ts SKIPs there) must be in make test's guests.
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const SCRIPT = path.join(ROOT, 'scripts/vmtest/plan.mjs');

function plan(...groups: string[]): string[] {
  const r = spawnSync(process.execPath, [SCRIPT, ...groups], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`plan.mjs ${groups.join(' ')}: ${r.stderr}`);
  return r.stdout.split('\n').filter(Boolean);
}

t.test('make test runs the SCTP suites in a guest', async (t) => {
  // make test's columns of scripts/vmtest/kernels: 5.10 kernel,e2e:1/2; 6.1 kernel,e2e:2/2; 6.12 bpf-unit
  const guests = [...plan('kernel', 'e2e:1/2'), ...plan('kernel', 'e2e:2/2')];
  t.equal(guests.filter((f) => f === 'test/e2e/sctp.ts').length, 1, 'test/e2e/sctp.ts: in exactly one part of the 5.10/6.1 split');
  t.ok(plan('kernel').includes('test/bpf'), 'test/bpf/sctp-csum.ts: in test/bpf, which 5.10 and 6.1 run whole');
  t.ok(plan('bpf-unit').includes('test/bpf/sctp-csum.ts'), 'and among the units 6.12 runs');
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
