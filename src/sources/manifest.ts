// A manifest file's text → the objects it holds, each with where it was
// found, and a problem for everything that could not be read. Pure: no I/O,
// and it never throws, whatever the text (the boundary every document
// crosses: a parser's exception, a limit, a shape built to exhaust memory or
// time all become problems naming the document).
//
// YAML is parsed with js-yaml (measured against `yaml` on a file of 10,000
// Services and 10,000 EndpointSlices: 0.4 s against 4.3-5.1 s; js-yaml 5
// took 0.9 s), one document at a time so that a broken document costs only
// itself. JSON files go through JSON.parse (0.05 s for the same objects).
// js-yaml shares an alias's value instead of copying it (an alias bomb costs
// no memory) and bounds nesting depth and merge keys itself; what a reader
// of the object would walk with aliases expanded, and string lengths, are
// bounded here.
import yaml from 'js-yaml';
import {
  MAX_DEPTH,
  MAX_MERGE_KEYS_PER_DOCUMENT,
  MAX_OBJECTS_PER_FILE,
  MAX_STRING_CHARS,
  MAX_VALUES_PER_FILE,
  MAX_VALUES_PER_OBJECT,
} from './limits.js';

/** One object of a file: a document, or an item of a List document. */
export interface ManifestObject {
  /** "document 3", or "document 3, item 7" inside a List. */
  readonly where: string;
  readonly value: unknown;
  /**
   * Why its shape is beyond the limits, when it is: it must not be used,
   * but it may still say which object it is (its metadata).
   */
  readonly beyondLimits?: string;
}

export interface ManifestProblem {
  /** "document 3", "document 3, item 7", or "" for the file as a whole. */
  readonly where: string;
  readonly reason: string;
  readonly category: 'parse' | 'limit';
}

export interface ParsedManifests {
  /** The file's objects and problems, in the order of the file. */
  readonly entries: Array<ManifestObject | ManifestProblem>;
  /**
   * Some part of the file could not be read at all, so what it held is
   * unknown: the caller keeps what the file yielded before.
   */
  readonly broken: boolean;
}

class TooManyValues extends Error {}

/** YAML 1.2's core schema (as kubectl reads manifests: no timestamps, no binary), plus merge keys (`<<`). */
const SCHEMA = yaml.CORE_SCHEMA.extend({ implicit: [yaml.types.merge] });

