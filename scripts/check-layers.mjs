#!/usr/bin/env node
// make check-layers: fails when an import of src/ breaks docs/architecture.md's
// layering table, when src/ has an import cycle (type-only imports
// included), or when a folder's index.ts names other imports than its row.
// The rules are built from the table (scripts/layers.mjs) and applied by
// dependency-cruiser, which resolves every static, dynamic and type-only
// import the way TypeScript does. Needs node_modules only, not a build.
//
// Usage: node scripts/check-layers.mjs [--root DIR]
//   DIR: the tree to check (default: this repository); test/unit/check-layers.ts
//   points it at small trees that break each rule.
// Prints one line per problem, naming the importing file, and exits 1.
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { cruise } from 'dependency-cruiser';
import { TABLE_DOC, checkIndexes, cruiseOptions, readLayers } from './layers.mjs';

const args = process.argv.slice(2);
const at = args.indexOf('--root');
const root = path.resolve(at >= 0 ? args[at + 1] ?? '' : path.join(path.dirname(fileURLToPath(import.meta.url)), '..'));

let layers;
try {
  layers = readLayers(root);
} catch (e) {
  console.error(`check-layers: ${e.message}`);
  process.exit(1);
}

// dependency-cruiser names modules relative to the working directory, which
// the rules' paths (^src/...) expect to be the root.
process.chdir(root);
const { output } = await cruise(['src'], cruiseOptions(root, layers));
const problems = checkIndexes(root, layers);
for (const v of output.summary.violations) {
  const rule = output.summary.ruleSetUsed.forbidden.find((r) => r.name === v.rule.name);
  if (v.cycle) {
    problems.push(`${v.from}: import cycle: ${[v.from, ...v.cycle.map((c) => c.name)].join(' → ')}`);
  } else if (v.rule.name === 'no-unresolved') {
    problems.push(`${v.from}: cannot resolve "${v.unresolvedTo ?? v.to}", so cannot check it`);
  } else {
    problems.push(`${v.from} imports ${v.to}: ${rule?.comment ?? v.rule.name}`);
  }
}
// A resolver that found nothing would pass every rule: insist on a graph.
const modules = output.modules.filter((m) => m.source.startsWith('src/'));
const local = modules.reduce((n, m) => n + m.dependencies.filter((d) => d.resolved.startsWith('src/')).length, 0);
if (local === 0) problems.push(`read ${modules.length} modules and no imports between them under ${root}/src: nothing to check`);

if (problems.length > 0) {
  for (const p of problems) console.error(`check-layers: ${p}`);
  console.error(`check-layers: ${problems.length} problem(s); the rules are ${TABLE_DOC}'s layering table`);
  process.exit(1);
}
console.log(`check-layers: ${modules.length} modules, ${local} imports within src/: every one allowed by ${TABLE_DOC}, no cycles`);
