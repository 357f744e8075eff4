// deploy/grafana/lbctl.json against the metrics the agent really exports: every
// metric a panel, an annotation or a template variable queries must be in the
// registry AgentMetrics builds (with prom-client's default metrics, and the
// datapath's counters read through a view as the agent reads them), every
// label it filters or groups on must be one that metric has, and the values
// of the closed label sets (the datapath's counter names, sync type and
// result) must be ones the agent can emit. The queries are read with a small
// PromQL tokenizer: enough to tell metric names from functions, keywords,
// label names, strings, numbers, durations and Grafana's $variables.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import t from 'tap';
import { AgentMetrics } from '../../src/http/metrics.js';
import { LbMetric } from '../../src/datapath/abi.gen.js';
import { sumCounters } from '../../src/datapath/counters.js';

const ROOT = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');
const DASHBOARD = path.join(ROOT, 'deploy/grafana/lbctl.json');

// ---------------------------------------------------------------- the agent's metrics

interface Series {
  /** The family's name as registered (a histogram's without _bucket/_sum/_count). */
  readonly family: string;
  readonly type: string;
  readonly labels: ReadonlySet<string>;
}

interface Catalogue {
  /** Every series name a query can select: counters and gauges as named, a histogram's _bucket/_sum/_count. */
  readonly series: ReadonlyMap<string, Series>;
  /** Families by name. */
  readonly families: ReadonlyMap<string, { readonly type: string; readonly labels: ReadonlySet<string> }>;
  /** Label values the agent can emit, where the set is closed ("family/label"). */
  readonly values: ReadonlyMap<string, ReadonlySet<string>>;
}

/** Added by Prometheus to every series it scrapes. */
const TARGET_LABELS = new Set(['job', 'instance']);
/** Labels whose every value the catalogue knows once the metrics are exercised below. */
const CLOSED = ['lbctl_datapath_events_total/reason', 'lbctl_syncs_total/type', 'lbctl_syncs_total/result', 'lbctl_datapath_feature/required'];

/** The agent's registry, built as `lbctl agent` builds it, exercised so that labelled families have series. */
async function agentCatalogue(): Promise<Catalogue> {
  // The datapath's counters as the agent reads them: sumCounters over lb_metrics (one CPU, all zero).
  const lbMetrics = { valueSize: 8, lookup: () => Buffer.alloc(8) };
  const metrics = new AgentMetrics({ view: { datapathCounters: () => sumCounters(lbMetrics) } });
  for (const full of [true, false]) for (const ok of [true, false]) metrics.observeSync(0.01, { full, ok });
  metrics.setFeatures([
    { name: 'a', required: true, available: true },
    { name: 'b', required: false, available: false },
  ]);
  const json = await metrics.registry.getMetricsAsJSON();
  const declared = new Map(metrics.registry.getMetricsAsArray().map((m) => [m.name, (m as unknown as { labelNames?: string[] }).labelNames ?? []]));
  const series = new Map<string, Series>();
  const families = new Map<string, { type: string; labels: Set<string> }>();
  const values = new Map<string, Set<string>>();
  for (const m of json) {
    const labels = new Set<string>(declared.get(m.name) ?? []);
    for (const v of m.values) for (const [k, val] of Object.entries(v.labels)) {
      if (k === 'le' || k === 'quantile') continue;
      labels.add(k);
      const key = `${m.name}/${k}`;
      if (CLOSED.includes(key)) values.set(key, (values.get(key) ?? new Set()).add(String(val)));
    }
    const type = String(m.type);
    families.set(m.name, { type, labels });
    if (type === 'histogram') {
      series.set(`${m.name}_bucket`, { family: m.name, type, labels: new Set([...labels, 'le']) });
      series.set(`${m.name}_sum`, { family: m.name, type, labels });
      series.set(`${m.name}_count`, { family: m.name, type, labels });
    } else if (type === 'summary') {
      series.set(m.name, { family: m.name, type, labels: new Set([...labels, 'quantile']) });
      series.set(`${m.name}_sum`, { family: m.name, type, labels });
      series.set(`${m.name}_count`, { family: m.name, type, labels });
    } else {
      series.set(m.name, { family: m.name, type, labels });
    }
  }
  return { series, families, values };
}

