// The tc programs switch onto every device as one, all or nothing (issue 34,
// item 10): node 1 serves n1e and n1b, two devices and two directions, four
// attachments. Through LBCTL_FAILPOINT_TC_ATTACH the kernel refuses the n-th
// attach of a switch (a program of another type: EINVAL), in each attach mode:
//   (a) a fresh node, the 3rd attach refused (n1e switched, n1b half): no
//       program of ours is left on any hook, no tcx link pinned; the agent
//       keeps running, says which device and what was undone, and retries;
//   (b) under load, with two long connections, an agent restarted with a new
//       flow-map size (--ct-max: its flows carried into a new map at the
//       switch), the 2nd attach refused at every try (n1e's ingress switched
//       before its egress failed): every hook runs the programs it ran
//       before, by id, the pinned lb4_ct is the old map, the staged maps wait
//       for a switch that succeeds; stopped, the agent removes them;
//   (c) the same, the 4th attach refused at the first try only: the retry
//       switches all four, commits the carried flows, the pinned lb4_ct is
//       the new map, and the long connections keep their pod and SNAT port.
// Not one request fails throughout.
import path from 'node:path';
import { existsSync, readdirSync } from 'node:fs';
import t, { type Test } from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import {
  ECHO_PORT, endpoint, hookPrograms, makeLab, NODE1, NODE1_TO_N2, northSouth, ourPrograms, perMode, POD2, type HookProgram, type Lab,
} from '../helpers/nodeport-lab.js';
import { CLI_TIMEOUT_MS, createSandbox, LBCTL, run, SLOW, type Sandbox } from '../helpers/sandbox.js';
import { PROGRAMS, type AttachMode } from '../../src/datapath/nodeport.js';
import { mapSpecs } from '../../src/datapath/abi.gen.js';

const WEB_PORT = 30080;
const REMOTE_ECHO = 30072;
const DEVICES = ['n1e', 'n1b'];
const NODE_ARGS = ['--devices', 'n1e,n1b', '--node-name', 'node1'];
const RATE = Math.max(10, Math.round(50 / SLOW));
const FAILPOINT = 'LBCTL_FAILPOINT_TC_ATTACH';
const OURS: ReadonlySet<string> = new Set(Object.values(PROGRAMS));
/** Another lb4_ct size than the default: the switch carries the flows into a new map. */
const CT_MAX = mapSpecs.lb4_ct.maxEntries / 2;

function manifests(): string {
  const both = { 4: [endpoint(1, 4), endpoint(2, 4)], 6: [endpoint(1, 6), endpoint(2, 6)] };
  return yamlDocs([
    ...northSouth({ name: 'web', clusterIPs: ['10.96.0.10', 'fd00:96::10'], ports: [{ name: 'http', port: 80, targetPort: 8080, nodePort: WEB_PORT }] }, both),
    ...northSouth({ name: 'echo-remote', clusterIPs: ['10.96.0.12'], ports: [{ name: 'echo', port: 7000, targetPort: ECHO_PORT, nodePort: REMOTE_ECHO }] }, { 4: [endpoint(2, 4)] }),
  ]);
}

/** Every program on n1e's and n1b's hooks that is ours (any mode), by "device/direction". */
async function oursOnHooks(lab: Lab): Promise<Record<string, HookProgram[]>> {
  const hooks = await hookPrograms(lab, lab.n1, DEVICES);
  const out: Record<string, HookProgram[]> = {};
  for (const dev of DEVICES) for (const dir of ['ingress', 'egress'] as const) out[`${dev}/${dir}`] = hooks[dev]![dir].filter((p) => OURS.has(p.name));
  return out;
}

const NOTHING = { 'n1e/ingress': [], 'n1e/egress': [], 'n1b/ingress': [], 'n1b/egress': [] };

/**
 * oursOnHooks between the agent's rounds: a retried round (1 s, 2 s, ...
 * after a failed one) attaches and undoes its programs while it runs, which
 * in a TCG guest takes long enough for a look to land inside it. What a
 * failed round left behind is there in every look; a round in progress is
 * gone in the next, so up to ten looks 300 ms apart, the first with nothing
 * of ours (else the last) returned.
 */
