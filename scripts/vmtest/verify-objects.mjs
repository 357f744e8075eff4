#!/usr/bin/env node
// Loads every program of every BPF object lbctl builds through the running
// kernel's verifier (no attach), with maps pinned under a throwaway bpffs
// directory that is removed afterwards. One line per object; exit 1 if any
// object fails, with the verifier's last words.
//
// Usage: node scripts/vmtest/verify-objects.mjs [OBJ...]   (default: bpf/.output/**/*.bpf.o)
import { mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const { BpfObject } = await import(path.join(root, 'dist/native/bpf.js'));
const { ensureBpffs, lacksSetRetval } = await import(path.join(root, 'dist/datapath/loader.js'));
const { lacksSockDestroy, UdpTerminator } = await import(path.join(root, 'dist/datapath/terminate.js'));
const { probeFeatures, featureLine, missingRequired } = await import(path.join(root, 'dist/datapath/features.js'));

// Objects that call bpf_set_retval (5.18), and the build each falls back to without it.
const SET_RETVAL_FALLBACK = {
  'sock.bpf.o': 'sock_compat.bpf.o',
  'sock_layout_test.bpf.o': 'sock_layout_test_compat.bpf.o',
  'tests/sock_test.bpf.o': 'tests/sock_compat_test.bpf.o',
};
// Loaded program by program by the feature probe (below), never whole.
const PROBE_OBJECT = 'probe.bpf.o';

function objects() {
  const out = [];
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.bpf.o') && e.name !== 'abi.bpf.o') out.push(p);
    }
  };
  walk(path.join(root, 'bpf/.output'));
  return out.sort();
}

/** The program the kernel refused (libbpf names it), and the verifier's last words. */
function refusal(err) {
  const log = String(err.log ?? err.message).trim();
  const prog = /prog '([^']+)': (?:BPF program load failed|failed to load)/.exec(log)?.[1] ?? err.prog ?? '(libbpf named none)';
  const lines = log.split('\n').filter((l) => !/^libbpf: failed to load object/.test(l)).slice(-10);
  return { prog, lines };
}

const list = process.argv.length > 2 ? process.argv.slice(2) : objects();
const pinRoot = `/sys/fs/bpf/lbctl-verify-${process.pid}`;
ensureBpffs(pinRoot);
// Stopped by a signal (a run cut short), the pins and the probe's cgroup go too.
let probeCgroup;
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => {
    rmSync(pinRoot, { recursive: true, force: true });
    try {
      if (probeCgroup) rmdirSync(probeCgroup);
    } catch {
      // still has a process, or gone already
    }
    process.exit(128 + (sig === 'SIGINT' ? 2 : sig === 'SIGTERM' ? 15 : 1));
  });
}
let failed = 0;
let passed = 0;
const outcome = new Map();
for (const file of list) {
  const rel = path.relative(path.join(root, 'bpf/.output'), path.resolve(file));
  const name = rel.startsWith('..') ? file : rel;
  if (name === PROBE_OBJECT) continue;
  mkdirSync(pinRoot, { recursive: true });
  const obj = BpfObject.open(file, { pinRoot });
  try {
    await obj.load();
    console.log(`verifier: ok   ${name}: ${obj.programNames().length} programs loaded`);
    outcome.set(name, 'ok');
    passed++;
  } catch (err) {
    // Kernels before 5.18 reject these for want of bpf_set_retval; the
    // agent (and the tests) load their compat builds then (checked below).
    if (SET_RETVAL_FALLBACK[name] && lacksSetRetval(err)) {
      console.log(`verifier: fallback ${name}: no bpf_set_retval on this kernel; ${SET_RETVAL_FALLBACK[name]} is used instead (refusals are EPERM)`);
      outcome.set(name, 'fallback');
      passed++;
      continue;
    }
    // Kernels before 6.5 have no bpf_sock_destroy kfunc: the agent destroys
    // stale connected UDP sockets over inet_diag instead (test/bpf/sock-destroy.ts).
    if (name === 'sock_destroy.bpf.o' && lacksSockDestroy(err)) {
      console.log(`verifier: fallback ${name}: no bpf_sock_destroy kfunc on this kernel; stale UDP sockets are destroyed over inet_diag`);
      outcome.set(name, 'fallback');
      passed++;
      continue;
    }
    failed++;
    outcome.set(name, 'fail');
    const { prog, lines } = refusal(err);
    console.log(`verifier: FAIL ${name} program ${prog}: ${err.code ?? ''} ${err.message.split('\n')[0]}`);
    for (const l of lines) console.log(`verifier:   | ${l}`);
  } finally {
    obj.close();
    rmSync(pinRoot, { recursive: true, force: true });
  }
}
for (const [std, compat] of Object.entries(SET_RETVAL_FALLBACK)) {
  if (outcome.get(std) === 'fallback' && outcome.get(compat) !== 'ok') {
    failed++;
    console.log(`verifier: FAIL ${std}'s fallback ${compat} did not load either`);
  }
}

// The agent's feature probe (bpf/probe.c, program by program): every
// required feature must be here, since this kernel is in the matrix.
const cgroupRoot = readFileSync('/proc/mounts', 'utf8').split('\n').map((l) => l.split(' ')).find((f) => f[2] === 'cgroup2')?.[1];
if (list.some((f) => f.endsWith(PROBE_OBJECT)) && cgroupRoot) {
  const cgroup = path.join(cgroupRoot, `lbctl-verify-${process.pid}`);
  mkdirSync(cgroup, { recursive: true });
  probeCgroup = cgroup;
  try {
    const features = await probeFeatures({ cgroup, bpfRoot: pinRoot });
    console.log(`features: ${featureLine(features)}`);
    for (const r of features.results) console.log(`feature: ${r.name} ${r.available ? 'yes' : 'no'}${r.required ? ' (required)' : ''}: ${r.detail}`);
    const missing = missingRequired(features);
    if (missing.length > 0) {
      failed++;
      console.log(`verifier: FAIL ${PROBE_OBJECT}: required features missing: ${missing.map((r) => `${r.name} (${r.detail})`).join('; ')}`);
    } else passed++;
  } finally {
    rmSync(pinRoot, { recursive: true, force: true });
    rmdirSync(cgroup);
  }
}
// How the agent will destroy stale connected UDP sockets here (its own detection, by loading).
const udp = await UdpTerminator.detect({ mechanism: 'auto' }).catch((err) => ({ mechanism: 'error', reason: err.message }));
console.log(`udp-termination: ${udp.mechanism}: ${udp.reason}`);
console.log(`fallbacks: set_retval=${outcome.get('sock.bpf.o') === 'fallback' ? 'absent, compat datapath (EPERM refusals)' : 'present, standard datapath (ECONNREFUSED)'}`);
console.log(`fallbacks: sock_destroy=${outcome.get('sock_destroy.bpf.o') === 'fallback' ? 'absent, inet_diag SOCK_DESTROY' : 'present, iter/udp + bpf_sock_destroy'}`);
console.log(`verifier: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
