// `lbctl agent --config FILE`: the file's keys are the agent's flags in
// camelCase, parsed by the flags' own parsers; the command line overrides
// the file, the file the defaults; durations take kube-proxy's form.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import type { Command } from 'commander';
import { formatDuration, parseDuration } from '../../src/cli/config.js';
import { buildProgram, resolveAgentOptions } from '../../src/cli/program.js';
import { nodePortOptions, type AgentCommandOptions } from '../../src/cli/commands/agent.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'lbctl-config-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
const file = (text: string): string => {
  const f = path.join(dir, `agent-${n++}.yaml`);
  writeFileSync(f, text);
  return f;
};
const HEADER = 'apiVersion: lbctl.io/v1alpha1\nkind: AgentConfiguration\n';

/** The options `lbctl agent ARGS` would run with (the agent itself is not started). */
async function optionsOf(args: string[]): Promise<AgentCommandOptions> {
  const program = buildProgram().exitOverride();
  const agent = program.commands.find((c) => c.name() === 'agent')!;
  agent.exitOverride().configureOutput({ writeErr: () => {}, writeOut: () => {} });
  let got: AgentCommandOptions | undefined;
  agent.action(async (_o: unknown, cmd: Command) => {
    got = await resolveAgentOptions(cmd);
  });
  await program.parseAsync(['agent', ...args], { from: 'user' });
  return got!;
}

t.test('durations: Go\'s form, as kube-proxy takes them, and bare milliseconds', async (t) => {
  const cases: Array<[string, number]> = [
    ['1s', 1000], ['500ms', 500], ['30s', 30_000], ['1m30s', 90_000], ['1.5h', 5_400_000], ['2h45m', 9_900_000],
    ['250000us', 250], ['250000\u00b5s', 250], ['250000\u03bcs', 250], ['1ms500\u00b5s', 2], ['0', 0], ['0s', 0], ['1500', 1500], ['.5s', 500], [' 10s ', 10_000],
  ];
  for (const [text, ms] of cases) t.equal(parseDuration(text), ms, `${JSON.stringify(text)} is ${ms} ms`);
  for (const bad of ['', 's', '1', '1 s', '1sec', '1d', '-1s', '1s2', 'ten seconds', '1e3s', '1h-5m', '999999h']) {
    if (bad === '1') continue; // a bare integer is milliseconds
    t.throws(() => parseDuration(bad), /duration|24 days/, `${JSON.stringify(bad)} is refused`);
  }
  t.equal(formatDuration(90_000), '90s');
  t.equal(formatDuration(3_600_000), '1h');
  t.equal(formatDuration(500), '500ms');
});

t.test('flags take durations', async (t) => {
  const o = await optionsOf(['--source', 'file:/x', '--sync-period', '1m', '--min-sync-period', '250ms', '--node-sync-timeout', '2s']);
  t.equal(o.syncPeriod, 60_000);
  t.equal(o.minSyncPeriod, 250);
  t.equal(o.nodeSyncTimeout, 2000);
  await t.rejects(optionsOf(['--source', 'file:/x', '--sync-period', '0s']), /at least 1ms/, 'a zero sync period is refused');
  await t.rejects(optionsOf(['--source', 'file:/x', '--sync-period', 'often']), /duration/, 'a word is refused');
});

t.test('the file sets what the command line leaves at its default; the command line wins', async (t) => {
  const f = file(`${HEADER}
source: file:/etc/lbctl/services
syncPeriod: 1m30s
minSyncPeriod: 1s
logLevel: debug
healthPort: 10256
metricsBindAddress: 0.0.0.0
nodeport: false
externalClusterip: true
devices: [eth0, eth1]
nodeportRange: 30000-32000
maxServices: 100000
`);
  const o = await optionsOf(['--config', f, '--log-level', 'warn', '--min-sync-period', '2s']);
  t.equal(o.source, 'file:/etc/lbctl/services');
  t.equal(o.syncPeriod, 90_000, 'a duration from the file');
  t.equal(o.minSyncPeriod, 2000, 'the flag wins over the file');
  t.equal(o.logLevel, 'warn', 'the flag wins over the file');
  t.equal(o.healthPort, 10256);
  t.equal(o.metricsBindAddress, '0.0.0.0');
  t.equal(o.nodeport, false, 'a negatable flag by its attribute (--no-nodeport: nodeport: false)');
  t.equal(o.externalClusterip, true);
  t.equal(o.devices, 'eth0,eth1', 'a list is the flag\'s comma-separated value');
  t.equal(o.nodeportRange, '30000-32000');
  t.equal(o.maxServices, 100_000);
  const d = await optionsOf(['--source', 'file:/x']);
  t.equal(d.syncPeriod, 30_000, 'without a file: the defaults');
  t.equal(d.logLevel, 'info');
});

