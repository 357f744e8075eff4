// The tc datapath's devices (issue 14): node 1 gets a third veth, n1x, to
// a second external client (ext2), named in --devices. The veth is deleted
// (its ifindex goes) and made again with the same name and addresses: the
// agent detaches, then attaches to the new device, says so, and the
// NodePort answers through it again. After the agent stops, `lbctl cleanup`
// leaves no tc program of ours on node 1's devices (no tcx link, no clsact
// filter), and an agent told `--devices nosuchdev` refuses to start,
// naming the flag.
import { execFileSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import path from 'node:path';
import t, { type Test } from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import { endpoint, extGet, hostOf, makeLab, NODE1, northSouth, POD1, POD2, tcxPrograms, wire, type Lab, type TcxHooks } from '../helpers/nodeport-lab.js';
import { CLI_TIMEOUT_MS, createSandbox, LBCTL, run, SLOW, type Sandbox } from '../helpers/sandbox.js';
import { removeNetns } from '../helpers/sandbox/topology.js';

const HTTP = 8080;
const NODE_PORT = 30080;
const N1X = { v4: '10.249.0.1', v6: 'fd00:249::1' };
const EXT2 = { v4: '10.249.0.2', v6: 'fd00:249::2' };
const NODE_ARGS = ['--devices', 'n1e,n1b,n1x', '--node-name', 'node1'];
const DEVICES = ['n1e', 'n1b', 'n1x'];

const manifests = (): string =>
  yamlDocs(northSouth({ name: 'web', clusterIPs: ['10.96.0.10'], ports: [{ name: 'http', port: 80, targetPort: HTTP, nodePort: NODE_PORT }] }, { 4: [endpoint(1), endpoint(2)] }));

/** n1x (node 1) ↔ ext20 (the second external client), as makeLab wires its own veths. */
const wireN1x = (lab: Lab, ext2: string): void => wire({ ns: lab.n1, dev: 'n1x', ...N1X }, { ns: ext2, dev: 'ext20', ...EXT2 });

function ifindex(ns: string, dev: string): number {
  const out = JSON.parse(execFileSync('ip', ['-n', ns, '-j', 'link', 'show', dev], { encoding: 'utf8' })) as Array<{ ifindex: number }>;
  return out[0]!.ifindex;
}

/** curl from ext2 to the NodePort at n1x's address, `n` times. */
async function fromExt2(lab: Lab, ext2: string, n: number): Promise<Array<{ ok: boolean; server: string; error: string }>> {
  const out = [];
  for (let i = 0; i < n; i++) {
    const r = await lab.inNs(ext2, ['curl', '-sS', '--max-time', String(3 * SLOW), `http://${N1X.v4}:${NODE_PORT}/`]);
    out.push({ ok: r.code === 0, server: r.stdout.trim(), error: r.stderr.trim() });
  }
  return out;
}

/** Names of the programs (by id) through bpftool; a program that is gone has no name. */
async function progNames(ids: readonly number[]): Promise<string[]> {
  const names = [];
  for (const id of ids) {
    const r = await run('bpftool', ['-j', 'prog', 'show', 'id', String(id)], CLI_TIMEOUT_MS);
    names.push(r.code === 0 ? (JSON.parse(r.stdout) as { name: string }).name : `#${id}?`);
  }
  return names;
}

async function oursOn(hooks: Record<string, TcxHooks>): Promise<string[]> {
  const out: string[] = [];
  for (const [dev, h] of Object.entries(hooks)) {
    for (const dir of ['ingress', 'egress'] as const) {
      const ids = h[dir];
      if (!Array.isArray(ids)) continue;
      for (const name of await progNames(ids)) if (/^lb_nodeport/.test(name)) out.push(`${dev}/${dir}:${name}`);
    }
  }
  return out.sort();
}

/** The tc pins under the bpf root: tc-<ifindex>-<direction>. */
const tcPins = (sb: Sandbox): string[] => readdirSync(path.join(sb.bpfRoot, 'links')).filter((n) => n.startsWith('tc-')).sort();

async function answersFromExt2(t: Test, lab: Lab, ext2: string, what: string): Promise<void> {
  const got = await fromExt2(lab, ext2, 8);
  t.ok(got.every((r) => r.ok), `${what}: the NodePort at ${N1X.v4}:${NODE_PORT} answers ext2 (${got.map((r) => r.server || r.error).join(', ')})`);
  t.ok(got.every((r) => [POD1.v4, POD2.v4].includes(hostOf(r.server))), `${what}: served by the pods`);
}

t.test('a device that vanishes and returns is attached again; lbctl cleanup leaves nothing on the devices; --devices nosuchdev refuses the start', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab = await makeLab(sb);
  const ext2 = `${sb.runId}-ext2`;
  sb.addCleanup(() => removeNetns(ext2));
  execFileSync('ip', ['netns', 'add', ext2]);
  execFileSync('ip', ['-n', ext2, 'link', 'set', 'lo', 'up']);
  wireN1x(lab, ext2);
  sb.writeManifest('services.yaml', manifests());

  await lab.agent.start(NODE_ARGS);
  const agent = lab.agent.agent!;
  const devicesLine = (from: number) => agent.logs.slice(from).filter((l) => l.msg === 'tc datapath: devices and node addresses') as Array<{ devices?: string[]; nodeAddresses?: string[] }>;
  const first = devicesLine(0).at(-1);
  t.same(first?.devices?.slice().sort(), [...DEVICES].sort(), 'the agent serves n1e, n1b and n1x');
  t.ok(first?.nodeAddresses?.includes(N1X.v4), `NodePorts answer at n1x's address too (${first?.nodeAddresses?.join(', ')})`);
  const oldIndex = ifindex(lab.n1, 'n1x');
  t.ok(tcPins(sb).includes(`tc-${oldIndex}-ingress`), `n1x (ifindex ${oldIndex}) has its tcx links (${tcPins(sb).join(', ')})`);
  await answersFromExt2(t, lab, ext2, 'at first');

  // The device vanishes.
  let mark = agent.logs.length;
  execFileSync('ip', ['-n', lab.n1, 'link', 'del', 'n1x']);
  const waiting = await agent.waitForLog((l) => l.msg === 'device named by --devices is not usable yet; attached when it is', mark);
  t.match(String(waiting.device), /^n1x: no such device/, `the agent notices: ${String(waiting.device)}`);
  await agent.waitForLog((l) => l.msg === 'tc datapath: devices and node addresses' && !(l.devices as string[]).includes('n1x'), mark);
  t.notOk(tcPins(sb).some((n) => n.startsWith(`tc-${oldIndex}-`)), `the old ifindex's links are unpinned (${tcPins(sb).join(', ')})`);
  t.ok(agent.running, 'the agent runs on');

  // It returns, same name, same addresses, a new ifindex.
  mark = agent.logs.length;
  wireN1x(lab, ext2);
  const newIndex = ifindex(lab.n1, 'n1x');
  t.not(newIndex, oldIndex, `n1x is back with a new ifindex (${oldIndex} → ${newIndex})`);
  const back = (await agent.waitForLog((l) => l.msg === 'tc datapath: devices and node addresses' && (l.devices as string[]).includes('n1x'), mark)) as { devices?: string[]; nodeAddresses?: string[] };
  t.same(back.devices?.slice().sort(), [...DEVICES].sort(), `the agent logs the re-attach: ${JSON.stringify(back)}`);
  t.ok(back.nodeAddresses?.includes(N1X.v4), 'with its address among the node addresses');
  t.notOk(agent.logs.slice(mark).some((l) => l.msg === 'tc datapath: device not attached'), 'no attach error');
  t.ok(tcPins(sb).includes(`tc-${newIndex}-ingress`) && tcPins(sb).includes(`tc-${newIndex}-egress`), `links for the new ifindex (${tcPins(sb).join(', ')})`);
  const hooks = await tcxPrograms(lab, lab.n1, DEVICES);
  const attached = await oursOn(hooks);
  t.same(
    attached.map((a) => a.replace(/:.*/, '')),
    ['n1b/egress', 'n1b/ingress', 'n1e/egress', 'n1e/ingress', 'n1x/egress', 'n1x/ingress'],
    `the kernel has our programs on every hook of the three devices (${attached.join(', ')})`,
  );
  await answersFromExt2(t, lab, ext2, 'after the re-attach');
  const fromExt = await extGet(lab, NODE1.v4, NODE_PORT);
  t.ok(fromExt.ok, `and still to the first client through n1e (${fromExt.server || fromExt.error})`);

  // The device goes and comes back while the agent is down: the next agent attaches to the new ifindex.
  t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM');
  execFileSync('ip', ['-n', lab.n1, 'link', 'del', 'n1x']);
  wireN1x(lab, ext2);
  const thirdIndex = ifindex(lab.n1, 'n1x');
  await lab.agent.start(NODE_ARGS);
  t.ok(tcPins(sb).includes(`tc-${thirdIndex}-ingress`), `n1x re-made while the agent was down (ifindex ${newIndex} → ${thirdIndex}): the next agent attaches to it (${tcPins(sb).join(', ')})`);
  await answersFromExt2(t, lab, ext2, 'after a restart that found n1x re-made');
  // (Fixed in 2be9830: the pins of an ifindex that vanished while the agent was down stayed, defunct, holding the old programs.)
  t.same(
    tcPins(sb).filter((n) => n.startsWith(`tc-${newIndex}-`)),
    [],
    `the links of ifindex ${newIndex}, gone while the agent was down, are unpinned at its next start (${tcPins(sb).join(', ')})`,
  );

  // Stopped, then cleaned up (in node 1's namespace, where the filters would be).
  const linkIds = Object.values(await sb.links()).map((l) => l.linkId);
  t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM');
  t.same((await oursOn(await tcxPrograms(lab, lab.n1, DEVICES))).length, 6, 'its programs stay attached after it stops');
  const cleanup = await run('nsenter', [`--net=/run/netns/${lab.n1}`, LBCTL, 'cleanup', '--bpf-root', sb.bpfRoot], CLI_TIMEOUT_MS);
  t.equal(cleanup.code, 0, `lbctl cleanup: ${cleanup.stdout.trim()}${cleanup.stderr.trim()}`);
  // tc filter show and bpftool net show see clsact filters (kernels before
  // 6.6); Debian's bpftool 7.1 does not list tcx links, so on a tcx kernel
  // the kernel's own answer (tcxPrograms) and the link ids are what prove it.
  const tcFilter = await lab.inNs(lab.n1, ['tc', 'filter', 'show', 'dev', 'n1e', 'ingress']);
  t.equal(tcFilter.stdout.trim(), '', `tc filter show dev n1e ingress: nothing (${tcFilter.stderr.trim() || 'empty'})`);
  const net = await lab.inNs(lab.n1, ['bpftool', '-j', 'net', 'show']);
  const netShow = JSON.parse(net.stdout || '[]') as Array<{ tc?: Array<{ devname: string; name?: string }>; xdp?: unknown[] }>;
  t.same(netShow.flatMap((n) => n.tc ?? []).filter((f) => /^lb_nodeport/.test(f.name ?? '')), [], `bpftool net show in node 1: no tc program of ours (${net.stdout.trim()})`);
  const after = await tcxPrograms(lab, lab.n1, DEVICES);
  t.same(await oursOn(after), [], `the tcx hooks of n1e, n1b and n1x hold none of ours (${JSON.stringify(after)})`);
  const links = JSON.parse((await run('bpftool', ['-j', 'link', 'show'], CLI_TIMEOUT_MS)).stdout || '[]') as Array<{ id: number }>;
  t.same(links.filter((l) => linkIds.includes(l.id)).map((l) => l.id), [], `none of the agent's ${linkIds.length} links exists any more`);
  const gone = await extGet(lab, NODE1.v4, NODE_PORT, 2);
  t.notOk(gone.ok, `the NodePort is no longer served (${gone.error})`);

  // A device that does not exist: the start is refused, naming the flag.
  const refused = await lab.agent.start(['--devices', 'nosuchdev', '--node-name', 'node1']).then(
    () => undefined,
    (e: unknown) => e as Error,
  );
  t.ok(refused, 'an agent with --devices nosuchdev does not start');
  const why = lab.agent.agent!.logs.find((l) => /--devices/.test(String(l.line ?? '')));
  t.match(String(why?.line), /^lbctl: --devices: no device nosuchdev/, `it says why, naming --devices: ${String(why?.line)}`);
  t.equal(await lab.agent.agent!.exited, 1, 'and exits 1');
});
