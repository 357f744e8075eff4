// Kubernetes' own Services conformance tests against the real cluster
// (docs/conformance.md): the 18 '[sig-network] Services ... [Conformance]'
// specs of e2e.test (CLUSTER_K8S_DIR), run by scripts/cluster/conformance.sh
// with lbctl deployed from deploy/ and no kube-proxy (scripts/cluster/lbctl.sh).
// Each spec is one assertion, from e2e.test's JUnit report; the file fails if
// any spec fails, is skipped, or is missing.
//
// LBCTL_CONFORMANCE_PROXY=kube-proxy runs the same specs with kube-proxy in
// its place (the baseline of docs/conformance.md); LBCTL_CONFORMANCE_FOCUS
// and LBCTL_CONFORMANCE_SKIP replace the focus (then any number of specs may
// run, each passed or skipped by the framework) and add a skip;
// LBCTL_CONFORMANCE_REPORT keeps the report (JUnit and e2e.test's log) in
// that directory.
import t from 'tap';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { clusterScript, clusterUp, clusterSettings, SCRIPTS } from '../helpers/cluster.js';

const IS_ROOT = process.getuid?.() === 0;
const SERVICES_CONFORMANCE = 18;
if (!IS_ROOT) {
  t.bailout('test/cluster/conformance.ts needs root (namespaces, cgroups, mounts): run it as root');
} else {
  t.setTimeout(3_600_000);
  const s = clusterSettings();
  if (existsSync(s.state)) throw new Error(`a cluster is up (${s.state}): make cluster-down first`);
  const proxy = process.env.LBCTL_CONFORMANCE_PROXY ?? 'lbctl';
  if (proxy !== 'lbctl' && proxy !== 'kube-proxy') throw new Error(`LBCTL_CONFORMANCE_PROXY=${proxy}: lbctl or kube-proxy`);
  const focus = process.env.LBCTL_CONFORMANCE_FOCUS;
  const skip = process.env.LBCTL_CONFORMANCE_SKIP;
  const keep = process.env.LBCTL_CONFORMANCE_REPORT;
  const report = keep ? path.resolve(keep) : mkdtempSync(path.join(os.tmpdir(), 'lbctl-conformance-'));
  t.teardown(() => {
    clusterScript('down.sh');
    if (!keep) rmSync(report, { recursive: true, force: true });
  });
  clusterUp();
  clusterScript(proxy === 'lbctl' ? 'lbctl.sh' : 'kube-proxy.sh');

  t.test(`e2e.test against the cluster with ${proxy}`, async (t) => {
    const t0 = performance.now();
    const r = spawnSync('bash', [path.join(SCRIPTS, 'conformance.sh'), '--report', report, ...(focus ? ['--focus', focus] : []), ...(skip ? ['--skip', skip] : [])],
      { encoding: 'utf8', stdio: ['ignore', 'inherit', 'inherit'], timeout: 3_300_000 });
    t.comment(`e2e.test: ${((performance.now() - t0) / 1000).toFixed(0)} s, exit ${r.status ?? r.signal}`);
    const junit = path.join(report, 'junit_01.xml');
    t.ok(existsSync(junit), 'e2e.test wrote its JUnit report');
    if (!existsSync(junit)) return;
    const ran = [...readFileSync(junit, 'utf8').matchAll(/<testcase name="([^"]*)"[^>]*time="([^"]*)">([\s\S]*?)<\/testcase>/g)]
      .map(([, name, time, body]) => ({ name: unescape(name!), secs: Number(time), skipped: /<skipped/.test(body!), failure: /<failure[^>]*message="([^"]*)"/.exec(body!)?.[1] }))
      .filter((c) => !(c.skipped && c.secs === 0)); // the specs left out by the focus
    if (!focus) t.equal(ran.length, SERVICES_CONFORMANCE, `the ${SERVICES_CONFORMANCE} Services conformance specs ran`);
    for (const c of ran) {
      if (c.skipped && focus) t.pass(`${c.name}: skipped by the framework`);
      else t.ok(!c.failure && !c.skipped, `${c.name} (${c.secs.toFixed(0)} s)`, c.failure ? { failure: unescape(c.failure).slice(0, 2000), log: path.join(report, 'e2e.log') } : {});
    }
    t.equal(r.status, 0, 'e2e.test exits 0');
  });
}

function unescape(x: string): string {
  return x.replace(/&#xA;/g, '\n').replace(/&#34;/g, '"').replace(/&#39;/g, "'").replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&');
}
