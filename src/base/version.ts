// What a process of lbctl runs: its version, the commit it was built from,
// the runtime (Node.js, V8), libbpf, the kernel, and a build id of each BPF
// object. `lbctl version` prints its own beside the running agent's, which
// the agent serves from what it read at its start (GET /v1/version).
// Imports nothing of lbctl's: the callers pass libbpf's version and the
// objects' paths in.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { VERSION } from './defaults.js';

// The bundle's build (Makefile: esbuild --define) replaces this name with
// the commit, so the image, which has no .git, still knows it. Unbundled
// (tap runs src/ directly) it is not defined.
declare const __LBCTL_COMMIT__: string | undefined;

/** HEAD when the bundle was built, with `-dirty` when tracked files differed from it; `unknown` unbundled or without git. */
export const BUILD_COMMIT: string = typeof __LBCTL_COMMIT__ === 'string' && __LBCTL_COMMIT__ !== '' ? __LBCTL_COMMIT__ : 'unknown';

export interface ObjectBuildId {
  /** The file's name (sock.bpf.o). */
  readonly name: string;
  readonly path: string;
  /**
   * SHA-256 of the object file's bytes, hex: the build id. The same sources
   * built by the same clang give the same bytes wherever the checkout is
   * (the Makefile maps the build directory out of the debug info); null
   * when the file could not be read.
   */
  readonly sha256: string | null;
  readonly error?: string;
}

/** The body of GET /v1/version, and each side of `lbctl version -o json`. */
export interface Versions {
  readonly lbctl: string;
  readonly commit: string;
  readonly node: string;
  readonly v8: string;
  readonly libbpf: string;
  /** uname -r of the kernel the process runs on. */
  readonly kernel: string;
  readonly objects: readonly ObjectBuildId[];
}

export function objectBuildId(file: string): ObjectBuildId {
  const name = path.basename(file);
  try {
    return { name, path: file, sha256: createHash('sha256').update(readFileSync(file)).digest('hex') };
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    return { name, path: file, sha256: null, error: e.code === 'ENOENT' ? 'missing' : (e.code ?? e.message) };
  }
}

/** This process's versions; `libbpf` from the addon, `objects` the paths of the BPF objects it loads (or would). */
export function collectVersions(opts: { libbpf: string; objects: readonly string[] }): Versions {
  return {
    lbctl: VERSION,
    commit: BUILD_COMMIT,
    node: process.version,
    v8: process.versions.v8,
    libbpf: opts.libbpf,
    kernel: os.release(),
    objects: opts.objects.map(objectBuildId),
  };
}
