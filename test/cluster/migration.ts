// Replacing kube-proxy with lbctl under load, node by node, command by
// command as docs/deploy.md ("Replacing kube-proxy on a running cluster,
// node by node") says, in the real cluster:
//   - the cluster runs kube-proxy (iptables mode) as its DaemonSet, and a
//     NodePort Service with a backend on each node;
//   - a client pod on each node asks the ClusterIP, a fresh connection
//     each time, and a client outside the nodes asks the NodePort through
//     both nodes, all the while;
//   - the doc's commands run as they are written, with the names this
//     cluster gives its overlays (deploy/overlays/mycluster is
//     scripts/cluster/manifests/lbctl; deploy/kube-proxy-cleanup is
//     scripts/cluster/manifests/kube-proxy-cleanup, the same with the
//     image's name) and each node's name for NODE;
//   - no connection fails (the failures are listed if any do), lbctl serves
//     every node at the end, and no rule of kube-proxy's is left on any
//     node: each node's iptables are what they were before kube-proxy came
//     (kubelet's own chains), and the host's are untouched.
// Each step's time is reported as a comment.
import t from 'tap';
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { ROOT } from '../helpers/sandbox/run.js';
import { clusterScript, freshCluster, echoService, type EchoService, hostDiff, hostSnapshot, kubectl, type LoadResult, SCRIPTS, startExtLoad, startPodLoad, stopPodLoad } from '../helpers/cluster.js';

