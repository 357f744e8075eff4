// deploy/ against the Kubernetes API's schemas and against the agent:
// every object rendered by `kubectl kustomize` validates with
// kubernetes-models (the API's OpenAPI schemas, generated); every flag the
// DaemonSets pass is one `lbctl --help` lists; the ConfigMap is a
// configuration the agent starts with; every probe path and port is one the
// agent serves (a real agent, started with the ConfigMap's file); the
// ClusterRole grants exactly what the Kubernetes source asks for (its
// API_ACCESS table, from which its request paths are built) and nothing
// else; the DaemonSet has what the issue and kube-proxy's own DaemonSet
// have (host network, priority, tolerations, rolling update, probes,
// capabilities without privilege, bpffs and cgroup v2 from the host); the
// move from kube-proxy node by node, run command by command from
// docs/deploy.md against the rendered DaemonSets and kubeadm's kube-proxy,
// never puts kube-proxy and lbctl on one node (their ports are the same).
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import yaml from 'js-yaml';
import { parseAllDocuments } from 'yaml';
import { API_ACCESS } from '../../src/sources/kubernetes.js';
import { createSandbox, LBCTL, ROOT } from '../helpers/sandbox.js';

type Obj = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string }; [k: string]: unknown };
// The parts of the objects the checks read (the schemas check the rest).
interface Container {
  name: string;
  image: string;
  command?: string[];
  args?: string[];
  env?: Array<{ name: string; valueFrom?: { fieldRef?: { fieldPath: string } } }>;
  ports?: Array<{ name: string; containerPort: number }>;
  startupProbe?: Probe;
  livenessProbe?: Probe;
  readinessProbe?: Probe;
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  securityContext?: { privileged?: boolean; capabilities?: { add?: string[] } };
  volumeMounts?: Array<{ name: string; mountPath: string; mountPropagation?: string; readOnly?: boolean }>;
}
interface Probe {
  httpGet: { path: string; port: string | number };
  periodSeconds?: number;
  failureThreshold?: number;
}
interface NodeSelectorTerm {
  matchExpressions?: Array<{ key: string; operator: string; values?: string[] }>;
  matchFields?: unknown[];
}
interface PodSpec {
  serviceAccountName?: string;
  nodeSelector?: Record<string, string>;
  affinity?: { nodeAffinity?: { requiredDuringSchedulingIgnoredDuringExecution?: { nodeSelectorTerms: NodeSelectorTerm[] } } };
  hostNetwork?: boolean;
  hostPID?: boolean;
  priorityClassName?: string;
  tolerations?: Array<{ operator?: string; key?: string }>;
  initContainers?: Container[];
  containers: Container[];
  volumes?: Array<{ name: string; hostPath?: { path: string }; configMap?: { name: string } }>;
}
interface DaemonSet extends Obj {
  spec: { updateStrategy?: { type: string; rollingUpdate?: { maxUnavailable?: number | string } }; template: { spec: PodSpec } };
}
interface Rule {
  apiGroups: string[];
  resources: string[];
  verbs: string[];
  resourceNames?: string[];
}

