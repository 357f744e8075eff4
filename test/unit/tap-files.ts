// scripts/vmtest/tap-files.mjs, the guests' test runner: what it counts
// when a file passes, fails an assertion, exits before its summary, or
// outlives its timeout, and that it runs a file's bundle in its place.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const RUNNER = path.join(ROOT, 'scripts/vmtest/tap-files.mjs');

function runner(cwd: string, args: string[]) {
  const r = spawnSync(process.execPath, [RUNNER, ...args], { cwd, encoding: 'utf8', timeout: 120_000 });
  const lines = r.stdout.split('\n');
  return {
    code: r.status,
    top: lines.filter((l) => /^(not )?ok \d+ - /.test(l)).map((l) => l.replace(/ # time=[\d.]+ms$/, '')),
    summary: lines.find((l) => l.startsWith('# { total:')),
    stdout: r.stdout,
  };
}

t.test('each file once, counted by its own summary; the runner fails when one file does', async (t) => {
  const dir = t.testdir({
    test: {
      'pass.ts': "import t from 'tap';\nt.pass('one');\nt.pass('two');\nt.test('three', { skip: 'not here' }, async () => {});\n",
      'fail.ts': "import t from 'tap';\nt.pass('one');\nt.equal(1 as number, 2, 'two');\n",
      'exit.ts': "import t from 'tap';\nt.pass('one');\nt.teardown(() => process.exit(3));\n",
      'slow.ts': "import t from 'tap';\nt.test('waits', async () => { await new Promise((r) => setTimeout(r, 10_000)); });\n",
    },
  });
  const r = runner(dir, ['--timeout', '2', 'test/pass.ts', 'test/fail.ts', 'test/exit.ts', 'test/slow.ts']);
  t.equal(r.code, 1, 'exit 1: a file failed');
  t.same(r.top, [
    'ok 1 - test/pass.ts',
    'not ok 2 - test/fail.ts # exit 1',
    'not ok 3 - test/exit.ts # exit 3, no summary',
    'not ok 4 - test/slow.ts # exit 1',
  ], 'one line a file, in order, with how a failed one ended');
  // pass.ts 2 of 2 and a skip, which neither passes nor fails; fail.ts 1 of
  // 2; exit.ts ended before its summary: one failed assertion for it;
  // slow.ts: tap's own timeout (TAP_TIMEOUT, from --timeout) failed its one
  // subtest.
  t.match(r.summary, /^# \{ total: 6, pass: 3, fail: 3, skip: 1 \}$/, 'the assertions of every file, and one for a file that ended without its summary');
  t.match(r.stdout, /^# Subtest: test\/fail\.ts\n {4}TAP version 14\n/m, "a file's own TAP follows its Subtest line, indented");
  t.match(r.stdout, /^1\.\.4$/m, 'the plan counts files');
});

t.test('every .ts under a directory; a file with a bundle runs from the bundle', async (t) => {
  const dir = t.testdir({
    test: { d: { 'a.ts': "import t from 'tap';\nt.pass('from the source');\n", 'b.ts': "import t from 'tap';\nt.pass('b');\n", 'helper.js': '' } },
  });
  mkdirSync(path.join(dir, 'bundles/test/d'), { recursive: true });
  writeFileSync(path.join(dir, 'bundles/test/d/a.mjs'), "import t from 'tap';\nt.pass('from the bundle');\n");
  const r = runner(dir, ['--bundles', 'bundles', 'test/d']);
  t.equal(r.code, 0);
  t.same(r.top, ['ok 1 - test/d/a.ts', 'ok 2 - test/d/b.ts'], 'the directory expands to its .ts files, sorted');
  t.match(r.stdout, /ok 1 - from the bundle/, 'a.ts ran as its bundle');
  t.notMatch(r.stdout, /from the source/);
  t.match(r.summary, /^# \{ total: 2, pass: 2 \}$/);
});

t.test('bad options are refused', async (t) => {
  const r = spawnSync(process.execPath, [RUNNER, '--timeout', 'soon', 'x.ts'], { encoding: 'utf8' });
  t.equal(r.status, 2);
  t.match(r.stderr, /usage/);
});
