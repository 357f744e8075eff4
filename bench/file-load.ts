// make bench (and bench-quick): the file source's cold load. A file of
// 10,000 Services and 10,000 EndpointSlices is renamed into a running
// agent's watched directory; the time is from the rename to the agent's
// "sync done" with all 10,000 frontends programmed (the 50 ms debounce
// included). Target (issue 11): 0.6 s. YAML (one document per object) and
// JSON (one List); every point 3 times, medians reported. In the same run,
// the parse alone: js-yaml (the file source's parser) against `yaml` (its
// parser before), as a ratio.
//
//   node --import=@tapjs/typescript/import bench/file-load.ts [--out DIR] [--reps N] [--services N]
import { mkdirSync, mkdtempSync, renameSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { Command } from 'commander';
import { stringify, parseAllDocuments } from 'yaml';
import { parseManifests } from '../src/sources/manifest.js';
import { serviceObject, sliceObject } from './lbctl.js';
import { makeServices } from './services.js';
import { BenchRun, LBCTL, ROOT } from './world.js';

const TARGET_MS = 600;

const o = new Command()
  .option('--out <dir>', 'where results go', path.join(ROOT, 'bench/results'))
  .option('--reps <n>', 'repetitions of every point', '3')
  .option('--services <n>', 'services (and as many EndpointSlices) in the file', '10000')
  .parse()
  .opts<{ out: string; reps: string; services: string }>();
const reps = Number(o.reps);
const n = Number(o.services);

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

const services = makeServices(n).slice(0, n);
const objects = services.flatMap((s) => [serviceObject(s), sliceObject(s)]);
const texts = {
  yaml: objects.map((x) => stringify(x)).join('---\n'),
  json: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects }),
};

// The parse alone, in this process: js-yaml (as the file source runs it) against yaml.
const parse: Record<string, number[]> = { 'js-yaml': [], yaml: [], json: [] };
for (let r = 0; r < reps; r++) {
  let t0 = performance.now();
  parseManifests(texts.yaml, 'yaml');
  parse['js-yaml']!.push(performance.now() - t0);
  t0 = performance.now();
  parseAllDocuments(texts.yaml).map((d) => d.toJS({ maxAliasCount: 100 }));
  parse.yaml!.push(performance.now() - t0);
  t0 = performance.now();
  parseManifests(texts.json, 'json');
  parse.json!.push(performance.now() - t0);
}

const run = new BenchRun();
const world = run.world();
const dir = mkdtempSync(path.join(os.tmpdir(), 'lbctl-bench-file-'));
const results: Record<'yaml' | 'json', number[]> = { yaml: [], json: [] };
/** Of each, the sync's own time (its 'sync done' durationMs): the rest is the debounce, reading, parsing and validating. */
const syncMs: Record<'yaml' | 'json', number[]> = { yaml: [], json: [] };
try {
  const agent = run.spawn(LBCTL, [
    'agent',
    '--source', `file:${dir}`,
    '--cgroup', run.cgroup,
    '--bpf-root', world.bpfRoot,
    '--health-port', '0',
    '--metrics-port', '0',
    '--api-socket', path.join(dir, '..', `${path.basename(dir)}.sock`),
    '--no-nodeport', // the machine's own network namespace: never on its devices
    '--health-mesh-port', '0', // nor on a fixed port of it
    '--sync-period', '3600000',
    '--max-services', String(Math.ceil(n * 1.25)),
    '--max-backends', String(Math.ceil(n * 3.75)),
  ]);
  const syncs: Array<{ frontends: number; at: number; durationMs: number }> = [];
  let waiter: (() => void) | undefined;
  createInterface({ input: agent.stderr! }).on('line', (line) => {
    const at = performance.now();
    try {
      const l = JSON.parse(line) as { msg?: string; frontends?: number; durationMs?: number };
      if (l.msg === 'sync done') {
        syncs.push({ frontends: Number(l.frontends), at, durationMs: Number(l.durationMs) });
        waiter?.();
      }
    } catch {
      // not a log line
    }
  });
  agent.stdout!.resume();
  const until = async (frontends: number, from: number): Promise<{ at: number; durationMs: number }> => {
    const deadline = performance.now() + 120_000;
    for (;;) {
      const s = syncs.slice(from).find((x) => x.frontends === frontends);
      if (s) return s;
      if (agent.exitCode !== null) throw new Error(`the agent exited ${agent.exitCode}`);
      if (performance.now() > deadline) throw new Error(`no sync with ${frontends} frontends within 120 s`);
      await new Promise<void>((resolve) => {
        waiter = resolve;
        setTimeout(resolve, 100);
      });
    }
  };
  await until(0, 0);
  for (let r = 0; r < reps; r++) {
    for (const format of ['yaml', 'json'] as const) {
      const file = path.join(dir, `services.${format}`);
      const tmp = path.join(dir, `.services.${format}.tmp`);
      writeFileSync(tmp, texts[format]);
      const from = syncs.length;
      const t0 = performance.now();
      renameSync(tmp, file);
      const done = await until(n, from);
      results[format].push(done.at - t0);
      syncMs[format].push(done.durationMs);
      const gone = syncs.length;
      unlinkSync(file);
      await until(0, gone);
    }
  }
  agent.kill('SIGTERM');
} finally {
  rmSync(dir, { recursive: true, force: true });
  world.close();
  run.close();
}

const ms = (x: number): string => `${Math.round(x)} ms`;
const lines = [
  `# File source cold load (${new Date().toISOString().slice(0, 10)}, ${os.cpus().length} CPUs, ${reps} runs, medians)`,
  '',
  `A file of ${n} Services and ${n} EndpointSlices renamed into the agent's directory, to all ${n} frontends programmed (the 50 ms debounce included). Target: ${TARGET_MS} ms.`,
  '',
  '| format | bytes | rename → programmed | of which the sync | runs | target |',
  '|---|---:|---:|---:|---|---|',
  ...(['yaml', 'json'] as const).map(
    (f) =>
      `| ${f.toUpperCase()} | ${texts[f].length} | ${ms(median(results[f]))} | ${ms(median(syncMs[f]))} | ${results[f].map(ms).join(', ')} | ${median(results[f]) <= TARGET_MS ? 'met' : `missed by ${ms(median(results[f]) - TARGET_MS)}`} |`,
  ),
  '',
  'The parse alone, in the bench process (the file source parses YAML with js-yaml; `yaml` was its parser before):',
  '',
  '| parser | YAML parse | ratio to js-yaml |',
  '|---|---:|---:|',
  ...Object.entries(parse).map(([k, v]) => `| ${k === 'json' ? 'JSON.parse (the same objects as one List)' : k} | ${ms(median(v))} | ${(median(v) / median(parse['js-yaml']!)).toFixed(2)}× |`),
  '',
];
mkdirSync(o.out, { recursive: true });
writeFileSync(path.join(o.out, 'file-load.md'), lines.join('\n'));
// Every run, for bench/record.ts.
const formats = Object.fromEntries((['yaml', 'json'] as const).map((f) => [f, { bytes: texts[f].length, runsMs: results[f], syncMs: syncMs[f] }]));
writeFileSync(path.join(o.out, 'file-load.json'), `${JSON.stringify({ date: new Date().toISOString(), n, reps, targetMs: TARGET_MS, formats, parseMs: parse }, null, 1)}\n`);
process.stdout.write(lines.join('\n'));
