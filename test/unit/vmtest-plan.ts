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
