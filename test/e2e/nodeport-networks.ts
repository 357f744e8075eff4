// NodePort on the networks real nodes have (issue 34, items 2-4 and 9),
// each in a lab of its own (test/helpers/nodeport-lab.ts), with a NodePort
// whose only endpoint is the pod on node 2 (so every flow is SNATed) and one
// whose endpoint is node 1's own pod:
//
// - an overlay: node 1 reaches node 2's pods through a VXLAN device over the
//   nodes' link (no route to them on the link itself). The tunnel is
//   attached beside the named devices, flows are SNATed to its address, the
//   replies come back through it and are translated there; a packet bigger
//   than the tunnel's MTU (1450) gets fragmentation needed / packet too big,
//   and an upload learns it;
// - a node whose device towards node 2 has a secondary address that sorts
//   before its primary, and a deprecated IPv6 one: flows are SNATed to what
//   the kernel would pick, and follow a route's src when it changes;
// - layer-3 overlays (ipip and ip6tnl; WireGuard): the same, through
//   devices whose packets have no Ethernet header (in the guests: this
//   host's kernel makes none of them, and the tests say so as a skip); on a
//   kernel before 5.14, which hands tc an IP-in-IP tunnel's packets with the
//   outer headers on, the agent says why flows through one fail;
// - --nodeport-addresses narrower than the SNAT address: NodePorts answer on
//   the client's side only, and the replies to the SNAT address outside it
//   still come back translated.
// Each in every tc attach mode, side by side.
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import t, { type Test } from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import { addVxlan, eachMode, endpoint, extGet, extLearnedMtu, extUpload, ip, makeLab, NODE1, NODE1_TO_N2, northSouth, ourPrograms, type Lab } from '../helpers/nodeport-lab.js';
import type { AttachMode } from '../../src/datapath/nodeport.js';
import { CLI_TIMEOUT_MS, createSandbox, LBCTL, run, SLOW, type Sandbox } from '../helpers/sandbox.js';

const HTTP = 8080;
const NP_REMOTE = 30100;
const NP_LOCAL = 30101;
const FAMILIES = ['v4', 'v6'] as const;
const NODE_ARGS = ['--devices', 'n1e,n1b', '--node-name', 'node1'];

const manifests = (): string =>
  yamlDocs([
    ...northSouth({ name: 'remote', clusterIPs: ['10.96.0.20', 'fd00:96::20'], ports: [{ name: 'http', port: 80, targetPort: HTTP, nodePort: NP_REMOTE }] },
      { 4: [endpoint(2, 4)], 6: [endpoint(2, 6)] }),
    ...northSouth({ name: 'local', clusterIPs: ['10.96.0.21', 'fd00:96::21'], ports: [{ name: 'http', port: 80, targetPort: HTTP, nodePort: NP_LOCAL }] },
      { 4: [endpoint(1, 4)], 6: [endpoint(1, 6)] }),
  ]);

async function start(t: Test, mode: AttachMode, extra: readonly string[] = [], prepare?: (lab: Lab) => void, made?: (sb: Sandbox) => void): Promise<{ sb: Sandbox; lab: Lab }> {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  made?.(sb);
  const lab = await makeLab(sb);
  prepare?.(lab);
  sb.writeManifest('services.yaml', manifests());
  const sync = await lab.agent.start([...NODE_ARGS, '--tc-attach', mode, ...extra]);
  t.ok(sync.frontends > 0, `the agent synced (${sync.frontends} frontends)`);
  await ourPrograms(t, lab, ['n1e', 'n1b'], mode, 'the kernel');
  return { sb, lab };
}

/** The last "devices and node addresses" line the agent logged. */
function devicesLog(lab: Lab): { devices?: string[]; tunnels?: string[]; snat?: Record<string, string[]>; nodeAddresses?: string[] } {
  return (lab.agent.agent!.logs.filter((l) => l.msg === 'tc datapath: devices and node addresses').at(-1) ?? {}) as ReturnType<typeof devicesLog>;
}

