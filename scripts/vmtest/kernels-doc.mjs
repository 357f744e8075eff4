#!/usr/bin/env node
// docs/kernels.md's table, checked against (or, with --write, rewritten
// from) a vmtest run: what each kernel of the matrix loads, what a refused
// connect returned there, how stale UDP sockets are destroyed, which tc
// attach mode the probe chose, and what runs there. A row whose kernel ran
// must match what the run found, so the page cannot drift from the truth.
//
// Usage: node scripts/vmtest/kernels-doc.mjs [--write] LOGDIR...
//   (LOGDIR: one per kernel, as vmtest.sh leaves them: label, facts, summary)
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const DOC = path.join(root, 'docs/kernels.md');
const BEGIN = '<!-- vmtest:begin (scripts/vmtest/kernels-doc.mjs writes and checks these rows) -->';
const END = '<!-- vmtest:end -->';
export const HEADER = [
  '| kernel | release | datapath object | a refused connect returns | stale UDP sockets are destroyed by | tc attach mode | required features | make vmtest runs | make test runs |',
  '|---|---|---|---|---|---|---|---|---|',
];

const GROUP_WORDS = { all: 'native, bpf, e2e', kernel: 'native, bpf', native: 'native', bpf: 'bpf', 'bpf-unit': 'BPF_PROG_TEST_RUN units', e2e: 'e2e' };
const groupsText = (groups) => groups.split(',').map((g) => GROUP_WORDS[g] ?? g.replace(/^e2e:(\d+)\/(\d+)$/, 'e2e part $1 of $2')).join(', ');

function matrix() {
  const rows = new Map();
  for (const line of readFileSync(path.join(root, 'scripts/vmtest/kernels'), 'utf8').split('\n')) {
    if (!line.trim() || line.startsWith('#')) continue;
    const [name, source, vm, test] = line.trim().split(/\s+/);
    rows.set(name, { name, source, vm: `verifier; ${groupsText(vm)}`, test: source === 'host' ? 'unit, native, bpf, e2e (make test-host)' : `verifier; ${groupsText(test)}` });
  }
  return rows;
}

/** One kernel's row from its log directory; undefined when it left no facts. */
export function rowFromRun(dir, m) {
  const name = path.basename(dir).replace(/^\d{8}-\d{6}-/, '');
  const file = path.join(dir, 'facts');
  if (!existsSync(file)) return undefined;
  const facts = readFileSync(file, 'utf8');
  const line = (re) => re.exec(facts)?.[1];
  const release = line(/^kernel: (\S+)/m) ?? '?';
  const compat = /^verifier: fallback sock\.bpf\.o/m.test(facts);
  const refused = line(/^measured: refused-connect (\S+)/m) ?? 'not measured';
  const udp = line(/^udp-termination: (\S+):/m) ?? '?';
  const tcx = line(/^feature: tcx (yes|no)/m);
  const req = /^features: .*all (\d+) required features present/m.exec(facts);
  const missing = line(/^features: .*MISSING ([^;]+)/m);
  const spec = m.get(name) ?? { vm: '?', test: '?', source: '?' };
  return {
    name,
    host: spec.source === 'host',
    cells: [
      name,
      release,
      compat ? 'sock_compat.bpf.o (no bpf_set_retval)' : 'sock.bpf.o',
      refused,
      { 'bpf-sock-destroy': 'iter/udp + bpf_sock_destroy kfunc', 'inet-diag': 'inet_diag SOCK_DESTROY (netlink)', none: 'none (left to the application)' }[udp] ?? udp,
      tcx === 'yes' ? 'tcx links' : tcx === 'no' ? 'clsact + cls_bpf' : '?',
      req ? `all ${req[1]}` : missing ? `MISSING ${missing}` : '?',
      spec.vm,
      spec.test,
    ],
  };
}

const render = (cells) => `| ${cells.join(' | ')} |`;
const parse = (line) => line.replace(/^\|\s*|\s*\|$/g, '').split(/\s*\|\s*/);

function main() {
  const args = process.argv.slice(2);
  const write = args[0] === '--write';
  const dirs = args.filter((a) => a !== '--write');
  const m = matrix();
  const doc = readFileSync(DOC, 'utf8');
  const b = doc.indexOf(BEGIN);
  const e = doc.indexOf(END);
  if (b < 0 || e < b) {
    console.error(`kernels-doc: ${DOC} has no table between ${BEGIN} and ${END}`);
    process.exit(1);
  }
  const documented = new Map();
  for (const l of doc.slice(b + BEGIN.length, e).split('\n')) {
    if (!l.startsWith('|') || l.startsWith('|---') || l.startsWith('| kernel |')) continue;
    const cells = parse(l);
    documented.set(cells[0], cells);
  }
  let problems = 0;
  for (const dir of dirs) {
    const row = rowFromRun(dir, m);
    if (!row) continue;
    const old = documented.get(row.name);
    // A cell the run did not measure (suites narrowed) keeps what the page says.
    const cells = row.cells.map((c, i) => (c === 'not measured' || c === '?') && old ? old[i] : c);
    if (write) {
      documented.set(row.name, cells);
      continue;
    }
    if (!old) {
      console.error(`kernels-doc: docs/kernels.md has no row for ${row.name}; the run found:\n  ${render(cells)}\n  (VMTEST_UPDATE_DOCS=1 make vmtest writes it)`);
      problems++;
      continue;
    }
    if (row.host && old[1] !== cells[1]) {
      console.error(`kernels-doc: note: this host runs ${cells[1]}, the page documents ${old[1]}: host row not checked`);
      continue;
    }
    // Debian's point releases move a suite's kernel package (6.12.117 to 6.12.119): the
    // release is checked to its major.minor, the rest noted, so the check holds when
    // a fresh machine resolves a newer package than the page names.
    const majorMinor = (r) => /^(\d+\.\d+)/.exec(r ?? '')?.[1] ?? r;
    const same = (i) => (i === 1 ? majorMinor(old[i]) === majorMinor(cells[i]) : old[i] === cells[i]);
    if (old[1] !== cells[1] && same(1)) console.error(`kernels-doc: note: ${row.name} ran ${cells[1]}, the page names ${old[1]} (VMTEST_UPDATE_DOCS=1 records it)`);
    const differ = HEADER[0].split('|').slice(1, -1).map((h) => h.trim()).filter((h, i) => !same(i));
    if (differ.length > 0) {
      console.error(`kernels-doc: docs/kernels.md's row for ${row.name} differs from this run in: ${differ.join(', ')}\n  page: ${render(old)}\n  run:  ${render(cells)}\n  (VMTEST_UPDATE_DOCS=1 make vmtest rewrites it)`);
      problems++;
    }
  }
  if (write) {
    const order = [...m.keys()];
    const rows = [...documented.values()].sort((x, y) => order.indexOf(x[0]) - order.indexOf(y[0]));
    const table = ['', ...HEADER, ...rows.map(render), ''].join('\n');
    writeFileSync(DOC, doc.slice(0, b + BEGIN.length) + table + doc.slice(e));
    console.error(`kernels-doc: wrote ${rows.length} rows to docs/kernels.md`);
    return;
  }
  if (problems > 0) process.exit(1);
  console.error(`kernels-doc: docs/kernels.md agrees with this run (${dirs.length} kernels)`);
}

main();
