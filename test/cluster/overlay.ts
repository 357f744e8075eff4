// lbctl in the real cluster over a VXLAN overlay (CLUSTER_NETWORK=vxlan,
// docs/cluster.md, "The VXLAN overlay"), as flannel's vxlan backend builds
// one: pod traffic between nodes goes through vxlan0, never over an
// underlay route. lbctl deployed from deploy/ (scripts/cluster/lbctl.sh),
// no kube-proxy:
//   - each node's vxlan0 is as flannel makes it (VNI 1, UDP 8472, local =
//     the node's address, over eth0, no learning, 10.244.i.0/32), the other
//     node's pod CIDR is routed through it and nowhere else, and pods get
//     its MTU (1450);
//   - each agent attached to vxlan0 as a tunnel (`lbctl status`);
//   - a client pod on the first node reaches a ClusterIP Service's backends
//     on both nodes, the remote one through the first node's vxlan0;
//   - a client outside the nodes reaches the NodePort through each node and
//     gets answers from both backends: the remote one through the
//     forwarding node's vxlan0 (its packet counters grow both ways), with
//     replies larger than the overlay's MTU intact;
//   - the host keeps its sysctls, firewall rules, root cgroups, network
//     and mounts.
import t from 'tap';
import { execFileSync, spawnSync } from 'node:child_process';
import path from 'node:path';
import { answers, clusterScript, freshCluster, echoService, type EchoService, hostDiff, hostnameVia, hostSnapshot, inExt, kubectl, SCRIPTS } from '../helpers/cluster.js';

