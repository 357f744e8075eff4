// The layering of src/, read from the one place it is written:
// docs/architecture.md's table (| `src/FOLDER` | what it owns | may import |),
// and turned into dependency-cruiser rules. scripts/check-layers.mjs
// (`make check-layers`) applies them; .dependency-cruiser.mjs hands the same
// configuration to `npx depcruise src` for graphs and reports.
//
// The table is checked before it is used: every folder of src/ has a row
// and every row a folder, an import names a row, and the rows form no
// cycle (so no two folders can each be allowed the other).
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

export const TABLE_DOC = 'docs/architecture.md';
const NOTHING = "nothing of lbctl's";
const NAME = /^[a-z][a-z0-9-]*$/;

/** Drops parenthesized notes, however nested: "a (b (c)), d" → "a , d". */
function withoutNotes(text) {
  let out = '';
  let depth = 0;
  for (const ch of text) {
    if (ch === '(') depth++;
    else if (ch === ')') depth = Math.max(0, depth - 1);
    else if (depth === 0) out += ch;
  }
  return out;
}

/** "model (validation), lb, base" → ['model', 'lb', 'base']; NOTHING → []. */
export function parseImports(cell) {
  const text = withoutNotes(cell).trim().replace(/\.$/, '');
  if (text === NOTHING) return [];
  return text.split(',').map((s) => s.trim()).filter((s) => s !== '');
}

/**
 * The table's rows as Map<folder, allowed folders>, in table order.
 * Throws, naming the document and the row, when the table is missing or
 * says something the check cannot hold src/ to.
 */
export function readLayers(root) {
  const doc = path.join(root, TABLE_DOC);
  const rows = readFileSync(doc, 'utf8').split('\n').filter((l) => /^\|\s*`src\//.test(l));
  if (rows.length === 0) throw new Error(`${TABLE_DOC}: no layering table (rows | \`src/FOLDER\` | owns | may import |)`);
  const layers = new Map();
  for (const row of rows) {
    const cells = row.split('|').slice(1, -1).map((c) => c.trim());
    if (cells.length < 2) throw new Error(`${TABLE_DOC}: a row without an imports column: ${row}`);
    const folders = [...cells[0].matchAll(/`src\/([^`/]+)`/g)].map((m) => m[1]);
    const imports = parseImports(cells.at(-1));
    for (const f of [...folders, ...imports]) {
      if (!NAME.test(f)) throw new Error(`${TABLE_DOC}: "${f}" is not a folder name, in: ${row}`);
    }
    for (const f of folders) {
      if (layers.has(f)) throw new Error(`${TABLE_DOC}: src/${f} has two rows`);
      layers.set(f, imports);
    }
  }
  for (const [f, imports] of layers) {
    for (const i of imports) {
      if (!layers.has(i)) throw new Error(`${TABLE_DOC}: src/${f} may import "${i}", which has no row`);
      if (i === f) throw new Error(`${TABLE_DOC}: src/${f} lists itself`);
    }
  }
  const cycle = findCycle(layers);
  if (cycle) throw new Error(`${TABLE_DOC}: the table allows a cycle: ${cycle.join(' → ')}`);
  const src = path.join(root, 'src');
  for (const e of readdirSync(src, { withFileTypes: true })) {
    if (e.isDirectory() && !layers.has(e.name)) throw new Error(`src/${e.name} has no row in ${TABLE_DOC}'s layering table`);
    if (!e.isDirectory()) throw new Error(`src/${e.name} is in no folder: every module belongs to a layer of ${TABLE_DOC}'s table`);
  }
  for (const f of layers.keys()) {
    if (!readdirSync(src).includes(f)) throw new Error(`${TABLE_DOC} has a row for src/${f}, which does not exist`);
  }
  return layers;
}

function findCycle(layers) {
  const state = new Map();
  const stack = [];
  const visit = (f) => {
    state.set(f, 'open');
    stack.push(f);
    for (const i of layers.get(f) ?? []) {
      if (state.get(i) === 'open') return [...stack.slice(stack.indexOf(i)), i];
      if (!state.has(i)) {
        const c = visit(i);
        if (c) return c;
      }
    }
    stack.pop();
    state.set(f, 'done');
    return undefined;
  };
  for (const f of layers.keys()) {
    if (!state.has(f)) {
      const c = visit(f);
      if (c) return c;
    }
  }
  return undefined;
}

const escape = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** The rules: one per folder (imports only what its row allows), no cycles, no unresolved imports, no barrels. */
export function forbiddenRules(layers) {
  const rules = [
    {
      name: 'no-circular',
      comment: 'No import cycle within src/, type-only imports included.',
      severity: 'error',
      from: { path: '^src/' },
      to: { circular: true },
    },
    {
      name: 'no-unresolved',
      comment: 'An import the check cannot resolve is one it cannot check.',
      severity: 'error',
      from: { path: '^src/' },
      to: { couldNotResolve: true },
    },
    {
      name: 'no-index-import',
      comment: "A folder's index.ts only describes it: modules import the file they need, so a command loads only what it runs.",
      severity: 'error',
      from: { path: '^src/' },
      to: { path: '^src/[^/]+/index\\.ts$' },
    },
  ];
  for (const [f, imports] of layers) {
    const allowed = [f, ...imports].map(escape).join('|');
    rules.push({
      name: `layer-${f}`,
      comment: `src/${f} may import ${imports.length ? imports.join(', ') : NOTHING} (${TABLE_DOC})`,
      severity: 'error',
      from: { path: `^src/${escape(f)}/` },
      to: { path: '^src/', pathNot: `^src/(${allowed})/` },
    });
  }
  return rules;
}

/** The cruise options, for the API (check-layers.mjs) and the CLI (.dependency-cruiser.mjs). */
export function cruiseOptions(root, layers = readLayers(root)) {
  return {
    // Type-only imports count: a layer that names another's types depends on it.
    tsPreCompilationDeps: true,
    ...(existsSync(path.join(root, 'tsconfig.json')) ? { tsConfig: { fileName: path.join(root, 'tsconfig.json') } } : {}),
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '^(dist|build|node_modules)/' },
    validate: true,
    ruleSet: { forbidden: forbiddenRules(layers) },
  };
}

/**
 * Each folder's index.ts says what it owns and, on a line of its own,
 * "May import: a, b." (or "May import: nothing of lbctl's."): the same
 * folders as its row. Returns the problems, one line each.
 */
export function checkIndexes(root, layers) {
  const problems = [];
  for (const [f, imports] of layers) {
    const file = `src/${f}/index.ts`;
    let text;
    try {
      text = readFileSync(path.join(root, file), 'utf8');
    } catch {
      problems.push(`${file}: missing (each folder's index.ts says what it owns and what it may import)`);
      continue;
    }
    const m = /^\/\/ May import: (.*)$/m.exec(text);
    if (!m) {
      problems.push(`${file}: no "// May import: ..." line`);
      continue;
    }
    const said = parseImports(m[1]);
    const same = said.length === imports.length && said.every((s) => imports.includes(s));
    if (!same) problems.push(`${file} says it may import ${said.join(', ') || NOTHING}; ${TABLE_DOC} says ${imports.join(', ') || NOTHING}`);
  }
  return problems;
}
