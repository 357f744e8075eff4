import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { ConfigError } from '../base/errors.js';

/** Mounts bpffs at /sys/fs/bpf when bpfRoot lives there and it is not mounted yet. */
export function ensureBpffs(bpfRoot: string, mounts = readFileSync('/proc/mounts', 'utf8')): void {
  const bpfMounts = mounts
    .split('\n')
    .map((l) => l.split(' '))
    .filter(([, , type]) => type === 'bpf')
    .map(([, mp]) => mp!);
  const abs = path.resolve(bpfRoot);
  if (bpfMounts.some((mp) => abs === mp || abs.startsWith(mp.endsWith('/') ? mp : `${mp}/`))) return;
  if (abs.startsWith('/sys/fs/bpf/')) {
    mkdirSync('/sys/fs/bpf', { recursive: true });
    execFileSync('mount', ['-t', 'bpf', 'bpf', '/sys/fs/bpf']);
    return;
  }
  throw new ConfigError(`--bpf-root ${bpfRoot} is not on a bpf filesystem (mount one with: mount -t bpf bpf <dir>)`);
}