/** HTTP through a NodePort on `host` from the external client; the address the pod saw the client as. */
async function through(t: Test, lab: Lab, host: string, port: number, what: string): Promise<string> {
  const r = await extGet(lab, host, port);
  t.ok(r.ok, `${what}: answered (${r.error || r.server})`);
  return r.client.replace(/^\[?([^\]]+?)\]?:\d+$/, '$1');
}

t.test('an overlay: remote pods behind a VXLAN device are SNATed to its address and their replies translated there', (t) => eachMode(t, async (t, mode) => {
  const { sb, lab } = await start(t, mode, [], addVxlan); // node 2's pods only through a VXLAN
  const d = devicesLog(lab);
  t.same(d.tunnels, ['vx1'], `the VXLAN device is attached as a tunnel beside --devices (${JSON.stringify(d)})`);
  t.same(d.snat?.['vx1'], ['10.253.0.1', 'fd00:253::1'], 'its SNAT sources are its own addresses');
  t.notOk(d.nodeAddresses?.includes('10.253.0.1'), 'NodePorts do not answer on the tunnel\'s address');
  for (const f of FAMILIES) {
    const seen = await through(t, lab, NODE1[f], NP_REMOTE, `IPv${f[1]}, the remote pod through the overlay`);
    t.equal(seen, f === 'v4' ? '10.253.0.1' : 'fd00:253::1', `IPv${f[1]}: the remote pod sees node 1's tunnel address (SNAT), not the client`);
    t.ok(await through(t, lab, NODE1[f], NP_LOCAL, `IPv${f[1]}, the local pod`), 'the local pod still answers');
  }
  const vxlan = JSON.parse(execFileSync('ip', ['-n', lab.n1, '-j', 'link', 'show', 'vx1'], { encoding: 'utf8' })) as Array<{ mtu: number }>;
  t.equal(vxlan[0]?.mtu, 1450, 'the tunnel\'s MTU is 1450 (its link\'s less 50 bytes of encapsulation)');
  for (const f of FAMILIES) {
    const u = await extUpload(sb, lab, NODE1[f], NP_REMOTE);
    t.ok(u.code === 0 && u.received === 2 << 20, `IPv${f[1]}: a 2 MB upload through the overlay completes (curl ${u.code}, ${u.received} bytes${u.error ? `, ${u.error}` : ''})`);
    t.equal(await extLearnedMtu(lab, NODE1[f]), 1450, `IPv${f[1]}: the client learned the tunnel's MTU from the datapath's error`);
  }
  const m = await sb.metrics();
  t.ok((m['np_frag_needed'] ?? 0) > 0, `np_frag_needed counted the too-big packets (${m['np_frag_needed']})`);
  await lab.agent.stop(10_000);
}));

/** Whether this kernel makes a link of `kind` (its module loads on demand in the guests; this project's host kernel has no ipip, ip6tnl nor wireguard). */
function kernelHas(kind: string): string | undefined {
  const probe = `lbctl-probe-${process.pid}`;
  try {
    ip('netns', 'add', probe);
    try {
      ip('-n', probe, 'link', 'add', 'probe0', 'type', kind, ...(kind === 'wireguard' ? [] : ['local', kind === 'ip6tnl' ? 'fd00::1' : '10.0.0.1', 'remote', kind === 'ip6tnl' ? 'fd00::2' : '10.0.0.2']));
      return undefined;
    } finally {
      ip('netns', 'del', probe);
    }
  } catch (err) {
    return `this kernel makes no ${kind} link (${String((err as { stderr?: Buffer }).stderr ?? err).trim()}): run in the guests (make test, make vmtest)`;
  }
}

const release = (): string => execFileSync('uname', ['-r'], { encoding: 'utf8' }).trim();

/** Whether this kernel is one that hands tc an IP-in-IP tunnel's packets with their outer headers (before 5.14, upstream 7ad136fd288c). */
function ipInIpWithOuterHeaders(): boolean {
  const [major, minor] = release().split(/[.-]/).map(Number) as [number, number];
  return major < 5 || (major === 5 && minor < 14);
}

