// scripts/check-layers.mjs (`make check-layers`, the first step of
// `make test`): src/ against docs/architecture.md's layering table. The real
// tree passes; small trees that each break one rule (an import upward, a
// type-only import upward, a dynamic import upward, a cycle, an index.ts
// that disagrees with the table, a folder the table does not name, a table
// that allows a cycle) fail, naming the file.
import t, { type Test } from 'tap';
import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const SCRIPT = path.join(ROOT, 'scripts/check-layers.mjs');

function check(root: string): { status: number | null; out: string } {
  const r = spawnSync(process.execPath, [SCRIPT, '--root', root], { encoding: 'utf8', timeout: 60_000 });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

const table = (rows: string): string => `# Architecture\n\n| folder | owns | may import |\n|---|---|---|\n${rows}\n`;
const index = (owns: string, imports: string): string => `// ${owns}\n//\n// May import: ${imports}.\nexport {};\n`;

/** A tree under a test directory of its own: top → low → base, each folder with its index.ts and one module, plus `extra`. */
function tree(t: Test, extra: Record<string, string> = {}, rows?: string): string {
  const files: Record<string, string> = {
    'docs/architecture.md': table(rows ?? "| `src/top` | the top | low (its helper), base |\n| `src/low` | below it | base |\n| `src/base` | the bottom | nothing of lbctl's |"),
    'tsconfig.json': JSON.stringify({ compilerOptions: { module: 'NodeNext', moduleResolution: 'NodeNext', strict: true } }),
    'src/top/index.ts': index('the top', 'low, base'),
    'src/top/a.ts': "import { b } from '../low/b.js';\nimport { e } from '../base/e.js';\nexport const a = b + e;\n",
    'src/low/index.ts': index('below it', 'base'),
    'src/low/b.ts': "import { e } from '../base/e.js';\nexport const b = e;\n",
    'src/base/index.ts': index('the bottom', "nothing of lbctl's"),
    'src/base/e.ts': 'export const e = 1;\n',
    ...extra,
  };
  const dir = t.testdir();
  for (const [file, text] of Object.entries(files)) {
    mkdirSync(path.dirname(path.join(dir, file)), { recursive: true });
    writeFileSync(path.join(dir, file), text);
  }
  return dir;
}

t.test('the repository: every import of src/ is allowed by the table, and there is no cycle', async (t) => {
  const r = check(ROOT);
  t.equal(r.status, 0, r.out.trim());
});

t.test('a tree that keeps to its table passes', async (t) => {
  const r = check(tree(t));
  t.equal(r.status, 0, r.out.trim());
  t.match(r.out, /6 modules, 3 imports within src\/: every one allowed/, 'and says how much it read');
});

t.test('an import upward fails, naming the file, what it imports and what its folder may import', async (t) => {
  const r = check(tree(t, { 'src/low/up.ts': "import { a } from '../top/a.js';\nexport const up = a;\n" }));
  t.equal(r.status, 1);
  t.match(r.out, /src\/low\/up\.ts imports src\/top\/a\.ts: src\/low may import base \(docs\/architecture\.md\)/);
});

t.test('a type-only import and a dynamic import upward fail too', async (t) => {
  const r = check(
    tree(t, {
      'src/base/typed.ts': "import type { b } from '../low/b.js';\nexport type T = typeof b;\n",
      'src/base/lazy.ts': "export const lazy = async (): Promise<number> => (await import('../top/a.js')).a;\n",
    }),
  );
  t.equal(r.status, 1);
  t.match(r.out, /src\/base\/typed\.ts imports src\/low\/b\.ts: src\/base may import nothing of lbctl's/);
  t.match(r.out, /src\/base\/lazy\.ts imports src\/top\/a\.ts/);
});

t.test('an import cycle within one folder fails, naming its modules', async (t) => {
  const r = check(
    tree(t, {
      'src/low/c1.ts': "import type { C2 } from './c2.js';\nexport interface C1 { next?: C2 }\n",
      'src/low/c2.ts': "import type { C1 } from './c1.js';\nexport interface C2 { next?: C1 }\n",
    }),
  );
  t.equal(r.status, 1);
  t.match(r.out, /import cycle: src\/low\/c[12]\.ts → src\/low\/c[12]\.ts → src\/low\/c[12]\.ts/);
});

t.test("an index.ts that names other imports than the table's row fails", async (t) => {
  const r = check(tree(t, { 'src/low/index.ts': index('below it', 'top, base') }));
  t.equal(r.status, 1);
  t.match(r.out, /src\/low\/index\.ts says it may import top, base; docs\/architecture\.md says base/);
});

t.test("importing a folder's index.ts fails: modules import the file they need", async (t) => {
  const r = check(tree(t, { 'src/top/barrel.ts': "export * from '../low/index.js';\n" }));
  t.equal(r.status, 1);
  t.match(r.out, /src\/top\/barrel\.ts imports src\/low\/index\.ts/);
});

t.test('a folder without a row, and a module in no folder, fail before anything is read', async (t) => {
  let r = check(tree(t, { 'src/extra/x.ts': 'export const x = 1;\n' }));
  t.equal(r.status, 1);
  t.match(r.out, /src\/extra has no row in docs\/architecture\.md's layering table/);
  r = check(tree(t, { 'src/loose.ts': 'export const x = 1;\n' }));
  t.equal(r.status, 1);
  t.match(r.out, /src\/loose\.ts is in no folder/);
});

t.test('a table that allows a cycle, or names an unknown folder, is refused', async (t) => {
  let r = check(tree(t, {}, "| `src/top` | the top | low |\n| `src/low` | below it | top, base |\n| `src/base` | the bottom | nothing of lbctl's |"));
  t.equal(r.status, 1);
  t.match(r.out, /the table allows a cycle: (top → low → top|low → top → low)/);
  r = check(tree(t, {}, "| `src/top` | the top | low, mystery |\n| `src/low` | below it | base |\n| `src/base` | the bottom | nothing of lbctl's |"));
  t.equal(r.status, 1);
  t.match(r.out, /src\/top may import "mystery", which has no row/);
});
