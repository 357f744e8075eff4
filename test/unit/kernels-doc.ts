// scripts/vmtest/kernels-doc.mjs: docs/kernels.md's rows are checked against
// what a vmtest run found on each kernel, so the page cannot drift: the same
// facts pass (a newer Debian point release of the same kernel only noted),
// a different fact fails naming the kernel and the column.
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';

const ROOT = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');
const SCRIPT = path.join(ROOT, 'scripts/vmtest/kernels-doc.mjs');
const row = readFileSync(path.join(ROOT, 'docs/kernels.md'), 'utf8').split('\n').find((l) => l.startsWith('| bullseye-5.10 |'))!;
const release = row.split('|')[2]!.trim();

/** A log directory as vmtest.sh leaves it, with the facts 5.10 gave. */
function run(facts: string): { status: number | null; stderr: string } {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'lbctl-kdoc-'));
  try {
    const logs = path.join(dir, '20260101-000000-bullseye-5.10');
    mkdirSync(logs);
    writeFileSync(path.join(logs, 'facts'), facts);
    return spawnSync('node', [SCRIPT, logs], { encoding: 'utf8' });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const FACTS = (rel: string, tcx = 'no', errno = 'EPERM'): string => `verifier: fallback sock.bpf.o: no bpf_set_retval on this kernel; sock_compat.bpf.o is used instead (refusals are EPERM)
features: kernel ${rel}: all 15 required features present; optional: set_retval=no sock_destroy_kfunc=no inet_diag_destroy=yes tcx=${tcx}
feature: tcx ${tcx}: tc programs attach through clsact and cls_bpf (EINVAL)
udp-termination: inet-diag: the kernel has no bpf_sock_destroy kfunc (before 6.5); SOCK_DESTROY over inet_diag netlink works
kernel: ${rel}
measured: refused-connect ${errno} sock_compat.bpf.o
`;

t.test('the facts the page states pass', async (t) => {
  const r = run(FACTS(release));
  t.equal(r.status, 0, r.stderr);
  t.match(r.stderr, /agrees with this run/);
});

t.test('a newer Debian build of the same kernel is noted, not failed', async (t) => {
  const r = run(FACTS(release.replace(/^(\d+\.\d+)\.0-\d+/, '$1.0-99')));
  t.equal(r.status, 0, r.stderr);
  t.match(r.stderr, /note: bullseye-5\.10 ran 5\.10\.0-99-amd64/);
});

t.test('a different fact fails, naming the kernel and the column', async (t) => {
  const r = run(FACTS(release, 'no', 'ECONNREFUSED'));
  t.equal(r.status, 1);
  t.match(r.stderr, /row for bullseye-5\.10 differs from this run in: a refused connect returns/);
  const other = run(FACTS('5.15.0-1-amd64'));
  t.equal(other.status, 1, 'another kernel altogether fails');
  t.match(other.stderr, /differs from this run in: release/);
});