/** A WireGuard key pair (wg genkey, wg pubkey): the private key's file and the public key. */
function wgKeys(sb: Sandbox, name: string): { file: string; pub: string } {
  const key = execFileSync('wg', ['genkey'], { encoding: 'utf8' }).trim();
  const file = path.join(sb.runDir, `${name}.key`);
  writeFileSync(file, `${key}\n`, { mode: 0o600 });
  return { file, pub: execFileSync('wg', ['pubkey'], { input: key, encoding: 'utf8' }).trim() };
}

/**
 * Node 2's pods through layer-3 tunnels (packets without an Ethernet header:
 * nodeport_l3.bpf.o's programs there), as Calico's IPIP mode and WireGuard
 * encryption build them: the remote pod sees node 1's tunnel address, its
 * replies come back through the tunnel and are translated there, then leave
 * by the client's Ethernet device; a packet too big for the tunnel gets
 * fragmentation needed / packet too big, and an upload learns it.
 */
async function layer3(t: Test, mode: AttachMode, kind: 'ipip' | 'wireguard'): Promise<void> {
  const devs = kind === 'ipip' ? ['ipip1', 'ip6t1'] : ['wg1'];
  let sbRef: Sandbox | undefined;
  const { sb, lab } = await start(t, mode, [], (lab) => {
    if (kind === 'ipip') {
      // IPv4 in IPv4 (ipip) and IPv6 in IPv6 (ip6tnl) over the nodes' link.
      for (const [ns, n, peer] of [[lab.n1, 1, 2], [lab.n2, 2, 1]] as const) {
        ip('-n', ns, 'link', 'add', `ipip${n}`, 'type', 'ipip', 'local', `10.251.0.${n}`, 'remote', `10.251.0.${peer}`);
        ip('-n', ns, 'addr', 'add', `10.253.0.${n}/24`, 'dev', `ipip${n}`);
        ip('-n', ns, 'link', 'add', `ip6t${n}`, 'type', 'ip6tnl', 'mode', 'ip6ip6', 'local', `fd00:251::${n}`, 'remote', `fd00:251::${peer}`);
        ip('-n', ns, '-6', 'addr', 'add', `fd00:253::${n}/64`, 'dev', `ip6t${n}`, 'nodad');
        for (const d of [`ipip${n}`, `ip6t${n}`]) ip('-n', ns, 'link', 'set', d, 'up');
      }
      ip('-n', lab.n1, 'route', 'replace', '10.252.2.0/24', 'dev', 'ipip1');
      ip('-n', lab.n1, '-6', 'route', 'replace', 'fd00:252:2::/64', 'dev', 'ip6t1');
    } else {
      const keys = [wgKeys(sbRef!, 'wg1'), wgKeys(sbRef!, 'wg2')];
      for (const [ns, n, peer] of [[lab.n1, 1, 2], [lab.n2, 2, 1]] as const) {
        const dev = `wg${n}`;
        ip('-n', ns, 'link', 'add', dev, 'type', 'wireguard');
        const allowed = n === 1 ? '10.252.2.0/24,fd00:252:2::/64,10.253.0.2/32,fd00:253::2/128' : '10.253.0.1/32,fd00:253::1/128';
        execFileSync('ip', ['netns', 'exec', ns, 'wg', 'set', dev, 'private-key', keys[n - 1]!.file, 'listen-port', '51820',
          'peer', keys[peer - 1]!.pub, 'allowed-ips', allowed, 'endpoint', `10.251.0.${peer}:51820`], { stdio: ['ignore', 'ignore', 'pipe'] });
        ip('-n', ns, 'addr', 'add', `10.253.0.${n}/24`, 'dev', dev);
        ip('-n', ns, '-6', 'addr', 'add', `fd00:253::${n}/64`, 'dev', dev, 'nodad');
        ip('-n', ns, 'link', 'set', dev, 'up');
      }
      ip('-n', lab.n1, 'route', 'replace', '10.252.2.0/24', 'dev', 'wg1');
      ip('-n', lab.n1, '-6', 'route', 'replace', 'fd00:252:2::/64', 'dev', 'wg1');
    }
  }, (sb) => {
    sbRef = sb;
  });
  const d = devicesLog(lab);
  t.same(d.tunnels, devs, `the ${kind} devices are attached as tunnels beside --devices (${JSON.stringify(d)})`);
  await ourPrograms(t, lab, devs, mode, `the ${kind} devices`);
  const status = await run(LBCTL, ['status', '--api-socket', lab.agent.place.apiSocket], CLI_TIMEOUT_MS);
  t.match(status.stdout, new RegExp(`${devs[0]} \\[tunnel, layer 3\\]`), `lbctl status marks ${devs[0]} a layer-3 tunnel`);
  if (kind === 'ipip' && ipInIpWithOuterHeaders()) {
    // Before 5.14 the kernel hands tc an IP-in-IP tunnel's packets with the
    // outer headers on: the replies cannot be translated there, and the
    // agent says so, naming what to do.
    const r = await extGet(lab, NODE1.v4, NP_REMOTE, 2);
    t.notOk(r.ok, `IPv4 through ipip on ${release()}: not answered (${r.error})`);
    const warned = await lab.agent.agent!.waitForLog((l) => l['counter'] === 'np_l3_outer', 0, 25_000 * SLOW);
    t.match(String(warned.msg), /ipip, sit and ip6tnl .* Linux 5\.14/, `the agent says why, and what to do (${warned.msg})`);
    t.ok(((await sb.metrics())['np_l3_outer'] ?? 0) > 0, 'np_l3_outer counts those packets');
    await lab.agent.stop(10_000);
    return;
  }
  for (const f of FAMILIES) {
    const seen = await through(t, lab, NODE1[f], NP_REMOTE, `IPv${f[1]}, the remote pod through ${kind}`);
    t.equal(seen, f === 'v4' ? '10.253.0.1' : 'fd00:253::1', `IPv${f[1]}: the remote pod sees node 1's tunnel address (SNAT), not the client`);
    t.ok(await through(t, lab, NODE1[f], NP_LOCAL, `IPv${f[1]}, the local pod`), 'the local pod still answers');
  }
  const mtus = Object.fromEntries(devs.map((dev) => [dev, (JSON.parse(execFileSync('ip', ['-n', lab.n1, '-j', 'link', 'show', dev], { encoding: 'utf8' })) as Array<{ mtu: number }>)[0]!.mtu]));
  for (const f of FAMILIES) {
    const dev = devs.length === 1 ? devs[0]! : devs[f === 'v4' ? 0 : 1]!;
    const u = await extUpload(sb, lab, NODE1[f], NP_REMOTE);
    t.ok(u.code === 0 && u.received === 2 << 20, `IPv${f[1]}: a 2 MB upload through ${dev} completes (curl ${u.code}, ${u.received} bytes${u.error ? `, ${u.error}` : ''})`);
    t.equal(await extLearnedMtu(lab, NODE1[f]), mtus[dev], `IPv${f[1]}: the client learned ${dev}'s MTU (${mtus[dev]}) from the datapath's error`);
  }
  const m = await sb.metrics();
  t.equal(m['np_fib_fail'] ?? 0, 0, 'nothing dropped for want of a route');
  await lab.agent.stop(10_000);
}

