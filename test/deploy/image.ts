// The container image (Dockerfile, `make image`, docs/image.md). The archive
// `make image` builds is unpacked layer by layer, and then:
//   - it must be what the Dockerfile describes: the runtime packages at the
//     versions pinned there (the image's dpkg status), the files COPYed into
//     /opt/lbctl (and no others), ENTRYPOINT, CMD, ENV, STOPSIGNAL, LABELs;
//     every object the agent loads is shipped, and the bundle needs no
//     node_modules;
//   - its `lbctl version` loads the addon against the image's libbpf (the
//     addon is built on this host, against bookworm's libbpf 1.1 headers)
//     and runs on the Node.js of scripts/node.env (no Debian nodejs);
//   - its `lbctl agent`, as PID 1 of a pid namespace in a chroot of the
//     rootfs (a container without a container engine: /proc, /sys with
//     bpffs and the cgroup2 mount, /dev), programs a sandbox's service so a
//     client reaches the backend, answers /readyz, and on SIGTERM exits and
//     leaves the datapath attached;
//   - a SIGTERM to that PID 1 at any moment from 1 ms after the entrypoint's
//     exec stops it promptly (the kernel drops a signal PID 1 neither
//     handles nor blocks: tini blocks them first thing and forwards them).
// The archive is rebuilt first when make says it is stale.
import t from 'tap';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { builtinModules } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { AgentProcess, createSandbox, HTTP_PORT, ROOT, run, SLOW } from '../helpers/sandbox.js';
import { serviceWithBackends } from '../helpers/manifests.js';
import { killPid, recordPid } from '../helpers/sandbox/run.js';
import { PREFIX } from '../helpers/sandbox/topology.js';