// ---------------------------------------------------------------- PromQL, enough to find names

type TokKind = 'ident' | 'string' | 'number' | 'duration' | 'var' | 'punct';
interface Tok {
  readonly kind: TokKind;
  readonly text: string;
  /** A string's value, unquoted and unescaped. */
  readonly value: string;
}

const PUNCT = ['=~', '!~', '!=', '==', '<=', '>=', '=', '<', '>', '+', '-', '*', '/', '%', '^', '@', ',', '(', ')', '{', '}', '[', ']', ':'];
const ESCAPES: Record<string, string> = { n: '\n', t: '\t', r: '\r', a: '\x07', b: '\b', f: '\f', v: '\v' };

function tokenize(src: string): Tok[] {
  const out: Tok[] = [];
  let i = 0;
  while (i < src.length) {
    const rest = src.slice(i);
    const c = src[i]!;
    if (/\s/.test(c)) {
      i++;
      continue;
    }
    if (c === '#') {
      const nl = src.indexOf('\n', i);
      i = nl < 0 ? src.length : nl + 1;
      continue;
    }
    if (c === '"' || c === "'" || c === '`') {
      let j = i + 1;
      let value = '';
      for (; j < src.length && src[j] !== c; j++) {
        if (src[j] === '\\' && c !== '`') {
          j++;
          const e = src[j];
          if (e === undefined) break;
          value += ESCAPES[e] ?? e;
        } else value += src[j];
      }
      if (j >= src.length) throw new Error(`unterminated string at ${i}: ${rest}`);
      out.push({ kind: 'string', text: src.slice(i, j + 1), value });
      i = j + 1;
      continue;
    }
    // Grafana's variables: $var, ${var}, ${var:fmt}, [[var]] (old syntax), $__rate_interval, ...
    const v = /^(?:\$\{[^}]*\}|\$[A-Za-z_]\w*|\[\[[^\]]*\]\])/.exec(rest);
    if (v) {
      out.push({ kind: 'var', text: v[0], value: v[0] });
      i += v[0].length;
      continue;
    }
    const d = /^(?:\d+(?:ms|[smhdwy]))+(?!\w)/.exec(rest);
    if (d) {
      out.push({ kind: 'duration', text: d[0], value: d[0] });
      i += d[0].length;
      continue;
    }
    const n = /^(?:0[xX][0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(?!\w)/.exec(rest);
    if (n) {
      out.push({ kind: 'number', text: n[0], value: n[0] });
      i += n[0].length;
      continue;
    }
    const id = /^[A-Za-z_][\w:]*/.exec(rest);
    if (id) {
      out.push({ kind: 'ident', text: id[0], value: id[0] });
      i += id[0].length;
      continue;
    }
    const p = PUNCT.find((x) => rest.startsWith(x));
    if (!p) throw new Error(`unexpected ${JSON.stringify(c)} at ${i} in ${JSON.stringify(src)}`);
    out.push({ kind: 'punct', text: p, value: p });
    i += p.length;
  }
  return out;
}

const AGGREGATIONS = new Set(['sum', 'min', 'max', 'avg', 'group', 'stddev', 'stdvar', 'count', 'count_values', 'bottomk', 'topk', 'quantile', 'limitk', 'limit_ratio']);
const FUNCTIONS = new Set(
  (
    'abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week day_of_year days_in_month delta deriv exp floor ' +
    'histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar histogram_sum holt_winters double_exponential_smoothing hour ' +
    'idelta increase irate label_join label_replace ln log2 log10 minute month predict_linear rate resets round scalar sgn sort sort_desc sort_by_label sort_by_label_desc ' +
    'sqrt time timestamp vector year avg_over_time min_over_time max_over_time sum_over_time count_over_time quantile_over_time stddev_over_time stdvar_over_time ' +
    'last_over_time present_over_time mad_over_time acos acosh asin asinh atan atanh cos cosh sin sinh tan tanh deg pi rad start end info'
  ).split(' '),
);
const GROUPING = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right']);
const BINARY_WORDS = new Set(['and', 'or', 'unless', 'bool', 'atan2']);
/** Functions whose range-vector argument must be a counter (or a histogram's series, all counters). */
const COUNTER_FUNCTIONS = new Set(['rate', 'irate', 'increase', 'resets']);

