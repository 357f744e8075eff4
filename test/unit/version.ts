// `lbctl version`: the build ids, the table of client and agent versions,
// GET /v1/version, and what the client says of an agent that is away or
// predates that endpoint. test/e2e/version.ts runs it against a real agent.
import t from 'tap';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os, { tmpdir } from 'node:os';
import path from 'node:path';
import { apiGet, startApiServer } from '../../src/http/api.js';
import { agentVersions, formatVersion, runtimeObjects, versionCommand, versionLine, type VersionReport } from '../../src/cli/commands/version.js';
import { COMPAT_OBJECT, DEFAULT_OBJECT } from '../../src/datapath/loader.js';
import { BUILD_COMMIT, collectVersions, objectBuildId, type Versions } from '../../src/base/version.js';
import { FakeView } from '../fakes/fake-view.js';

type T = { teardown(fn: () => unknown): void };

function tempDir(t: T): string {
  const dir = mkdtempSync(path.join(tmpdir(), 'lbctl-version-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

const SHA = (c: string): string => c.repeat(64);
const CLIENT: Versions = {
  lbctl: '0.1.0',
  commit: '0123456789abcdef0123456789abcdef01234567',
  node: 'v24.22.3',
  v8: '13.6.233.17-node.63',
  libbpf: '1.1',
  kernel: '6.18.44',
  objects: [
    { name: 'sock.bpf.o', path: '/opt/lbctl/bpf/.output/sock.bpf.o', sha256: SHA('a') },
    { name: 'probe.bpf.o', path: '/opt/lbctl/bpf/.output/probe.bpf.o', sha256: SHA('b') },
  ],
};

t.test('an object\'s build id is the SHA-256 of its bytes; a missing one says so', async (t) => {
  const dir = tempDir(t);
  const file = path.join(dir, 'x.bpf.o');
  writeFileSync(file, 'ELF bytes');
  t.same(objectBuildId(file), { name: 'x.bpf.o', path: file, sha256: createHash('sha256').update('ELF bytes').digest('hex') });
  writeFileSync(file, 'other bytes');
  t.equal(objectBuildId(file).sha256, createHash('sha256').update('other bytes').digest('hex'), 'other bytes, another id');
  t.same(objectBuildId(path.join(dir, 'none.bpf.o')), { name: 'none.bpf.o', path: path.join(dir, 'none.bpf.o'), sha256: null, error: 'missing' });
});

t.test("collectVersions: this process's runtime, kernel and objects", async (t) => {
  const dir = tempDir(t);
  const file = path.join(dir, 'sock.bpf.o');
  writeFileSync(file, 'x');
  const v = collectVersions({ libbpf: '9.9', objects: [file] });
  t.equal(v.node, process.version);
  t.equal(v.v8, process.versions.v8);
  t.equal(v.kernel, os.release());
  t.equal(v.libbpf, '9.9');
  t.equal(v.commit, BUILD_COMMIT);
  t.equal(BUILD_COMMIT, 'unknown', 'unbundled (tap runs src/), no commit was baked in');
  t.same(v.objects.map((o) => o.name), ['sock.bpf.o']);
});

t.test('runtimeObjects: the built objects, or the ones the flags name', async (t) => {
  const names = (l: string[]): string[] => l.map((p) => path.basename(p));
  t.same(names(runtimeObjects()), ['sock.bpf.o', 'sock_compat.bpf.o', 'nodeport.bpf.o', 'nodeport_l3.bpf.o', 'sock_destroy.bpf.o', 'probe.bpf.o']);
  t.equal(runtimeObjects()[0], DEFAULT_OBJECT);
  t.equal(runtimeObjects()[1], COMPAT_OBJECT);
  const custom = runtimeObjects({ bpfObject: '/tmp/v2/sock.bpf.o', tcObject: '/tmp/v2/np.bpf.o' });
  t.same(custom.slice(0, 3), ['/tmp/v2/sock.bpf.o', '/tmp/v2/np.bpf.o', '/tmp/v2/np_l3.bpf.o'], '--bpf-object replaces both socket objects; --tc-object brings its layer-3 twin');
  t.same(names(runtimeObjects({ nodeport: false })), ['sock.bpf.o', 'sock_compat.bpf.o', 'sock_destroy.bpf.o', 'probe.bpf.o'], '--no-nodeport: no tc object');
});

t.test('the table: client and agent side by side, differences marked', async (t) => {
  const same = formatVersion({ client: CLIENT, agent: CLIENT });
  t.equal(
    same,
    [
      'lbctl 0.1.0 (libbpf 1.1, node v24.22.3)',
      '',
      '              CLIENT                AGENT',
      'lbctl         0.1.0                 0.1.0',
      'commit        0123456789ab          0123456789ab',
      'node          v24.22.3              v24.22.3',
      'v8            13.6.233.17-node.63   13.6.233.17-node.63',
      'libbpf        1.1                   1.1',
      'kernel        6.18.44               6.18.44',
      'sock.bpf.o    aaaaaaaaaaaa          aaaaaaaaaaaa',
      'probe.bpf.o   bbbbbbbbbbbb          bbbbbbbbbbbb',
      '',
    ].join('\n'),
  );
  t.equal(same.split('\n')[0], versionLine(CLIENT), 'the first line is the one lbctl always printed');

  const agent: Versions = {
    ...CLIENT,
    commit: 'fedcba9876543210fedcba9876543210fedcba98-dirty',
    node: 'v20.20.2',
    objects: [
      { name: 'sock.bpf.o', path: '/tmp/old/sock.bpf.o', sha256: SHA('c') },
      { name: 'probe.bpf.o', path: '/opt/lbctl/bpf/.output/probe.bpf.o', sha256: SHA('b') },
      { name: 'extra.bpf.o', path: '/x/extra.bpf.o', sha256: null, error: 'missing' },
    ],
  };
  const diff = formatVersion({ client: CLIENT, agent }).split('\n');
  t.equal(diff.find((l) => l.startsWith('commit')), 'commit        0123456789ab          fedcba987654-dirty *', 'a dirty build says so');
  t.equal(diff.find((l) => l.startsWith('node')), 'node          v24.22.3              v20.20.2 *');
  t.equal(diff.find((l) => l.startsWith('sock.bpf.o')), 'sock.bpf.o    aaaaaaaaaaaa          cccccccccccc *', 'another object: another id');
  t.equal(diff.find((l) => l.startsWith('probe.bpf.o')), 'probe.bpf.o   bbbbbbbbbbbb          bbbbbbbbbbbb', 'the same object is not marked');
  t.equal(diff.find((l) => l.startsWith('extra.bpf.o')), 'extra.bpf.o   -                     (missing)', 'an object only the agent names');
  t.ok(diff.includes("* the agent's differs from this lbctl's"), 'the mark is explained');
  t.notOk(formatVersion({ client: CLIENT, agent: CLIENT }).includes('*'), 'and not printed when nothing differs');
});

t.test('no agent, an older agent, --client', async (t) => {
  const away = formatVersion({ client: CLIENT, agent: null, agentError: 'cannot reach the agent: no API socket at /run/lbctl/agent.sock: is the agent running (lbctl agent)?' });
  t.match(away, /^ {14}CLIENT\n/m, 'a CLIENT column only');
  t.notMatch(away, /AGENT/);
  t.match(away, /\nagent: not reachable: no API socket at \/run\/lbctl\/agent\.sock: is the agent running \(lbctl agent\)\?\n$/, 'and why there is no agent column');

  const older = formatVersion({ client: CLIENT, agent: { lbctl: '0.0.9' } as Versions, agentError: 'the agent (lbctl 0.0.9) serves no /v1/version: it predates it' }).split('\n');
  t.equal(older.find((l) => l.startsWith('lbctl  ')), 'lbctl         0.1.0                 0.0.9 *');
  t.equal(older.find((l) => l.startsWith('node')), 'node          v24.22.3              -', 'what an older agent does not say is -');
  t.equal(older.find((l) => l.startsWith('sock.bpf.o')), 'sock.bpf.o    aaaaaaaaaaaa          -');
  t.equal(older.at(-2), 'agent: the agent (lbctl 0.0.9) serves no /v1/version: it predates it');

  const client = formatVersion({ client: CLIENT });
  t.notMatch(client, /AGENT|agent:/, '--client: no agent at all');
});

t.test('GET /v1/version answers what the agent read at its start; the client falls back for an agent without it', async (t) => {
  const dir = tempDir(t);
  const versions = collectVersions({ libbpf: '1.1', objects: [] });
  const sock = path.join(dir, 'agent.sock');
  const srv = await startApiServer({ view: new FakeView(), socketPath: sock, version: '0.1.0', versions });
  t.teardown(() => srv.close());
  t.same(await apiGet(sock, '/v1/version'), versions);
  t.same(await agentVersions(sock), { agent: versions });

  // An agent from before /v1/version: 404 there, its version from /v1/status.
  const oldSock = path.join(dir, 'old.sock');
  const old = await startApiServer({ view: new FakeView(), socketPath: oldSock, version: '0.0.9' });
  t.teardown(() => old.close());
  await t.rejects(apiGet(oldSock, '/v1/version'), { code: 'EAPI', message: /HTTP 404/ });
  t.same(await agentVersions(oldSock), { agent: { lbctl: '0.0.9' }, agentError: 'the agent (lbctl 0.0.9) serves no /v1/version: it predates it' });

  const none = await agentVersions(path.join(dir, 'none.sock'));
  t.equal(none.agent, null);
  t.match(none.agentError, /^cannot reach the agent: no API socket at /);

  // The command: JSON with both sides, and --client without asking.
  const out: string[] = [];
  await versionCommand({ output: 'json', apiSocket: sock }, (s) => out.push(s));
  const report = JSON.parse(out.join('')) as VersionReport;
  t.same(report.agent, versions, 'json: the agent as it answered');
  t.equal(report.client.node, process.version);
  t.equal(report.apiSocket, sock);
  t.same(report.client.objects.map((o) => o.name), runtimeObjects().map((p) => path.basename(p)));
  out.length = 0;
  await versionCommand({ output: 'json', apiSocket: path.join(dir, 'none.sock'), client: true }, (s) => out.push(s));
  t.same(Object.keys(JSON.parse(out.join('')) as object), ['client'], '--client: the client only');
});