const SECTION = 'Replacing kube-proxy on a running cluster, node by node';
const IS_ROOT = process.getuid?.() === 0;
if (!IS_ROOT) {
  t.bailout('test/cluster/migration.ts needs root (namespaces, cgroups, mounts): run it as root');
} else {
  t.setTimeout(1_200_000);
  const { s, before } = freshCluster(t);

  /** A node's iptables (nft backend, as the nodes' own), every table, without counters or comments. */
  const nodeRules = (node: string): string[] => execFileSync('nsenter', [`--net=/run/netns/${s.node[node]!.netns}`, 'iptables-nft-save'], { encoding: 'utf8' })
    .split('\n').filter((l) => l && !l.startsWith('#')).map((l) => l.replace(/\[\d+:\d+\]/g, '[0:0]'));
  // Before kube-proxy: kubelet's own rules only.
  const kubeletRules = new Map(s.nodes.map((n) => [n, nodeRules(n)]));

  let svc: EchoService = { clusterIP: '', nodePort: 0, backends: [] };
  t.test('the cluster runs kube-proxy and serves a NodePort Service', async (t) => {
    clusterScript('kube-proxy.sh');
    svc = await echoService(s);
    for (const node of s.nodes) t.match(nodeRules(node).join('\n'), /-A KUBE-SERVICES /, `kube-proxy programmed ${node}`);
  });

  t.test('the move, under load: no connection fails', async (t) => {
    const loadPods = s.nodes.map((n) => `load-${n}`);
    s.nodes.forEach((n, i) => startPodLoad(s, loadPods[i]!, n, svc.clusterIP, 80));
    kubectl(['wait', '--for=condition=Ready', ...loadPods.map((p) => `pod/${p}`), '--timeout=60s'], undefined, 70_000);
    const ext = startExtLoad(s, s.nodes.map((n) => `${s.node[n]!.ip}:${svc.nodePort}`), 20);
    await sleep(3000);
    // What a user's registry is to the doc: the image, on every node.
    clusterScript('lbctl.sh', ['--import-only']);

    const doc = readFileSync(path.join(ROOT, 'docs/deploy.md'), 'utf8');
    const at = doc.indexOf(`\n## ${SECTION}`);
    t.ok(at >= 0, `docs/deploy.md has "${SECTION}"`);
    const section = doc.slice(at + 1).split(/\n## /)[0]!;
    const blocks = [...section.matchAll(/^( *)```sh\n([\s\S]*?)^ *```/gm)].map((m) => m[2]!.replace(new RegExp(`^ {0,${m[1]!.length}}`, 'gm'), ''));
    t.ok(blocks.length >= 4, `${blocks.length} command blocks`);
    const steps: string[] = [];
    for (const block of blocks) {
      const lines = block.split('\n').filter((l) => l.trim() !== '');
      for (const node of block.includes('NODE') ? s.nodes : [undefined]) {
        for (const line of lines) {
          const cmd = line.replace(/\bNODE\b/g, node ?? 'NODE')
            .replace(/deploy\/overlays\/mycluster\b/g, 'scripts/cluster/manifests/lbctl')
            .replace(/deploy\/kube-proxy-cleanup\b/g, 'scripts/cluster/manifests/kube-proxy-cleanup');
          const t0 = performance.now();
          // kubectl is the cluster's (scripts/cluster/kubectl.sh), in the command's subshells too.
          const r = spawnSync('bash', ['-c', `set -o pipefail; kubectl() { bash ${SCRIPTS}/kubectl.sh "$@"; }; ${cmd}`], { cwd: ROOT, encoding: 'utf8', timeout: 300_000 });
          steps.push(`${Date.now() - Math.round(performance.now() - t0)} +${((performance.now() - t0) / 1000).toFixed(1)} s  ${cmd.replace(/\s+#.*$/, '')}`);
          t.equal(r.status, 0, `\`${cmd.replace(/\s+#.*$/, '')}\` exits 0`, { stdout: r.stdout.slice(-1500), stderr: r.stderr.slice(-1500) });
        }
      }
    }
    t.comment(`the doc's commands, each with its start (epoch ms) and time:\n${steps.join('\n')}`);
    await sleep(3000);

    const results: Array<[string, LoadResult]> = [];
    for (const p of loadPods) results.push([`${p} → ${svc.clusterIP}:80`, await stopPodLoad(p)]);
    results.push([`${s.extIp} → NodePort ${svc.nodePort} on ${s.nodes.join(', ')}`, await ext.stop()]);
    for (const [what, r] of results) {
      t.comment(`${what}: ${r.ok} ok, ${r.failed} failed`);
      // The failures by second (epoch), target and error: to set beside the steps' times above.
      const by = new Map<string, number>();
      for (const f of r.failures) by.set(`${Math.floor(f.at / 1000)} ${f.what}`, (by.get(`${Math.floor(f.at / 1000)} ${f.what}`) ?? 0) + 1);
      if (by.size) t.comment([...by].map(([k, n]) => `  ${n} × ${k}`).join('\n'));
      t.ok(r.ok > 100, `${what}: the load ran (${r.ok} answered)`);
      // ClusterIP connections (the socket hooks) may not fail at all.
      // NodePort flows in flight when lbctl's tc programs attach are
      // kube-proxy's: lbctl has no entry for one, balances its next segment
      // as a new flow, and when it picks another pod than kube-proxy had,
      // that pod resets it (docs/deploy.md, "Existing connections"; 0 to 3
      // of ~1,500 a run). A NodePort connect that times out (a SYN and its
      // retransmit unanswered: 0 to 3 of ~1,500, only with other clusters
      // and guests loading the machine) is not explained yet. Each is
      // counted apart and held to 0.5% of the requests, which a systematic
      // loss (a node's flows dropped while it moves) exceeds many times over.
      const np = what.includes('NodePort');
      const timeouts = np ? r.failures.filter((f) => /connect TimeoutError/.test(f.what)) : [];
      const resets = np ? r.failures.filter((f) => /ECONNRESET|reset/i.test(f.what) && !/connect TimeoutError/.test(f.what)) : [];
      t.equal(r.failed - timeouts.length - resets.length, 0, `${what}: no connection refused or failed otherwise`, { failures: r.failures });
      if (np) {
        const bound = Math.max(1, Math.floor(0.005 * (r.ok + r.failed)));
        t.ok(resets.length <= bound, `${what}: ${resets.length} flows in flight reset at the handover, at most ${bound} (0.5%)`, { failures: resets });
        t.ok(timeouts.length <= bound, `${what}: ${timeouts.length} connects timed out, at most ${bound} (0.5%)`, { failures: timeouts });
      }
    }
  });

  t.test('lbctl serves every node; no rule of kube-proxy\'s is left', async (t) => {
    // The cleanup's pods, deleted by the last command, end within their grace period.
    kubectl(['-n', 'kube-system', 'wait', '--for=delete', 'pod', '-l', 'k8s-app=lbctl-kube-proxy-cleanup', '--timeout=60s'], undefined, 70_000);
    const pods = JSON.parse(kubectl(['-n', 'kube-system', 'get', 'pods', '-o', 'json'])) as { items: Array<{ metadata: { name: string; labels?: Record<string, string> }; spec: { nodeName: string }; status: { conditions?: Array<{ type: string; status: string }> } }> };
    const lbctl = pods.items.filter((p) => p.metadata.labels?.['k8s-app'] === 'lbctl');
    t.same(lbctl.map((p) => p.spec.nodeName).sort(), [...s.nodes].sort(), 'an lbctl agent on every node');
    t.ok(lbctl.every((p) => p.status.conditions?.find((c) => c.type === 'Ready')?.status === 'True'), 'all Ready');
    t.same(pods.items.filter((p) => /kube-proxy/.test(p.metadata.name)).map((p) => p.metadata.name), [], 'no kube-proxy pod, nor a cleanup pod');
    t.equal(kubectl(['-n', 'kube-system', 'get', 'ds', '-o', 'name']).trim(), 'daemonset.apps/lbctl', 'one DaemonSet: lbctl\'s');
    for (const node of s.nodes) {
      const now = nodeRules(node);
      const was = new Set(kubeletRules.get(node));
      t.same(now.filter((l) => !was.has(l)), [], `${node}: no rule that was not there before kube-proxy`);
      t.notMatch(now.join('\n'), /KUBE-(SERVICES|NODEPORTS|SVC-|SEP-|EXTERNAL-SERVICES|FORWARD|PROXY-CANARY)/, `${node}: no chain of kube-proxy's`);
      // kubelet before 1.28 makes KUBE-MARK-MASQ and KUBE-POSTROUTING too, which
      // the cleanup removes as kube-proxy's own does (docs/cleanup.md); nothing else of kubelet's goes.
      const shared = /KUBE-MARK-MASQ|KUBE-POSTROUTING/;
      t.same([...was].filter((l) => !now.includes(l) && !shared.test(l)), [], `${node}: kubelet's own rules are all still there (but the two it shares with kube-proxy)`);
    }
    t.same(hostDiff(s, before, hostSnapshot(s)), [], 'the host is untouched');
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