t.test('bad files are refused, naming the file and the key', async (t) => {
  const bad: Array<[string, RegExp]> = [
    [`${HEADER}syncPeriod: often\n`, /agent-\d+\.yaml: syncPeriod: "often": expected a duration/],
    [`${HEADER}maxServices: -3\n`, /maxServices: "-3": expected a positive integer/],
    [`${HEADER}healthPort: 70000\n`, /healthPort: "70000": expected a port/],
    [`${HEADER}logLevel: loud\n`, /logLevel: "loud": expected trace, debug/],
    [`${HEADER}syncPeriood: 1s\n`, /unknown setting "syncPeriood" \(settings are the agent's flags in camelCase: .*syncPeriod/],
    [`${HEADER}config: /etc/other.yaml\n`, /unknown setting "config"/],
    [`${HEADER}nodeport: "no"\n`, /nodeport: expected true or false/],
    [`${HEADER}devices: {a: 1}\n`, /devices: expected a string, a number or a list/],
    [`${HEADER}syncPeriod:\n`, /syncPeriod: no value/],
    ['apiVersion: v1\nkind: ConfigMap\n', /expected apiVersion lbctl\.io\/v1alpha1 and kind AgentConfiguration, found "v1" and "ConfigMap"/],
    ['- a\n- b\n', /expected a mapping of settings, found a list/],
    ['a: [\n', /not YAML/],
  ];
  for (const [text, re] of bad) {
    const f = file(text);
    await t.rejects(optionsOf(['--config', f]), re, text.replace(HEADER, '').trim());
  }
  await t.rejects(optionsOf(['--config', path.join(dir, 'missing.yaml')]), /--config .*missing\.yaml: ENOENT/, 'a missing file');
  t.same(await optionsOf(['--config', file(''), '--source', 'file:/x']).then((o) => o.syncPeriod), 30_000, 'an empty file sets nothing');
});

t.test('the ConfigMap in deploy/ is a valid configuration', async (t) => {
  const yaml = (await import('js-yaml')).default;
  const { readFileSync } = await import('node:fs');
  const cm = yaml.load(readFileSync(new URL('../../deploy/base/configmap.yaml', import.meta.url), 'utf8')) as { data: Record<string, string> };
  const f = file(cm.data['agent.yaml']!);
  const o = await optionsOf(['--config', f]);
  t.equal(o.healthPort, 10256, 'health on kube-proxy\'s port');
  t.equal(o.metricsPort, 10249, 'metrics on kube-proxy\'s port');
  t.equal(o.metricsBindAddress, '127.0.0.1');
});

t.test('--probe-all-failed: open (the default) or closed, from the command line or the file', async (t) => {
  t.equal((await optionsOf(['--source', 'file:/x'])).probeAllFailed, 'open');
  t.equal((await optionsOf(['--source', 'file:/x', '--probe-all-failed', 'closed'])).probeAllFailed, 'closed');
  await t.rejects(optionsOf(['--source', 'file:/x', '--probe-all-failed', 'shut']), /expected open or closed/);
  t.equal((await optionsOf(['--config', file(`${HEADER}probeAllFailed: closed\nsource: file:/x\n`)])).probeAllFailed, 'closed');
});

t.test('--watch-list: off (the default), auto or on, from the command line or the file', async (t) => {
  t.equal((await optionsOf(['--source', 'file:/x'])).watchList, 'off');
  t.equal((await optionsOf(['--kubeconfig', '/k', '--watch-list', 'auto'])).watchList, 'auto');
  await t.rejects(optionsOf(['--kubeconfig', '/k', '--watch-list', 'yes']), /expected off, auto or on/);
  t.equal((await optionsOf(['--config', file(`${HEADER}watchList: on\nkubeconfig: /k\n`)])).watchList, 'on');
});

t.test('--tc-attach: auto (the default), tcx or clsact, from the command line or the file, handed to the tc datapath', async (t) => {
  const o = await optionsOf(['--source', 'file:/x']);
  t.equal(o.tcAttach, 'auto');
  t.equal(nodePortOptions(o)?.tcAttach, 'auto');
  const c = await optionsOf(['--source', 'file:/x', '--tc-attach', 'clsact']);
  t.equal(nodePortOptions(c)?.tcAttach, 'clsact');
  await t.rejects(optionsOf(['--source', 'file:/x', '--tc-attach', 'tc']), /expected auto, tcx or clsact/);
  t.equal((await optionsOf(['--config', file(`${HEADER}tcAttach: tcx\nsource: file:/x\n`)])).tcAttach, 'tcx');
  await t.rejects(optionsOf(['--config', file(`${HEADER}tcAttach: xdp\nsource: file:/x\n`)]), /tcAttach: "xdp": expected auto, tcx or clsact/);
});

t.test('--nodeport-acceleration: disabled (the default), native or best-effort, from the command line or the file, handed to the tc datapath', async (t) => {
  t.equal(nodePortOptions(await optionsOf(['--source', 'file:/x']))?.acceleration, 'disabled');
  for (const a of ['native', 'best-effort'] as const) t.equal(nodePortOptions(await optionsOf(['--source', 'file:/x', '--nodeport-acceleration', a]))?.acceleration, a);
  await t.rejects(optionsOf(['--source', 'file:/x', '--nodeport-acceleration', 'generic']), /expected disabled, native or best-effort/);
  t.equal(nodePortOptions(await optionsOf(['--config', file(`${HEADER}nodeportAcceleration: native\nsource: file:/x\n`)]))?.acceleration, 'native');
  await t.rejects(optionsOf(['--config', file(`${HEADER}nodeportAcceleration: xdp\nsource: file:/x\n`)]), /nodeportAcceleration: "xdp": expected disabled, native or best-effort/);
});

t.test('--nodeport-mode: snat (the default), dsr or hybrid, from the command line or the file, handed to the tc datapath', async (t) => {
  const o = await optionsOf(['--source', 'file:/x']);
  t.equal(nodePortOptions(o)?.settings.mode, 'snat');
  for (const mode of ['dsr', 'hybrid'] as const) t.equal(nodePortOptions(await optionsOf(['--source', 'file:/x', '--nodeport-mode', mode]))?.settings.mode, mode);
  await t.rejects(optionsOf(['--source', 'file:/x', '--nodeport-mode', 'ipip']), /expected snat, dsr or hybrid/);
  t.equal(nodePortOptions(await optionsOf(['--config', file(`${HEADER}nodeportMode: dsr\nsource: file:/x\n`)]))?.settings.mode, 'dsr');
  await t.rejects(optionsOf(['--config', file(`${HEADER}nodeportMode: direct\nsource: file:/x\n`)]), /nodeportMode: "direct": expected snat, dsr or hybrid/);
});
