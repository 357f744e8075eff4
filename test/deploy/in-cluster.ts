// The agent as its DaemonSet runs it: in a pod's environment
// (KUBERNETES_SERVICE_HOST/PORT, NODE_NAME, no kubeconfig), with the
// service account's token and CA at /var/run/secrets/kubernetes.io/
// serviceaccount, against an API server that serves HTTPS, authenticates the
// token as system:serviceaccount:kube-system:lbctl and enforces the RBAC of
// deploy/ as rendered (`kubectl kustomize deploy`).
//
// The pod's files live in a private mount namespace of the agent's own: a
// tmpfs over /run (/var/run links to it) holds only the service account's
// directory, so nothing is written to the host's /run, and nothing else the
// agent needs may live there (its API socket is the run directory's). The
// namespace, and the tmpfs, go with the agent's process.
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import { get as httpsGet } from 'node:https';
import { createServer, type AddressInfo } from 'node:net';
import path from 'node:path';
import t, { type Test } from 'tap';
import { parseAllDocuments, stringify } from 'yaml';
import { FakeApiServer, LBCTL_SERVICE_ACCOUNT, serviceAccountUser } from '../helpers/fake-apiserver.js';
import { CLI_TIMEOUT_MS, createSandbox, HTTP_PORT, LBCTL, ROOT, run, SLOW, type ExecResult, type Sandbox } from '../helpers/sandbox.js';

t.setTimeout(240_000 * SLOW);

const NODE = 'node-a';
const WEB = '10.96.0.10';
const SA = LBCTL_SERVICE_ACCOUNT.name;
const SA_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/** deploy/ as `kubectl apply -k deploy` would send it. */
const DEPLOY = execFileSync('kubectl', ['kustomize', path.join(ROOT, 'deploy')], { encoding: 'utf8' });

/** deploy/'s manifests with `edit` applied to its ClusterRole lbctl. */
function withClusterRole(edit: (rules: Array<{ apiGroups: string[]; resources: string[]; verbs: string[] }>) => typeof rules): string {
  let found = false;
  const docs = parseAllDocuments(DEPLOY).map((d) => {
    const o = d.toJS() as { kind: string; metadata: { name: string }; rules?: Array<{ apiGroups: string[]; resources: string[]; verbs: string[] }> };
    if (o.kind === 'ClusterRole' && o.metadata.name === 'lbctl') {
      found = true;
      o.rules = edit(o.rules ?? []);
    }
    return stringify(o);
  });
  if (!found) throw new Error('deploy/ renders no ClusterRole lbctl');
  return docs.join('---\n');
}

const cluster = `apiVersion: v1
kind: Node
metadata: {name: ${NODE}, labels: {topology.kubernetes.io/zone: zone-a}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: ClusterIP
  clusterIP: ${WEB}
  clusterIPs: [${WEB}]
  ports: [{name: http, port: 80, protocol: TCP, targetPort: http}]
`;

const slice = (ip: string): string => `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abcde, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: ${HTTP_PORT}, protocol: TCP}]
endpoints:
- addresses: [${ip}]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: ${NODE}
`;

/**
 * The agent's command runs in a mount namespace of its own whose /run is a
 * fresh tmpfs holding the service account's files, with a pod's
 * environment; the shell execs the agent, so its pid is the agent's.
 */
const POD = `set -e
sa=$1 port=$2 node=$3
shift 3
mount -t tmpfs -o mode=0755,size=1m lbctl-test-pod-run /run
mkdir -p ${SA_DIR}
cp "$sa/token" "$sa/ca.crt" "$sa/namespace" ${SA_DIR}/
exec env KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT="$port" NODE_NAME="$node" "$@"
`;

interface Pod {
  readonly sb: Sandbox;
  readonly api: FakeApiServer;
}

/**
 * A TLS API server with deploy/'s RBAC (or `rbac`) and a service-account
 * token, the cluster's objects, and a sandbox whose agent runs as in a pod
 * (not started). `servicePort` is the pod's KUBERNETES_SERVICE_PORT
 * (default: the API server's); `token` what the token file holds.
 */
