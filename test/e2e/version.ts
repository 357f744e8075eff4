// `lbctl version` against a running agent in a sandbox: both sides run on
// the Node.js of scripts/node.env (bin/lbctl picks it, whatever node PATH
// has), name the commit baked into the bundle, and give each BPF object's
// build id (the SHA-256 of the file). The agent's side is what it read at
// its start: an agent started on another object keeps naming that object's
// bytes after the file changes, and its rows are marked as differing from
// the client's. With the agent gone, the command still answers (exit 0) and
// says why there is no agent column.
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import t from 'tap';
import type { VersionReport } from '../../src/cli/commands/version.js';
import { CLI_TIMEOUT_MS, createSandbox, LBCTL, ROOT, run } from '../helpers/sandbox.js';

const sha256 = (file: string): string => createHash('sha256').update(readFileSync(file)).digest('hex');
const NODE_VERSION = /^LBCTL_NODE_VERSION=(.*)$/m.exec(readFileSync(path.join(ROOT, 'scripts/node.env'), 'utf8'))![1]!;
const PACKAGE_VERSION = (JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
const OUT = path.join(ROOT, 'bpf/.output');

async function version(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return run(LBCTL, ['version', ...args], CLI_TIMEOUT_MS);
}

t.test('client and agent side by side: the same build, on Node.js ' + NODE_VERSION, async (t) => {
  const sb = await createSandbox(t, { backends: 0 });
  const json = await version(['-o', 'json', '--api-socket', sb.apiSocket]);
  t.equal(json.code, 0, `exits 0${json.code === 0 ? '' : `: ${json.stderr}`}`);
  t.equal(json.stderr, '', 'nothing on stderr');
  const r = JSON.parse(json.stdout) as VersionReport;
  t.notOk(r.agentError, 'the agent answered');
  const agent = r.agent!;
  for (const [side, v] of [['client', r.client], ['agent', agent]] as const) {
    t.equal(v.node, `v${NODE_VERSION}`, `${side}: runs on scripts/node.env's Node.js`);
    t.equal(v.lbctl, PACKAGE_VERSION, `${side}: lbctl ${PACKAGE_VERSION}`);
    t.match(v.v8, /^\d+\.\d+\.\d+/, `${side}: V8 ${v.v8}`);
    t.match(v.libbpf, /^\d+\.\d+$/, `${side}: libbpf ${v.libbpf}`);
    t.equal(v.kernel, os.release(), `${side}: kernel ${v.kernel}`);
    t.match(v.commit, /^[0-9a-f]{40}(-dirty)?$/, `${side}: the commit make baked into the bundle (${v.commit})`);
  }
  t.equal(agent.commit, r.client.commit, 'the same bundle: the same commit');
  // A commit of this repository (where git can read it: the guests see the host's .git too).
  const sha = r.client.commit.slice(0, 40);
  const git = spawnSync('git', ['-C', ROOT, 'cat-file', '-e', `${sha}^{commit}`]);
  if (git.error) t.comment(`git not run (${git.error.message}): the commit is not looked up`);
  else t.equal(git.status, 0, `${sha} is a commit of this repository`);
  t.same(
    r.client.objects.map((o) => [o.name, o.sha256]),
    ['sock.bpf.o', 'sock_compat.bpf.o', 'nodeport.bpf.o', 'nodeport_l3.bpf.o', 'sock_destroy.bpf.o', 'probe.bpf.o'].map((n) => [n, sha256(path.join(OUT, n))]),
    "the client's build ids: the SHA-256 of each object beside it",
  );
  t.same(
    agent.objects.map((o) => [o.name, o.sha256]),
    ['sock.bpf.o', 'sock_compat.bpf.o', 'sock_destroy.bpf.o', 'probe.bpf.o'].map((n) => [n, sha256(path.join(OUT, n))]),
    "the agent's: the same files (the sandbox's agent has --no-nodeport: no tc object)",
  );

  const text = await version(['--api-socket', sb.apiSocket]);
  t.equal(text.code, 0);
  const lines = text.stdout.split('\n');
  t.equal(lines[0], `lbctl ${PACKAGE_VERSION} (libbpf ${r.client.libbpf}, node v${NODE_VERSION})`, 'the first line as lbctl always printed it');
  t.match(lines[2], /^ +CLIENT +AGENT$/, 'a CLIENT and an AGENT column');
  t.match(text.stdout, new RegExp(`^node +v${NODE_VERSION.replace(/\./g, '\\.')} +v${NODE_VERSION.replace(/\./g, '\\.')}$`, 'm'));
  t.match(text.stdout, new RegExp(`^sock\\.bpf\\.o +${sha256(path.join(OUT, 'sock.bpf.o')).slice(0, 12)} +${sha256(path.join(OUT, 'sock.bpf.o')).slice(0, 12)}$`, 'm'), 'build ids, 12 hex digits');
  t.match(text.stdout, /^nodeport\.bpf\.o +[0-9a-f]{12} +-$/m, 'an object the agent does not load: -');
  t.notMatch(text.stdout, /\*/, 'nothing differs');

  // bin/lbctl takes the prefix's node even when PATH finds the machine's first.
  const bare = await run('env', ['PATH=/usr/sbin:/usr/bin:/sbin:/bin', LBCTL, 'version', '--client', '-o', 'json'], CLI_TIMEOUT_MS);
  t.equal(bare.code, 0, `without the prefix on PATH${bare.code === 0 ? '' : `: ${bare.stderr}`}`);
  t.equal((JSON.parse(bare.stdout) as VersionReport).client.node, `v${NODE_VERSION}`, 'bin/lbctl still runs the Node.js of scripts/node.env');

  // LBCTL_NODE runs another node (make bench's other runtime): the machine's, when it has another.
  const other = existsSync('/usr/bin/node') ? execFileSync('/usr/bin/node', ['--version'], { encoding: 'utf8' }).trim() : undefined;
  if (other === undefined || other === `v${NODE_VERSION}`) {
    t.comment(`LBCTL_NODE not tried: ${other === undefined ? 'no /usr/bin/node' : `/usr/bin/node is ${other} too`}`);
  } else {
    const alt = await run('env', ['LBCTL_NODE=/usr/bin/node', LBCTL, 'version', '--client', '-o', 'json'], CLI_TIMEOUT_MS);
    t.equal(alt.code, 0, `LBCTL_NODE=/usr/bin/node${alt.code === 0 ? '' : `: ${alt.stderr}`}`);
    t.equal((JSON.parse(alt.stdout) as VersionReport).client.node, other, `runs /usr/bin/node (${other}), and the addon loads there too`);
  }
});

t.test("an agent on another object names the bytes it loaded, marked; gone, it is said so", async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  // The compat build under the name sock.bpf.o: the same programs, other bytes.
  const custom = path.join(sb.runDir, 'sock.bpf.o');
  copyFileSync(path.join(OUT, 'sock_compat.bpf.o'), custom);
  const loaded = sha256(custom);
  await sb.startAgent(['--bpf-object', custom]);
  // A newer build replaces the file: the agent still runs what it loaded.
  writeFileSync(custom, Buffer.concat([readFileSync(custom), Buffer.from('newer')]));
  t.not(sha256(custom), loaded);

  const json = await version(['-o', 'json', '--api-socket', sb.apiSocket]);
  t.equal(json.code, 0);
  const r = JSON.parse(json.stdout) as VersionReport;
  t.same(r.agent!.objects.filter((o) => o.name === 'sock.bpf.o'), [{ name: 'sock.bpf.o', path: custom, sha256: loaded }], 'the agent names --bpf-object, and the bytes it read at its start');
  t.notOk(r.agent!.objects.some((o) => o.name === 'sock_compat.bpf.o'), 'and no compat object: a custom object has none');

  const text = await version(['--api-socket', sb.apiSocket]);
  t.match(text.stdout, new RegExp(`^sock\\.bpf\\.o +${sha256(path.join(OUT, 'sock.bpf.o')).slice(0, 12)} +${loaded.slice(0, 12)} \\*$`, 'm'), 'its row is marked');
  t.match(text.stdout, /^\* the agent's differs from this lbctl's$/m);

  await sb.stopAgent();
  const away = await version(['--api-socket', sb.apiSocket]);
  t.equal(away.code, 0, 'with the agent gone, still exit 0');
  t.match(away.stdout, /^ +CLIENT$/m, 'a CLIENT column only');
  t.match(away.stdout, /^agent: not reachable: /m, `and why: ${away.stdout.split('\n').find((l) => l.startsWith('agent:'))}`);
  const awayJson = JSON.parse((await version(['-o', 'json', '--api-socket', sb.apiSocket])).stdout) as VersionReport;
  t.equal(awayJson.agent, null);
  t.match(awayJson.agentError, /^cannot reach the agent: /);
  const client = await version(['--client', '--api-socket', sb.apiSocket]);
  t.notMatch(client.stdout, /agent/i, '--client does not ask');
});