const IS_ROOT = process.getuid?.() === 0;
if (!IS_ROOT) {
  t.bailout('test/cluster/overlay.ts needs root (namespaces, cgroups, mounts): run it as root');
} else {
  t.setTimeout(900_000);
  // Every script this test runs (up.sh, kubectl.sh, lbctl.sh, down.sh) reads it.
  process.env.CLUSTER_NETWORK = 'vxlan';
  const { s, before } = freshCluster(t);

  const ipIn = (node: string, args: readonly string[]): string => execFileSync('ip', ['-n', s.node[node]!.netns, ...args], { encoding: 'utf8' });
  const ipJson = <T>(node: string, args: readonly string[]): T => JSON.parse(ipIn(node, ['-j', ...args])) as T;
  const index = (node: string): number => s.nodes.indexOf(node) + 1;
  const vtep = (node: string): string => `10.244.${index(node)}.0`;
  /** vxlan0's packet counters on `node`. */
  const vxlanPackets = (node: string): { rx: number; tx: number } => {
    const [l] = ipJson<Array<{ stats64: { rx: { packets: number }; tx: { packets: number } } }>>(node, ['-s', 'link', 'show', 'dev', 'vxlan0']);
    return { rx: l!.stats64.rx.packets, tx: l!.stats64.tx.packets };
  };
  /** What `ask` returns, and how many packets vxlan0 on `node` sent and received meanwhile. */
  const through = <T>(node: string, ask: () => T): { value: T; rx: number; tx: number } => {
    const a = vxlanPackets(node);
    const value = ask();
    const b = vxlanPackets(node);
    return { value, rx: b.rx - a.rx, tx: b.tx - a.tx };
  };

  t.test('each node\'s vxlan0 is flannel\'s, and the other node\'s pods are reached only through it', async (t) => {
    for (const node of s.nodes) {
      interface Link { mtu: number; address: string; addr_info?: Array<{ family: string; local: string; prefixlen: number }>; linkinfo: { info_kind: string; info_data: { id: number; port: number; local: string; link: string; learning: boolean } } }
      const [l] = ipJson<Link[]>(node, ['-d', 'addr', 'show', 'dev', 'vxlan0']);
      t.equal(l!.linkinfo.info_kind, 'vxlan', `${node}: vxlan0 is a vxlan device`);
      t.match(l!.linkinfo.info_data, { id: 1, port: 8472, local: s.node[node]!.ip, link: 'eth0', learning: false }, `${node}: VNI 1, UDP 8472, local ${s.node[node]!.ip}, over eth0, no learning`);
      t.equal(l!.mtu, 1450, `${node}: vxlan0's MTU is eth0's less VXLAN's 50 bytes`);
      t.same(l!.addr_info?.filter((a) => a.family === 'inet').map((a) => `${a.local}/${a.prefixlen}`), [`${vtep(node)}/32`], `${node}: vxlan0 holds ${vtep(node)}/32`);
      for (const other of s.nodes.filter((n) => n !== node)) {
        const cidr = s.node[other]!.podCidr;
        // Every table's routes to pod addresses: the other node's CIDR only through vxlan0, none through eth0.
        const routes = ipJson<Array<{ dst: string; gateway?: string; dev: string; flags: string[] }>>(node, ['route', 'show', 'table', 'all'])
          .filter((r) => r.dst.startsWith('10.244.'));
        t.same(routes.filter((r) => r.dst === cidr).map((r) => `${r.dst} via ${r.gateway} dev ${r.dev} ${r.flags.join(',')}`), [`${cidr} via ${vtep(other)} dev vxlan0 onlink`], `${node}: ${cidr} only via ${vtep(other)} dev vxlan0 onlink`);
        t.same(routes.filter((r) => r.dev === 'eth0'), [], `${node}: no underlay route to any pod address`);
        t.match(ipIn(node, ['neigh', 'show', 'dev', 'vxlan0']), new RegExp(`^${vtep(other).replace(/\./g, '\\.')} lladdr ([0-9a-f:]+) PERMANENT`, 'm'), `${node}: a static neighbour entry for ${vtep(other)}`);
        const mac = /lladdr ([0-9a-f:]+)/.exec(ipIn(node, ['neigh', 'show', 'dev', 'vxlan0', 'to', vtep(other)]))?.[1] ?? '(none)';
        t.equal(mac, ipJson<Array<{ address: string }>>(other, ['link', 'show', 'dev', 'vxlan0'])[0]!.address, `${node}: it is ${other}'s vxlan0 MAC`);
        t.match(execFileSync('bridge', ['-n', s.node[node]!.netns, 'fdb', 'show', 'dev', 'vxlan0'], { encoding: 'utf8' }), new RegExp(`^${mac} dst ${s.node[other]!.ip.replace(/\./g, '\\.')} self permanent`, 'm'), `${node}: the FDB sends ${mac} to ${s.node[other]!.ip}`);
      }
    }
  });

  const agents = new Map<string, string>(); // node → agent pod
  t.test('lbctl runs on each node and attached to vxlan0 as a tunnel', async (t) => {
    const t0 = performance.now();
    clusterScript('lbctl.sh');
    t.comment(`lbctl.sh (import, apply -k, rollout): ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    const pods = (JSON.parse(kubectl(['-n', 'kube-system', 'get', 'pods', '-l', 'k8s-app=lbctl', '-o', 'json'])) as { items: Array<{ metadata: { name: string }; spec: { nodeName: string } }> }).items;
    t.same(pods.map((p) => p.spec.nodeName).sort(), [...s.nodes].sort(), 'one agent per node');
    t.equal(kubectl(['-n', 'kube-system', 'get', 'ds', '-o', 'name']).trim(), 'daemonset.apps/lbctl', 'and no kube-proxy');
    for (const p of pods) {
      agents.set(p.spec.nodeName, p.metadata.name);
      const status = kubectl(['-n', 'kube-system', 'exec', p.metadata.name, '-c', 'lbctl-agent', '--', 'lbctl', 'status']);
      const np = /^NodePort:.*$/m.exec(status)?.[0] ?? '(no NodePort line)';
      t.match(np, new RegExp(`vxlan0 \\[tunnel\\] \\(${vtep(p.spec.nodeName).replace(/\./g, '\\.')}/32; SNAT ${vtep(p.spec.nodeName).replace(/\./g, '\\.')}\\)`), `${p.spec.nodeName}: lbctl status lists vxlan0 as a tunnel, SNAT to its address`, { status });
      t.match(np, /\beth0 \(/, `${p.spec.nodeName}: and eth0 as a front door`);
    }
  });

  let svc: EchoService = { clusterIP: '', nodePort: 0, backends: [] };
  let podIp: Record<string, string> = {};
  t.test('a NodePort Service with a backend on each node; pods get vxlan0\'s MTU', async (t) => {
    svc = await echoService(s);
    const pods = JSON.parse(kubectl(['get', 'pods', '-l', 'app=echo', '-o', 'json'])) as { items: Array<{ metadata: { name: string }; status: { podIP: string } }> };
    podIp = Object.fromEntries(pods.items.map((p) => [p.metadata.name, p.status.podIP]));
    t.equal(kubectl(['exec', 'client', '--', 'cat', '/sys/class/net/eth0/mtu']).trim(), '1450', 'the client pod\'s eth0 has MTU 1450 (the bridge CNI\'s mtu)');
    const remote = podIp[`echo-${s.nodes[1]}`]!;
    t.match(ipIn(s.nodes[0]!, ['route', 'get', remote]), new RegExp(`via ${vtep(s.nodes[1]!).replace(/\./g, '\\.')} dev vxlan0 `), `${s.nodes[0]} routes the remote backend ${remote} through vxlan0`);
  });

  t.test('a client pod on the first node reaches both backends through the ClusterIP, the remote one through vxlan0', async (t) => {
    const inPod = (sh: string): string => kubectl(['exec', 'client', '--', 'sh', '-c', sh]);
    const r = through(s.nodes[0]!, () => answers(() => hostnameVia(inPod, svc.clusterIP, 80), 16));
    t.same([...r.value].sort(), svc.backends, `answers through ${svc.clusterIP}:80`);
    t.ok(r.tx > 0 && r.rx > 0, `${s.nodes[0]}'s vxlan0 sent ${r.tx} and received ${r.rx} packets meanwhile`);
    const direct = through(s.nodes[0]!, () => hostnameVia(inPod, podIp[`echo-${s.nodes[1]}`]!, 8080));
    t.equal(direct.value, `echo-${s.nodes[1]}`, 'and the remote backend directly, pod to pod');
    t.ok(direct.tx > 0 && direct.rx > 0, `through vxlan0 (${direct.tx} sent, ${direct.rx} received)`);
  });

  t.test('the NodePort, from outside the nodes, through each node: both backends, the remote one through the overlay', async (t) => {
    for (const node of s.nodes) {
      const ip = s.node[node]!.ip;
      const r = through(node, () => answers(() => hostnameVia((sh) => inExt(s, ['busybox', 'sh', '-c', sh]), ip, svc.nodePort), 16));
      t.same([...r.value].sort(), svc.backends, `answers to ${s.extIp} through ${ip}:${svc.nodePort}`);
      t.ok(r.tx > 0 && r.rx > 0, `${node}'s vxlan0 sent ${r.tx} and received ${r.rx} packets meanwhile (the remote backend's flows)`);
      // Larger than one overlay frame each way: a 6000-byte request and its echo.
      const msg = 'x'.repeat(6000);
      const big = answers(() => {
        const reply = inExt(s, ['busybox', 'sh', '-c', `printf 'GET /echo?msg=${msg} HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${ip} ${svc.nodePort}`]);
        return String(reply.split('\r\n\r\n')[1]?.length ?? -1);
      }, 8);
      t.same([...big], ['6000'], `8 requests and replies of 6000 bytes through ${ip}:${svc.nodePort}, intact`);
    }
    t.match(inExtTry(['ip', 'route', 'get', Object.values(podIp)[0]!]), /unreachable/i, `${s.extIp} has no route to the pods`);
  });

  t.test('each agent programmed the Services (lbctl bpf lb list)', async (t) => {
    for (const node of s.nodes) {
      const list = kubectl(['-n', 'kube-system', 'exec', agents.get(node)!, '-c', 'lbctl-agent', '--', 'lbctl', 'bpf', 'lb', 'list']);
      for (const frontend of [`${svc.clusterIP}:80/TCP`, `${s.node[node]!.ip}:${svc.nodePort}/TCP`]) {
        t.match(list, new RegExp(`^${frontend.replace(/\./g, '\\.')}\\s`, 'm'), `${node}: ${frontend}`);
      }
      for (const ip of Object.values(podIp)) t.match(list, new RegExp(`^\\s+${ip.replace(/\./g, '\\.')}:8080 `, 'm'), `${node}: backend ${ip}:8080`);
    }
  });

  t.test('the host is untouched', async (t) => {
    t.same(hostDiff(s, before, hostSnapshot(s)), [], 'no host sysctl, firewall rule, root cgroup setting or program, host network or host mount changed');
  });

  /** A command in the external client's namespace and cgroup, its stdout and stderr whatever its exit. */
  function inExtTry(cmd: readonly string[]): string {
    const r = spawnSync('bash', [path.join(SCRIPTS, 'enter.sh'), 'ext', s.extNetns, ...cmd], { encoding: 'utf8', timeout: 60_000 });
    return `${r.stdout}${r.stderr}`;
  }
}
