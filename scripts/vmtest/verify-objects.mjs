#!/usr/bin/env node
// Loads every program of every BPF object lbctl builds through the running
// kernel's verifier (no attach), with maps pinned under a throwaway bpffs
// directory that is removed afterwards. One line per object; exit 1 if any
// object fails, with the verifier's last words.
//
// Usage: node scripts/vmtest/verify-objects.mjs [OBJ...]   (default: bpf/.output/**/*.bpf.o)
import { mkdirSync, readdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const { BpfObject } = await import(path.join(root, 'dist/native/bpf.js'));
const { lacksSetRetval } = await import(path.join(root, 'dist/datapath/loader.js'));
const { lacksSockDestroy } = await import(path.join(root, 'dist/datapath/terminate.js'));

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

const list = process.argv.length > 2 ? process.argv.slice(2) : objects();
const pinRoot = `/sys/fs/bpf/lbctl-verify-${process.pid}`;
let failed = 0;
const outcome = new Map();
for (const file of list) {
  const name = path.relative(path.join(root, 'bpf/.output'), file);
  mkdirSync(pinRoot, { recursive: true });
  const obj = BpfObject.open(file, { pinRoot });
  try {
    await obj.load();
    console.log(`verifier: ok   ${name}: ${obj.programNames().length} programs loaded`);
    outcome.set(name, 'ok');
  } catch (err) {
    // Kernels before 5.18 reject the standard datapath for want of
    // bpf_set_retval; the agent then loads the compat object (checked below).
    if (name === 'sock.bpf.o' && lacksSetRetval(err)) {
      console.log(`verifier: fallback ${name}: no bpf_set_retval on this kernel; the agent uses sock_compat.bpf.o (refusals are EPERM)`);
      outcome.set(name, 'fallback');
      continue;
    }
    // Kernels before 6.5 have no bpf_sock_destroy kfunc: the agent destroys
    // stale connected UDP sockets over inet_diag instead (test/bpf/sock-destroy.ts).
    if (name === 'sock_destroy.bpf.o' && lacksSockDestroy(err)) {
      console.log(`verifier: fallback ${name}: no bpf_sock_destroy kfunc on this kernel; stale UDP sockets are destroyed over inet_diag`);
      outcome.set(name, 'fallback');
      continue;
    }
    failed++;
    outcome.set(name, 'fail');
    const log = String(err.log ?? err.message).trim().split('\n').slice(-8).join('\n    ');
    console.log(`verifier: FAIL ${name}: ${err.code ?? ''} ${err.message.split('\n')[0]}\n    ${log}`);
  } finally {
    obj.close();
    rmSync(pinRoot, { recursive: true, force: true });
  }
}
if (outcome.get('sock.bpf.o') === 'fallback' && outcome.get('sock_compat.bpf.o') !== 'ok') {
  failed++;
  console.log('verifier: FAIL the fallback sock_compat.bpf.o did not load either');
}
console.log(`fallbacks: set_retval=${outcome.get('sock.bpf.o') === 'fallback' ? 'absent, compat datapath (EPERM refusals)' : 'present, standard datapath (ECONNREFUSED)'}`);
console.log(`fallbacks: sock_destroy=${outcome.get('sock_destroy.bpf.o') === 'fallback' ? 'absent, inet_diag SOCK_DESTROY' : 'present, iter/udp + bpf_sock_destroy'}`);
console.log(`verifier: ${list.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
