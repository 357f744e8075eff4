// The tc datapath's devices (issue 14): node 1 gets a third veth, n1x, to
// a second external client (ext2), named in --devices. The veth is deleted
// (its ifindex goes) and made again with the same name and addresses: the
// agent detaches, then attaches to the new device, says so, and the
// NodePort answers through it again. After the agent stops, `lbctl cleanup`
// leaves no tc program of ours on node 1's devices (no tcx link, no clsact
// filter). Someone else's clsact filter at lbctl's handle, running a
// program whose name shares the 15 characters the kernel keeps of ours
// (lb_nodeport_ingest), is neither replaced nor removed. All of it once per
// tc attach mode. An agent told `--devices nosuchdev`, or `--tc-attach tcx`
// on a kernel without tcx, refuses to start, naming the flag.
import { execFileSync } from 'node:child_process';
import { mkdirSync, readdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import t, { type Test } from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import { endpoint, extGet, hookPrograms, hostOf, makeLab, NODE1, northSouth, ourPrograms, perMode, POD1, POD2, tcAttachModes, wire, type Lab } from '../helpers/nodeport-lab.js';
import { CLI_TIMEOUT_MS, createSandbox, ROOT, run, SLOW, type Sandbox } from '../helpers/sandbox.js';
import { PROGRAMS, TC_HANDLE, TC_PRIORITY, type AttachMode } from '../../src/datapath/nodeport.js';
import { removeNetns } from '../helpers/sandbox/topology.js';

const HTTP = 8080;
const NODE_PORT = 30080;
const N1X = { v4: '10.249.0.1', v6: 'fd00:249::1' };
const EXT2 = { v4: '10.249.0.2', v6: 'fd00:249::2' };
const NODE_ARGS_ANY_MODE = ['--devices', 'n1e,n1b,n1x', '--node-name', 'node1'];
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

/** Our programs (by BTF function name) on any hook of node 1's devices, as "device/direction:mode". */
async function oursOn(lab: Lab): Promise<string[]> {
  const ours = new Set(Object.values(PROGRAMS));
  const hooks = await hookPrograms(lab, lab.n1, DEVICES);
  return Object.entries(hooks).flatMap(([dev, h]) => (['ingress', 'egress'] as const).flatMap((dir) => h[dir].filter((p) => ours.has(p.name)).map((p) => `${dev}/${dir}:${p.mode}`))).sort();
}

/** The tc pins under the bpf root: tc-<ifindex>-<direction>. */
const tcPins = (sb: Sandbox): string[] => readdirSync(path.join(sb.bpfRoot, 'links')).filter((n) => n.startsWith('tc-')).sort();

async function answersFromExt2(t: Test, lab: Lab, ext2: string, what: string): Promise<void> {
  const got = await fromExt2(lab, ext2, 8);
  t.ok(got.every((r) => r.ok), `${what}: the NodePort at ${N1X.v4}:${NODE_PORT} answers ext2 (${got.map((r) => r.server || r.error).join(', ')})`);
  t.ok(got.every((r) => [POD1.v4, POD2.v4].includes(hostOf(r.server))), `${what}: served by the pods`);
}

/**
 * Someone else's tc program at lbctl's clsact handle and priority on n1x
 * ingress: lb_nodeport_ingest of bpf/tests/tc_count_test.c, loaded and
 * pinned by bpftool, attached by tc, counting the packets it sees. Its
 * kernel name, lb_nodeport_ing, is ours too.
 */
async function foreignFilter(sb: Sandbox, lab: Lab, name: string): Promise<{ id: number; count: () => Promise<number>; remove: () => Promise<void> }> {
  // Named after the run, so a crashed run's sweep removes it too.
  const dir = `${sb.bpfRoot}-${name}`;
  mkdirSync(dir, { recursive: true });
  const removeDir = (): void => rmSync(dir, { recursive: true, force: true });
  sb.addCleanup(removeDir);
  const obj = `${ROOT}/bpf/.output/tests/tc_count_test.bpf.o`;
  const load = await run('bpftool', ['prog', 'loadall', obj, `${dir}/progs`, 'pinmaps', `${dir}/maps`], CLI_TIMEOUT_MS);
  if (load.code !== 0) throw new Error(`bpftool prog loadall: ${load.stderr}`);
  // nsenter, not ip netns exec (which remounts /sys): tc reads the pinned program.
  const tc = (...args: string[]) => run('nsenter', [`--net=/run/netns/${lab.n1}`, 'tc', ...args], CLI_TIMEOUT_MS);
  await tc('qdisc', 'add', 'dev', 'n1x', 'clsact');
  const add = await tc('filter', 'add', 'dev', 'n1x', 'ingress', 'prio', String(TC_PRIORITY), 'handle', `0x${TC_HANDLE.toString(16)}`, 'bpf', 'da', 'object-pinned', `${dir}/progs/lb_nodeport_ingest`);
  if (add.code !== 0) throw new Error(`tc filter add: ${add.stderr}`);
  const hooks = await hookPrograms(lab, lab.n1, ['n1x']);
  const id = hooks.n1x!.ingress.find((p) => p.name === 'lb_nodeport_ingest')!.id;
  return {
    id,
    count: async () => {
      const r = await run('bpftool', ['-j', 'map', 'dump', 'pinned', `${dir}/maps/tc_packets`], CLI_TIMEOUT_MS);
      const v = (JSON.parse(r.stdout) as Array<{ value: string[] | number }>)[0]?.value;
      return Array.isArray(v) ? Buffer.from(v.map((b) => parseInt(b, 16))).readUInt32LE(0) : Number(v ?? 0);
    },
    remove: async () => {
      const del = await tc('filter', 'del', 'dev', 'n1x', 'ingress', 'prio', String(TC_PRIORITY), 'handle', `0x${TC_HANDLE.toString(16)}`, 'bpf');
      if (del.code !== 0) throw new Error(`tc filter del: ${del.stderr}`);
      removeDir();
    },
  };
}

t.test('a device that vanishes and returns is attached again; lbctl cleanup leaves nothing of ours and nothing else; a bad --devices or --tc-attach refuses the start', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab = await makeLab(sb);
  const ext2 = `${sb.runId}-ext2`;
  sb.addCleanup(() => removeNetns(ext2));
  execFileSync('ip', ['netns', 'add', ext2]);
  execFileSync('ip', ['-n', ext2, 'link', 'set', 'lo', 'up']);
  wireN1x(lab, ext2);
  sb.writeManifest('services.yaml', manifests());

  await perMode(t, lab, async (t, mode) => {
    await devicesFollowed(t, sb, lab, ext2, mode);
    await foreignLeftAlone(t, sb, lab, ext2, mode);
  });

  // A device that does not exist: the start is refused, naming the flag.
  const refused = await lab.agent.start(['--devices', 'nosuchdev', '--node-name', 'node1']).then(
    () => undefined,
    (e: unknown) => e as Error,
  );
  t.ok(refused, 'an agent with --devices nosuchdev does not start');
  const why = lab.agent.agent!.logs.find((l) => /--devices/.test(String(l.line ?? '')));
  t.match(String(why?.line), /^lbctl: --devices: no device nosuchdev/, `it says why, naming --devices: ${String(why?.line)}`);
  t.equal(await lab.agent.agent!.exited, 1, 'and exits 1');

  // tcx where the kernel has none (the 5.10 and 6.1 guests; test/unit/features.ts decides it for every kernel).
  if (!(await tcAttachModes()).includes('tcx')) {
    const no = await lab.agent.start(['--devices', 'n1e', '--node-name', 'node1', '--tc-attach', 'tcx']).then(() => undefined, (e: unknown) => e as Error);
    t.ok(no, 'an agent with --tc-attach tcx on a kernel without tcx does not start');
    const line = lab.agent.agent!.logs.find((l) => /--tc-attach/.test(String(l.line ?? '')));
    t.match(String(line?.line), /^lbctl: --tc-attach tcx: this kernel \(.+\) has no tcx links \(Linux 6\.6\+\): use --tc-attach auto or clsact/, `it says why, naming --tc-attach: ${String(line?.line)}`);
    t.equal(await lab.agent.agent!.exited, 1, 'and exits 1');
    t.same(await oursOn(lab), [], 'and attached nothing');
  }
});