async function setup(t: Test, opts: { rbac?: string; servicePort?: number; token?: string } = {}): Promise<Pod> {
  if (lstatSync('/var/run').isSymbolicLink() === false || readlinkSync('/var/run').replace(/^\//, '') !== 'run') {
    throw new Error('this test mounts its tmpfs on /run and expects /var/run to link there, as on Debian');
  }
  const api = new FakeApiServer({ tls: true });
  await api.start();
  t.teardown(() => api.stop());
  const token = `lbctl-sa-token-${Math.random().toString(16).slice(2)}`;
  api.tokens.clear();
  api.tokens.set(token, LBCTL_SERVICE_ACCOUNT);
  api.setRbac(opts.rbac ?? DEPLOY);
  api.apply(cluster);

  const sb = await createSandbox(t, { backends: 1, agent: false });
  api.apply(slice(sb.backends[0]!.v4));
  const sa = path.join(sb.runDir, 'serviceaccount');
  mkdirSync(sa);
  writeFileSync(path.join(sa, 'token'), opts.token ?? token);
  copyFileSync(api.caFile, path.join(sa, 'ca.crt'));
  writeFileSync(path.join(sa, 'namespace'), 'kube-system');
  sb.node.place.wrap = ['unshare', '--mount', '--propagation', 'private', 'sh', '-c', POD, 'pod', sa, String(opts.servicePort ?? api.port), NODE];
  // No source flags: the in-cluster config, as in the DaemonSet.
  sb.sourceArgs = ['--sync-period', '600000'];
  return { sb, api };
}

/** `lbctl status` against the agent's API socket. */
const status = (sb: Sandbox): Promise<ExecResult> => run(LBCTL, ['status', '--api-socket', sb.apiSocket], CLI_TIMEOUT_MS);

async function readyz(sb: Sandbox): Promise<{ status: number; body: string }> {
  const r = await fetch(`http://127.0.0.1:${sb.agentPort('health')}/readyz`);
  return { status: r.status, body: await r.text() };
}

const frontends = async (sb: Sandbox): Promise<string[]> => (await sb.lbList()).map((e) => `${e.frontend} -> ${e.backends.map((b) => b.address).join(',')}`);

/** The agent's warnings that a list or watch failed, for one kind, from log line `from` on. */
const failures = (sb: Sandbox, kind: string, from = 0): string[] =>
  sb.agent!.logs.slice(from).filter((l) => l.msg === 'list or watch failed; retrying after backoff' && l.kind === kind).map((l) => String(l.err));

/** Waits for the agent's health port to be logged (it serves before the first sync). */
const serving = (sb: Sandbox): Promise<unknown> => sb.agent!.waitForLog((l) => l.msg === 'serving health, metrics and the local API');

t.test("in a pod with deploy/'s RBAC: the agent lists and watches Services, EndpointSlices and Nodes, asks nothing else, and serves the Service", async (t) => {
  const { sb, api } = await setup(t);
  const backend = sb.backends[0]!.v4;
  t.notOk(existsSync('/run/secrets/kubernetes.io'), "the host's /run has no service account (before)");
  const first = await sb.startAgent();
  t.ok(first.planned > 0, 'the first sync programs what the lists returned');
  t.same(await frontends(sb), [`${WEB}:80/TCP -> ${backend}:${HTTP_PORT}`]);
  const res = (await sb.client<{ results: Array<{ error?: string; peer?: string }> }>(['tcp', WEB, '80', '--count', '3'])).results;
  t.same(res.filter((r) => r.error), [], 'a client connects through the Service');

  const st = await status(sb);
  t.equal(st.code, 0, `lbctl status: ok\n${st.stdout}${st.stderr}`);
  t.match(st.stdout, `Source:      kubernetes:https://127.0.0.1:${api.port}\n`, 'the source is the in-cluster config: KUBERNETES_SERVICE_HOST:PORT over HTTPS');
  t.notMatch(st.stdout, /note:/, 'nothing failing');

  await sb.waitUntil(() => api.openWatches >= 3, 'three watches open');
  t.same(
    Object.keys(api.requestCounts()).sort(),
    [`${SA} list endpointslices.discovery.k8s.io`, `${SA} list nodes`, `${SA} list services`, `${SA} watch endpointslices.discovery.k8s.io`, `${SA} watch nodes`, `${SA} watch services`],
    'as its service account: list and watch of services, endpointslices and nodes, nothing else',
  );
  t.same(api.requestCounts({ refused: true }), {}, 'nothing refused');
  t.ok(api.requests.every((r) => r.user === SA), 'every request carried the token');
  // The agent's view of the file system, through its /proc root: its own /run, holding the service account alone.
  const root = `/proc/${sb.agent!.pid}/root`;
  t.same(readdirSync(`${root}/run`), ['secrets'], "the agent's /run holds the service account and nothing else");
  // (/var/run is a link to /run, which would resolve in this process's root: read through /run.)
  t.equal(readFileSync(`${root}${SA_DIR.replace(/^\/var\/run\//, '/run/')}/namespace`, 'utf8'), 'kube-system', `the service account at ${SA_DIR}`);
  t.notOk(existsSync('/run/secrets/kubernetes.io'), "the host's /run has no service account (while the agent runs)");
});

t.test('a rule missing from the ClusterRole: not ready, and the log, lbctl status and /readyz name it; restored, the agent syncs without a restart', async (t) => {
  const noSlices = withClusterRole((rules) => rules.filter((r) => !r.resources.includes('endpointslices')));
  const { sb, api } = await setup(t, { rbac: noSlices });
  const backend = sb.backends[0]!.v4;
  const denied = `endpointslices.discovery.k8s.io is forbidden: User "${SA}" cannot list resource "endpointslices" in API group "discovery.k8s.io" at the cluster scope`;
  const firstSync = sb.startAgent().catch((e: unknown) => e); // no sync until the rule is back
  await serving(sb);
  await sb.waitUntil(() => failures(sb, 'EndpointSlice').length >= 2, 'the EndpointSlice list refused twice');
  t.equal(failures(sb, 'EndpointSlice')[0], `list /apis/discovery.k8s.io/v1/endpointslices: HTTP 403: ${denied}`, "the log names the missing permission: the API server's own words");

  const ready = await readyz(sb);
  t.equal(ready.status, 500, '/readyz fails');
  t.match(ready.body, `[-]source-synced failed: the source has not delivered its initial state yet: EndpointSlice list or watch failing, retrying: list /apis/discovery.k8s.io/v1/endpointslices: HTTP 403: ${denied}\n`, 'and its failing check says why');
  const st = await status(sb);
  t.equal(st.code, 1, 'lbctl status fails');
  t.match(st.stdout, `  note: EndpointSlice list or watch failing, retrying: list /apis/discovery.k8s.io/v1/endpointslices: HTTP 403: ${denied}\n`, 'lbctl status notes it');
  t.same(sb.agent!.syncs(), [], 'no sync');
  t.same(await sb.lbList(), [], 'nothing programmed from half the state');
  t.same(Object.keys(api.requestCounts({ refused: true })), [`${SA} list endpointslices.discovery.k8s.io`], 'only the EndpointSlice list was refused');

  // The ClusterRole is fixed (kubectl apply -k deploy): the agent's next retry lists.
  api.setRbac(DEPLOY);
  const agent = sb.agent!;
  const sync = await agent.waitForLog((l) => l.msg === 'sync done', 0, 60_000);
  t.ok(Number(sync.planned) > 0, 'synced once the rule is back');
  t.equal(sb.agent, agent, 'the same agent process: no restart');
  t.ok(agent.running, 'still running');
  t.same(await frontends(sb), [`${WEB}:80/TCP -> ${backend}:${HTTP_PORT}`]);
  await sb.waitUntil(async () => (await readyz(sb)).status === 200, '/readyz passes');
  t.notMatch((await status(sb)).stdout, /note:/, 'the note is gone');
  await firstSync;

  // Watch taken away from services: the watch is refused (the list it
  // resumes from succeeded), the log and lbctl status say so, and the agent
  // stays ready: its maps hold the last state it had, as kube-proxy's do.
  const mark = agent.logs.length;
  api.setRbac(withClusterRole((rules) => rules.map((r) => (r.resources.includes('services') ? { ...r, resources: r.resources.filter((x) => x !== 'services') } : r)).concat({ apiGroups: [''], resources: ['services'], verbs: ['list'] })));
  api.dropWatches();
  await sb.waitUntil(() => failures(sb, 'Service', mark).some((e) => e.includes('HTTP 403')), 'the Service watch refused');
  const watchDenied = `services is forbidden: User "${SA}" cannot watch resource "services" in API group "" at the cluster scope`;
  t.equal(failures(sb, 'Service', mark).find((e) => e.includes('HTTP 403')), `watch /api/v1/services: HTTP 403: ${watchDenied}`, 'the log names the verb refused');
  t.match((await status(sb)).stdout, `  note: Service list or watch failing, retrying: watch /api/v1/services: HTTP 403: ${watchDenied}\n`, 'lbctl status notes it');
  t.equal((await readyz(sb)).status, 200, 'still ready');
  const restored = api.requests.length;
  api.setRbac(DEPLOY);
  await sb.waitUntil(() => api.requests.slice(restored).some((r) => r.verb === 'watch' && r.resource === 'services' && !r.refused) && api.openWatches >= 3, 'the Service watch resumes');
  await sb.waitUntil(async () => !/note:/.test((await status(sb)).stdout), 'the note goes');
});

t.test("a token the API server does not know: 401, and the agent says so", async (t) => {
  const { sb, api } = await setup(t, { token: 'not-a-token-the-server-issued' });
  const firstSync = sb.startAgent().catch((e: unknown) => e);
  await serving(sb);
  await sb.waitUntil(() => failures(sb, 'Service').length >= 1, 'the Service list refused');
  t.equal(failures(sb, 'Service')[0], 'list /api/v1/services: HTTP 401: Unauthorized', 'the log says the API server refused the credentials');
  t.match((await readyz(sb)).body, '[-]source-synced failed: the source has not delivered its initial state yet: Service list or watch failing, retrying: list /api/v1/services: HTTP 401: Unauthorized', '/readyz says why');
  t.ok(api.requests.length > 0 && api.requests.every((r) => r.refused === 401), 'every request was refused as unauthenticated');
  t.same(sb.agent!.syncs(), [], 'no sync');
  await sb.stopAgent();
  await firstSync;
});

t.test('--master: the in-cluster address is dead, the API server is named directly; the pod’s token and CA still authenticate', async (t) => {
  const dead = await new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as AddressInfo;
      s.close(() => resolve(port));
    });
  });
  const { sb, api } = await setup(t, { servicePort: dead });
  sb.sourceArgs = [...sb.sourceArgs, '--master', api.url];
  const first = await sb.startAgent();
  t.ok(first.planned > 0, 'synced');
  t.same(await frontends(sb), [`${WEB}:80/TCP -> ${sb.backends[0]!.v4}:${HTTP_PORT}`]);
  t.match((await status(sb)).stdout, `Source:      kubernetes:${api.url}\n`);
  t.ok(api.requests.length > 0 && api.requests.every((r) => r.user === SA && !r.refused), 'as the service account, over the pod’s CA');
});