interface Matcher {
  readonly label: string;
  readonly op: string;
  readonly value: string;
}
interface Selector {
  readonly name: string;
  readonly matchers: readonly Matcher[];
  /** Token index of the selector's first token. */
  readonly at: number;
}
interface Grouping {
  readonly keyword: string;
  readonly labels: readonly string[];
  /** Token range [from, to] whose selectors the labels must come from. */
  readonly from: number;
  readonly to: number;
}
interface Call {
  readonly name: string;
  /** Token indices of the argument's parentheses. */
  readonly open: number;
  readonly close: number;
}
interface Parsed {
  readonly selectors: readonly Selector[];
  readonly groupings: readonly Grouping[];
  readonly calls: readonly Call[];
}

/** The selectors, groupings and calls of one PromQL expression. Throws on what it cannot read. */
function parse(expr: string): Parsed {
  const toks = tokenize(expr);
  const is = (i: number, text: string) => toks[i]?.kind === 'punct' && toks[i]!.text === text;
  // Matching parentheses, both ways.
  const match = new Map<number, number>();
  const stack: number[] = [];
  toks.forEach((tk, i) => {
    if (tk.kind !== 'punct') return;
    if (tk.text === '(') stack.push(i);
    else if (tk.text === ')') {
      const o = stack.pop();
      if (o === undefined) throw new Error(`unbalanced ) in ${expr}`);
      match.set(o, i).set(i, o);
    }
  });
  if (stack.length) throw new Error(`unbalanced ( in ${expr}`);

  const selectors: Selector[] = [];
  const groupings: Grouping[] = [];
  const calls: Call[] = [];

  /** A `{...}` at i: its matchers and the index after `}`. */
  const matchers = (i: number): [Matcher[], number] => {
    const ms: Matcher[] = [];
    i++;
    while (!is(i, '}')) {
      const label = toks[i];
      const op = toks[i + 1];
      const val = toks[i + 2];
      if (label?.kind !== 'ident' || op?.kind !== 'punct' || !['=', '!=', '=~', '!~'].includes(op.text) || val?.kind !== 'string') {
        throw new Error(`bad label matcher at ${toks.slice(i, i + 3).map((x) => x.text).join(' ')} in ${expr}`);
      }
      ms.push({ label: label.text, op: op.text, value: val.value });
      i += 3;
      if (is(i, ',')) i++;
      else if (!is(i, '}')) throw new Error(`expected , or } after a matcher in ${expr}`);
    }
    return [ms, i + 1];
  };
  /** `( a, b )` at i: the label names and the index after `)`. */
  const labelList = (i: number): [string[], number] => {
    const close = match.get(i)!;
    const names = toks.slice(i + 1, close).filter((x) => !(x.kind === 'punct' && x.text === ','));
    for (const x of names) if (x.kind !== 'ident') throw new Error(`not a label name: ${x.text} in ${expr}`);
    return [names.map((x) => x.text), close + 1];
  };
  /** The scope of a by/without at i: the aggregation's argument, before or after the clause. */
  const aggregationScope = (i: number): [number, number] => {
    const prev = toks[i - 1];
    if (prev?.kind === 'ident' && AGGREGATIONS.has(prev.text.toLowerCase())) {
      const open = match.get(i + 1)! + 1; // after the label list
      if (!is(open, '(')) throw new Error(`aggregation ${prev.text} without an argument in ${expr}`);
      return [open, match.get(open)!];
    }
    if (is(i - 1, ')')) {
      const open = match.get(i - 1)!;
      const agg = toks[open - 1];
      if (agg?.kind === 'ident' && AGGREGATIONS.has(agg.text.toLowerCase())) return [open, i - 1];
    }
    throw new Error(`${toks[i]!.text} outside an aggregation in ${expr}`);
  };

  let i = 0;
  while (i < toks.length) {
    const tk = toks[i]!;
    if (tk.kind === 'punct' && tk.text === '[') {
      // A range or subquery: durations, variables, a colon.
      while (i < toks.length && !is(i, ']')) i++;
      i++;
      continue;
    }
    if (tk.kind === 'punct' && tk.text === '{') {
      const [ms, next] = matchers(i);
      const name = ms.find((m) => m.label === '__name__' && m.op === '=');
      if (!name) throw new Error(`a selector without a metric name in ${expr}`);
      selectors.push({ name: name.value, matchers: ms.filter((m) => m !== name), at: i });
      i = next;
      continue;
    }
    if (tk.kind !== 'ident') {
      i++;
      continue;
    }
    const word = tk.text.toLowerCase();
    if (GROUPING.has(word)) {
      if (!is(i + 1, '(')) {
        if (word === 'group_left' || word === 'group_right') {
          i++;
          continue;
        }
        throw new Error(`${tk.text} without a label list in ${expr}`);
      }
      const [labels, next] = labelList(i + 1);
      const [from, to] = word === 'by' || word === 'without' ? aggregationScope(i) : [0, toks.length - 1];
      groupings.push({ keyword: word, labels, from, to });
      i = next;
      continue;
    }
    if (BINARY_WORDS.has(word) || word === 'inf' || word === 'nan') {
      i++;
      continue;
    }
    if (word === 'offset') {
      i += is(i + 1, '-') ? 3 : 2;
      continue;
    }
    if (is(i + 1, '(')) {
      calls.push({ name: tk.text, open: i + 1, close: match.get(i + 1)! });
      i++;
      continue;
    }
    if (AGGREGATIONS.has(word) && ['by', 'without'].includes(toks[i + 1]?.text.toLowerCase() ?? '')) {
      calls.push({ name: tk.text, open: match.get(i + 2)! + 1, close: match.get(match.get(i + 2)! + 1) ?? -1 });
      i++;
      continue;
    }
    // A metric name, with or without matchers.
    if (is(i + 1, '{')) {
      const [ms, next] = matchers(i + 1);
      selectors.push({ name: tk.text, matchers: ms, at: i });
      i = next;
    } else {
      selectors.push({ name: tk.text, matchers: [], at: i });
      i++;
    }
  }
  return { selectors, groupings, calls };
}