const VERSION = (JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
/** scripts/node.env: the Node.js the image ships (/opt/lbctl/node), from this machine's prefix. */
const NODE_ENV = Object.fromEntries([...readFileSync(path.join(ROOT, 'scripts/node.env'), 'utf8').matchAll(/^(\w+)=(.*)$/gm)].map((m) => [m[1]!, m[2]!]));
const NODE_PREFIX = NODE_ENV.LBCTL_NODE_PREFIX!;
const IMAGE_REL = `build/image/lbctl-${VERSION}.oci.tar`;
const IMAGE = path.join(ROOT, IMAGE_REL);
const IS_ROOT = process.getuid?.() === 0;
const VIP = '10.96.0.10';

// ------------------------------------------------------------ the Dockerfile

interface DockerfileStage {
  readonly from: string;
  /** name → version of every `name=version` an `apt-get install` names. */
  readonly packages: Map<string, string>;
  /** Destination paths of every COPY, one per file. */
  readonly copied: string[];
  /** [target, link] of every `ln -s` a RUN makes. */
  readonly links: Array<[string, string]>;
  readonly env: Record<string, string>;
  readonly labels: Record<string, string>;
  readonly entrypoint: string[];
  readonly cmd: string[];
  readonly stopSignal: string | undefined;
}

/** The Dockerfile's last stage (the image), with continuation lines joined and comment lines dropped, as docker reads it. */
function parseDockerfile(text: string): DockerfileStage {
  const instructions: string[] = [];
  let pending = '';
  for (const line of text.split('\n')) {
    if (/^\s*#/.test(line)) continue;
    const cont = /\\\s*$/.test(line);
    pending += (pending ? ' ' : '') + line.replace(/\\\s*$/, '').trim();
    if (!cont) {
      if (pending.trim()) instructions.push(pending.trim());
      pending = '';
    }
  }
  if (pending.trim()) instructions.push(pending.trim());
  const lastFrom = instructions.map((i) => /^FROM\s/i.test(i)).lastIndexOf(true);
  if (lastFrom < 0) throw new Error('the Dockerfile has no FROM');

  const stage: DockerfileStage = {
    from: instructions[lastFrom]!.split(/\s+/)[1]!,
    packages: new Map(),
    copied: [],
    links: [],
    env: {},
    labels: {},
    entrypoint: [],
    cmd: [],
    stopSignal: undefined,
  };
  const pairs = (s: string): Array<[string, string]> =>
    [...s.matchAll(/([\w.-]+)=(?:"([^"]*)"|(\S*))/g)].map((m) => [m[1]!, m[2] ?? m[3] ?? '']);
  const mutable = stage as { -readonly [K in keyof DockerfileStage]: DockerfileStage[K] };
  for (const ins of instructions.slice(lastFrom + 1)) {
    const [op, ...rest] = ins.split(/\s+/);
    const args = rest.join(' ');
    switch (op!.toUpperCase()) {
      case 'RUN':
        for (const cmd of args.split(/&&|;/).map((c) => c.trim().split(/\s+/))) {
          if (cmd[0] === 'apt-get' && cmd.includes('install')) {
            for (const tok of cmd) {
              const m = /^([a-z0-9][a-z0-9.+-]*)=(.+)$/.exec(tok);
              if (m) stage.packages.set(m[1]!, m[2]!);
            }
          }
          if (cmd[0] === 'ln' && cmd[1] === '-s' && cmd.length === 4) stage.links.push([cmd[2]!, cmd[3]!]);
        }
        break;
      case 'COPY': {
        const paths = rest.filter((a) => !a.startsWith('--'));
        const dest = paths.pop()!;
        if (dest.endsWith('/')) for (const src of paths) stage.copied.push(dest + path.basename(src));
        else if (paths.length === 1) stage.copied.push(dest);
        else throw new Error(`COPY of several files to ${dest}, which does not end with /`);
        break;
      }
      case 'ENV':
        Object.assign(stage.env, Object.fromEntries(pairs(args)));
        break;
      case 'LABEL':
        Object.assign(stage.labels, Object.fromEntries(pairs(args)));
        break;
      case 'ENTRYPOINT':
        mutable.entrypoint = JSON.parse(args) as string[];
        break;
      case 'CMD':
        mutable.cmd = JSON.parse(args) as string[];
        break;
      case 'STOPSIGNAL':
        mutable.stopSignal = args;
        break;
    }
  }
  return stage;
}

// -------------------------------------------------------------- the archive

interface ImageConfig {
  config: {
    Entrypoint?: string[];
    Cmd?: string[];
    Env?: string[];
    Labels?: Record<string, string>;
    StopSignal?: string;
  };
}

interface Unpacked {
  readonly rootfs: string;
  readonly refName: string;
  readonly config: ImageConfig;
}

/** Extracts the archive's one image, layer over layer, into `dir`/rootfs. Our layers have no whiteouts (checked). */
function unpack(archive: string, dir: string): Unpacked {
  const layout = path.join(dir, 'layout');
  const rootfs = path.join(dir, 'rootfs');
  mkdirSync(layout);
  mkdirSync(rootfs);
  execFileSync('tar', ['-xf', archive, '-C', layout]);
  const blob = (digest: string): string => path.join(layout, 'blobs', ...digest.split(':'));
  const index = JSON.parse(readFileSync(path.join(layout, 'index.json'), 'utf8')) as {
    manifests: Array<{ digest: string; annotations?: Record<string, string> }>;
  };
  if (index.manifests.length !== 1) throw new Error(`the archive holds ${index.manifests.length} images, not one`);
  const desc = index.manifests[0]!;
  const manifest = JSON.parse(readFileSync(blob(desc.digest), 'utf8')) as {
    config: { digest: string };
    layers: Array<{ digest: string; mediaType: string }>;
  };
  for (const layer of manifest.layers) {
    if (!layer.mediaType.endsWith('tar+gzip')) throw new Error(`layer ${layer.digest}: ${layer.mediaType}, not tar+gzip`);
    // One pass: -v lists what it extracts, for the whiteout check (gunzip is most of the time here).
    const names = execFileSync('tar', ['-xzvf', blob(layer.digest), '-C', rootfs, '--numeric-owner'], { encoding: 'utf8', maxBuffer: 64 << 20 });
    if (/(^|\/)\.wh\./m.test(names)) throw new Error(`layer ${layer.digest} has whiteouts, which this unpacker does not apply`);
  }
  return {
    rootfs,
    refName: desc.annotations?.['org.opencontainers.image.ref.name'] ?? '',
    config: JSON.parse(readFileSync(blob(manifest.config.digest), 'utf8')) as ImageConfig,
  };
}

/** Package → version of every package dpkg has installed in the rootfs. */
function dpkgInstalled(rootfs: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const para of readFileSync(path.join(rootfs, 'var/lib/dpkg/status'), 'utf8').split(/\n\n+/)) {
    const field = (name: string): string | undefined => new RegExp(`^${name}: (.*)$`, 'm').exec(para)?.[1];
    if (field('Status') === 'install ok installed') out.set(field('Package')!, field('Version')!);
  }
  return out;
}

/** Every file and symlink under `dir`, as absolute image paths. */
function filesUnder(rootfs: string, dir: string): string[] {
  const out: string[] = [];
  const walk = (rel: string): void => {
    for (const name of readdirSync(path.join(rootfs, rel))) {
      const p = path.join(rel, name);
      if (lstatSync(path.join(rootfs, p)).isDirectory()) walk(p);
      else out.push(p);
    }
  };
  walk(dir);
  return out.sort();
}

/** The runtime objects the agent loads: the bpf/.output/*.bpf.o paths src/ names. */
function objectsTheAgentLoads(): string[] {
  const found = new Set<string>();
  const walk = (dir: string): void => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.ts')) for (const m of readFileSync(p, 'utf8').matchAll(/'(bpf\/\.output\/[\w-]+\.bpf\.o)'/g)) found.add(m[1]!);
    }
  };
  walk(path.join(ROOT, 'src'));
  return [...found].sort();
}