/** Lines that start a YAML document: `---` alone or followed by a space (never inside a scalar, by the spec's c-forbidden). */
const DOCUMENT_START = /^---(?=[ \t\r\n]|$)/gm;
/** A line that holds nothing of a document: blank, a comment or a directive. */
const NOTHING = /^(?:[ \t]*(?:#.*)?|%.*)\r?$/;

function firstLine(text: string): string {
  const nl = text.indexOf('\n');
  return nl < 0 ? text : text.slice(0, nl);
}

/**
 * The YAML documents of a file, each with the line it starts on (1-based);
 * undefined when there are more than MAX_OBJECTS_PER_FILE of them.
 */
function splitDocuments(text: string): Array<{ text: string; line: number }> | undefined {
  const starts: number[] = [];
  for (const m of text.matchAll(DOCUMENT_START)) if (starts.push(m.index) > MAX_OBJECTS_PER_FILE) return undefined;
  if (starts[0] !== 0) {
    // Text before the first `---` is a document only if it holds something;
    // comments and directives there belong to the next document.
    const head = text.slice(0, starts[0] ?? text.length);
    if (starts.length === 0 || head.split('\n').some((l) => !NOTHING.test(l))) starts.unshift(0);
  }
  const docs: Array<{ text: string; line: number }> = [];
  let line = 1;
  let at = 0;
  for (let i = 0; i < starts.length; i++) {
    const from = i === 0 ? 0 : starts[i]!;
    const to = starts[i + 1] ?? text.length;
    for (let j = at; j < from; j++) if (text.charCodeAt(j) === 10) line++;
    at = from;
    docs.push({ text: text.slice(from, to), line });
  }
  return docs;
}

function yamlError(err: unknown, line: number): string {
  if (err instanceof yaml.YAMLException) {
    const mark = err.mark as { line?: number; column?: number } | undefined;
    const at = mark?.line !== undefined ? ` at line ${line + mark.line}, column ${(mark.column ?? 0) + 1}` : '';
    return `YAML error: ${err.reason}${at}`;
  }
  // Anything else from the parser (a RangeError, a bug): still this document's problem.
  return `YAML error: ${err instanceof Error ? err.message : String(err)}`;
}

interface Walk {
  readonly v: unknown;
  readonly depth: number;
  readonly key: string | number | undefined;
  readonly parent: Walk | undefined;
}

function pathOf(w: Walk | undefined): string {
  const parts: string[] = [];
  for (let p = w; p && p.key !== undefined; p = p.parent) parts.push(typeof p.key === 'number' ? `[${p.key}]` : `.${p.key}`);
  const s = parts.reverse().join('');
  return s.startsWith('.') ? s.slice(1) : s || '(top)';
}

/**
 * Why an object's shape is beyond the limits, or undefined: depth, values
 * (aliases expanded: a shared value is counted every time it is reached) and
 * string lengths. Iterative, and it stops at the first limit, so it costs at
 * most MAX_VALUES_PER_OBJECT steps whatever the object. The walk keeps no
 * path (it runs for every object read); a walk that finds a problem runs
 * again with paths, to say where.
 */
export function shapeProblem(root: unknown): string | undefined {
  return fastWalk(root) ? undefined : pathWalk(root);
}

/** True when the object is within the limits; no allocation per value. */
function fastWalk(root: unknown): boolean {
  const values: unknown[] = [root];
  const depths: number[] = [0];
  let count = 1;
  while (values.length > 0) {
    const v = values.pop();
    const depth = depths.pop()!;
    if (typeof v === 'string') {
      if (v.length > MAX_STRING_CHARS) return false;
      continue;
    }
    if (typeof v !== 'object' || v === null) continue;
    if (depth >= MAX_DEPTH) return false;
    if (Array.isArray(v)) {
      if ((count += v.length) > MAX_VALUES_PER_OBJECT) return false;
      for (let i = 0; i < v.length; i++) {
        values.push(v[i]);
        depths.push(depth + 1);
      }
    } else {
      for (const k in v) {
        if (!Object.hasOwn(v, k)) continue;
        if (++count > MAX_VALUES_PER_OBJECT || k.length > MAX_STRING_CHARS) return false;
        values.push((v as Record<string, unknown>)[k]);
        depths.push(depth + 1);
      }
    }
  }
  return true;
}

/** The same walk with a path to every value: the message for an object fastWalk refused. */
function pathWalk(root: unknown): string {
  const stack: Walk[] = [{ v: root, depth: 0, key: undefined, parent: undefined }];
  // Counted when pushed, so the stack itself never holds more than the limit.
  let values = 1;
  while (stack.length > 0) {
    const w = stack.pop()!;
    const v = w.v;
    if (typeof v === 'string') {
      if (v.length > MAX_STRING_CHARS) return `a string of ${v.length} characters at ${pathOf(w)}, more than ${MAX_STRING_CHARS}`;
      continue;
    }
    if (typeof v !== 'object' || v === null) continue;
    if (w.depth >= MAX_DEPTH) return `nested deeper than ${MAX_DEPTH} levels (at ${pathOf(w)})`;
    const tooMany = (n: number): string | undefined =>
      (values += n) > MAX_VALUES_PER_OBJECT ? `more than ${MAX_VALUES_PER_OBJECT} values with aliases expanded (at ${pathOf(w)})` : undefined;
    if (Array.isArray(v)) {
      const over = tooMany(v.length);
      if (over) return over;
      for (let i = v.length - 1; i >= 0; i--) stack.push({ v: v[i], depth: w.depth + 1, key: i, parent: w });
    } else {
      const keys = Object.keys(v);
      const over = tooMany(keys.length);
      if (over) return over;
      for (const k of keys) {
        if (k.length > MAX_STRING_CHARS) return `a key of ${k.length} characters in ${pathOf(w)}, more than ${MAX_STRING_CHARS}`;
        stack.push({ v: (v as Record<string, unknown>)[k], depth: w.depth + 1, key: k, parent: w });
      }
    }
  }
  return 'beyond the limits';
}

/** An upper bound on the values in a JSON text: one, plus one per comma, `[` and `{` (inside strings too: a bound, not a count). */
function jsonValuesAtMost(text: string): number {
  let n = 1;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 44 /* , */ || c === 91 /* [ */ || c === 123 /* { */) n++;
  }
  return n;
}