/** Whether `value` (a Prometheus regex, fully anchored) accepts `s`. */
function regexAccepts(value: string, s: string): boolean {
  return new RegExp(`^(?:${value})$`).test(s);
}

/** Problems with one expression against the catalogue; [] when it only asks for what the agent exports. */
function check(expr: string, cat: Catalogue): string[] {
  let p: Parsed;
  try {
    p = parse(expr);
  } catch (err) {
    return [`cannot read ${JSON.stringify(expr)}: ${(err as Error).message}`];
  }
  const problems: string[] = [];
  const seriesAt = new Map<number, Series>();
  for (const s of p.selectors) {
    const series = cat.series.get(s.name);
    if (!series) {
      const fam = cat.families.get(s.name);
      problems.push(fam ? `${s.name} is a ${fam.type}: query ${s.name}_bucket, _sum or _count` : `unknown metric ${s.name}`);
      continue;
    }
    seriesAt.set(s.at, series);
    for (const m of s.matchers) {
      if (!series.labels.has(m.label) && !TARGET_LABELS.has(m.label)) {
        problems.push(`${s.name} has no label ${m.label}`);
        continue;
      }
      const known = cat.values.get(`${series.family}/${m.label}`);
      if (!known || m.value.includes('$')) continue;
      const literal = /^[\w-]+(?:\|[\w-]+)*$/.test(m.value);
      if (literal) {
        for (const alt of m.value.split('|')) if (!known.has(alt)) problems.push(`${s.name}{${m.label}} has no value ${alt}`);
      } else if ((m.op === '=~' || m.op === '!~') && ![...known].some((k) => regexAccepts(m.value, k))) {
        problems.push(`${s.name}{${m.label}${m.op}"${m.value}"} matches no value the agent emits`);
      } else if (m.op === '=' || m.op === '!=') {
        problems.push(`${s.name}{${m.label}} has no value ${m.value}`);
      }
    }
  }
  const inRange = (from: number, to: number) => p.selectors.filter((s) => s.at > from && s.at < to && seriesAt.has(s.at)).map((s) => seriesAt.get(s.at)!);
  for (const g of p.groupings) {
    const scope = g.keyword === 'by' || g.keyword === 'without' ? inRange(g.from, g.to) : [...seriesAt.values()];
    if (scope.length === 0) continue;
    for (const l of g.labels) {
      if (!TARGET_LABELS.has(l) && !scope.some((s) => s.labels.has(l))) problems.push(`${g.keyword} (${l}): no metric under it has label ${l}`);
    }
  }
  for (const c of p.calls) {
    const lower = c.name.toLowerCase();
    if (!FUNCTIONS.has(lower) && !AGGREGATIONS.has(lower)) problems.push(`unknown function ${c.name}`);
    if (lower === 'histogram_quantile') {
      const args = inRange(c.open, c.close);
      const inner = p.selectors.filter((s) => s.at > c.open && s.at < c.close);
      if (inner.some((s) => !s.name.endsWith('_bucket') || seriesAt.get(s.at)?.type !== 'histogram')) problems.push(`histogram_quantile over something other than a histogram's _bucket: ${expr}`);
      for (const g of p.groupings) {
        if (g.from < c.open || g.to > c.close) continue;
        if (g.keyword === 'by' && !g.labels.includes('le')) problems.push(`histogram_quantile: by (${g.labels.join(', ')}) drops le`);
        if (g.keyword === 'without' && g.labels.includes('le')) problems.push('histogram_quantile: without (le) drops le');
      }
      if (args.length === 0 && inner.length === 0) problems.push(`histogram_quantile without a metric: ${expr}`);
    }
    if (COUNTER_FUNCTIONS.has(lower)) {
      for (const s of inRange(c.open, c.close)) if (s.type !== 'counter' && s.type !== 'histogram' && s.type !== 'summary') problems.push(`${c.name}() over ${s.family}, a ${s.type}`);
    }
  }
  return problems;
}

