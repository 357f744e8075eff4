// scripts/vmtest/bundle-tests.mjs, the guests' test bundles: each module
// bundled into a test file still finds files relative to its own source.
// The script rewrites every repository module's import.meta.url to its
// source's URL relative to the bundle; a wrong depth would point the addon,
// the BPF objects and the helpers' scripts at nothing, and only the guests
// would notice. Here the real script bundles the real test files (into a
// directory of its own under dist/), and every rewritten URL, resolved from
// the bundle that holds it, must name the source file it came from.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const SCRIPT = path.join(ROOT, 'scripts/vmtest/bundle-tests.mjs');

/** Every file under `dir` whose name ends with `ext`. */
function walk(dir: string, ext: string): string[] {
  return readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && e.name.endsWith(ext))
    .map((e) => path.join(e.parentPath, e.name));
}

t.test("each bundled module's import.meta.url is its own source's, resolved from the bundle", async (t) => {
  const out = path.join(ROOT, 'dist', `vmtest-bundles-check-${process.pid}`);
  t.teardown(() => rmSync(out, { recursive: true, force: true }));
  const r = spawnSync(process.execPath, [SCRIPT, '--out', out], { cwd: ROOT, encoding: 'utf8', timeout: 90_000 });
  if (!t.equal(r.status, 0, `the script ran: ${r.stderr.slice(-500)}`)) return;

  const bundles = walk(out, '.mjs');
  const sources = ['test/native', 'test/bpf', 'test/e2e'].flatMap((d) => readdirSync(path.join(ROOT, d)).filter((f) => f.endsWith('.ts')).map((f) => `${d}/${f}`));
  t.equal(bundles.length, sources.length, 'one bundle per test file of test/native, test/bpf and test/e2e');

  const rewritten = /new URL\("([^"]+)", import\.meta\.url\)/g;
  let urls = 0;
  const wrong: string[] = [];
  for (const file of bundles) {
    const text = readFileSync(file, 'utf8');
    const bare = text.split('import.meta.url').length - 1;
    let here = 0;
    for (const m of text.matchAll(rewritten)) {
      here++;
      const target = fileURLToPath(new URL(m[1]!, pathToFileURL(file)));
      if (!target.startsWith(`${ROOT}/`) || !target.endsWith('.ts') || target.includes('/node_modules/') || !existsSync(target)) wrong.push(`${path.relative(out, file)}: ${m[1]} → ${target}`);
    }
    // The banner-free bundle's every import.meta.url is inside a rewrite: none is left as the bundle's own.
    if (bare !== here) wrong.push(`${path.relative(out, file)}: ${bare - here} import.meta.url not rewritten`);
    urls += here;
  }
  t.same(wrong, [], 'every rewritten URL names an existing source file of the repository; none left bare');
  t.ok(urls >= bundles.length, `the rewrite is exercised (${urls} URLs in ${bundles.length} bundles)`);

  // test/native/maps.ts's bundle: the loader and the binding each see their
  // own file, from which they find the BPF objects and the addon.
  const maps = path.join(out, 'test/native/maps.mjs');
  const own = new Set([...readFileSync(maps, 'utf8').matchAll(rewritten)].map((m) => path.relative(ROOT, fileURLToPath(new URL(m[1]!, pathToFileURL(maps))))));
  t.ok(own.has('src/datapath/loader.ts') && own.has('src/native/binding.ts'), `test/native/maps.mjs: the loader's and the binding's own URLs (${[...own].join(', ')})`);
});

t.test('--out anywhere but dist/vmtest-bundles* is refused before anything is removed', async (t) => {
  for (const [args, reason] of [
    [['--out', path.join(ROOT, 'src')], /must name a directory/],
    [['--out', 'dist/cli'], /must name a directory/],
    [['--out=dist'], /must name a directory/],
    [['--out'], /needs a directory/],
  ] as const) {
    const r = spawnSync(process.execPath, [SCRIPT, ...args], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 });
    t.not(r.status, 0, `${args.join(' ')}: refused`);
    t.match(r.stderr, reason, `${args.join(' ')}: with the reason`);
  }
  t.ok(existsSync(path.join(ROOT, 'src/cli')) && existsSync(path.join(ROOT, 'dist/cli')), 'src/ and dist/cli are still there');
});
