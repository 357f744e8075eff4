// lbctl in the real cluster, deployed as users deploy it (docs/deploy.md):
// `make image`'s archive imported into each node's containerd, then
// `kubectl apply -k` of the cluster's overlay (scripts/cluster/lbctl.sh,
// scripts/cluster/manifests/lbctl: deploy/base with this cluster's knobs),
// and no kube-proxy anywhere:
//   - the DaemonSet runs an agent on each node, Ready, as the DaemonSet says:
//     its probes, its capabilities (not privileged), its mounts; its cgroup
//     root is the node's cgroup2 subtree, where its socket programs are
//     attached, and the host's root cgroup has none;
//   - a client pod on the first node reaches a ClusterIP Service's backends
//     on both nodes, and the kubernetes Service (the API server, which lbctl
//     itself reaches by address, as a cluster without kube-proxy needs);
//   - the pod resolves the Service's name through the cluster's DNS (UDP
//     to the kube-dns ClusterIP, through lbctl's socket programs);
//   - a node reaches the ClusterIP too;
//   - the NodePort answers a client outside the nodes (a namespace on the
//     nodes' bridge that has no route to the pods) through either node,
//     from the local and the remote backend;
//   - `lbctl bpf lb list` in each agent pod shows the Services, and /readyz
//     answers 200 on the node's health port;
//   - nothing of kube-proxy's is on the nodes, and the host keeps its
//     sysctls, firewall rules, root cgroups, network and mounts.
import t from 'tap';
import { statSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { answers, clusterScript, freshCluster, serviceReachTests, echoService, type EchoService, hostDiff, hostnameVia, hostSnapshot, inExt, kubectl } from '../helpers/cluster.js';

const IS_ROOT = process.getuid?.() === 0;
if (!IS_ROOT) {
  t.bailout('test/cluster/lbctl.ts needs root (namespaces, cgroups, mounts): run it as root');
} else {
  t.setTimeout(900_000);
  const { s, before } = freshCluster(t);

  interface Pod { metadata: { name: string }; spec: { nodeName: string; containers: Array<Record<string, unknown> & { name: string; securityContext?: { privileged?: boolean; capabilities?: { add?: string[] } } }>; volumes: Array<{ name: string; hostPath?: { path: string } }> }; status: { conditions?: Array<{ type: string; status: string }> } }
  const agents = new Map<string, string>(); // node → agent pod

  t.test('the DaemonSet runs an agent on each node, Ready, as deploy/ says', async (t) => {
    const t0 = performance.now();
    clusterScript('lbctl.sh');
    t.comment(`lbctl.sh (import, apply -k, rollout): ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    const pods = (JSON.parse(kubectl(['-n', 'kube-system', 'get', 'pods', '-l', 'k8s-app=lbctl', '-o', 'json'])) as { items: Pod[] }).items;
    t.same(pods.map((p) => p.spec.nodeName).sort(), [...s.nodes].sort(), 'one agent per node');
    for (const p of pods) {
      agents.set(p.spec.nodeName, p.metadata.name);
      t.equal(p.status.conditions?.find((c) => c.type === 'Ready')?.status, 'True', `${p.metadata.name} is Ready (its readinessProbe on /readyz)`);
      const agent = p.spec.containers.find((c) => c.name === 'lbctl-agent')!;
      t.ok(agent.startupProbe && agent.livenessProbe && agent.readinessProbe, 'with the startup, liveness and readiness probes of deploy/base');
      t.equal(agent.securityContext?.privileged, false, 'not privileged');
      // The capabilities the container got: the effective set of its PID 1.
      const status = kubectl(['-n', 'kube-system', 'exec', p.metadata.name, '-c', 'lbctl-agent', '--', 'cat', '/proc/1/status']);
      const eff = BigInt(`0x${/^CapEff:\s+([0-9a-f]+)$/m.exec(status)![1]}`);
      const has = (bit: number): boolean => ((eff >> BigInt(bit)) & 1n) === 1n;
      t.ok(has(12) && has(21) && has(38) && has(39), 'CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_PERFMON and CAP_BPF');
      t.notOk(has(16), 'and not all of them: no CAP_SYS_MODULE');
      // The cgroup root it attaches to is its node's cgroup2 subtree.
      t.equal(p.spec.volumes.find((v) => v.name === 'cgroup-root')?.hostPath?.path, '/run/lbctl-cluster/cgroup2');
      const ino = Number(kubectl(['-n', 'kube-system', 'exec', p.metadata.name, '-c', 'lbctl-agent', '--', 'stat', '-c', '%i', '/host/sys/fs/cgroup']).trim());
      t.equal(ino, statSync(path.join(s.cgroupV2, s.name, p.spec.nodeName)).ino, `${p.metadata.name}'s /host/sys/fs/cgroup is ${p.spec.nodeName}'s cgroup2 subtree`);
      const attached = execFileSync('bpftool', ['cgroup', 'show', path.join(s.cgroupV2, s.name, p.spec.nodeName)], { encoding: 'utf8' });
      t.match(attached, /inet4_connect\s.*lb_connect4/, `the socket programs are attached to ${p.spec.nodeName}'s subtree`);
    }
    t.notOk(/lb_connect/.test(execFileSync('bpftool', ['cgroup', 'show', s.cgroupV2], { encoding: 'utf8' })), 'and none to the host\'s root cgroup');
  });

  t.test('no kube-proxy: no DaemonSet, no KUBE-SERVICES on the nodes', async (t) => {
    t.equal(kubectl(['-n', 'kube-system', 'get', 'ds', '-o', 'name']).trim(), 'daemonset.apps/lbctl');
    for (const node of s.nodes) {
      const rules = execFileSync('nsenter', [`--net=/run/netns/${s.node[node]!.netns}`, 'iptables-nft-save'], { encoding: 'utf8' });
      t.notMatch(rules, /KUBE-SERVICES|KUBE-NODEPORTS/, `${node} has no kube-proxy chain`);
    }
  });

  let svc: EchoService = { clusterIP: '', nodePort: 0, backends: [] };
  t.test('a NodePort Service with a backend on each node', async (t) => {
    svc = await echoService(s);
    t.match(svc.clusterIP, /^10\.96\./);
    t.ok(svc.nodePort >= 30000 && svc.nodePort <= 32767, `NodePort ${svc.nodePort}`);
  });

  t.test('a client pod on the first node reaches both backends through the ClusterIP, and the API server through its Service', async (t) => {
    const inPod = (sh: string): string => kubectl(['exec', 'client', '--', 'sh', '-c', sh]);
    const seen = answers(() => hostnameVia(inPod, svc.clusterIP, 80), 16);
    t.same([...seen].sort(), svc.backends, `answers through ${svc.clusterIP}:80`);
    // The kubernetes Service: 10.96.0.1:443 is the API server at 10.240.0.1:6443.
    const reply = inPod("printf 'GET /livez HTTP/1.0\\r\\n\\r\\n' | nc -w 3 10.96.0.1 443 | head -1");
    t.match(reply, /^HTTP\/1\.0 400 Bad Request/, `the API server's TLS port answers through 10.96.0.1:443 (plain HTTP to TLS: 400): ${reply.trim()}`);
  });

  t.test('the client pod resolves the Service\'s name through kube-dns (UDP, through lbctl)', async (t) => {
    kubectl(['-n', 'kube-system', 'wait', '--for=condition=Available', 'deploy/cluster-dns', '--timeout=60s'], undefined, 70_000);
    const out = kubectl(['exec', 'client', '--', 'nslookup', 'echo.default.svc.cluster.local', '10.96.0.10']);
    t.match(out, new RegExp(`Address:\\s+${svc.clusterIP.replace(/\./g, '\\.')}\\b`), `echo.default.svc.cluster.local is ${svc.clusterIP}`, { out });
  });

  serviceReachTests(t, s, () => svc);

  t.test('each agent shows the Services (lbctl bpf lb list) and is ready (/readyz)', async (t) => {
    for (const node of s.nodes) {
      const list = kubectl(['-n', 'kube-system', 'exec', agents.get(node)!, '-c', 'lbctl-agent', '--', 'lbctl', 'bpf', 'lb', 'list']);
      const ip = s.node[node]!.ip;
      for (const frontend of [`${svc.clusterIP}:80/TCP`, `${ip}:${svc.nodePort}/TCP`, '10.96.0.1:443/TCP']) {
        t.match(list, new RegExp(`^${frontend.replace(/\./g, '\\.')}\\s`, 'm'), `${node}: ${frontend}`);
      }
      const pods = JSON.parse(kubectl(['get', 'pods', '-l', 'app=echo', '-o', 'json'])) as { items: Array<{ status: { podIP: string } }> };
      for (const p of pods.items) t.match(list, new RegExp(`^\\s+${p.status.podIP.replace(/\./g, '\\.')}:8080 `, 'm'), `${node}: backend ${p.status.podIP}:8080`);
      const ready = inExt(s, ['busybox', 'sh', '-c', `printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${ip} 10256`]);
      t.match(ready, /^HTTP\/1\.[01] 200 /, `${node}'s /readyz on ${ip}:10256: 200`);
    }
  });

  // Issue 36's memory budget: the control plane, two nodes, their pods and
  // lbctl in 6 GiB. mem.sh's cgroup count is the memory controller's (RSS
  // plus the page cache each cgroup charged: etcd's data, the images'
  // files), the larger of its two figures.
  t.test('the cluster with two nodes and lbctl fits in 6 GiB', async (t) => {
    const mem = JSON.parse(clusterScript('mem.sh', ['--json'])) as Record<string, { processes: number; rssMiB: number; cgroupMiB: number }>;
    const total = mem.total!;
    t.comment(Object.entries(mem).map(([g, m]) => `${g}: ${m.processes} processes, RSS ${m.rssMiB} MiB, cgroup ${m.cgroupMiB} MiB`).join('\n'));
    t.ok(total.rssMiB > 0, 'mem.sh found the cluster\'s processes');
    t.ok(Math.max(total.rssMiB, total.cgroupMiB) <= 6144, `${Math.max(total.rssMiB, total.cgroupMiB)} MiB ≤ 6,144 MiB`);
  });

  t.test('the host is untouched', async (t) => {
    t.same(hostDiff(s, before, hostSnapshot(s)), [], 'no host sysctl, firewall rule, root cgroup setting or program, host network or host mount changed');
  });
}
