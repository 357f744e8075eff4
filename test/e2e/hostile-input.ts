// The agent, for real, against a directory of thousands of malformed and
// hostile manifests beside one good service (the issue's reproduction: the
// first file holding a YAML alias bomb used to end the process). The agent
// keeps running, keeps serving the good service through real connections,
// keeps answering /livez and its API, names every bad file, counts it, and
// its peak memory stays under a stated bound.
import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import t from 'tap';

t.setTimeout(300_000);
import { asYaml, hostileText, SENTINEL_IP, service, slice } from '../helpers/hostile.js';
import { MAX_FILE_BYTES } from '../../src/sources/limits.js';
import { CLI_TIMEOUT_MS, createSandbox, HTTP_PORT, LBCTL, run, SLOW, type LogLine, type Sandbox } from '../helpers/sandbox.js';

/** Hostile files written into the running agent's directory. */
const FILES = 2000;
/** The agent's peak RSS (VmHWM) through all of it: measured 2026-11-25, docs/standalone.md "Limits". */
const AGENT_PEAK_BOUND_MIB = 400;

function vmKiB(pid: number, field: 'VmHWM' | 'VmRSS'): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? NaN);
}

async function reachable(sb: Sandbox): Promise<boolean> {
  const r = await sb.exec(['curl', '-sS', '--max-time', String(3 * SLOW), `http://${SENTINEL_IP}/`]);
  return r.code === 0 && r.stdout.startsWith('10.244.1.');
}

async function get(port: number, p: string): Promise<number> {
  return (await fetch(`http://127.0.0.1:${port}${p}`)).status;
}

t.test('thousands of hostile manifests beside one good service: it is served, the agent stays up and says what it skipped', async (t) => {
  const sb = await createSandbox(t, { backends: 2, agent: false });
  const sentinel = [
    service('sentinel', SENTINEL_IP),
    { ...slice('sentinel-1', 'sentinel', sb.backends.map((b) => b.v4)), ports: [{ name: 'http', port: HTTP_PORT, protocol: 'TCP' }] },
  ];
  sb.writeManifest('m-sentinel.yaml', asYaml(sentinel));
  await sb.startAgent();
  const agent = sb.agent!;
  const sentinelEntry = async (): Promise<unknown> => (await sb.lbList()).find((e) => e.frontend === `${SENTINEL_IP}:80/TCP`);
  const before = await sentinelEntry();
  t.ok(before, 'the sentinel is programmed');
  t.ok(await reachable(sb), 'the sentinel answers');
  const baseKiB = vmKiB(agent.pid, 'VmRSS');

  // The reproduction: a few lines whose aliases expand to 2^30 nodes.
  const laughs = ['a0: &a0 [lol, lol]', ...Array.from({ length: 29 }, (_, i) => `a${i + 1}: &a${i + 1} [*a${i}, *a${i}]`)];
  sb.writeManifest('a-bomb.yaml', `apiVersion: v1\nkind: Service\nmetadata: {name: bomb, namespace: default}\nx:\n${laughs.map((l) => `  ${l}`).join('\n')}\nspec:\n  ports: *a29\n`);
  const bomb = await agent.waitForLog((l) => l.msg === 'bad input skipped' && String(l.where).includes('a-bomb.yaml'), 0, 30_000);
  t.match(String(bomb.reason), /more than \d+ values with aliases expanded/, `the alias bomb is named: ${String(bomb.reason)}`);

  // The worst file of each limit, at the size limit: each costs the most a
  // file can cost in parse time and memory.
  const big = MAX_FILE_BYTES - 1024;
  const worst: Record<string, string> = {
    'b-flat.yaml': `kind: Service\nx: [${'0,'.repeat(big / 2 - 16)}0]\n`,
    'b-flat.json': `{"kind":"Service","x":[${'0,'.repeat(big / 2 - 32)}0]}`,
    'b-empty-docs.yaml': '---\n{}\n'.repeat(Math.floor(big / 7)),
    'b-objects.json': JSON.stringify({ kind: 'List', items: Array.from({ length: 90_000 }, (_, i) => service(`w${i}`, '10.97.0.1')) }).slice(0, big),
  };
  for (const [name, text] of Object.entries(worst)) sb.writeManifest(name, text);

  // Then the flood, written one file after another into the watched directory.
  // (Each under 256 KiB: the files at the size limit are the ones above.)
  const texts = fc.sample(hostileText.filter((x) => x.length < 256 * 1024), { seed: 20261125, numRuns: FILES });
  const t0 = Date.now();
  for (const [i, text] of texts.entries()) sb.writeManifest(`h-${String(i).padStart(4, '0')}.${i % 4 === 0 ? 'json' : 'yaml'}`, text);
  const mark = agent.logs.length;
  sb.writeManifest('zz-last.yaml', asYaml([service('last', '10.96.0.250')]));
  await sb.waitUntil(async () => (await sb.lbList()).some((e) => e.frontend === '10.96.0.250:80/TCP'), 'the file written last is programmed', 120_000);

  t.comment(`the flood was read and programmed in ${Date.now() - t0} ms`);
  t.ok(agent.running, 'the agent is still running');
  t.same(await sentinelEntry(), before, 'the sentinel is programmed exactly as before');
  t.ok(await reachable(sb), 'the sentinel still answers');
  t.equal(await get(sb.agentPort('health'), '/livez'), 200, '/livez answers 200');
  t.equal(await get(sb.agentPort('health'), '/healthz'), 200, '/healthz answers 200');
  const status = await run(LBCTL, ['status', '--brief', '--api-socket', sb.apiSocket], CLI_TIMEOUT_MS);
  t.equal(status.code, 0, `the local API answers: ${status.stdout.trim()}`);

  const skipped = agent.logs.filter((l: LogLine) => l.msg === 'bad input skipped');
  t.ok(skipped.length > FILES / 4, `${skipped.length} problems reported`);
  const unnamed = skipped.filter((l) => typeof l.where !== 'string' || !l.where.includes(sb.manifestDir) || typeof l.reason !== 'string' || l.reason === '');
  t.same(unnamed.slice(0, 3), [], 'every problem names its file and says why');
  const metrics = await (await fetch(`http://127.0.0.1:${sb.agentPort('metrics')}/metrics`)).text();
  const counted = [...metrics.matchAll(/^lbctl_skipped_objects_total\{kind="[^"]+",reason="([a-z]+)"\} (\d+)/gm)];
  t.ok(counted.reduce((n, m) => n + Number(m[2]), 0) >= skipped.length, `lbctl_skipped_objects_total counts them (${counted.map((m) => `${m[1]}=${m[2]}`).join(' ')})`);
  t.notOk(agent.logs.slice(mark).some((l) => l.msg === 'sync failed; the maps keep their last good state'), 'no sync failed');

  const peakMiB = Math.round(vmKiB(agent.pid, 'VmHWM') / 1024);
  t.ok(peakMiB < AGENT_PEAK_BOUND_MIB, `the agent's peak RSS is ${peakMiB} MiB (${Math.round(baseKiB / 1024)} MiB before the flood), under ${AGENT_PEAK_BOUND_MIB} MiB`);
});