async function betweenRounds(lab: Lab): Promise<Record<string, HookProgram[]>> {
  let seen = await oursOnHooks(lab);
  for (let i = 0; i < 9 && Object.values(seen).some((v) => v.length > 0); i++) {
    await new Promise((r) => setTimeout(r, 300 * SLOW));
    seen = await oursOnHooks(lab);
  }
  return seen;
}

const tcLinks = (sb: Sandbox): string[] => (existsSync(path.join(sb.bpfRoot, 'links')) ? readdirSync(path.join(sb.bpfRoot, 'links')).filter((n) => n.startsWith('tc-')) : []);
const staged = (sb: Sandbox): boolean => existsSync(path.join(sb.bpfRoot, 'tc-maps-next'));
const pinnedCt = async (sb: Sandbox): Promise<{ id: number; max_entries: number }> => sb.bpftool(['map', 'show', 'pinned', path.join(sb.bpfRoot, 'maps', 'lb4_ct')]);

/** The agent's "device not attached" problems so far. */
const problems = (lab: Lab): string[] => lab.agent.requireAgent().logs.filter((l) => l.msg === 'tc datapath: device not attached').map((l) => String(l.problem));

async function statusLine(lab: Lab): Promise<string> {
  const r = await run(LBCTL, ['status', '--api-socket', lab.agent.place.apiSocket], CLI_TIMEOUT_MS);
  return r.stdout;
}

