#!/usr/bin/env node
// Bundles each test file of test/native, test/bpf and test/e2e, with the
// repository's modules it imports, into one ESM file under
// dist/vmtest-bundles/ (packages stay imports from node_modules), for the
// vmtest guests: vmtest.sh writes them afresh before every run, and
// scripts/vmtest/tap-files.mjs runs a file's bundle in its place.
//
// Why: under TCG, a test file took 38-42 s to load through the TypeScript
// loader (its hooks on their own thread, resolving and transpiling every
// module of src/ and test/helpers it imports, one by one), and about 26 s
// from its bundle, which is one file to compile: test/native/maps.ts took
// 40-45 s in all in a guest, 29-30 s from its bundle, its tests 3 s. What is
// left is mostly node and tap themselves. On the host the same file runs in
// 0.57 instead of 1.42 s.
//
// Modules find files relative to themselves (import.meta.url: the addon, the
// BPF objects, the test helpers' scripts). In a bundle every module would
// see the bundle's URL, so each module's import.meta.url is rewritten to its
// own source's URL, relative to the bundle: every entry sits two levels
// under the repository (test/DIR/FILE.ts), so every bundle sits at
// dist/vmtest-bundles/test/DIR/, four levels under it.
//
// Usage: node scripts/vmtest/bundle-tests.mjs [--out DIR]   (prints how many it wrote)
// DIR: dist/vmtest-bundles (the default) or another dist/vmtest-bundles*
// (test/unit/bundle-tests.ts writes to one of its own, so as not to
// replace the guests' bundles).
import { build } from 'esbuild';
import { readdirSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
// --out DIR or --out=DIR. DIR is removed and written afresh, so it may only
// be a directory of dist/ named vmtest-bundles*: never dist/ itself, nor
// the build's own dist/cli or dist/bundle.
const args = process.argv.slice(2);
const at = args.findIndex((a) => a === '--out' || a.startsWith('--out='));
const outArg = at < 0 ? undefined : args[at] === '--out' ? args[at + 1] : args[at].slice('--out='.length);
if (at >= 0 && !outArg) throw new Error('bundle-tests: --out needs a directory');
const OUT = outArg === undefined ? 'dist/vmtest-bundles' : path.relative(root, path.resolve(outArg));
if (path.dirname(OUT) !== 'dist' || !path.basename(OUT).startsWith('vmtest-bundles')) {
  throw new Error(`bundle-tests: --out must name a directory ${root}/dist/vmtest-bundles*, not ${outArg}`);
}
const DIRS = ['test/native', 'test/bpf', 'test/e2e'];
// From a bundle's directory (OUT/test/DIR) back to the repository's root.
const UP = path.relative(path.join(root, OUT, 'test/x'), root);

const entryPoints = DIRS.flatMap((d) => readdirSync(path.join(root, d)).filter((f) => f.endsWith('.ts')).map((f) => `${d}/${f}`));

/** Each repository module's import.meta.url, as its source's URL relative to the bundle it lands in. */
const ownUrl = {
  name: 'own-import-meta-url',
  setup(b) {
    b.onLoad({ filter: /\.ts$/ }, (args) => {
      if (!args.path.startsWith(`${root}/`) || args.path.includes('/node_modules/')) return undefined;
      const rel = `${UP}/${path.relative(root, args.path)}`;
      const text = readFileSync(args.path, 'utf8').replaceAll('import.meta.url', `new URL(${JSON.stringify(rel)}, import.meta.url).href`);
      return { contents: text, loader: 'ts' };
    });
  },
};

rmSync(path.join(root, OUT), { recursive: true, force: true });
const result = await build({
  absWorkingDir: root,
  entryPoints,
  outdir: OUT,
  outbase: '.',
  outExtension: { '.js': '.mjs' },
  bundle: true,
  platform: 'node',
  format: 'esm',
  target: 'node24',
  packages: 'external',
  sourcemap: true,
  metafile: true,
  logLevel: 'warning',
  plugins: [ownUrl],
});
console.log(`bundle-tests: ${Object.keys(result.metafile.outputs).filter((f) => f.endsWith('.mjs')).length} test bundles in ${OUT}`);