async function devicesFollowed(t: Test, sb: Sandbox, lab: Lab, ext2: string, mode: AttachMode): Promise<void> {
  const NODE_ARGS = [...NODE_ARGS_ANY_MODE, '--tc-attach', mode];
  await lab.agent.start(NODE_ARGS);
  const agent = lab.agent.agent!;
  const devicesLine = (from: number) => agent.logs.slice(from).filter((l) => l.msg === 'tc datapath: devices and node addresses') as Array<{ devices?: string[]; nodeAddresses?: string[] }>;
  const first = devicesLine(0).at(-1);
  t.same(first?.devices?.slice().sort(), [...DEVICES].sort(), 'the agent serves n1e, n1b and n1x');
  t.ok(first?.nodeAddresses?.includes(N1X.v4), `NodePorts answer at n1x's address too (${first?.nodeAddresses?.join(', ')})`);
  const oldIndex = ifindex(lab.n1, 'n1x');
  await ourPrograms(t, lab, DEVICES, mode, `n1x (ifindex ${oldIndex}), n1e and n1b at first`);
  if (mode === 'tcx') t.ok(tcPins(sb).includes(`tc-${oldIndex}-ingress`), `n1x (ifindex ${oldIndex}) has its tcx links (${tcPins(sb).join(', ')})`);
  else t.same(tcPins(sb), [], 'no tcx link pinned in clsact mode');
  await answersFromExt2(t, lab, ext2, 'at first');

  // The device vanishes.
  let mark = agent.logs.length;
  execFileSync('ip', ['-n', lab.n1, 'link', 'del', 'n1x']);
  const waiting = await agent.waitForLog((l) => l.msg === 'device named by --devices is not usable yet; attached when it is', mark);
  t.match(String(waiting.device), /^n1x: no such device/, `the agent notices: ${String(waiting.device)}`);
  await agent.waitForLog((l) => l.msg === 'tc datapath: devices and node addresses' && !(l.devices as string[]).includes('n1x'), mark);
  if (mode === 'tcx') t.notOk(tcPins(sb).some((n) => n.startsWith(`tc-${oldIndex}-`)), `the old ifindex's links are unpinned (${tcPins(sb).join(', ')})`);
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
  if (mode === 'tcx') t.ok(tcPins(sb).includes(`tc-${newIndex}-ingress`) && tcPins(sb).includes(`tc-${newIndex}-egress`), `links for the new ifindex (${tcPins(sb).join(', ')})`);
  await ourPrograms(t, lab, DEVICES, mode, 'the kernel, after the re-attach');
  await answersFromExt2(t, lab, ext2, 'after the re-attach');
  const fromExt = await extGet(lab, NODE1.v4, NODE_PORT);
  t.ok(fromExt.ok, `and still to the first client through n1e (${fromExt.server || fromExt.error})`);

  // The device goes and comes back while the agent is down: the next agent attaches to the new ifindex.
  t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM');
  execFileSync('ip', ['-n', lab.n1, 'link', 'del', 'n1x']);
  wireN1x(lab, ext2);
  const thirdIndex = ifindex(lab.n1, 'n1x');
  await lab.agent.start(NODE_ARGS);
  await ourPrograms(t, lab, DEVICES, mode, `n1x re-made while the agent was down (ifindex ${newIndex} → ${thirdIndex}): the next agent attaches to it`);
  await answersFromExt2(t, lab, ext2, 'after a restart that found n1x re-made');
  if (mode === 'tcx') {
    t.ok(tcPins(sb).includes(`tc-${thirdIndex}-ingress`), `tcx links for ifindex ${thirdIndex} (${tcPins(sb).join(', ')})`);
    // (Fixed in 2be9830: the pins of an ifindex that vanished while the agent was down stayed, defunct, holding the old programs.)
    t.same(
      tcPins(sb).filter((n) => n.startsWith(`tc-${newIndex}-`)),
      [],
      `the links of ifindex ${newIndex}, gone while the agent was down, are unpinned at its next start (${tcPins(sb).join(', ')})`,
    );
  }

  // Stopped, then cleaned up (in node 1's namespace, where the filters would be).
  const linkIds = Object.values(await sb.links()).map((l) => l.linkId);
  t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM');
  t.equal((await oursOn(lab)).length, 6, 'its programs stay attached after it stops');
  const cleanup = await lab.cleanup();
  t.equal(cleanup.code, 0, `lbctl cleanup: ${cleanup.stdout.trim()}${cleanup.stderr.trim()}`);
  // tc filter show and bpftool net show see clsact filters; Debian's bpftool
  // 7.1 does not list tcx links, so the kernel's own answer (hookPrograms:
  // BPF_PROG_QUERY and every cls_bpf filter) and the link ids prove it.
  const tcFilter = await lab.inNs(lab.n1, ['tc', 'filter', 'show', 'dev', 'n1e', 'ingress']);
  t.equal(tcFilter.stdout.trim(), '', `tc filter show dev n1e ingress: nothing (${tcFilter.stderr.trim() || 'empty'})`);
  const net = await lab.inNs(lab.n1, ['bpftool', '-j', 'net', 'show']);
  const netShow = JSON.parse(net.stdout || '[]') as Array<{ tc?: Array<{ devname: string; name?: string }>; xdp?: unknown[] }>;
  t.same(netShow.flatMap((n) => n.tc ?? []).filter((f) => /^lb_nodeport/.test(f.name ?? '')), [], `bpftool net show in node 1: no tc program of ours (${net.stdout.trim()})`);
  t.same(await oursOn(lab), [], 'no hook of n1e, n1b and n1x holds a program of ours, tcx or clsact');
  const links = JSON.parse((await run('bpftool', ['-j', 'link', 'show'], CLI_TIMEOUT_MS)).stdout || '[]') as Array<{ id: number }>;
  t.same(links.filter((l) => linkIds.includes(l.id)).map((l) => l.id), [], `none of the agent's ${linkIds.length} links exists any more`);
  const gone = await extGet(lab, NODE1.v4, NODE_PORT, 2);
  t.notOk(gone.ok, `the NodePort is no longer served (${gone.error})`);
}

