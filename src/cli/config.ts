// `lbctl agent --config FILE`: the agent's settings as a file (the
// DaemonSet's ConfigMap), as kube-proxy's --config takes a
// KubeProxyConfiguration. Every key is the long name of one of the agent's
// flags in camelCase (--min-sync-period: minSyncPeriod), and every value is
// parsed by that flag's own parser, so a file and a command line cannot mean
// different things. A flag given on the command line overrides the file,
// the file overrides the defaults (commander's value sources record which
// is which). An unknown key, a wrong type or a bad value refuses the start,
// naming the file and the key.
import { readFileSync } from 'node:fs';
import { InvalidArgumentError, type Command, type Option } from 'commander';
import yaml from 'js-yaml';
import { ConfigError } from '../base/errors.js';

export const CONFIG_API_VERSION = 'lbctl.io/v1alpha1';
export const CONFIG_KIND = 'AgentConfiguration';
/** A configuration is a handful of keys: a bigger file is not one. */
const MAX_CONFIG_BYTES = 1 << 20;

/** Keys of the file that are not settings, and flags the file cannot set. */
const HEADER = new Set(['apiVersion', 'kind']);
const NOT_IN_FILE = new Set(['config']);

/**
 * Applies FILE's settings to `cmd`'s options whose value still comes from
 * the default (a flag on the command line wins). Returns the keys applied.
 */
export function applyConfigFile(cmd: Command, file: string): string[] {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError(`--config ${file}: ${(err as Error).message}`);
  }
  if (Buffer.byteLength(text) > MAX_CONFIG_BYTES) throw new ConfigError(`--config ${file}: larger than ${MAX_CONFIG_BYTES} bytes`);
  let doc: unknown;
  try {
    doc = yaml.load(text, { filename: file });
  } catch (err) {
    throw new ConfigError(`--config ${file}: not YAML: ${(err as Error).message}`);
  }
  if (doc === null || doc === undefined) return [];
  if (typeof doc !== 'object' || Array.isArray(doc)) throw new ConfigError(`--config ${file}: expected a mapping of settings, found ${Array.isArray(doc) ? 'a list' : typeof doc}`);
  const settings = doc as Record<string, unknown>;
  if (settings.apiVersion !== CONFIG_API_VERSION || settings.kind !== CONFIG_KIND) {
    throw new ConfigError(`--config ${file}: expected apiVersion ${CONFIG_API_VERSION} and kind ${CONFIG_KIND}, found ${JSON.stringify(settings.apiVersion ?? null)} and ${JSON.stringify(settings.kind ?? null)}`);
  }
  const byKey = new Map<string, Option>();
  for (const o of cmd.options) if (!NOT_IN_FILE.has(o.attributeName())) byKey.set(o.attributeName(), o);
  const applied: string[] = [];
  for (const [key, raw] of Object.entries(settings)) {
    if (HEADER.has(key)) continue;
    const option = byKey.get(key);
    if (!option) {
      throw new ConfigError(`--config ${file}: unknown setting ${JSON.stringify(key)} (settings are the agent's flags in camelCase: ${[...byKey.keys()].sort().join(', ')})`);
    }
    const value = settingValue(option, key, raw, file);
    // The command line wins over the file; the file over the default.
    const source = cmd.getOptionValueSource(key);
    if (source === 'cli' || source === 'env') continue;
    cmd.setOptionValueWithSource(key, value, 'config');
    applied.push(key);
  }
  return applied;
}

/** One setting's value, parsed as its flag would be. */
function settingValue(option: Option, key: string, raw: unknown, file: string): unknown {
  const where = `--config ${file}: ${key}`;
  if (raw === null) throw new ConfigError(`${where}: no value (remove the key for the default)`);
  // A boolean flag (--external-clusterip) or a negatable one (--no-nodeport: nodeport).
  if (option.isBoolean() || option.negate) {
    if (typeof raw !== 'boolean') throw new ConfigError(`${where}: expected true or false, found ${JSON.stringify(raw)}`);
    return raw;
  }
  let text: string;
  if (typeof raw === 'string') text = raw;
  else if (typeof raw === 'number' && Number.isFinite(raw)) text = String(raw);
  else if (Array.isArray(raw) && raw.every((x) => typeof x === 'string' || typeof x === 'number')) text = raw.join(',');
  else throw new ConfigError(`${where}: expected a string, a number or a list of them, found ${JSON.stringify(raw)}`);
  if (!option.parseArg) return text;
  try {
    return option.parseArg(text, undefined as unknown);
  } catch (err) {
    if (err instanceof InvalidArgumentError || err instanceof ConfigError) throw new ConfigError(`${where}: ${JSON.stringify(text)}: ${err.message}`);
    throw err;
  }
}

// The two micro signs Go accepts (U+00B5 and U+03BC), escaped: one character
// above U+00FF anywhere in the agent's bundle makes V8 keep its whole source
// as two bytes a character (Makefile, BUNDLE).
const UNIT_MS: Record<string, number> = { ns: 1e-6, us: 1e-3, '\u00b5s': 1e-3, '\u03bcs': 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/**
 * A duration in milliseconds: Go's time.ParseDuration form, which
 * kube-proxy's flags and configuration take ("500ms", "30s", "1m30s",
 * "1.5h"), or a bare integer, read as milliseconds (lbctl's flags took
 * milliseconds before they took durations). Hand-written rather than a
 * library: the npm parsers accept far more ("1 day", "2 weeks") than Go
 * does, and a setting kube-proxy refuses should be refused here too.
 */
export function parseDuration(text: string): number {
  const s = text.trim();
  if (/^\d+$/.test(s)) return Number(s);
  const m = /^((?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|\u00b5s|\u03bcs|ms|s|m|h))+$/.exec(s);
  if (!m) throw new InvalidArgumentError('expected a duration such as 500ms, 30s, 1m30s or 1h (or milliseconds)');
  let ms = 0;
  for (const part of s.matchAll(/(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)/g)) ms += Number(part[1]) * UNIT_MS[part[2]!]!;
  const whole = Math.round(ms);
  if (!Number.isSafeInteger(whole) || whole > 2 ** 31 - 1) throw new InvalidArgumentError('longer than 24 days, the longest timer Node keeps');
  return whole;
}

/** Formats milliseconds as a duration the way Go prints one (for help and docs). */
export function formatDuration(ms: number): string {
  if (ms === 0) return '0s';
  if (ms % 3_600_000 === 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0) return `${ms / 60_000}m`;
  if (ms % 1000 === 0) return `${ms / 1000}s`;
  return `${ms}ms`;
}
