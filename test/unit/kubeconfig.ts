// Where the Kubernetes source connects: a kubeconfig, the in-cluster config,
// and --master replacing the server's URL in either (kube-proxy's --master).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import { loadKubeConfig } from '../../src/sources/kubernetes.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'lbctl-kubeconfig-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const kubeconfig = path.join(dir, 'kubeconfig');
writeFileSync(kubeconfig, `apiVersion: v1
kind: Config
clusters: [{ name: c, cluster: { server: "https://10.96.0.1:443", insecure-skip-tls-verify: true } }]
users: [{ name: u, user: { token: secret } }]
contexts: [{ name: x, context: { cluster: c, user: u } }]
current-context: x
`);
const env = { host: process.env.KUBERNETES_SERVICE_HOST, port: process.env.KUBERNETES_SERVICE_PORT };
t.afterEach(() => {
  for (const [k, v] of [['KUBERNETES_SERVICE_HOST', env.host], ['KUBERNETES_SERVICE_PORT', env.port]] as const) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
});

t.test('a kubeconfig, with and without --master', async (t) => {
  t.equal(loadKubeConfig({ kubeconfig }).getCurrentCluster()?.server, 'https://10.96.0.1:443');
  const kc = loadKubeConfig({ kubeconfig, master: 'https://192.0.2.10:6443/' });
  t.equal(kc.getCurrentCluster()?.server, 'https://192.0.2.10:6443', '--master replaces the URL');
  t.equal(kc.getCurrentUser()?.token, 'secret', 'and keeps the credentials');
  t.equal(kc.getCurrentCluster()?.skipTLSVerify, true, 'and the TLS settings');
});

t.test('in a pod: the in-cluster config, and --master replacing its URL', async (t) => {
  process.env.KUBERNETES_SERVICE_HOST = 'fd00::1';
  process.env.KUBERNETES_SERVICE_PORT = '443';
  const kc = loadKubeConfig({});
  t.equal(kc.getCurrentCluster()?.server, 'https://[fd00::1]:443', 'the kubernetes Service');
  t.equal(kc.getCurrentCluster()?.caFile, '/var/run/secrets/kubernetes.io/serviceaccount/ca.crt', "the service account's CA");
  t.equal(kc.getCurrentUser()?.authProvider?.config?.tokenFile, '/var/run/secrets/kubernetes.io/serviceaccount/token', 'and token, re-read as it rotates');
  const m = loadKubeConfig({ master: 'https://10.0.0.10:6443' });
  t.equal(m.getCurrentCluster()?.server, 'https://10.0.0.10:6443', 'bootstrapping: the API server directly');
  t.equal(m.getCurrentUser()?.authProvider?.config?.tokenFile, '/var/run/secrets/kubernetes.io/serviceaccount/token', "with the pod's token still");
});

t.test('outside a pod: --master alone, or a clear error', async (t) => {
  delete process.env.KUBERNETES_SERVICE_HOST;
  delete process.env.KUBERNETES_SERVICE_PORT;
  t.equal(loadKubeConfig({ master: 'http://127.0.0.1:8080' }).getCurrentCluster()?.server, 'http://127.0.0.1:8080');
  t.throws(() => loadKubeConfig({}), /cannot load the in-cluster config: no kubeconfig, no --master, and not in a pod/);
  t.throws(() => loadKubeConfig({ master: 'not a url' }), /--master "not a url": not a URL/);
  t.throws(() => loadKubeConfig({ master: 'ftp://x' }), /expected an http or https URL/);
  t.throws(() => loadKubeConfig({ kubeconfig: path.join(dir, 'missing') }), /cannot load kubeconfig .*missing/);
});
