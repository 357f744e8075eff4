// scripts/vmtest/verify-objects.mjs, the first step on every kernel of the
// vmtest matrix: an object the verifier refuses fails the run, and the
// output names the object, the program and the verifier's last lines (the
// kernel's name is added by vmtest.sh in front of each such line).
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { ROOT } from '../helpers/sandbox.js';

const SCRIPT = path.join(ROOT, 'scripts/vmtest/verify-objects.mjs');
const ARCH_INC = `/usr/include/${execFileSync('gcc', ['-dumpmachine'], { encoding: 'utf8' }).trim()}`;

t.test('a program the verifier refuses: exit 1, naming the object, the program and the verifier', async (t) => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'lbctl-verify-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(path.join(dir, 'bad.c'), `
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "GPL";
SEC("cgroup/connect4")
int good_one(struct bpf_sock_addr *ctx) { return 1; }
SEC("cgroup/connect4")
int reads_past_the_stack(struct bpf_sock_addr *ctx)
{
	volatile char buf[8] = {};
	return buf[ctx->user_port & 0xff];
}
`);
  const obj = path.join(dir, 'bad.bpf.o');
  execFileSync('clang', ['-O2', '-g', '-target', 'bpf', `-I${ARCH_INC}`, '-c', path.join(dir, 'bad.c'), '-o', obj]);
  const r = spawnSync('node', [SCRIPT, obj, path.join(ROOT, 'bpf/.output/sock_compat.bpf.o')], { encoding: 'utf8' });
  t.equal(r.status, 1, 'the run fails');
  t.match(r.stdout, new RegExp(`^verifier: FAIL ${obj.replace(/[.]/g, '\\.')} program reads_past_the_stack: EINVAL`, 'm'), 'the object and the program are named');
  t.match(r.stdout, /^verifier: {3}\| .*(invalid variable-offset read from stack|invalid indirect read|variable stack access)/m, "the verifier's own words follow");
  t.match(r.stdout, /^verifier: ok {3}sock_compat\.bpf\.o: 11 programs loaded$/m, 'the other object still went through');
  t.match(r.stdout, /^verifier: 1 passed, 1 failed$/m);
});

t.test("this tree's objects all pass on this kernel, with the feature probe", async (t) => {
  const r = spawnSync('node', [SCRIPT], { encoding: 'utf8' });
  t.equal(r.status, 0, r.status === 0 ? 'exit 0' : r.stdout.split('\n').filter((l) => /FAIL|\|/.test(l)).join('\n'));
  t.match(r.stdout, /^features: kernel \S+: all 15 required features present; optional: set_retval=(yes|no) sock_destroy_kfunc=(yes|no) inet_diag_destroy=(yes|no) tcx=(yes|no)$/m);
  t.match(r.stdout, /^udp-termination: (bpf-sock-destroy|inet-diag|none): /m);
});
