// `make demo` end to end: scripts/demo.sh builds its own sandbox on
// examples/, drives curl and dig through the services, and must exit 0 and
// leave nothing behind.
import t from 'tap';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { cgroup2Mount, ROOT, run, SLOW } from '../helpers/sandbox.js';

t.test('scripts/demo.sh succeeds and cleans up after itself', async (t) => {
  // About 4 s here; the emulated vmtest guest (SLOW) is many times slower.
  const r = await run('bash', [path.join(ROOT, 'scripts/demo.sh')], 90_000 * SLOW);
  t.equal(r.code, 0, `demo exits 0${r.code === 0 ? '' : `:\n${r.stdout.slice(-3000)}\n${r.stderr.slice(-2000)}`}`);
  t.match(r.stdout, /demo: OK/, 'and says so');
  for (const b of ['web-1 10.244.1.1', 'web-2 10.244.1.2', 'web-3 10.244.1.3']) t.match(r.stdout, b, `the spread lists ${b}`);
  t.match(r.stdout, /10\.96\.0\.53:53\/UDP/, 'lbctl bpf lb list is printed');
  t.match(r.stdout, /xlate_fwd\s+\d+/, 'lbctl bpf metrics list is printed');
  t.comment(`demo took ${Math.round(r.ms)} ms`);

  const runId = /run id (lbctl-demo-\d+)/.exec(r.stdout)?.[1];
  t.ok(runId, 'the demo names its run');
  const left = [
    path.join('/sys/fs/bpf', runId!),
    path.join(cgroup2Mount(), runId!),
    path.join('/run/netns', `${runId}-c`),
    path.join('/run/netns', `${runId}-b`),
    path.join('/etc/netns', `${runId}-c`),
    path.join('/tmp', runId!),
  ].filter((p) => existsSync(p));
  t.same(left, [], 'no bpf root, cgroup, netns or temp dir is left');
  t.notOk(readdirSync('/proc').some((pid) => /^\d+$/.test(pid) && procCmdline(pid).includes(runId!)), 'no process of the run is left');
});

function procCmdline(pid: string): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8');
  } catch {
    return '';
  }
}