/**
 * A foreign filter at our handle on n1x ingress, its program named
 * lb_nodeport_ingest (lb_nodeport_ing to the kernel, as ours is): the agent
 * neither replaces it (clsact: n1x ingress is reported, the filter runs on;
 * tcx: our link goes in front of it) nor removes it, and nor does lbctl
 * cleanup.
 */
async function foreignLeftAlone(t: Test, sb: Sandbox, lab: Lab, ext2: string, mode: AttachMode): Promise<void> {
  const foreign = await foreignFilter(sb, lab, `foreign-${mode}`);
  // Three UDP datagrams to n1x's address, which no service uses: our program passes them on.
  const send = `import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); [s.sendto(b'x', ('${N1X.v4}', 9)) for _ in range(3)]`;
  const traffic = async (): Promise<void> => {
    const r = await lab.inNs(ext2, ['python3', '-c', send]);
    if (r.code !== 0) throw new Error(`python3 in ${ext2}: ${r.stderr}`);
  };
  await lab.agent.start([...NODE_ARGS_ANY_MODE, '--tc-attach', mode]);
  const hooks = await hookPrograms(lab, lab.n1, ['n1x']);
  t.same(hooks.n1x!.ingress.filter((p) => p.mode === 'clsact').map((p) => p.id), [foreign.id], `the foreign filter on n1x ingress is left in place, its program unchanged (${JSON.stringify(hooks.n1x!.ingress)})`);
  if (mode === 'clsact') {
    const problems = lab.agent.requireAgent().logs.filter((l) => l.msg === 'tc datapath: device not attached').map((l) => String(l.problem));
    t.match(problems.join('\n'), new RegExp(`device n1x \\(ifindex \\d+\\): a tc ingress filter of another program \\(id ${foreign.id}, lb_nodeport_ingest\\) holds handle 0x4c42 priority 1: not replaced`), `the agent reports it, naming the program (${problems.join('; ')})`);
    await ourPrograms(t, lab, ['n1e', 'n1b'], mode, 'the other devices are served');
  } else {
    await ourPrograms(t, lab, DEVICES, mode, 'every device is served, ours before the foreign filter');
  }
  const before = await foreign.count();
  await traffic();
  t.ok((await foreign.count()) > before, `the foreign program still sees packets (${before} → ${await foreign.count()})`);
  t.equal(await lab.agent.stop(10_000), 0, 'the agent exits 0 on SIGTERM');
  const cleanup = await lab.cleanup();
  t.equal(cleanup.code, 0, `lbctl cleanup: ${cleanup.stdout.trim()}${cleanup.stderr.trim()}`);
  t.same(await oursOn(lab), [], 'lbctl cleanup removed ours');
  const after = await hookPrograms(lab, lab.n1, ['n1x']);
  t.same(after.n1x!.ingress.map((p) => [p.mode, p.id, p.name]), [['clsact', foreign.id, 'lb_nodeport_ingest']], 'and left the foreign filter alone');
  await foreign.remove();
}