function isList(v: unknown): v is { kind: 'List'; items: unknown[] } {
  return typeof v === 'object' && v !== null && (v as { kind?: unknown }).kind === 'List' && Array.isArray((v as { items?: unknown }).items);
}

/**
 * Adds a document's objects (a List's items one by one), each checked
 * against the shape limits unless `withinLimits` says its text already
 * bounds them.
 */
function addDocument(value: unknown, where: string, out: ParsedManifests, count: { objects: number }, withinLimits = false): boolean {
  if (value === null || value === undefined) return true;
  const items = isList(value) ? value.items : [value];
  if ((count.objects += items.length) > MAX_OBJECTS_PER_FILE) {
    out.entries.length = 0;
    out.entries.push({ where: '', reason: `more than ${MAX_OBJECTS_PER_FILE} objects in one file (documents and List items)`, category: 'limit' });
    return false;
  }
  for (let i = 0; i < items.length; i++) {
    const at = isList(value) ? `${where}, item ${i}` : where;
    const item = items[i];
    // A List's own fields are not walked: its items are, one by one.
    const problem = withinLimits ? undefined : shapeProblem(item);
    out.entries.push(problem ? { where: at, value: item, beyondLimits: problem } : { where: at, value: item });
  }
  return true;
}

/** The objects of a file of YAML documents (`format: 'yaml'`) or of one JSON value (`'json'`). */
export function parseManifests(text: string, format: 'yaml' | 'json'): ParsedManifests {
  const out = { entries: [] as ParsedManifests['entries'], broken: false };
  const count = { objects: 0 };
  const broken = (p: ManifestProblem): ParsedManifests => ({ entries: [p], broken: true });

  if (format === 'json') {
    // Every JSON value but the first follows a comma or an opening bracket:
    // their count bounds the values JSON.parse would build, before it does.
    const most = jsonValuesAtMost(text);
    if (most > MAX_VALUES_PER_FILE) return broken({ where: '', reason: `up to ${most} JSON values, more than the ${MAX_VALUES_PER_FILE} lbctl reads from one file`, category: 'limit' });
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (err) {
      return broken({ where: '', reason: `not JSON: ${(err as Error).message}`, category: 'parse' });
    }
    out.broken = !addDocument(value, 'document 0', out, count);
    return out;
  }

  // js-yaml tells every node it makes: the file's count stops a parse that
  // would build more than any manifest holds.
  let values = 0;
  const countValue = (event: 'open' | 'close'): void => {
    if (event === 'open' && ++values > MAX_VALUES_PER_FILE) throw new TooManyValues();
  };
  const docs = splitDocuments(text);
  if (docs === undefined || docs.length > MAX_OBJECTS_PER_FILE) {
    return broken({ where: '', reason: `more than ${MAX_OBJECTS_PER_FILE} YAML documents: more objects than lbctl reads from one file`, category: 'limit' });
  }
  for (const [index, doc] of docs.entries()) {
    const where = `document ${index}`;
    let value: unknown;
    try {
      value = yaml.load(doc.text, { schema: SCHEMA, maxDepth: MAX_DEPTH, maxTotalMergeKeys: MAX_MERGE_KEYS_PER_DOCUMENT, listener: countValue });
    } catch (err) {
      if (err instanceof TooManyValues) return broken({ where: '', reason: `more than ${MAX_VALUES_PER_FILE} YAML values in one file`, category: 'limit' });
      out.entries.push({ where, reason: firstLine(yamlError(err, doc.line)), category: 'parse' });
      out.broken = true;
      continue;
    }
    // A document without an alias holds no more values than its text has
    // characters, no string longer than its text, and js-yaml bounded its
    // depth: if its text is within both limits, nothing in it can be beyond
    // one, and the walk is spared.
    const withinLimits = doc.text.length <= Math.min(MAX_STRING_CHARS, MAX_VALUES_PER_OBJECT) && !doc.text.includes('*');
    if (!addDocument(value, where, out, count, withinLimits)) return { entries: out.entries, broken: true };
  }
  return out;
}
