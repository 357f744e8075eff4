// kube-proxy in the real cluster (scripts/cluster/kube-proxy.sh): the
// shared binary in iptables mode, as a DaemonSet from our own image, and
// Services it serves:
//   - it runs on both nodes and programs their iptables (KUBE-SERVICES),
//     in the nodes' network namespaces only;
//   - a ClusterIP Service with an agnhost backend on each node: a client
//     pod reaches both backends through the ClusterIP, and so does a node
//     itself;
//   - the same Service's NodePort, from outside the nodes (the control
//     plane's namespace), through either node;
//   - the host keeps its sysctls (kube-proxy's conntrack settings are per
//     network namespace, and its global ones are turned off), firewall
//     rules, root cgroups, network and mounts.
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { clusterScript, clusterSettings, hostDiff, hostSnapshot, kubectl, onNode } from '../helpers/cluster.js';

const IS_ROOT = process.getuid?.() === 0;
if (!IS_ROOT) {
  t.bailout('test/cluster/kube-proxy.ts needs root (namespaces, cgroups, mounts): run it as root');
} else {
  t.setTimeout(900_000);
  const s = clusterSettings();
  if (existsSync(s.state)) throw new Error(`a cluster is up (${s.state}): make cluster-down first`);
  const before = hostSnapshot(s);
  t.teardown(() => { clusterScript('down.sh'); });
  clusterScript('up.sh');

  /** HTTP/1.0 GET of /hostname with busybox nc, from a pod or (cmd prefix) elsewhere: the answer's body. */
  const hostnameVia = (run: (script: string) => string, addr: string, port: number): string => {
    const reply = run(`printf 'GET /hostname HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${addr} ${port}`);
    return reply.split('\r\n\r\n')[1] ?? `(no answer: ${JSON.stringify(reply)})`;
  };
  /** The distinct answers of `tries` requests. */
  const answers = (ask: () => string, tries: number): Set<string> => {
    const seen = new Set<string>();
    for (let i = 0; i < tries; i++) seen.add(ask());
    return seen;
  };

  t.test('kube-proxy runs on both nodes', async (t) => {
    clusterScript('kube-proxy.sh');
    const ds = JSON.parse(kubectl(['-n', 'kube-system', 'get', 'ds', 'kube-proxy', '-o', 'json'])) as { status: { numberReady: number } };
    t.equal(ds.status.numberReady, s.nodes.length);
  });

  const backends = s.nodes.map((n) => `echo-${n}`);
  let clusterIP = '';
  let nodePort = 0;
  t.test('a ClusterIP Service with a backend on each node', async (t) => {
    const items = [
      ...s.nodes.map((node) => ({
        apiVersion: 'v1', kind: 'Pod',
        metadata: { name: `echo-${node}`, labels: { app: 'echo' } },
        spec: {
          nodeSelector: { 'kubernetes.io/hostname': node }, terminationGracePeriodSeconds: 1,
          containers: [{ name: 'echo', image: s.testImage, imagePullPolicy: 'Never', args: ['netexec', '--http-port=8080'], readinessProbe: { httpGet: { path: '/healthz', port: 8080 }, periodSeconds: 1 } }],
        },
      })),
      {
        apiVersion: 'v1', kind: 'Pod',
        metadata: { name: 'client' },
        spec: {
          nodeSelector: { 'kubernetes.io/hostname': s.nodes[0] }, terminationGracePeriodSeconds: 1,
          containers: [{ name: 'client', image: s.testImage, imagePullPolicy: 'Never', args: ['pause'] }],
        },
      },
      {
        apiVersion: 'v1', kind: 'Service',
        metadata: { name: 'echo' },
        spec: { type: 'NodePort', selector: { app: 'echo' }, ports: [{ name: 'http', port: 80, targetPort: 8080 }] },
      },
    ];
    kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
    kubectl(['wait', '--for=condition=Ready', 'pod/client', ...backends.map((b) => `pod/${b}`), '--timeout=120s'], undefined, 130_000);
    const svc = JSON.parse(kubectl(['get', 'svc', 'echo', '-o', 'json'])) as { spec: { clusterIP: string; ports: Array<{ nodePort: number }> } };
    clusterIP = svc.spec.clusterIP;
    nodePort = svc.spec.ports[0]!.nodePort;
    // The EndpointSlice controller has both backends ready.
    for (let i = 0; i < 50; i++) {
      const slices = JSON.parse(kubectl(['get', 'endpointslices', '-l', 'kubernetes.io/service-name=echo', '-o', 'json'])) as { items: Array<{ endpoints?: Array<{ conditions: { ready?: boolean } }> }> };
      if (slices.items.flatMap((sl) => sl.endpoints ?? []).filter((e) => e.conditions.ready).length === backends.length) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    t.match(clusterIP, /^10\.96\./);
    t.ok(nodePort >= 30000 && nodePort <= 32767, `NodePort ${nodePort}`);
  });

  t.test('the client pod reaches both backends through the ClusterIP', async (t) => {
    const seen = answers(() => hostnameVia((sh) => kubectl(['exec', 'client', '--', 'sh', '-c', sh]), clusterIP, 80), 16);
    t.same([...seen].sort(), backends, `answers through ${clusterIP}:80`);
  });

  t.test('a node reaches both backends through the ClusterIP', async (t) => {
    const node = s.nodes[1]!;
    const seen = answers(() => hostnameVia((sh) => onNode(s, node, ['busybox', 'sh', '-c', sh]), clusterIP, 80), 16);
    t.same([...seen].sort(), backends, `answers to ${node} through ${clusterIP}:80`);
  });

  t.test('the NodePort, from outside the nodes, through either node', async (t) => {
    for (const node of s.nodes) {
      const ip = s.node[node]!.ip;
      const ask = (): string => hostnameVia((sh) => execFileSync('nsenter', [`--net=/run/netns/${s.cpNetns}`, 'busybox', 'sh', '-c', sh], { encoding: 'utf8' }), ip, nodePort);
      const seen = answers(ask, 16);
      t.same([...seen].sort(), backends, `answers through ${ip}:${nodePort}`);
    }
  });

  t.test('kube-proxy programmed the nodes, not the host', async (t) => {
    for (const node of s.nodes) {
      const rules = execFileSync('nsenter', [`--net=/run/netns/${s.node[node]!.netns}`, 'iptables-nft-save', '-t', 'nat'], { encoding: 'utf8' });
      t.match(rules, new RegExp(`-A KUBE-SERVICES -d ${clusterIP.replace(/\./g, '\\.')}/32 .*default/echo:http`), `${node}'s iptables has the Service`);
    }
    t.same(hostDiff(s, before, hostSnapshot(s)), [], 'no host sysctl, firewall rule, root cgroup setting, host network or host mount changed');
  });
}