/** A Grafana Prometheus variable query: label_values([expr,] label), query_result(expr), or other helpers. */
function checkVariableQuery(query: string, cat: Catalogue): string[] {
  const lv = /^\s*label_values\(\s*(.*)\)\s*$/s.exec(query);
  if (lv) {
    const args = lv[1]!;
    const comma = args.lastIndexOf(',');
    const label = args.slice(comma + 1).trim();
    if (comma < 0) return [`label_values(${label}) without a metric: name one so the variable lists lbctl's targets only`];
    const expr = args.slice(0, comma);
    const problems = check(expr, cat);
    if (problems.length) return problems;
    const names = parse(expr).selectors.map((s) => cat.series.get(s.name)!);
    if (!TARGET_LABELS.has(label) && !names.some((s) => s.labels.has(label))) problems.push(`label_values: no label ${label} on ${expr.trim()}`);
    return problems;
  }
  const qr = /^\s*query_result\((.*)\)\s*$/s.exec(query);
  if (qr) return check(qr[1]!, cat);
  return [`unsupported variable query ${JSON.stringify(query)}`];
}

// ---------------------------------------------------------------- the dashboard

interface Panel {
  id?: unknown;
  type?: unknown;
  title?: unknown;
  gridPos?: { h?: unknown; w?: unknown; x?: unknown; y?: unknown };
  datasource?: { type?: unknown; uid?: unknown };
  targets?: Array<{ refId?: unknown; expr?: unknown; datasource?: { uid?: unknown } }>;
  panels?: Panel[];
  collapsed?: boolean;
}
interface Variable {
  name: string;
  type: string;
  query?: unknown;
  datasource?: { uid?: unknown };
}
interface Dashboard {
  title?: unknown;
  uid?: unknown;
  schemaVersion?: unknown;
  panels?: Panel[];
  templating?: { list?: Variable[] };
  annotations?: { list?: Array<{ expr?: unknown; datasource?: { uid?: unknown } }> };
}

