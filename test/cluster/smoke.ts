// The real cluster (scripts/cluster/, docs/cluster.md), end to end:
//   - `cluster-up` brings up the control plane and both nodes, Ready;
//   - a pod on each node (placed by the scheduler), from our own agnhost
//     image, in a sandbox of our own pause image, Running and Ready, with an
//     address of its node's pod CIDR, its cgroups under its node's subtree;
//   - each pod reaches the other's HTTP server by pod IP, across the nodes;
//   - a privileged pod's Bidirectional hostPath mount (lbctl's bpffs mount)
//     reaches its node's bpffs, not the host's;
//   - the host keeps its sysctls (kubelet wrote its six into the node's
//     covering files), iptables and nftables, root cgroups, network and
//     mounts, while the cluster runs and after, and nothing listens on the
//     cluster's ports in the host's namespace;
//   - `cluster-down` leaves no process, cgroup, network namespace, mount
//     point or state behind.
// The time to come up, and the cluster's memory (scripts/cluster/mem.sh),
// are reported as comments.
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { clusterScript, clusterUp, clusterSettings, hostDiff, hostSnapshot, kubectl, onNode } from '../helpers/cluster.js';

const IS_ROOT = process.getuid?.() === 0;
if (!IS_ROOT) {
  t.bailout('test/cluster/smoke.ts needs root (namespaces, cgroups, mounts): run it as root');
} else {
  t.setTimeout(900_000);
  const s = clusterSettings();
  if (existsSync(s.state)) throw new Error(`a cluster is up (${s.state}): make cluster-down first`);
  const before = hostSnapshot(s);
  // The cluster's ports: etcd, the API server, the controllers, kubelet.
  const clusterPorts = [2379, 2380, 2381, 6443, 10248, 10250, 10257, 10259];
  const hostListening = (): number[] => execFileSync('ss', ['-Hltn'], { encoding: 'utf8' }).split('\n')
    .map((l) => Number(l.split(/\s+/)[3]?.split(':').pop())).filter((p) => clusterPorts.includes(p));
  const listeningBefore = hostListening();
  // Mount points cluster-up makes unless they exist.
  const mountPoints = ['/var/lib/kubelet', '/var/lib/containerd', '/var/lib/cni', '/etc/cni/net.d', '/var/log/pods', '/var/log/containers'];
  const existedBefore = new Set(mountPoints.filter((d) => existsSync(d)));
  const sysctlBefore = new Map(['vm.overcommit_memory', 'vm.panic_on_oom', 'kernel.panic', 'kernel.panic_on_oops', 'kernel.keys.root_maxkeys', 'kernel.keys.root_maxbytes'].map((k) => [k, before.sysctls.get(k)]));
  let down = false;
  const teardown = (): void => {
    if (!down) clusterScript('down.sh');
    down = true;
  };
  t.teardown(teardown);

  const t0 = performance.now();
  clusterUp();
  t.comment(`cluster-up: ${((performance.now() - t0) / 1000).toFixed(1)} s`);

  t.test('both nodes are Ready, with their pod CIDRs', async (t) => {
    const nodes = JSON.parse(kubectl(['get', 'nodes', '-o', 'json'])) as { items: Array<{ metadata: { name: string }; spec: { podCIDR?: string }; status: { conditions: Array<{ type: string; status: string }>; addresses: Array<{ type: string; address: string }> } }> };
    t.same(nodes.items.map((n) => n.metadata.name).sort(), [...s.nodes].sort());
    for (const n of nodes.items) {
      t.equal(n.status.conditions.find((c) => c.type === 'Ready')?.status, 'True', `${n.metadata.name} Ready`);
      t.equal(n.spec.podCIDR, s.node[n.metadata.name]!.podCidr, `${n.metadata.name}'s pod CIDR`);
      t.equal(n.status.addresses.find((a) => a.type === 'InternalIP')?.address, s.node[n.metadata.name]!.ip, `${n.metadata.name}'s InternalIP`);
    }
  });

  t.test('a pod on each node reaches the other by pod IP', async (t) => {
    const pods = s.nodes.map((node) => ({
      apiVersion: 'v1', kind: 'Pod',
      metadata: { name: `smoke-${node}`, labels: { app: 'smoke' } },
      spec: {
        nodeSelector: { 'kubernetes.io/hostname': node },
        containers: [{
          name: 'web', image: s.testImage, imagePullPolicy: 'Never', args: ['netexec', '--http-port=8080'],
          readinessProbe: { httpGet: { path: '/healthz', port: 8080 }, periodSeconds: 1 },
        }],
        terminationGracePeriodSeconds: 1,
      },
    }));
    kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: pods }));
    const t1 = performance.now();
    kubectl(['wait', '--for=condition=Ready', ...pods.map((p) => `pod/${p.metadata.name}`), '--timeout=120s'], undefined, 130_000);
    t.comment(`pods Ready ${((performance.now() - t1) / 1000).toFixed(1)} s after they were created`);

    const ips = new Map<string, string>();
    for (const node of s.nodes) {
      const pod = JSON.parse(kubectl(['get', 'pod', `smoke-${node}`, '-o', 'json'])) as { spec: { nodeName: string }; status: { phase: string; podIP: string } };
      t.equal(pod.spec.nodeName, node, `smoke-${node} was scheduled on ${node}`);
      t.equal(pod.status.phase, 'Running');
      t.ok(inCidr(pod.status.podIP, s.node[node]!.podCidr), `smoke-${node}'s IP ${pod.status.podIP} is in ${node}'s pod CIDR`);
      ips.set(node, pod.status.podIP);
      // Every hierarchy, cgroup2 included, puts the pod under its node's subtree.
      const cgroups = kubectl(['exec', `smoke-${node}`, '--', 'cat', '/proc/self/cgroup']).trim().split('\n');
      t.ok(cgroups.length > 0 && cgroups.every((l) => l.split(':')[2]!.startsWith(`/${s.name}/${node}/kubepods/`)), `smoke-${node}'s cgroups are under /${s.name}/${node}/kubepods`, { found: cgroups });
      // The node's cgroup2 subtree, where lbctl's socket hooks will attach, at its own path in the node.
      t.equal(Number(onNode(s, node, ['stat', '-c', '%i', '/run/lbctl-cluster/cgroup2']).trim()), statSync(path.join(s.cgroupV2, s.name, node)).ino,
        `${node}'s /run/lbctl-cluster/cgroup2 is its cgroup2 subtree`);
      // The sandbox is our pause image.
      const sandboxes = onNode(s, node, ['ctr', '--address', '/run/containerd/containerd.sock', '-n', 'k8s.io', 'containers', 'ls']);
      t.ok(sandboxes.split('\n').some((l) => l.split(/\s+/)[1] === s.pauseImage), `${node}'s sandboxes run ${s.pauseImage}`, { found: sandboxes });
    }
    const pairs: Array<[string, string]> = [[s.nodes[0]!, s.nodes[1]!], [s.nodes[1]!, s.nodes[0]!]];
    for (const [from, to] of pairs) {
      // busybox nc: HTTP/1.0 to netexec's /hostname, which answers the pod's name.
      const reply = kubectl(['exec', `smoke-${from}`, '--', 'sh', '-c', `printf 'GET /hostname HTTP/1.0\\r\\n\\r\\n' | nc -w 5 ${ips.get(to)} 8080`]);
      t.match(reply, /^HTTP\/1\.0 200 OK/, `smoke-${from} reaches smoke-${to} at ${ips.get(to)}:8080`);
      t.equal(reply.split('\r\n\r\n')[1], `smoke-${to}`, `and smoke-${to} answers`);
    }
  });

  t.test('a pod\'s Bidirectional hostPath mount reaches its node, not the host', async (t) => {
    // What lbctl's mount-bpf-fs init container does with /sys/fs/bpf; the
    // node's bpffs is its own.
    const node = s.nodes[0]!;
    kubectl(['apply', '-f', '-'], JSON.stringify({
      apiVersion: 'v1', kind: 'Pod',
      metadata: { name: 'smoke-propagation' },
      spec: {
        nodeSelector: { 'kubernetes.io/hostname': node }, terminationGracePeriodSeconds: 1,
        containers: [{
          name: 'c', image: s.testImage, imagePullPolicy: 'Never', securityContext: { privileged: true },
          command: ['sh', '-c', 'mkdir -p /host-bpf/smoke && mount -t tmpfs smoke /host-bpf/smoke && echo from-the-pod >/host-bpf/smoke/x && touch /ready && exec sleep 3600'],
          readinessProbe: { exec: { command: ['cat', '/ready'] }, periodSeconds: 1 },
          volumeMounts: [{ name: 'bpf', mountPath: '/host-bpf', mountPropagation: 'Bidirectional' }],
        }],
        volumes: [{ name: 'bpf', hostPath: { path: '/sys/fs/bpf' } }],
      },
    }));
    kubectl(['wait', '--for=condition=Ready', 'pod/smoke-propagation', '--timeout=60s'], undefined, 70_000);
    t.equal(onNode(s, node, ['cat', '/sys/fs/bpf/smoke/x']).trim(), 'from-the-pod', `${node} sees the pod's mount in its /sys/fs/bpf`);
    t.notOk(existsSync('/sys/fs/bpf/smoke'), 'the host\'s /sys/fs/bpf does not');
    kubectl(['delete', 'pod', 'smoke-propagation', '--wait=false']);
  });

  t.test('the host is untouched while the cluster runs', async (t) => {
    t.same(hostDiff(s, before, hostSnapshot(s)), [], 'no host sysctl, firewall rule, root cgroup setting, host network or host mount changed');
    // kubelet did write its kernel settings: into the node's files over /proc/sys.
    const want: Record<string, string> = { 'vm.overcommit_memory': '1', 'vm.panic_on_oom': '0', 'kernel.panic': '10', 'kernel.panic_on_oops': '1' };
    for (const node of s.nodes) {
      for (const [k, v] of Object.entries(want) as Array<[string, string]>) {
        t.equal(readFileSync(path.join(s.state, 'nodes', node, 'sysctl', k), 'utf8').trim(), v as string, `${node}: kubelet set ${k}=${v} in the node's file`);
        t.equal(onNode(s, node, ['cat', `/proc/sys/${k.replace(/\./g, '/')}`]).trim(), v, `${node} reads ${k}=${v}`);
      }
      t.notOk(existsSync(path.join(s.state, 'nodes', node, 'modprobe.log')), `${node}: nothing asked for a kernel module`);
    }
    for (const [k, v] of sysctlBefore) t.equal(readFileSync(`/proc/sys/${k.replace(/\./g, '/')}`, 'utf8').trim(), v, `the host's ${k} is still ${v}`);
    t.same(hostListening(), listeningBefore, `nothing listens on the cluster's ports (${clusterPorts.join(', ')}) in the host's namespace`);
    const netns = readdirSync('/run/netns').filter((n) => n.startsWith('cni-'));
    t.same(netns, [], 'no pod network namespace is pinned in the host\'s /run/netns');
    t.comment(clusterScript('mem.sh').trimEnd());
  });

  t.test('cluster-down removes everything it made', async (t) => {
    const t2 = performance.now();
    teardown();
    t.comment(`cluster-down: ${((performance.now() - t2) / 1000).toFixed(1)} s`);
    t.notOk(existsSync(s.state), `${s.state} is gone`);
    for (const ns of [s.cpNetns, s.extNetns, ...s.nodes.map((n) => s.node[n]!.netns)]) t.notOk(existsSync(`/run/netns/${ns}`), `netns ${ns} is gone`);
    for (const m of [...s.cgroupV1, s.cgroupV2]) t.notOk(existsSync(path.join(m, s.name)), `${m}/${s.name} is gone`);
    // Zombies still name their cgroup until PID 1 reaps them: only live ones count.
    const live = (p: string): boolean => {
      try {
        return !/^[ZX]/.test(readFileSync(`/proc/${p}/stat`, 'utf8').replace(/^.*\) /s, '')) && readFileSync(`/proc/${p}/cgroup`, 'utf8').includes(`/${s.name}/`);
      } catch { return false; }
    };
    t.same(readdirSync('/proc').filter((p) => /^\d+$/.test(p) && live(p)), [], 'no process is left in the cluster\'s cgroups');
    for (const d of mountPoints) if (!existedBefore.has(d)) t.notOk(existsSync(d), `${d} (a mount point cluster-up made) is gone`);
    t.same(hostDiff(s, before, hostSnapshot(s)), [], 'the host is as it was');
  });
}

function inCidr(ip: string, cidr: string): boolean {
  const [net, bits] = cidr.split('/');
  const n = (a: string): number => a.split('.').reduce((x, o) => x * 256 + Number(o), 0);
  const mask = 2 ** 32 - 2 ** (32 - Number(bits));
  return (n(ip) & mask) >>> 0 === (n(net!) & mask) >>> 0;
}