const KUSTOMIZATIONS = ['deploy', 'deploy/overlays/example', 'deploy/uninstall', 'deploy/kube-proxy-cleanup'];
const kubectl = execFileSync(path.join(ROOT, 'scripts/tools/kubectl.sh'), { encoding: 'utf8' }).trim();
const rendered = new Map<string, Obj[]>();
for (const k of KUSTOMIZATIONS) {
  const text = execFileSync(kubectl, ['kustomize', path.join(ROOT, k)], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  rendered.set(k, parseAllDocuments(text).map((d) => d.toJS() as Obj));
}
const base = rendered.get('deploy')!;
const find = <T extends Obj>(objs: Obj[], kind: string, name?: string): T => {
  const o = objs.find((x) => x.kind === kind && (name === undefined || x.metadata.name === name));
  if (!o) throw new Error(`no ${kind}${name ? ` ${name}` : ''} rendered`);
  return o as T;
};
const daemonSet = find<DaemonSet>(base, 'DaemonSet', 'lbctl');
const pod = daemonSet.spec.template.spec;
const agent = pod.containers.find((c) => c.name === 'lbctl-agent')!;

/** kubernetes-models' class for an apiVersion and kind: its module path is GROUP/VERSION/KIND (core: VERSION/KIND). */
async function modelOf(apiVersion: string, kind: string): Promise<{ new (o: unknown): { validate(): void } }> {
  const mod = (await import(`kubernetes-models/${apiVersion}/${kind}`)) as Record<string, { new (o: unknown): { validate(): void } }>;
  const cls = mod[kind];
  if (!cls) throw new Error(`kubernetes-models has no ${apiVersion} ${kind}`);
  return cls;
}

t.test('every rendered object validates against the Kubernetes API schema of its kind', async (t) => {
  for (const [k, objs] of rendered) {
    t.ok(objs.length > 0, `${k} renders objects`);
    for (const o of objs) {
      const Model = await modelOf(o.apiVersion, o.kind);
      t.doesNotThrow(() => new Model(o).validate(), `${k}: ${o.kind} ${o.metadata.name}`);
    }
  }
  // The check can fail: a DaemonSet with a mistyped field is refused.
  const Model = await modelOf('apps/v1', 'DaemonSet');
  const broken = structuredClone(daemonSet) as DaemonSet;
  (broken.spec.template.spec as unknown as { hostNetwork: string }).hostNetwork = 'yes';
  t.throws(() => new Model(broken).validate(), /hostNetwork must be boolean/, 'a wrong type is refused');
  const namespaced = base.filter((o) => !['ClusterRole', 'ClusterRoleBinding'].includes(o.kind));
  t.same([...new Set(namespaced.map((o) => o.metadata.namespace))], ['kube-system'], "namespaced objects are in kube-system, kube-proxy's namespace");
});

/** The long flags a command's --help lists. */
function helpFlags(args: string[]): Set<string> {
  const help = execFileSync(LBCTL, [...args, '--help'], { encoding: 'utf8' });
  return new Set([...help.matchAll(/(?:^|[\s,])(--[a-z][a-z0-9-]*)/g)].map((m) => m[1]!));
}

/** The long flags in a container's command and args (after the `lbctl SUBCOMMAND…` words). */
function flagsOf(c: Container): { words: string[]; flags: string[] } {
  const all = [...(c.command ?? []), ...(c.args ?? [])];
  return { words: all.filter((a) => !a.startsWith('-')), flags: all.filter((a) => a.startsWith('--')).map((a) => a.split('=')[0]!) };
}

t.test('every flag the manifests pass is one lbctl has', async (t) => {
  const checked: string[] = [];
  for (const [k, objs] of rendered) {
    for (const ds of objs.filter((o) => o.kind === 'DaemonSet') as DaemonSet[]) {
      const spec = ds.spec.template.spec;
      for (const c of [...(spec.initContainers ?? []), ...spec.containers]) {
        if (c.command?.[0] !== 'lbctl') continue;
        const { words, flags } = flagsOf(c);
        const known = helpFlags(words.slice(1));
        for (const f of flags) t.ok(known.has(f), `${k}: ${ds.metadata.name}/${c.name}: \`${words.join(' ')}\` has ${f}`);
        checked.push(`${ds.metadata.name}/${c.name}`);
      }
    }
  }
  t.same([...new Set(checked)].sort(), ['lbctl-kube-proxy-cleanup/cleanup', 'lbctl-uninstall/cleanup', 'lbctl/lbctl-agent'], 'the agent and both cleanups are checked');
  t.notOk(helpFlags(['agent']).has('--no-such-flag'), 'and a flag lbctl lacks would be caught');
});

t.test('the ClusterRole grants exactly what the Kubernetes source asks for', async (t) => {
  const role = find<Obj & { rules: Rule[] }>(base, 'ClusterRole', 'lbctl');
  const granted = new Set<string>();
  for (const r of role.rules) {
    t.notOk(r.resourceNames, 'no resourceNames');
    for (const g of r.apiGroups) for (const res of r.resources) for (const v of r.verbs) {
      t.not(g, '*', 'no wildcard group');
      t.not(res, '*', 'no wildcard resource');
      t.not(v, '*', 'no wildcard verb');
      granted.add(`${g}/${res}:${v}`);
    }
  }
  const used = new Set(Object.values(API_ACCESS).flatMap((a) => a.verbs.map((v) => `${a.group}/${a.resource}:${v}`)));
  t.same([...granted].sort(), [...used].sort(), `granted: ${[...granted].sort().join(', ')}`);
  const binding = find<Obj & { roleRef: { kind: string; name: string }; subjects: Array<{ kind: string; name: string; namespace?: string }> }>(base, 'ClusterRoleBinding', 'lbctl');
  t.same(binding.roleRef, { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'lbctl' });
  const sa = find(base, 'ServiceAccount');
  t.same(binding.subjects, [{ kind: 'ServiceAccount', name: sa.metadata.name, namespace: sa.metadata.namespace }], "bound to the DaemonSet's service account");
  t.equal(pod.serviceAccountName, sa.metadata.name);
  for (const k of ['deploy/uninstall', 'deploy/kube-proxy-cleanup']) {
    const ds = rendered.get(k)!.find((o) => o.kind === 'DaemonSet') as DaemonSet & { spec: { template: { spec: { automountServiceAccountToken?: boolean } } } };
    t.equal(ds.spec.template.spec.automountServiceAccountToken, false, `${k}: no API access at all`);
  }
});

t.test('the DaemonSet: host network, every node, one at a time, not privileged', async (t) => {
  t.equal(pod.hostNetwork, true, 'hostNetwork');
  t.notOk(pod.hostPID, 'no hostPID');
  t.equal(pod.priorityClassName, 'system-node-critical');
  t.ok(pod.tolerations?.some((x) => x.operator === 'Exists' && x.key === undefined), 'tolerates every taint (control-plane, not-ready)');
  t.same(daemonSet.spec.updateStrategy, { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 1 } });
  t.ok(agent.resources?.requests?.memory && agent.resources.requests.cpu, 'requests');
  t.ok(agent.resources?.limits?.memory, 'a memory limit');
  t.equal(agent.securityContext?.privileged, false, 'the agent is not privileged');
  t.same([...(agent.securityContext?.capabilities?.add ?? [])].sort(), ['BPF', 'NET_ADMIN', 'PERFMON', 'SYS_ADMIN', 'SYS_RESOURCE']);
  t.same(agent.env?.find((e) => e.name === 'NODE_NAME')?.valueFrom, { fieldRef: { fieldPath: 'spec.nodeName' } }, 'node name from the downward API');
  const mounts = new Map(agent.volumeMounts?.map((m) => [m.mountPath, m]));
  const volume = (name: string): string | undefined => pod.volumes?.find((v) => v.name === name)?.hostPath?.path;
  t.equal(volume(mounts.get('/sys/fs/bpf')!.name), '/sys/fs/bpf', "bpffs is the host's");
  const init = pod.initContainers?.find((c) => c.name === 'mount-bpf-fs');
  t.match(init?.command?.join(' '), /mount -t bpf bpf \/sys\/fs\/bpf/, 'an init container mounts bpffs when missing');
  t.equal(init?.volumeMounts?.[0]?.mountPropagation, 'Bidirectional', 'so that the host sees the mount');
  t.equal(init?.securityContext?.privileged, true, 'which Kubernetes allows only to a privileged container (docs/deploy.md says so)');
  const cm = find<Obj & { data: Record<string, string> }>(base, 'ConfigMap', 'lbctl-config');
  const config = yaml.load(cm.data['agent.yaml']!) as Record<string, string | number>;
  t.ok(mounts.has(String(config.cgroup)), `the cgroup the ConfigMap names (${config.cgroup}) is mounted`);
  t.equal(volume(mounts.get(String(config.cgroup))!.name), '/sys/fs/cgroup', "from the host's cgroup v2 root");
  t.notOk(mounts.get(String(config.cgroup))!.readOnly, 'writable: the link probe makes and removes a child cgroup there (EROFS otherwise, and the agent refuses to start)');
  t.equal(volume(mounts.get(`${config.procfs}/sys/net`)!.name), '/proc/sys/net', "--procfs reaches the host's /proc/sys/net");
  t.equal(volume(mounts.get('/etc/lbctl')!.name), undefined);
  t.equal(pod.volumes?.find((v) => v.name === mounts.get('/etc/lbctl')!.name)?.configMap?.name, 'lbctl-config');
});

