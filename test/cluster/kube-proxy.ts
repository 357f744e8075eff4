// kube-proxy in the real cluster (scripts/cluster/kube-proxy.sh): the
// shared binary in iptables mode, as a DaemonSet from our own image, and
// Services it serves:
//   - it runs on both nodes and programs their iptables (KUBE-SERVICES),
//     in the nodes' network namespaces only;
//   - a ClusterIP Service with an agnhost backend on each node: a client
//     pod reaches both backends through the ClusterIP, and so does a node
//     itself;
//   - the same Service's NodePort, from outside the nodes (a client on
//     the nodes' bridge with no route to pods), through either node;
//   - the host keeps its sysctls (kube-proxy's conntrack settings are per
//     network namespace, and its global ones are turned off), firewall
//     rules, root cgroups, network and mounts.
import t from 'tap';
import { execFileSync } from 'node:child_process';

import { answers, clusterScript, freshCluster, serviceReachTests, echoService, type EchoService, hostDiff, hostnameVia, hostSnapshot, kubectl } from '../helpers/cluster.js';

const IS_ROOT = process.getuid?.() === 0;
if (!IS_ROOT) {
  t.bailout('test/cluster/kube-proxy.ts needs root (namespaces, cgroups, mounts): run it as root');
} else {
  t.setTimeout(900_000);
  const { s, before } = freshCluster(t);

  t.test('kube-proxy runs on both nodes', async (t) => {
    clusterScript('kube-proxy.sh');
    const ds = JSON.parse(kubectl(['-n', 'kube-system', 'get', 'ds', 'kube-proxy', '-o', 'json'])) as { status: { numberReady: number } };
    t.equal(ds.status.numberReady, s.nodes.length);
  });

  let svc: EchoService = { clusterIP: '', nodePort: 0, backends: [] };
  t.test('a ClusterIP Service with a backend on each node', async (t) => {
    svc = await echoService(s);
    t.match(svc.clusterIP, /^10\.96\./);
    t.ok(svc.nodePort >= 30000 && svc.nodePort <= 32767, `NodePort ${svc.nodePort}`);
  });

  t.test('the client pod reaches both backends through the ClusterIP', async (t) => {
    const seen = answers(() => hostnameVia((sh) => kubectl(['exec', 'client', '--', 'sh', '-c', sh]), svc.clusterIP, 80), 16);
    t.same([...seen].sort(), svc.backends, `answers through ${svc.clusterIP}:80`);
  });

  serviceReachTests(t, s, () => svc);

  t.test('kube-proxy programmed the nodes, not the host', async (t) => {
    for (const node of s.nodes) {
      const rules = execFileSync('nsenter', [`--net=/run/netns/${s.node[node]!.netns}`, 'iptables-nft-save', '-t', 'nat'], { encoding: 'utf8' });
      t.match(rules, new RegExp(`-A KUBE-SERVICES -d ${svc.clusterIP.replace(/\./g, '\\.')}/32 .*default/echo:http`), `${node}'s iptables has the Service`);
    }
    t.same(hostDiff(s, before, hostSnapshot(s)), [], 'no host sysctl, firewall rule, root cgroup setting, host network or host mount changed');
  });
}
