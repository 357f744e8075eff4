// The docs stay pages a user reads in minutes (issue 35): no page over 500
// lines, docs/benchmarks.md within 400 (run records live in bench/results/),
// the README within 150; and every relative link between them resolves.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import t from 'tap';

const ROOT = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');
const LIMITS: Record<string, number> = { 'README.md': 150, 'docs/benchmarks.md': 400 };
const pages = ['README.md', ...readdirSync(path.join(ROOT, 'docs')).filter((f) => f.endsWith('.md')).map((f) => `docs/${f}`)];

for (const page of pages) {
  const text = readFileSync(path.join(ROOT, page), 'utf8');
  const lines = text.split('\n').length - (text.endsWith('\n') ? 1 : 0);
  const limit = LIMITS[page] ?? 500;
  t.ok(lines <= limit, `${page}: ${lines} lines, at most ${limit}`);
  for (const m of text.matchAll(/\]\(([^)#\s]+)(#[^)\s]*)?\)/g)) {
    const target = m[1]!;
    if (/^[a-z]+:/.test(target)) continue; // https:, mailto:
    const resolved = path.join(ROOT, path.dirname(page), target);
    t.ok(existsSync(resolved), `${page} links to ${target}, which exists`);
  }
}