for (const kind of ['ipip', 'wireguard'] as const) {
  const missing = kind === 'ipip' ? (kernelHas('ipip') ?? kernelHas('ip6tnl')) : kernelHas('wireguard');
  t.test(`layer-3 tunnels (${kind === 'ipip' ? 'ipip and ip6tnl' : 'WireGuard'}): remote pods behind them are SNATed to their address and their replies translated there`,
    missing ? { skip: missing } : {}, (t) => eachMode(t, (t, mode) => layer3(t, mode, kind)));
}

t.test('the SNAT source is what the kernel would pick: not a secondary or deprecated address, whatever its text sorts as; a route\'s src is followed', (t) => eachMode(t, async (t, mode) => {
  const { sb, lab } = await start(t, mode, [], (lab) => {
    // n1b: primary 10.251.0.5, then a keepalived-style secondary 10.251.0.100 in the same subnet
    // (text order puts it first), and a deprecated IPv6 address that also sorts first.
    ip('-n', lab.n1, 'addr', 'del', `${NODE1_TO_N2.v4}/24`, 'dev', 'n1b');
    ip('-n', lab.n1, 'addr', 'add', '10.251.0.5/24', 'dev', 'n1b');
    ip('-n', lab.n1, 'addr', 'add', '10.251.0.100/24', 'dev', 'n1b');
    ip('-n', lab.n1, 'route', 'replace', '10.252.2.0/24', 'via', '10.251.0.2');
    ip('-n', lab.n1, '-6', 'addr', 'add', 'fd00:1::9/64', 'dev', 'n1b', 'nodad', 'preferred_lft', '0');
  });
  const d = devicesLog(lab);
  t.same(d.snat?.['n1b'], ['10.251.0.5', NODE1_TO_N2.v6], `n1b's SNAT sources: its primary IPv4 and its preferred IPv6 address (${JSON.stringify(d.snat)})`);
  t.equal(await through(t, lab, NODE1.v4, NP_REMOTE, 'IPv4'), '10.251.0.5', 'the pod sees the primary address, not the secondary one');
  t.equal(await through(t, lab, NODE1.v6, NP_REMOTE, 'IPv6'), NODE1_TO_N2.v6, 'nor the deprecated IPv6 address');

  // The route to node 2's pods names a source: flows follow it.
  const mark = lab.agent.agent!.logs.length;
  ip('-n', lab.n1, 'route', 'replace', '10.252.2.0/24', 'via', '10.251.0.2', 'src', '10.251.0.100');
  await lab.agent.agent!.waitForLog((l) => l.msg === 'tc datapath: devices and node addresses' && JSON.stringify(l).includes('10.251.0.100'), mark, 10_000);
  t.equal(await through(t, lab, NODE1.v4, NP_REMOTE, 'IPv4 after the route names src 10.251.0.100'), '10.251.0.100', 'new flows leave with the route\'s src');
  const status = await run(LBCTL, ['status', '--api-socket', lab.agent.place.apiSocket], CLI_TIMEOUT_MS);
  t.match(status.stdout, /n1b \(.*SNAT 10\.251\.0\.100/, `lbctl status shows n1b's SNAT source (${status.stdout.split('\n').find((l) => l.startsWith('NodePort')) ?? status.stdout})`);
  await lab.agent.stop(10_000);
}));

t.test('--nodeport-addresses narrower than the SNAT address: replies to it are translated all the same', (t) => eachMode(t, async (t, mode) => {
  const { sb, lab } = await start(t, mode, ['--nodeport-addresses', '10.250.0.0/24,fd00:250::/64'], (lab) => {
    // the client can reach n1b's address too, through node 1
    ip('-n', lab.ext, 'route', 'add', `${NODE1_TO_N2.v4}/32`, 'via', NODE1.v4);
  });
  const d = devicesLog(lab);
  t.same(d.nodeAddresses?.sort(), [NODE1.v4, NODE1.v6].sort(), 'NodePorts answer on the client-side addresses only');
  for (const f of FAMILIES) {
    t.equal(await through(t, lab, NODE1[f], NP_REMOTE, `IPv${f[1]}, the remote pod`), NODE1_TO_N2[f], `IPv${f[1]}: SNATed to n1b's address, outside --nodeport-addresses, and the reply came back`);
  }
  const refused = await extGet(lab, NODE1_TO_N2.v4, NP_REMOTE, 2);
  t.notOk(refused.ok, `a NodePort on the address outside --nodeport-addresses is not served (${refused.error})`);
  const m = await sb.metrics();
  t.equal(m['np_fib_fail'] ?? 0, 0, 'nothing dropped for want of a route');
  await lab.agent.stop(10_000);
}));
