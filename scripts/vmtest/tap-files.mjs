#!/usr/bin/env node
// Runs tap test files one after another, each as its own node process (from
// its bundle, or else through the TypeScript loader), and writes one TAP
// stream in the shape tap's runner gives (`# Subtest: FILE`, its output
// indented, `ok N - FILE # time=...`, and a `# { total, pass, fail }`
// summary: total is passed plus failed assertions, skip and todo apart),
// for the vmtest guest (scripts/vmtest/suites.sh).
//
// Why not tap's runner there: it starts each file, and through NODE_OPTIONS
// every node a test starts in turn, with @tapjs/processinfo's import, a
// loader thread that records processes for coverage (off in this project).
// Under TCG that import costs about 10 s a node start (a CLI start took 13 s
// with it, 3 s without), and one trivial file took 40 s through the runner.
// The files are the same tap tests; on the host, make test still runs them
// through tap's runner.
//
// Usage: node scripts/vmtest/tap-files.mjs [--timeout SECONDS] [--bundles DIR] PATH...
//   PATH: a test file, or a directory whose .ts files (recursively) are run.
//   DIR: where scripts/vmtest/bundle-tests.mjs wrote the files' bundles
//   (test/e2e/x.ts runs as DIR/test/e2e/x.mjs); a file without one runs
//   through the TypeScript loader.
// Exits 1 when any file fails, ends by a signal or times out.
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';

const args = process.argv.slice(2);
let timeoutS = 1200;
let bundles;
while (args[0]?.startsWith('--')) {
  const [flag, value] = args.splice(0, 2);
  if (flag === '--timeout') timeoutS = Number(value);
  else if (flag === '--bundles') bundles = value;
  if ((flag !== '--timeout' && flag !== '--bundles') || !(timeoutS > 0) || !value) {
    console.error('tap-files: usage: tap-files.mjs [--timeout SECONDS] [--bundles DIR] PATH...');
    process.exit(2);
  }
}

function expand(p) {
  if (!statSync(p).isDirectory()) return [p];
  return readdirSync(p, { withFileTypes: true })
    .sort((a, b) => a.name.localeCompare(b.name))
    .flatMap((e) => (e.isDirectory() ? expand(path.join(p, e.name)) : e.name.endsWith('.ts') ? [path.join(p, e.name)] : []));
}

const files = [...new Set(args.flatMap(expand))];
const fileEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== 'TAP' && !k.startsWith('TAP_')));
const out = (s) => process.stdout.write(s);

/** Runs one file; resolves with its summary counts (from its own `# { total, pass }` line), how it ended and its time. */
function runFile(file) {
  const t0 = performance.now();
  return new Promise((resolve) => {
    // The file's bundle when there is one (scripts/vmtest/bundle-tests.mjs), else the file through the TypeScript loader.
    const bundle = bundles && path.join(bundles, file.replace(/\.ts$/, '.mjs'));
    const argv = bundle && existsSync(bundle) ? [bundle] : ['--import=@tapjs/typescript/import', file];
    const child = spawn(process.execPath, ['--enable-source-maps', ...argv], {
      stdio: ['ignore', 'pipe', 'pipe'],
      // This is the runner: a TAP or TAP_* variable from around it (run from
      // a tap test) would make the file report to a runner that is not there.
      // tap's root test times out after TAP_TIMEOUT seconds (30 when unset);
      // tap's runner sets it from --timeout, as this does.
      env: { ...fileEnv, TS_NODE_TRANSPILE_ONLY: '1', TAP_TIMEOUT: String(timeoutS) },
    });
    let summary;
    let pending = '';
    const line = (l, stream) => {
      // The root test's summary, e.g. `# { total: 3, pass: 1, todo: 1, skip: 1 }`.
      if (stream === 'stdout' && l.startsWith('# { total: ')) {
        const n = (k) => Number(new RegExp(`\\b${k}: (\\d+)`).exec(l)?.[1] ?? 0);
        summary = { pass: n('pass'), fail: n('fail'), skip: n('skip'), todo: n('todo') };
      }
      out(stream === 'stdout' ? `    ${l}\n` : `    # stderr: ${l}\n`);
    };
    const feed = (stream) => (d) => {
      const text = (stream === 'stdout' ? pending : '') + d.toString();
      const lines = text.split('\n');
      const rest = lines.pop();
      if (stream === 'stdout') pending = rest;
      else if (rest) lines.push(rest);
      for (const l of lines) line(l, stream);
    };
    child.stdout.on('data', feed('stdout'));
    child.stderr.on('data', feed('stderr'));
    // A file that outlives the root test's own timeout: SIGTERM by its pid, SIGKILL a minute later.
    let timedOut = false;
    const kill = setTimeout(() => {
      timedOut = true;
      child.kill('SIGTERM');
      setTimeout(() => child.kill('SIGKILL'), 60_000).unref();
    }, (timeoutS + 60) * 1000);
    child.on('close', (code, signal) => {
      clearTimeout(kill);
      if (pending) line(pending, 'stdout');
      resolve({ summary, code, signal, timedOut, ms: performance.now() - t0 });
    });
  });
}

// The summary counts assertions that passed and failed; skipped and todo
// ones are counted apart, as they neither pass nor fail.
const start = performance.now();
const sum = { pass: 0, fail: 0, skip: 0, todo: 0 };
let failed = 0;
out('TAP version 14\n');
for (const [i, file] of files.entries()) {
  out(`# Subtest: ${file}\n`);
  const r = await runFile(file);
  const ok = r.code === 0 && r.summary !== undefined && r.summary.fail === 0;
  for (const k of Object.keys(sum)) sum[k] += r.summary?.[k] ?? 0;
  if (!ok) failed++;
  // A file that failed with no failed assertion of its own (no summary, a
  // signal, a non-zero exit after passing) counts as one failed assertion.
  if (!ok && !r.summary?.fail) sum.fail++;
  const why = ok ? ''
    : r.timedOut ? ` # timed out after ${timeoutS} s`
    : r.signal ? ` # killed by ${r.signal}`
    : ` # exit ${r.code}${r.summary === undefined ? ', no summary' : ''}`;
  out(`${ok ? 'ok' : 'not ok'} ${i + 1} - ${file}${why} # time=${r.ms.toFixed(3)}ms\n\n`);
}
out(`1..${files.length}\n`);
const extra = ['fail', 'skip', 'todo'].filter((k) => sum[k] > 0).map((k) => `, ${k}: ${sum[k]}`).join('');
out(`# { total: ${sum.pass + sum.fail}, pass: ${sum.pass}${extra} }\n`);
out(`# time=${(performance.now() - start).toFixed(3)}ms\n`);
process.exit(failed ? 1 : 0);
