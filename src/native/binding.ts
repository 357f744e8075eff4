/**
 * Loads the lb_native addon (build/Release, then build/Debug), once, lazily:
 * importing this module never touches the addon, so code that does not need
 * the kernel can be loaded and tested without a build.
 */
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { LbError } from '../base/errors.js';
import type { NativeBinding } from './native.js';

const require = createRequire(import.meta.url);

/** The package root: this file is dist/native/binding.js (or src/native/binding.ts under a TS loader). */
const packageRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Where the addon is looked for, in order. LBCTL_NATIVE overrides with one explicit path. */
export function candidatePaths(): string[] {
  const override = process.env['LBCTL_NATIVE'];
  if (override) return [path.resolve(override)];
  return [
    path.join(packageRoot, 'build', 'Release', 'lb_native.node'),
    path.join(packageRoot, 'build', 'Debug', 'lb_native.node'),
  ];
}

let cached: NativeBinding | undefined;

/** The addon; throws one LbError (code ENATIVE) naming every path tried, and why each failed. */
export function loadBinding(): NativeBinding {
  if (cached) return cached;
  const failures: string[] = [];
  for (const p of candidatePaths()) {
    try {
      cached = require(p) as NativeBinding;
      return cached;
    } catch (err) {
      failures.push(`  ${p}: ${err instanceof Error ? err.message.split('\n')[0] : String(err)}`);
    }
  }
  throw new LbError(
    `cannot load the lb_native addon; tried:\n${failures.join('\n')}\nrun \`make build\` to build it`,
    'ENATIVE',
  );
}