t.test('probes and ports: kube-proxy\'s numbers, the cadence asked for, and paths the agent serves', async (t) => {
  const ports = new Map(agent.ports?.map((p) => [p.name, p.containerPort]));
  t.equal(ports.get('healthz'), 10256, "health on kube-proxy's port");
  t.equal(ports.get('metrics'), 10249, "metrics on kube-proxy's port");
  const cm = find<Obj & { data: Record<string, string> }>(base, 'ConfigMap', 'lbctl-config');
  const config = yaml.load(cm.data['agent.yaml']!) as Record<string, string | number>;
  t.equal(config.healthPort, 10256, 'the ConfigMap serves health where the probes look');
  t.equal(config.metricsPort, 10249);
  t.equal(config.metricsBindAddress, '127.0.0.1', 'metrics on loopback, as kube-proxy');
  t.match(agent.livenessProbe, { httpGet: { path: '/livez', port: 'healthz' }, periodSeconds: 5, failureThreshold: 3 });
  t.match(agent.readinessProbe, { httpGet: { path: '/readyz', port: 'healthz' }, periodSeconds: 1 });
  t.match(agent.startupProbe, { httpGet: { path: '/livez', port: 'healthz' } });
  // A probe that restarts the agent must not read what a restart cannot
  // cure: an API server away, a map too small (/readyz). test/e2e/kubelet-probes.ts
  // runs these very settings against a real agent.
  for (const kind of ['startupProbe', 'livenessProbe'] as const) t.not(agent[kind]?.httpGet.path, '/readyz', `the ${kind} does not read /readyz`);
  const s = agent.startupProbe!;
  t.ok((s.periodSeconds ?? 10) * (s.failureThreshold ?? 3) >= 60, `the startup probe allows ${(s.periodSeconds ?? 10) * (s.failureThreshold ?? 3)} s to load the datapath`);

  // The agent, started with the ConfigMap's own file: the sandbox's flags
  // override where it attaches and listens, as a flag overrides the file.
  const dir = mkdtempSync(path.join(os.tmpdir(), 'lbctl-deploy-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'agent.yaml');
  writeFileSync(file, cm.data['agent.yaml']!);
  const sb = await createSandbox(t, { backends: 1, agent: false });
  await sb.startAgent(['--config', file]);
  const port = sb.agentPort('health');
  const paths = new Set([agent.livenessProbe!, agent.readinessProbe!, agent.startupProbe!].map((p) => p.httpGet.path));
  for (const p of paths) {
    const status = await new Promise<number>((resolve, reject) => {
      http.get({ host: '127.0.0.1', port, path: p }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      }).on('error', reject);
    });
    t.equal(status, 200, `GET ${p}: 200 from the agent once synced`);
  }
  const started = sb.agent!.logs.find((l) => l.msg === 'serving health, metrics and the local API');
  t.ok(started, 'the agent started from the ConfigMap');
});

// ------------------------------------------------ replacing kube-proxy

/**
 * Whether a DaemonSet's pod runs on a node with these labels: its
 * nodeSelector and its required node affinity, as the scheduler reads them
 * (terms ORed, expressions ANDed). Every DaemonSet here tolerates every
 * taint, so taints do not decide.
 */
function runsOn(spec: PodSpec, labels: Record<string, string>): boolean {
  if (!Object.entries(spec.nodeSelector ?? {}).every(([k, v]) => labels[k] === v)) return false;
  const terms = spec.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms;
  if (!terms) return true;
  return terms.some((term) => {
    if (term.matchFields?.length) throw new Error('matchFields is not modelled');
    return (term.matchExpressions ?? []).every(({ key, operator, values = [] }) => {
      const v = labels[key];
      switch (operator) {
        case 'In': return v !== undefined && values.includes(v);
        case 'NotIn': return v === undefined || !values.includes(v);
        case 'Exists': return v !== undefined;
        case 'DoesNotExist': return v === undefined;
        default: throw new Error(`operator ${operator} is not modelled`);
      }
    });
  });
}

/** RFC 7386 JSON merge patch (`kubectl patch --type merge`). */
function mergePatch(target: unknown, patch: unknown): unknown {
  if (patch === null || typeof patch !== 'object' || Array.isArray(patch)) return patch;
  const out: Record<string, unknown> = target !== null && typeof target === 'object' && !Array.isArray(target) ? { ...(target as Record<string, unknown>) } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

/** kube-proxy's DaemonSet as kubeadm installs it (cmd/kubeadm/app/phases/addons/proxy/manifests.go): the parts that decide where it runs. */
const KUBEADM_KUBE_PROXY: { spec: { template: { spec: PodSpec } } } = {
  spec: {
    template: {
      spec: {
        nodeSelector: { 'kubernetes.io/os': 'linux' },
        tolerations: [{ operator: 'Exists' }],
        hostNetwork: true,
        priorityClassName: 'system-node-critical',
        containers: [{ name: 'kube-proxy', image: 'registry.k8s.io/kube-proxy' }],
      },
    },
  },
};

/** The sh and yaml code blocks of a section of docs/deploy.md, in order. */
function docBlocks(heading: string): Array<{ lang: string; text: string }> {
  const doc = readFileSync(path.join(ROOT, 'docs/deploy.md'), 'utf8');
  const at = doc.indexOf(`\n## ${heading}`);
  if (at < 0) throw new Error(`docs/deploy.md has no section "${heading}"`);
  const section = doc.slice(at + 1).split(/\n## /)[0]!;
  // Each block's lines lose the fence's own indentation (a block inside a list item), and no more.
  return [...section.matchAll(/^( *)```(\w+)\n([\s\S]*?)^ *```/gm)].map((m) => ({ lang: m[2]!, text: m[3]!.replace(new RegExp(`^ {0,${m[1]!.length}}`, 'gm'), '') }));
}

t.test('replacing kube-proxy node by node, command by command as docs/deploy.md says: never both on a node, never neither', async (t) => {
  const SECTION = 'Replacing kube-proxy on a running cluster, node by node';
  const lbctlSpec = (k: string): PodSpec => find<DaemonSet>(rendered.get(k)!, 'DaemonSet').spec.template.spec;
  const nodes = new Map<string, Record<string, string>>(['node-a', 'node-b', 'node-c'].map((n) => [n, { 'kubernetes.io/os': 'linux', 'kubernetes.io/hostname': n }]));
  let kubeProxy: PodSpec | undefined = structuredClone(KUBEADM_KUBE_PROXY.spec.template.spec);
  let lbctl: PodSpec | undefined;
  let cleanup: PodSpec | undefined;
  const where = (spec: PodSpec | undefined): string[] => [...nodes].filter(([, labels]) => spec && runsOn(spec, labels)).map(([n]) => n);
  const states: string[] = [];
  let steps = 0;
  let joined = false;
  const check = (after: string): void => {
    steps++;
    const kp = new Set(where(kubeProxy));
    const lb = new Set(where(lbctl));
    const both = [...nodes.keys()].filter((n) => kp.has(n) && lb.has(n));
    const neither = [...nodes.keys()].filter((n) => !kp.has(n) && !lb.has(n) && (lbctl !== undefined || kubeProxy === undefined));
    const cleanedUnderKubeProxy = where(cleanup).filter((n) => kp.has(n));
    if (both.length + neither.length + cleanedUnderKubeProxy.length > 0) {
      t.fail(`after \`${after}\`: ${[both.length ? `both on ${both.join(', ')}` : '', neither.length ? `no proxy on ${neither.join(', ')}` : '', cleanedUnderKubeProxy.length ? `the cleanup under kube-proxy on ${cleanedUnderKubeProxy.join(', ')}` : ''].filter(Boolean).join('; ')}`);
    }
    states.push(`${after.slice(0, 40)}…: kube-proxy [${[...kp].join(' ')}], lbctl [${[...lb].join(' ')}]`);
  };

  const run = (line: string, node: string | undefined): void => {
    const cmd = line.replace(/\s+#.*$/, '').trim();
    let m: RegExpExecArray | null;
    if ((m = /^kubectl label nodes --all ([\w./-]+)=(\S+)$/.exec(cmd))) for (const labels of nodes.values()) labels[m[1]!] = m[2]!;
    else if ((m = /^kubectl label node NODE ([\w./-]+)-$/.exec(cmd))) delete nodes.get(node!)![m[1]!];
    else if ((m = /^kubectl -n kube-system patch ds kube-proxy --type merge -p '(.*)'$/.exec(cmd))) {
      kubeProxy = (mergePatch({ spec: { template: { spec: kubeProxy } } }, JSON.parse(m[1]!)) as typeof KUBEADM_KUBE_PROXY).spec.template.spec;
    } else if (cmd === 'kubectl apply -k deploy/overlays/mycluster') lbctl = lbctlSpec('deploy/overlays/example');
    else if (cmd === 'kubectl -n kube-system delete ds kube-proxy') kubeProxy = undefined;
    else if (cmd === 'kubectl apply -k deploy/kube-proxy-cleanup') cleanup = lbctlSpec('deploy/kube-proxy-cleanup');
    else if (cmd === 'kubectl delete -k deploy/kube-proxy-cleanup') cleanup = undefined;
    else if (/^kubectl -n kube-system (rollout status|exec|delete cm kube-proxy)\b/.test(cmd)) return;
    else return void t.fail(`docs/deploy.md's procedure has a command this test does not model: ${cmd}`);
    check(node ? cmd.replace('NODE', node) : cmd);
  };

  check('(the cluster as it is)');
  const blocks = docBlocks(SECTION).filter((b) => b.lang === 'sh');
  t.ok(blocks.length >= 4, `${blocks.length} command blocks in "${SECTION}"`);
  for (const block of blocks) {
    const lines = block.text.split('\n').filter((l) => l.trim() !== '');
    // The block that names NODE is done node by node.
    const order = block.text.includes('NODE') ? [...nodes.keys()] : [undefined];
    for (const node of order) for (const line of lines) run(line, node);
    if (kubeProxy?.affinity && !joined) {
      // A node joins mid-way, unlabelled: it must get a proxy, one only.
      nodes.set('node-new', { 'kubernetes.io/os': 'linux', 'kubernetes.io/hostname': 'node-new' });
      joined = true;
      check('a new node joins');
    }
  }
  t.comment(states.join('\n'));
  t.ok(steps >= 10, `${steps} states checked: no node had both, none had neither, the cleanup never ran under kube-proxy`);
  t.equal(kubeProxy, undefined, 'kube-proxy is gone at the end');
  t.same(where(lbctl), [...nodes.keys()], 'and lbctl runs on every node, answering load balancers on 10256 (the ConfigMap and the healthz port, above)');
  t.same(where(lbctlSpec('deploy')), [...nodes.keys()], 'the base, unedited, runs on every node of a cluster without the label');

  // A node taken back: lbctl's pins stay, so deploy/uninstall is kept to the labelled nodes by the patch the docs give.
  const uninstallPatch = docBlocks(SECTION).find((b) => b.lang === 'yaml' && b.text.includes('lbctl-uninstall'));
  t.ok(uninstallPatch, 'the docs give the uninstall patch for a node taken back');
  if (!uninstallPatch) return;
  const dir = mkdtempSync(path.join(os.tmpdir(), 'lbctl-uninstall-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  // An overlay as a user writes one: deploy/uninstall as its base, and the patch.
  writeFileSync(path.join(dir, 'kustomization.yaml'), `resources:\n  - ${path.relative(dir, path.join(ROOT, 'deploy/uninstall'))}\n${uninstallPatch.text}`);
  const text = execFileSync(kubectl, ['kustomize', dir], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  const uninstall = find<DaemonSet>(parseAllDocuments(text).map((d) => d.toJS() as Obj), 'DaemonSet', 'lbctl-uninstall').spec.template.spec;
  const back = { 'kubernetes.io/os': 'linux', 'lbctl.io/kube-proxy': 'true' };
  t.ok(runsOn(uninstall, back) && !runsOn(uninstall, { 'kubernetes.io/os': 'linux' }), 'which removes the datapath only from nodes labelled for kube-proxy');
  t.ok(runsOn(KUBEADM_KUBE_PROXY.spec.template.spec, back) && !runsOn(lbctlSpec('deploy'), back), 'and the evaluator tells the two apart (a labelled node: kube-proxy, not lbctl)');
});