const dashboard = JSON.parse(readFileSync(DASHBOARD, 'utf8')) as Dashboard;
const DS_UID = '${datasource}';
const cat = await agentCatalogue();

/** Every panel, rows' nested panels included. */
function allPanels(d: Dashboard): Panel[] {
  return (d.panels ?? []).flatMap((p) => [p, ...(p.panels ?? [])]);
}
/** Every PromQL expression the dashboard sends, with where it is. */
function expressions(d: Dashboard): Array<{ where: string; expr: string }> {
  const out: Array<{ where: string; expr: string }> = [];
  for (const p of allPanels(d)) for (const tg of p.targets ?? []) out.push({ where: `panel ${String(p.id)} "${String(p.title)}" ${String(tg.refId)}`, expr: String(tg.expr) });
  for (const a of d.annotations?.list ?? []) if (typeof a.expr === 'string') out.push({ where: 'annotation', expr: a.expr });
  return out;
}
function variableQuery(v: Variable): string {
  return typeof v.query === 'string' ? v.query : String((v.query as { query?: unknown } | undefined)?.query);
}

t.test('the dashboard has the shape Grafana imports', async (t) => {
  t.type(dashboard.title, 'string');
  t.type(dashboard.uid, 'string');
  t.ok(typeof dashboard.schemaVersion === 'number' && dashboard.schemaVersion >= 36, `schemaVersion ${String(dashboard.schemaVersion)}`);
  const vars = dashboard.templating?.list ?? [];
  const ds = vars.find((v) => v.name === 'datasource');
  t.equal(ds?.type, 'datasource', 'a datasource variable');
  t.equal(ds?.query, 'prometheus', 'of Prometheus data sources');
  const node = vars.find((v) => v.name === 'node');
  t.equal(node?.type, 'query', 'a node variable');
  t.match(variableQuery(node!), /instance\)\s*$/, 'listing instances');
  for (const v of vars.filter((v) => v.type === 'query')) t.equal(v.datasource?.uid, DS_UID, `variable ${v.name} queries \${datasource}`);

  const panels = allPanels(dashboard);
  t.ok(panels.length > 10, `${panels.length} panels`);
  const ids = new Set<unknown>();
  const boxes: Array<{ id: unknown; x: number; y: number; w: number; h: number }> = [];
  for (const p of panels) {
    const name = `panel ${String(p.id)} "${String(p.title)}"`;
    t.ok(Number.isInteger(p.id) && !ids.has(p.id), `${name}: a unique integer id`);
    ids.add(p.id);
    const g = p.gridPos ?? {};
    const [x, y, w, h] = [g.x, g.y, g.w, g.h];
    if (!(Number.isInteger(x) && Number.isInteger(y) && Number.isInteger(w) && Number.isInteger(h))) {
      t.fail(`${name}: gridPos with integer x, y, w, h`);
      continue;
    }
    const box = { id: p.id, x: x as number, y: y as number, w: w as number, h: h as number };
    if (box.w < 1 || box.h < 1 || box.x < 0 || box.x + box.w > 24) t.fail(`${name}: gridPos ${JSON.stringify(g)} outside the 24-column grid`);
    const over = boxes.find((b) => b.x < box.x + box.w && box.x < b.x + b.w && b.y < box.y + box.h && box.y < b.y + b.h);
    if (over) t.fail(`${name} overlaps panel ${String(over.id)}`);
    boxes.push(box);
    if (p.type === 'row') continue;
    t.equal(p.datasource?.uid, DS_UID, `${name}: datasource \${datasource}`);
    const targets = p.targets ?? [];
    t.ok(targets.length > 0, `${name}: has targets`);
    const refIds = targets.map((tg) => tg.refId);
    t.ok(refIds.every((r) => typeof r === 'string' && r !== ''), `${name}: every target has a refId`);
    t.equal(new Set(refIds).size, refIds.length, `${name}: refIds unique`);
    for (const tg of targets) {
      t.ok(typeof tg.expr === 'string' && tg.expr.trim() !== '', `${name} ${String(tg.refId)}: an expr`);
      t.equal(tg.datasource?.uid, DS_UID, `${name} ${String(tg.refId)}: datasource \${datasource}`);
    }
  }
});