// ------------------------------------------------------------------- set-up

/** `make image` when make says the archive is stale (a no-op run of make takes about a second). */
function ensureImage(): void {
  const q = spawnSync('make', ['-q', IMAGE_REL], { cwd: ROOT, stdio: 'ignore' });
  if (q.status === 0) return;
  if (!IS_ROOT) throw new Error(`${IMAGE_REL} is missing or stale, and building it takes root: run make image`);
  t.comment(`${IMAGE_REL} is missing or stale: make image`);
  // A fresh machine's build (about 80 s, downloads included) on top of the tests would pass tap's 120 s.
  t.setTimeout(15 * 60_000);
  const r = spawnSync('make', ['image'], { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  if (r.status !== 0) throw new Error(`make image failed (${r.status}):\n${r.stdout.slice(-2000)}\n${r.stderr.slice(-3000)}`);
}

const t0 = performance.now();
ensureImage();
const tBuilt = performance.now();
// The name starts with the sandbox prefix and this pid, so the sweep of a later run removes it should this one crash.
const work = mkdtempSync(path.join(os.tmpdir(), `${PREFIX}${process.pid}-image-`));
t.teardown(() => rmSync(work, { recursive: true, force: true }));
const image = unpack(IMAGE, work);
t.comment(`make image check ${Math.round(tBuilt - t0)} ms, unpack ${Math.round(performance.now() - tBuilt)} ms`);
const dockerfile = parseDockerfile(readFileSync(path.join(ROOT, 'Dockerfile'), 'utf8'));
const entrypoint = image.config.config.Entrypoint ?? [];
const imageEnv = image.config.config.Env ?? [];

// ------------------------------------------------------------------- tests

t.test('the Dockerfile and make image build the same image', async (t) => {
  t.equal(dockerfile.from, 'debian:trixie-slim', 'the Dockerfile runs on debian:trixie-slim');
  t.match(readFileSync(path.join(image.rootfs, 'etc/os-release'), 'utf8'), /^VERSION_CODENAME=trixie$/m, 'the image is Debian trixie');
  t.equal(image.refName, VERSION, `the archive's image is tagged ${VERSION}`);

  t.ok(dockerfile.packages.size >= 3, `the Dockerfile pins its runtime packages (${[...dockerfile.packages.keys()].join(' ')})`);
  const installed = dpkgInstalled(image.rootfs);
  const pinned = [...dockerfile.packages.keys()];
  t.same(
    Object.fromEntries(pinned.map((p) => [p, installed.get(p) ?? 'not installed'])),
    Object.fromEntries(dockerfile.packages),
    'every package the Dockerfile pins is installed in the image at that version',
  );
  for (const p of ['libstdc++6', 'libbpf1', 'libelf1t64', 'iptables', 'nftables']) t.ok(dockerfile.packages.has(p), `${p} is among them`);
  t.notOk(installed.has('nodejs'), "no Debian nodejs: the image's node is scripts/node.env's");

  const expected = dockerfile.copied.filter((p) => p.startsWith('/opt/lbctl/')).sort();
  t.same(filesUnder(image.rootfs, '/opt/lbctl'), expected, 'the image has exactly the files the Dockerfile COPYs into /opt/lbctl');
  t.same(dockerfile.copied.filter((p) => !p.startsWith('/opt/lbctl/')), [], 'and COPYs nothing elsewhere');
  for (const obj of objectsTheAgentLoads()) t.ok(expected.includes(`/opt/lbctl/${obj}`), `${obj}, which the agent loads, is shipped`);
  t.ok(expected.includes('/opt/lbctl/build/Release/lb_native.node'), 'so is the addon');
  t.ok(expected.includes('/opt/lbctl/node/bin/node'), 'and node');
  // make image copies this checkout's build and its Node.js: the same bytes (a stale archive shows here).
  for (const p of expected) {
    const rel = p.slice('/opt/lbctl/'.length);
    const shipped = path.join(image.rootfs, p);
    const local = rel.startsWith('node/') ? path.join(NODE_PREFIX, rel.slice('node/'.length)) : path.join(ROOT, rel);
    t.ok(existsSync(shipped) && readFileSync(shipped).equals(readFileSync(local)), `${rel} is ${rel.startsWith('node/') ? `${NODE_PREFIX}'s` : "this checkout's"}`);
  }
  for (const [target, link] of dockerfile.links) {
    t.equal(readlinkSync(path.join(image.rootfs, link)), target, `${link} -> ${target}`);
  }

  // The bundle runs without node_modules: its only requires of packages are optional ones behind a try.
  const bundle = readFileSync(path.join(image.rootfs, 'opt/lbctl/dist/bundle/lbctl.js'), 'utf8');
  // require("x") and esbuild's __require("x"), import("x") and static
  // imports (the bundle's whitespace is minified: import{a}from"x").
  const specifiers = [...bundle.matchAll(/(?<![\w$.])(?:__)?require\("([^"]+)"\)|\bimport\("([^"]+)"\)|(?<=^|[;}\s])import\s*(?:[\w$*{][^;"'()]*?\bfrom\s*)?["']([^"']+)["']/gm)].map((m) => (m[1] ?? m[2] ?? m[3])!);
  t.ok(specifiers.filter((s) => s === 'node:fs').length > 1, 'static imports are read (node:fs is imported by several modules)');
  const bare = new Set(specifiers.filter((m) => !m.startsWith('node:') && !builtinModules.includes(m)));
  t.same([...bare].sort(), ['bufferutil', 'encoding', 'utf-8-validate'], 'the bundle requires no package but the optional ones');

  const c = image.config.config;
  t.same(c.Entrypoint, dockerfile.entrypoint, `ENTRYPOINT ${JSON.stringify(dockerfile.entrypoint)}`);
  t.same(c.Cmd, dockerfile.cmd, `CMD ${JSON.stringify(dockerfile.cmd)}`);
  t.equal(c.StopSignal, dockerfile.stopSignal, `STOPSIGNAL ${dockerfile.stopSignal}`);
  t.same(dockerfile.entrypoint, ['/usr/bin/tini-static', '--', '/opt/lbctl/bin/lbctl'], 'PID 1 is tini, which runs bin/lbctl (its node settings and the heap cap from the memory limit)');
  t.ok(existsSync(path.join(image.rootfs, 'usr/bin/tini-static')), 'tini-static is in the image');
  t.match(readFileSync(path.join(image.rootfs, 'opt/lbctl/bin/lbctl'), 'utf8'), /^exec "\$node" /m, 'bin/lbctl execs node: tini forwards signals to node itself');
  const envOf = Object.fromEntries(imageEnv.map((e) => [e.slice(0, e.indexOf('=')), e.slice(e.indexOf('=') + 1)]));
  for (const [k, v] of Object.entries(dockerfile.env)) t.equal(envOf[k], v, `ENV ${k}=${v}`);
  t.same(c.Labels, dockerfile.labels, 'the same LABELs');
  t.equal(c.Labels?.['org.opencontainers.image.version'], VERSION, `labelled with version ${VERSION}`);
});

/**
 * Runs ARGS in a chroot of the rootfs as PID 1 of new pid and mount
 * namespaces, with the image's environment: fresh /proc, the host's /sys
 * (bpffs and the cgroup2 mount below it) and /dev, and the `binds`
 * (host dir → image dir). The mounts live and die with the mount namespace;
 * --kill-child ends the namespace's processes should unshare die first.
 */
function spawnInImage(args: readonly string[], binds: ReadonlyArray<[string, string]> = []) {
  const script = [
    'r=$1; shift',
    'mount -t proc proc "$r/proc"',
    'mount --rbind /sys "$r/sys"',
    'mount --rbind /dev "$r/dev"',
    ...binds.map(([from, to]) => `mkdir -p "$r${to}" && mount --bind ${shq(from)} "$r${to}"`),
    // Only the image's environment: not this test's (tap's NODE_OPTIONS names loaders the image does not have).
    `exec env -i ${imageEnv.map(shq).join(' ')} chroot "$r" "$@"`,
  ].join('\n');
  return spawn('unshare', ['--mount', '--pid', '--fork', '--kill-child=SIGKILL', '--propagation', 'private', 'sh', '-ec', script, 'image-init', image.rootfs, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

const shq = (s: string): string => `'${s.replace(/'/g, `'\\''`)}'`;

/** The pid of unshare's one child: the namespace's PID 1, as the host sees it. */
function nsInit(unsharePid: number): number | undefined {
  try {
    const pid = Number(readFileSync(`/proc/${unsharePid}/task/${unsharePid}/children`, 'utf8').trim().split(/\s+/)[0]);
    return pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

// Running the image takes root (chroot, mounts, BPF): as root, as make test runs, nothing here is skipped.
if (!IS_ROOT) t.bailout('test/deploy/image.ts needs root (chroot, mounts, BPF): run make test as root');

t.test("the image's lbctl version loads the addon against the image's libbpf", async (t) => {
  const proc = spawnInImage([...entrypoint, 'version']);
  let stdout = '';
  let stderr = '';
  proc.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  proc.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const timer = setTimeout(() => killPid(proc.pid), 30_000 * SLOW);
  const code = await new Promise<number | null>((resolve) => proc.on('close', resolve));
  clearTimeout(timer);
  t.equal(code, 0, `exits 0${code === 0 ? '' : `: ${stderr}`}`);
  // 1:1.5.0-3 → libbpf 1.5: the image's own, not this host's; node: scripts/node.env's.
  const libbpf = /^(?:\d+:)?(\d+\.\d+)/.exec(dockerfile.packages.get('libbpf1') ?? '')?.[1];
  const lines = stdout.split('\n');
  t.equal(lines[0], `lbctl ${VERSION} (libbpf ${libbpf}, node v${NODE_ENV.LBCTL_NODE_VERSION})`, 'prints the image versions');
  t.match(stdout, /^ +CLIENT$/m, 'no agent runs in there: the client column only');
  // The commit baked into the bundle (the image has no .git): the one this checkout's bundle names.
  const host = JSON.parse(execFileSync(path.join(ROOT, 'bin/lbctl'), ['version', '--client', '-o', 'json'], { encoding: 'utf8' })) as { client: { commit: string } };
  t.match(host.client.commit, /^[0-9a-f]{40}(-dirty)?$/);
  t.match(stdout, new RegExp(`^commit +${host.client.commit.replace(/^([0-9a-f]{12})[0-9a-f]{28}/, '$1')}$`, 'm'), `the commit baked into the bundle (${host.client.commit})`);
  const sha = (f: string): string => createHash('sha256').update(readFileSync(f)).digest('hex').slice(0, 12);
  for (const obj of objectsTheAgentLoads()) {
    t.match(stdout, new RegExp(`^${path.basename(obj).replace(/\./g, '\\.')} +${sha(path.join(ROOT, obj))}$`, 'm'), `${path.basename(obj)}: this checkout's build id`);
  }
  t.equal(stderr, '', 'and nothing on stderr');

  // The official node build trusts its own CA store: no system bundle, no warning (Debian's needed NODE_EXTRA_CA_CERTS="").
  const tls = spawnInImage(['/usr/local/bin/node', '-e', 'process.stdout.write(String(require("tls").rootCertificates.length))']);
  let tlsErr = '';
  tls.stderr!.on('data', (d: Buffer) => (tlsErr += d.toString()));
  tls.stdout!.resume();
  t.equal(await new Promise<number | null>((resolve) => tls.on('close', resolve)), 0, 'node loads its CA store');
  t.equal(tlsErr, '', 'without a warning');
});

t.test("the image's lbctl agent programs a service as PID 1 and leaves the datapath on SIGTERM", async (t) => {
  const sb = await createSandbox(t, { backends: 1, agent: false });
  sb.writeManifest(
    'web.yaml',
    serviceWithBackends({ name: 'web', clusterIPs: [VIP], ports: [{ name: 'http', port: 80 }] }, [
      { name: 'web-v4', family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: [sb.backends[0]!.v4] },
    ]),
  );
  const apiDir = path.join(sb.runDir, 'image-api');
  mkdirSync(apiDir);
  const proc = spawnInImage(
    [
      ...entrypoint,
      'agent',
      '--source', 'file:/etc/lbctl/manifests',
      '--cgroup', sb.cgroup,
      '--bpf-root', sb.bpfRoot,
      '--health-port', '0',
      '--health-bind-address', '127.0.0.1',
      '--metrics-port', '0',
      '--api-socket', '/run/lbctl/agent.sock',
      '--no-nodeport',
      '--health-mesh-port',
      '0',
    ],
    [
      [sb.manifestDir, '/etc/lbctl/manifests'],
      [apiDir, '/run/lbctl'],
    ],
  );
  recordPid(sb.runDir, proc.pid);
  let init: number | undefined;
  sb.addCleanup(() => {
    killPid(init);
    killPid(proc.pid);
  });
  const agent = new AgentProcess(proc);
  await agent.waitForLog((l) => l.msg === 'sync done', 0, 30_000);
  init = nsInit(proc.pid!);
  recordPid(sb.runDir, init);
  t.ok(init, 'the agent runs');
  const nspid = /^NSpid:\s+(.*)$/m.exec(readFileSync(`/proc/${init}/status`, 'utf8'))?.[1]?.split(/\s+/);
  t.equal(nspid?.at(-1), '1', `tini runs as PID 1 of its pid namespace (host pid ${init})`);
  t.match(readFileSync(`/proc/${init}/cmdline`, 'utf8').replace(/\0/g, ' '), /^\/usr\/bin\/tini-static -- \/opt\/lbctl\/bin\/lbctl agent /, 'the entrypoint as the image gives it');
  const node = nsInit(init!);
  t.match(node && readFileSync(`/proc/${node}/cmdline`, 'utf8').replace(/\0/g, ' '), /^node .*\/opt\/lbctl\/bin\/\.\.\/dist\/bundle\/lbctl\.js agent /, 'its child is the agent, node itself (bin/lbctl exec\'d it)');
  t.equal(readlinkSync(`/proc/${init}/root`), image.rootfs, "in the image's rootfs");

  const port = Number(agent.logs.find((l) => l.msg === 'serving health, metrics and the local API')?.health);
  const ready = await fetch(`http://127.0.0.1:${port}/readyz`);
  t.equal(ready.status, 200, '/readyz answers 200');
  const status = await run(path.join(ROOT, 'bin/lbctl'), ['status', '--api-socket', path.join(apiDir, 'agent.sock')], 30_000 * SLOW);
  t.equal(status.code, 0, `the host's lbctl status reads the agent's API socket${status.code === 0 ? '' : `: ${status.stderr}`}`);

  const fe = (await sb.lbList()).find((e) => e.frontend === `${VIP}:80/TCP`);
  t.same(fe?.backends.map((b) => b.address), [`${sb.backends[0]!.v4}:${HTTP_PORT}`], "the host's lbctl bpf lb list shows the service and its backend");
  const curl = (): Promise<{ code: number | null; stdout: string; stderr: string }> =>
    sb.exec(['curl', '-sS', '--max-time', String(5 * SLOW), `http://${VIP}/`]);
  const before = await curl();
  t.equal(before.code, 0, `a client in the sandbox reaches the service${before.code === 0 ? '' : `: ${before.stderr}`}`);
  t.equal(before.stdout.trim(), `${sb.backends[0]!.v4}:${HTTP_PORT}`, 'served by its backend');

  // SIGTERM from outside the namespace, to PID 1 as the runtime sends it: tini forwards it to the agent.
  killPid(init, 'SIGTERM');
  const timer = setTimeout(() => killPid(init), 15_000 * SLOW);
  const code = await agent.exited;
  clearTimeout(timer);
  t.equal(code, 0, 'SIGTERM ends the agent, exit 0');
  t.equal(agent.exitSignal, null, 'by itself, not killed');
  t.ok(existsSync(path.join(sb.bpfRoot, 'links')) && readdirSync(path.join(sb.bpfRoot, 'links')).length > 0, 'its links stay pinned');
  const after = await curl();
  t.equal(after.code, 0, `the service still answers with the agent gone${after.code === 0 ? '' : `: ${after.stderr}`}`);
  t.comment(`image test so far ${Math.round(performance.now() - t0)} ms`);
});

/** Whether the kernel would keep a SIGTERM for `pid` rather than drop it: blocked, handled, or waited for in rt_sigtimedwait (x86-64: 128), whose waited signals /proc shows as unblocked. */
function takesSigterm(pid: number): boolean {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const mask = (field: string): bigint => BigInt(`0x${new RegExp(`^${field}:\\s+([0-9a-f]+)$`, 'm').exec(status)?.[1] ?? '0'}`);
  const bit = 1n << 14n; // SIGTERM (15)
  if ((mask('SigBlk') & bit) !== 0n || (mask('SigCgt') & bit) !== 0n) return true;
  return readFileSync(`/proc/${pid}/syscall`, 'utf8').split(' ')[0] === '128';
}

t.test("SIGTERM to the image's PID 1 at once after the entrypoint's exec and later, many times: none lost once PID 1 runs anything", async (t) => {
  // The kernel drops a signal that a pid namespace's init neither handles
  // nor blocks, and exec resets every handler. With node as PID 1, a
  // SIGTERM during bin/lbctl's shell or node's own start (a few hundred ms)
  // was lost, and the kubelet waited out the grace period. tini blocks
  // every signal before it starts anything, and forwards them to its child.
  // Here SIGTERM goes to PID 1 as the runtime sends it, at once as the exec
  // shows and at delays that span the agent's start (a real agent: sandbox,
  // manifests). Just before each, PID 1's state is read: whether it would
  // take the signal (blocked, handled, waited for), and whether it is still
  // in the entrypoint's first instructions (the program exec'd, nothing
  // forked or exec'd since). A SIGTERM may be lost only there: no init can
  // take a signal before its first instructions (exec has just reset the
  // handlers), and how long those last is the scheduler's to say, not the
  // image's. Any other SIGTERM must stop it within 5 s.
  const sb = await createSandbox(t, { backends: 0, agent: false });
  sb.writeManifest('web.yaml', serviceWithBackends({ name: 'web', clusterIPs: [VIP], ports: [{ name: 'http', port: 80 }] }, []));
  const apiDir = path.join(sb.runDir, 'image-api-sigterm');
  mkdirSync(apiDir);
  const args = [
    ...entrypoint, 'agent',
    '--source', 'file:/etc/lbctl/manifests', '--cgroup', sb.cgroup, '--bpf-root', sb.bpfRoot,
    '--health-port', '0', '--health-bind-address', '127.0.0.1', '--metrics-port', '0',
    '--api-socket', '/run/lbctl/agent.sock', '--no-nodeport', '--health-mesh-port', '0',
  ];
  const binds: Array<[string, string]> = [[sb.manifestDir, '/etc/lbctl/manifests'], [apiDir, '/run/lbctl']];
  /** PID 1 runs the entrypoint as exec'd: its argv[0] (or, for a script, its interpreter's argv[1]). */
  const isEntrypoint = (argv: readonly string[]): boolean => argv[0] === entrypoint[0] || argv[1] === entrypoint[0];
  /** PID 1 is still spawnInImage's launcher (unshare's fork, the mount script, env, chroot) or between two execs. */
  const isLauncher = (argv: readonly string[]): boolean =>
    argv[0] === '' || argv[0] === 'unshare' || (argv[0] === 'sh' && argv[1] === '-ec') || argv[0] === 'env' || argv[0] === 'chroot';
  const STOP_BOUND_MS = 5_000 * SLOW;
  const busyUntil = (at: number): void => {
    while (performance.now() < at);
  };

  const delays = [...Array(3).keys()].flatMap(() => [0, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 300, 600, 1000]);
  // Each lost SIGTERM costs the bound; the image before tini lost most of them.
  t.setTimeout(delays.length * (STOP_BOUND_MS + 3_000 * SLOW) + 60_000);
  const lost: string[] = [];
  const first = { tries: 0, lost: 0 };
  let taken = 0;
  const ends = new Map<string, number>();
  for (const d of delays) {
    const proc = spawnInImage(args, binds);
    proc.stdout!.resume();
    proc.stderr!.resume();
    recordPid(sb.runDir, proc.pid);
    const closed = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => proc.on('close', (code, signal) => resolve({ code, signal })));
    // Polled without yielding, so that the signal follows the exec by as little as this loop takes.
    let init: number | undefined;
    let execAt: number | undefined;
    for (const end = performance.now() + 10_000 * SLOW; execAt === undefined && performance.now() < end; ) {
      init ??= nsInit(proc.pid!);
      if (init === undefined) continue;
      try {
        if (!isLauncher(readFileSync(`/proc/${init}/cmdline`, 'utf8').split('\0'))) execAt = performance.now();
      } catch {
        // between two execs
      }
    }
    if (execAt === undefined || init === undefined) {
      t.fail(`the entrypoint never ran as PID 1 (delay ${d} ms)`);
      killPid(proc.pid);
      await closed;
      continue;
    }
    recordPid(sb.runDir, init);
    busyUntil(execAt + d);
    let state: { takes: boolean; firstInstructions: boolean; comm: string };
    try {
      const takes = takesSigterm(init);
      const firstInstructions = !takes && isEntrypoint(readFileSync(`/proc/${init}/cmdline`, 'utf8').split('\0')) && readFileSync(`/proc/${init}/task/${init}/children`, 'utf8').trim() === '';
      state = { takes, firstInstructions, comm: readFileSync(`/proc/${init}/comm`, 'utf8').trim() };
    } catch (err) {
      t.fail(`PID 1 ended before the signal (delay ${d} ms): ${(err as Error).message}`);
      killPid(proc.pid);
      await closed;
      continue;
    }
    const { takes, firstInstructions, comm } = state;
    const sentAt = performance.now();
    killPid(init, 'SIGTERM');
    let timer: NodeJS.Timeout | undefined;
    const ended = await Promise.race([closed, new Promise<undefined>((r) => (timer = setTimeout(() => r(undefined), STOP_BOUND_MS)))]);
    clearTimeout(timer);
    if (!ended) {
      killPid(init);
      await closed;
    } else {
      const how = ended.code !== null ? `exit ${ended.code}` : ended.signal!;
      ends.set(how, (ends.get(how) ?? 0) + 1);
    }
    if (takes) taken++;
    if (firstInstructions) {
      first.tries++;
      if (!ended) first.lost++;
    } else if (!ended) {
      lost.push(`SIGTERM ${(sentAt - execAt).toFixed(2)} ms after the exec, PID 1 ${comm} ${takes ? 'taking it' : 'not taking it'}: still running ${STOP_BOUND_MS / 1000} s later`);
    }
  }
  t.same(lost, [], `${delays.length} SIGTERMs, at once to ${Math.max(...delays)} ms after the exec: none lost once PID 1 was past its first instructions`);
  t.ok(taken >= delays.length / 2, `PID 1 took the signal (blocked, handled or waited for) at ${taken} of them, forwarded to the agent`);
  t.comment(`how they ended: ${[...ends].map(([k, v]) => `${k} ×${v}`).join(', ')}`);
  t.comment(`sent while PID 1 was in its first instructions: ${first.tries}, of which lost: ${first.lost}`);
});