async function scenario(t: Test, sb: Sandbox, lab: Lab, mode: AttachMode): Promise<void> {
  const args = (...more: string[]): string[] => [...NODE_ARGS, '--tc-attach', mode, ...more];

  // (a) A fresh node; the switch fails half way through n1b.
  const fresh = await lab.agent.start(args(), { env: { [FAILPOINT]: '3' } });
  t.ok(fresh.frontends > 0, `the agent started and synced its ClusterIPs all the same (${fresh.frontends} frontends)`);
  const [freshProblem] = problems(lab);
  t.match(
    freshProblem,
    /^tc programs not switched: device n1[eb] \(ifindex \d+\) ingress \(3 of 4 attachments\): .*EINVAL.*; every device \(n1e, n1b\) runs what it ran before \(switched back: 0, new ones removed: 2\); retried/,
    `the agent names the device, the attach and what it undid (${freshProblem})`,
  );
  t.same(await betweenRounds(lab), NOTHING, 'no program of ours is left on any hook: n1e\'s two were removed');
  t.same(tcLinks(sb), [], 'no tcx link of ours is pinned');
  // Retried after 1 s, then 2 s: still refused, still nothing half done, logged once.
  await new Promise((r) => setTimeout(r, 3500 * SLOW));
  t.same(await betweenRounds(lab), NOTHING, 'after the retries: still nothing half switched');
  t.equal(problems(lab).length, 1, 'the problem is logged once, not at every retry');
  t.match(await statusLine(lab), /tc programs not switched: device n1[eb]/, 'lbctl status shows it');
  t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM');

  // Served by a start without the failpoint; a load and a long connection through SNAT from here on.
  await lab.agent.start(args());
  const before = await ourPrograms(t, lab, DEVICES, mode, 'a start without the failpoint');
  const ctBefore = await pinnedCt(sb);
  const load = lab.startLoad({ tcp: [`${NODE1.v4}:${WEB_PORT}@${RATE}`, `[${NODE1.v6}]:${WEB_PORT}@${Math.max(5, RATE / 2)}`], maxSeconds: 90 * SLOW });
  await load.waitFor((p) => p.ok >= RATE, 'the load to run');
  const long = lab.startLong(NODE1.v4, REMOTE_ECHO, { maxSeconds: 100 * SLOW });
  await long.answered(3, 'the first answers');
  const served = async (what: string): Promise<void> => {
    const p0 = load.progress()!;
    const p = await load.waitFor((x) => x.ok >= p0.ok + 2 * RATE, `${2 * RATE} more connections ${what}`, 30_000);
    t.equal(p.failed, 0, `${what}: new connections keep succeeding (${p.ok - p0.ok} more; ${p.failed} failed${p.failed ? `: ${JSON.stringify(p.failures)}` : ''})`);
    await long.answered(5, `5 more answers ${what}`);
    t.equal(long.progress()?.failed, 0, `${what}: the long connection answers`);
  };
  t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM before the upgrade');

  // (b) The new flow-map size, and n1e's egress refused at every try.
  await lab.agent.start(args('--ct-max', String(CT_MAX)), { env: { [FAILPOINT]: '2' } });
  const [upgradeProblem] = problems(lab);
  t.match(
    upgradeProblem,
    /^tc programs not switched: device n1[eb] \(ifindex \d+\) egress \(2 of 4 attachments\): .*; every device \(n1e, n1b\) runs what it ran before \(switched back: 1, new ones removed: 0\)/,
    `the switch was refused at the 2nd attach and undone (${upgradeProblem})`,
  );
  const rolledBack = await ourPrograms(t, lab, DEVICES, mode, 'after the refused switch');
  t.same(
    Object.keys(rolledBack).filter((k) => rolledBack[k]!.id !== before[k]!.id),
    [],
    `every hook runs the very program it ran before (${Object.entries(rolledBack).map(([k, p]) => `${k} ${p.id}`).join(', ')})`,
  );
  t.equal((await pinnedCt(sb)).id, ctBefore.id, 'the pinned lb4_ct is still the old map, which those programs use');
  t.ok(staged(sb), 'the new maps wait in tc-maps-next for a switch that succeeds');
  await served('with the switch refused');
  t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM');
  t.notOk(staged(sb), 'stopped before any switch succeeded, it removed the staged maps');
  t.equal((await pinnedCt(sb)).id, ctBefore.id, 'and left the old lb4_ct pinned');

  // (c) The last attach refused at the first try only: the retry switches all.
  const started = Date.now();
  await lab.agent.start(args('--ct-max', String(CT_MAX)), { env: { [FAILPOINT]: '4:1' } });
  const committed = await lab.agent.requireAgent().waitForLog((l) => l.msg === 'tc maps carried over: committed after the switch (entries the old programs wrote meanwhile carried too)', 0, 20_000 * SLOW);
  t.pass(`the retry switched every device and committed the carried flows ${Math.round((Date.now() - started) / 100) / 10} s after the start (${JSON.stringify(committed.after)})`);
  t.match(problems(lab)[0], /\(4 of 4 attachments\).*\(switched back: 3, new ones removed: 0\)/, `the first try was undone whole (${problems(lab)[0]})`);
  const after = await ourPrograms(t, lab, DEVICES, mode, 'after the retry');
  t.same(Object.keys(after).filter((k) => after[k]!.id === before[k]!.id), [], 'every hook runs a newly loaded program');
  const ctAfter = await pinnedCt(sb);
  t.ok(ctAfter.id !== ctBefore.id && ctAfter.max_entries === CT_MAX, `the pinned lb4_ct is the new map of ${CT_MAX} entries (id ${ctBefore.id} -> ${ctAfter.id})`);
  t.notOk(staged(sb), 'nothing left staged');
  t.notMatch(await statusLine(lab), /not switched/, 'lbctl status shows no problem any more');
  await served('after the retry');

  const r = await load.stop();
  t.equal(r.failed, 0, `the load: ${r.ok} connections, none failed${r.failed ? `: ${JSON.stringify(r.failures.slice(0, 3))}` : ''}`);
  const l = await long.stop();
  t.ok(l.sent >= 20 && l.ok === l.sent && l.failures.length === 0, `the long connection: every one of ${l.sent} requests answered`);
  t.same(Object.keys(l.servers), [`${POD2.v4}:${ECHO_PORT}`], 'by one pod throughout');
  const seenAs = Object.keys(l.seenAs);
  t.ok(seenAs.length === 1 && seenAs[0]!.startsWith(`${NODE1_TO_N2.v4}:`), `through one SNAT address and port throughout (${seenAs.join(', ')})`);
  await lab.agent.stop(10_000);
}

t.test('tc programs switch onto every device all or nothing: a refused attach undoes the whole switch, which is retried; no request fails', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab = await makeLab(sb);
  sb.writeManifest('services.yaml', manifests());
  await perMode(t, lab, (t, mode) => scenario(t, sb, lab, mode));
});