t.test('every metric the dashboard queries is one the agent exports', async (t) => {
  const exprs = expressions(dashboard);
  t.ok(exprs.length > 20, `${exprs.length} expressions`);
  for (const { where, expr } of exprs) t.same(check(expr, cat), [], `${where}: ${expr}`);
  for (const v of (dashboard.templating?.list ?? []).filter((v) => v.type === 'query')) t.same(checkVariableQuery(variableQuery(v), cat), [], `variable ${v.name}`);
});

t.test('every query follows the job and node variables', async (t) => {
  for (const { where, expr } of expressions(dashboard)) {
    for (const s of parse(expr).selectors) {
      const has = (label: string, v: string) => s.matchers.some((m) => m.label === label && m.op === '=~' && m.value === v);
      t.ok(has('job', '$job') && has('instance', '$node'), `${where}: ${s.name} filtered by job=~"$job", instance=~"$node"`);
    }
  }
});

t.test('every lbctl and kube-proxy metric, and every datapath counter, is on the dashboard', async (t) => {
  const used = new Set<string>();
  const reasons = new Set<string>();
  for (const { expr } of expressions(dashboard)) {
    for (const s of parse(expr).selectors) {
      const fam = cat.series.get(s.name)?.family;
      if (fam) used.add(fam);
      if (s.name !== 'lbctl_datapath_events_total') continue;
      const rs = s.matchers.filter((m) => m.label === 'reason');
      if (rs.length === 0) continue; // the per-node panel shows them all, unnamed
      for (const r of cat.values.get('lbctl_datapath_events_total/reason') ?? []) {
        const ok = rs.every((m) => (m.op === '=' ? r === m.value : m.op === '!=' ? r !== m.value : m.op === '=~' ? regexAccepts(m.value, r) : !regexAccepts(m.value, r)));
        if (ok) reasons.add(r);
      }
    }
  }
  for (const fam of cat.families.keys()) if (/^(lbctl|kubeproxy)_/.test(fam)) t.ok(used.has(fam), `${fam} has a panel`);
  const all = Object.keys(LbMetric).filter((k) => k !== 'LB_MTR_MAX').map((k) => k.replace(/^LB_MTR_/, '').toLowerCase());
  t.same([...(cat.values.get('lbctl_datapath_events_total/reason') ?? [])].sort(), all.sort(), 'the catalogue has every lb_metrics counter');
  for (const r of all) t.ok(reasons.has(r), `datapath counter ${r} has a panel`);
});