// The authorizer above is the test API server's; these are the RBAC rules it
// follows beyond deploy/'s (kube-apiserver's: plugin/pkg/auth/authorizer/rbac).
t.test("the test API server's RBAC: namespaced Roles, groups, wildcards, resourceNames, a missing role", async (t) => {
  const api = new FakeApiServer({ tls: true });
  await api.start();
  t.teardown(() => api.stop());
  const ca = readFileSync(api.caFile);
  api.tokens.set('bob', { name: 'bob', groups: ['team', 'system:authenticated'] });
  api.tokens.set('carol', { name: 'carol', groups: ['system:authenticated'] });
  api.tokens.set('dave', serviceAccountUser('kube-system', 'dave'));
  api.setRbac(`apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader, namespace: default}
rules: [{apiGroups: [""], resources: [services], verbs: [list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: team-reads, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}
subjects: [{kind: Group, name: team}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: watch-all}
rules: [{apiGroups: ["*"], resources: ["*"], verbs: [watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: carol-watches, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: watch-all}
subjects: [{kind: User, name: carol}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: own-node}
rules: [{apiGroups: [""], resources: [nodes], resourceNames: [${NODE}], verbs: [list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: own-node}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: own-node}
subjects: [{kind: Group, name: team}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: dave}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: missing}
subjects: [{kind: ServiceAccount, name: dave, namespace: kube-system}]
`);
  const ask = (token: string, p: string): Promise<{ code: number; message?: string }> =>
    new Promise((resolve, reject) => {
      httpsGet(`${api.url}${p}`, { ca, headers: { authorization: `Bearer ${token}` } }, (res) => {
        // A watch streams until its timeoutSeconds: its status is the answer.
        if (res.statusCode === 200) {
          res.destroy();
          return resolve({ code: 200 });
        }
        let body = '';
        res.on('data', (d: Buffer) => (body += d.toString()));
        res.on('end', () => resolve({ code: res.statusCode!, message: (JSON.parse(body) as { message: string }).message }));
      }).on('error', reject);
    });
  t.same(await ask('bob', '/api/v1/namespaces/default/services'), { code: 200 }, 'a Role binds a group in its namespace');
  t.same(await ask('bob', '/api/v1/namespaces/other/services'), { code: 403, message: 'services is forbidden: User "bob" cannot list resource "services" in API group "" in the namespace "other"' }, 'and nowhere else');
  t.same(await ask('bob', '/api/v1/services'), { code: 403, message: 'services is forbidden: User "bob" cannot list resource "services" in API group "" at the cluster scope' }, 'not cluster-wide');
  t.same(await ask('carol', '/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices?watch=true&timeoutSeconds=1'), { code: 200 }, "a RoleBinding to a ClusterRole of wildcards: watch anything in the binding's namespace");
  t.same(await ask('carol', '/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices'), { code: 403, message: 'endpointslices.discovery.k8s.io is forbidden: User "carol" cannot list resource "endpointslices" in API group "discovery.k8s.io" in the namespace "kube-system"' }, 'only the verb granted');
  t.same(await ask('bob', `/api/v1/nodes?fieldSelector=metadata.name%3D${NODE}`), { code: 200 }, 'resourceNames: a list pinned to the name by its field selector');
  t.same(await ask('bob', '/api/v1/nodes'), { code: 403, message: 'nodes is forbidden: User "bob" cannot list resource "nodes" in API group "" at the cluster scope' }, 'but not every node');
  t.same(await ask('dave', '/api/v1/services'), { code: 403, message: 'services is forbidden: User "system:serviceaccount:kube-system:dave" cannot list resource "services" in API group "" at the cluster scope: RBAC: clusterrole.rbac.authorization.k8s.io "missing" not found' }, 'a binding to a missing role: the reason says so');
  t.same(await ask('eve', '/api/v1/services'), { code: 401, message: 'Unauthorized' }, 'an unknown token');
  t.same(api.requestCounts({ refused: true }), {
    'bob list services': 2,
    'carol list endpointslices.discovery.k8s.io': 1,
    'bob list nodes': 1,
    'system:serviceaccount:kube-system:dave list services': 1,
  }, 'refusals counted by user, verb and resource');
});