t.test('the checker', async (t) => {
  t.test('finds what a real query names, and nothing else', async (t) => {
    const p = parse(
      `# a comment naming not_a_metric
      histogram_quantile(0.99, sum by (instance, le) (rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket{job=~"$job", instance=~"fake_metric|$node"}[$__rate_interval] offset 5m)))
        / on (instance) group_left () max without (le) (lbctl_services @ end()) > bool 1e3 or vector(0x10) and {__name__="lbctl_backends", instance!="x"}[5m:1m]`,
    );
    t.same(p.selectors.map((s) => s.name), ['kubeproxy_sync_proxy_rules_duration_seconds_bucket', 'lbctl_services', 'lbctl_backends']);
    t.same(p.calls.map((c) => c.name), ['histogram_quantile', 'sum', 'rate', 'max', 'end', 'vector']);
    t.same(p.groupings.map((g) => [g.keyword, g.labels]), [['by', ['instance', 'le']], ['on', ['instance']], ['group_left', []], ['without', ['le']]]);
    t.same(p.selectors[0]!.matchers, [{ label: 'job', op: '=~', value: '$job' }, { label: 'instance', op: '=~', value: 'fake_metric|$node' }]);
  });
  t.test('a query of exported metrics passes', async (t) => {
    t.same(check('histogram_quantile(0.9, sum by (le) (rate(kubeproxy_network_programming_duration_seconds_bucket[5m])))', cat), []);
    t.same(check('sum by (reason) (rate(lbctl_datapath_events_total{reason=~"np_.+", reason!~"np_new|np_fwd"}[1m]))', cat), []);
    t.same(check('time() - process_start_time_seconds', cat), []);
    t.same(checkVariableQuery('label_values(lbctl_services{job=~"$job"}, instance)', cat), []);
  });
  t.test('names what is wrong', async (t) => {
    t.same(check('sum(rate(lbctl_no_such_thing_total{job=~"$job"}[5m]))', cat), ['unknown metric lbctl_no_such_thing_total']);
    t.same(check('rate(kubeproxy_sync_proxy_rules_duration_seconds[5m])', cat), ['kubeproxy_sync_proxy_rules_duration_seconds is a histogram: query kubeproxy_sync_proxy_rules_duration_seconds_bucket, _sum or _count']);
    t.same(check('lbctl_services_bucket', cat), ['unknown metric lbctl_services_bucket'], 'a gauge has no _bucket');
    t.same(check('lbctl_syncs_total{kind="x"}', cat), ['lbctl_syncs_total has no label kind']);
    t.same(check('sum by (map) (lbctl_bpf_map_pressure)', cat), ['by (map): no metric under it has label map']);
    t.same(check('lbctl_datapath_events_total{reason=~"xlate_fwd|np_bogus"}', cat), ['lbctl_datapath_events_total{reason} has no value np_bogus']);
    t.same(check('lbctl_datapath_events_total{reason=~"sock_.*_x"}', cat), ['lbctl_datapath_events_total{reason=~"sock_.*_x"} matches no value the agent emits']);
    t.same(check('histogram_quantile(0.9, sum by (instance) (rate(kubeproxy_network_programming_duration_seconds_bucket[5m])))', cat), ['histogram_quantile: by (instance) drops le']);
    t.same(check('rate(lbctl_services[5m])', cat), ['rate() over lbctl_services, a gauge']);
    t.same(check('histogram_quantil(0.9, x_bucket)', cat), ['unknown metric x_bucket', 'unknown function histogram_quantil']);
    t.match(check('lbctl_services{job=', cat), [/^cannot read/]);
    t.same(checkVariableQuery('label_values(lbctl_services, node_name)', cat), ['label_values: no label node_name on lbctl_services']);
    t.same(checkVariableQuery('label_values(nope, instance)', cat), ['unknown metric nope']);
  });
  t.test('the dashboard with one unknown metric fails', async (t) => {
    const bad = structuredClone(dashboard);
    const p = allPanels(bad).find((x) => x.targets?.length)!;
    p.targets![0]!.expr = 'sum(lbctl_watch_errors_total{job=~"$job", instance=~"$node"})';
    const problems = expressions(bad).flatMap(({ expr }) => check(expr, cat));
    t.same(problems, ['unknown metric lbctl_watch_errors_total']);
  });
});
