/**
 * What this kernel can do, asked of the kernel itself: each feature lbctl
 * needs or can use is probed by loading a program that uses exactly it
 * (bpf/probe.c, one program at a time) or by making the call it names, not
 * by reading a version number (backports and distribution configs make
 * version numbers lie). The agent probes at start, logs one line, reports
 * the result in `lbctl status` and as `lbctl_datapath_feature{feature}`, and
 * refuses to start when a required feature is absent, naming it.
 *
 * Minimum kernel: 5.10 (the oldest of the vmtest matrix, docs/kernels.md).
 * The `since` of each feature is the mainline release that added it, for
 * the message only.
 */
import { mkdirSync, readFileSync, rmdirSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ConfigError } from '../base/errors.js';
import { BpfObject, isErrno, linkCreateProbe, unpin } from '../native/bpf.js';
import { ensureBpffs } from './bpffs.js';
import { udpTerminationSupport } from './terminate.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const PROBE_OBJECT = path.join(ROOT, 'bpf/.output/probe.bpf.o');

/** The stated minimum: every required feature exists from this release on. */
export const MINIMUM_KERNEL = '5.10';

export type FeatureName =
  | 'cgroup_connect4' | 'cgroup_connect6' | 'cgroup_sendmsg4' | 'cgroup_sendmsg6'
  | 'cgroup_recvmsg4' | 'cgroup_recvmsg6' | 'cgroup_getpeername4' | 'cgroup_getpeername6'
  | 'cgroup_sock_release' | 'socket_cookie' | 'release_socket_cookie' | 'netns_cookie'
  | 'map_batch' | 'cgroup_link' | 'link_update'
  | 'set_retval' | 'sock_destroy_kfunc' | 'inet_diag_destroy' | 'tcx';

interface FeatureSpec {
  readonly name: FeatureName;
  /** Required features refuse the start when absent; the others choose a fallback. */
  readonly required: boolean;
  /** The mainline release that added it (for messages; the probe decides). */
  readonly since: string;
  /** What it is, in a few words. */
  readonly what: string;
  /** Optional features: what lbctl does with and without it. */
  readonly yes?: string;
  readonly no?: string;
}

const SPECS: readonly FeatureSpec[] = [
  { name: 'cgroup_connect4', required: true, since: '4.17', what: 'cgroup/connect4 (BPF_CGROUP_INET4_CONNECT)' },
  { name: 'cgroup_connect6', required: true, since: '4.17', what: 'cgroup/connect6 (BPF_CGROUP_INET6_CONNECT)' },
  { name: 'cgroup_sendmsg4', required: true, since: '4.18', what: 'cgroup/sendmsg4 (BPF_CGROUP_UDP4_SENDMSG)' },
  { name: 'cgroup_sendmsg6', required: true, since: '4.18', what: 'cgroup/sendmsg6 (BPF_CGROUP_UDP6_SENDMSG)' },
  { name: 'cgroup_recvmsg4', required: true, since: '5.2', what: 'cgroup/recvmsg4 (BPF_CGROUP_UDP4_RECVMSG)' },
  { name: 'cgroup_recvmsg6', required: true, since: '5.2', what: 'cgroup/recvmsg6 (BPF_CGROUP_UDP6_RECVMSG)' },
  { name: 'cgroup_getpeername4', required: true, since: '5.8', what: 'cgroup/getpeername4 (BPF_CGROUP_INET4_GETPEERNAME)' },
  { name: 'cgroup_getpeername6', required: true, since: '5.8', what: 'cgroup/getpeername6 (BPF_CGROUP_INET6_GETPEERNAME)' },
  { name: 'cgroup_sock_release', required: true, since: '5.9', what: 'cgroup/sock_release (BPF_CGROUP_INET_SOCK_RELEASE)' },
  { name: 'socket_cookie', required: true, since: '5.7', what: 'bpf_get_socket_cookie in cgroup sock_addr programs' },
  { name: 'release_socket_cookie', required: true, since: '5.9', what: 'bpf_get_socket_cookie in cgroup/sock_release' },
  { name: 'netns_cookie', required: true, since: '5.7', what: 'bpf_get_netns_cookie in cgroup sock_addr programs' },
  { name: 'map_batch', required: true, since: '5.6', what: 'batched map updates (BPF_MAP_UPDATE_BATCH)' },
  { name: 'cgroup_link', required: true, since: '5.7', what: 'cgroup attach through a bpf_link (BPF_LINK_CREATE)' },
  { name: 'link_update', required: true, since: '5.7', what: 'BPF_LINK_UPDATE on a cgroup link (restarts and upgrades without a gap)' },
  {
    name: 'set_retval', required: false, since: '5.18', what: 'bpf_set_retval in cgroup sock_addr programs',
    yes: 'sock.bpf.o: a refused connect returns ECONNREFUSED', no: 'sock_compat.bpf.o: a refused connect returns EPERM',
  },
  {
    name: 'sock_destroy_kfunc', required: false, since: '6.5', what: 'the bpf_sock_destroy kfunc in iter/udp programs',
    yes: 'stale connected UDP sockets are destroyed by an iter/udp program', no: 'stale connected UDP sockets are destroyed over inet_diag where it can',
  },
  {
    name: 'inet_diag_destroy', required: false, since: '4.5', what: 'SOCK_DESTROY over inet_diag netlink (CONFIG_INET_DIAG_DESTROY)',
    yes: 'the fallback for stale connected UDP sockets', no: 'without the kfunc either, stale connected UDP sockets are left to their applications',
  },
  {
    name: 'tcx', required: false, since: '6.6', what: 'tc programs attached through tcx links (BPF_TCX_INGRESS)',
    yes: 'tc programs can attach through tcx links (--tc-attach auto does)', no: 'tc programs attach through clsact and cls_bpf',
  },
];

/** Program of bpf/probe.c that proves each load-probed feature. */
const PROGRAM: Partial<Record<FeatureName, string>> = {
  cgroup_connect4: 'probe_connect4', cgroup_connect6: 'probe_connect6',
  cgroup_sendmsg4: 'probe_sendmsg4', cgroup_sendmsg6: 'probe_sendmsg6',
  cgroup_recvmsg4: 'probe_recvmsg4', cgroup_recvmsg6: 'probe_recvmsg6',
  cgroup_getpeername4: 'probe_getpeername4', cgroup_getpeername6: 'probe_getpeername6',
  cgroup_sock_release: 'probe_sock_release', socket_cookie: 'probe_socket_cookie',
  release_socket_cookie: 'probe_release_cookie', netns_cookie: 'probe_netns_cookie',
  set_retval: 'probe_set_retval',
};

/** enum bpf_attach_type: BPF_TCX_INGRESS (6.6). */
const BPF_TCX_INGRESS = 46;

export interface FeatureResult {
  readonly name: FeatureName;
  readonly required: boolean;
  readonly available: boolean;
  readonly since: string;
  readonly what: string;
  /** Why it is absent (the kernel's answer), or what lbctl does with it. */
  readonly detail: string;
}

export interface DatapathFeatures {
  /** uname -r */
  readonly kernel: string;
  readonly results: readonly FeatureResult[];
}

export function has(features: DatapathFeatures, name: FeatureName): boolean {
  return features.results.find((r) => r.name === name)?.available ?? false;
}

export function missingRequired(features: DatapathFeatures): FeatureResult[] {
  return features.results.filter((r) => r.required && !r.available);
}

/** The kernel's own answer to a refused probe, short: the verifier's last meaningful line or the errno. */
function answer(err: unknown): string {
  const e = err as { code?: string; log?: string; message?: string };
  const lines = String(e.log ?? '').split('\n').map((l) => l.trim())
    .filter((l) => l && !l.startsWith('libbpf:') && !l.startsWith('--') && !l.startsWith('processed') && !l.startsWith(';'));
  const last = lines.at(-1);
  return last ? `${e.code ?? 'error'}: ${last}` : (e.code ?? (e.message ?? String(err)).split('\n')[0]!);
}

/** The operations a probe makes, injectable so the refusal path can be driven with a kernel that lacks a feature. */
export interface ProbeKernel {
  /** Loads one program of the probe object; rejects with the kernel's answer. */
  loadProgram(program: string): Promise<void>;
  /** Batch-updates the probe object's hash map. */
  mapBatch(): Promise<void>;
  /** Attaches a probe program to a child of `cgroup` through a pinned link, then updates that link. */
  cgroupLink(cgroup: string, pinDir: string): Promise<{ link?: unknown; update?: unknown }>;
  /** BPF_LINK_CREATE with BPF_TCX_INGRESS on a device that does not exist. */
  tcxLink(): Promise<void>;
  /** The two ways of destroying stale UDP sockets: undefined where each works, else why not. */
  udpTermination(): Promise<{ kfunc?: string; inetDiag?: string }>;
  release(): string;
}

/** The running kernel, through the probe object. */
export function realKernel(object = PROBE_OBJECT): ProbeKernel {
  const load = (programs: string[]): Promise<BpfObject> => BpfObject.openLoaded(object, { programs });
  return {
    async loadProgram(program) {
      (await load([program])).close();
    },
    async mapBatch() {
      const obj = await load([]);
      try {
        const keys = Buffer.alloc(8);
        keys.writeUInt32LE(1, 4);
        obj.map('probe_hash').batchUpdate(keys, Buffer.alloc(8), 2);
      } finally {
        obj.close();
      }
    },
    async cgroupLink(cgroup, pinDir) {
      // A child cgroup of the agent's, with no process in it: the probe
      // programs (which allow everything anyway) never see a socket.
      const child = path.join(cgroup, `lbctl-probe-${process.pid}`);
      const pin = path.join(pinDir, 'link');
      const obj = await load(['probe_connect4', 'probe_socket_cookie']);
      const out: { link?: unknown; update?: unknown } = {};
      try {
        try {
          mkdirSync(child);
        } catch (err) {
          if (!isErrno(err, 'EEXIST')) throw err; // left by a crashed agent of the same pid: ours
        }
        ensureBpffs(pinDir);
        mkdirSync(pinDir, { recursive: true });
        try {
          obj.attachCgroup('probe_connect4', child, pin);
        } catch (err) {
          out.link = err;
          return out;
        }
        try {
          // A second attach through the same pinned link is BPF_LINK_UPDATE.
          const r = obj.attachCgroup('probe_socket_cookie', child, pin);
          if (!r.updated) out.update = new Error('the pinned link was attached again instead of updated');
        } catch (err) {
          out.update = err;
        }
        return out;
      } finally {
        try {
          unpin(pin);
        } catch { /* not pinned */ }
        rmSync(pinDir, { recursive: true, force: true });
        try {
          rmdirSync(child);
        } catch { /* never made */ }
        obj.close();
      }
    },
    async tcxLink() {
      const obj = await load(['probe_tc']);
      try {
        linkCreateProbe(obj.progFd('probe_tc'), 0xffffffff, BPF_TCX_INGRESS);
      } finally {
        obj.close();
      }
    },
    udpTermination: () => udpTerminationSupport(),
    release() {
      try {
        return readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim();
      } catch {
        return 'unknown';
      }
    },
  };
}

export interface ProbeOptions {
  /** The cgroup the datapath attaches to; the link probes use a child of it. */
  readonly cgroup: string;
  /** A bpffs directory for the probe's link pin (removed afterwards). */
  readonly bpfRoot: string;
  readonly kernel?: ProbeKernel;
}

/** Probes every feature; never throws for a missing one (see requireFeatures). */
export async function probeFeatures(opts: ProbeOptions): Promise<DatapathFeatures> {
  // The link probe makes a child of the cgroup: never the cgroup itself.
  if (!opts.kernel && !statSync(opts.cgroup, { throwIfNoEntry: false })?.isDirectory()) {
    throw new ConfigError(`--cgroup ${opts.cgroup} is not a directory of the cgroup v2 hierarchy`);
  }
  const kernel = opts.kernel ?? realKernel();
  const found = new Map<FeatureName, string | undefined>(); // undefined: available; else why not
  for (const [name, program] of Object.entries(PROGRAM) as [FeatureName, string][]) {
    try {
      await kernel.loadProgram(program);
      found.set(name, undefined);
    } catch (err) {
      found.set(name, answer(err));
    }
  }
  try {
    await kernel.mapBatch();
    found.set('map_batch', undefined);
  } catch (err) {
    found.set('map_batch', answer(err));
  }
  if (found.get('cgroup_connect4') === undefined) {
    const r = await kernel.cgroupLink(opts.cgroup, path.join(opts.bpfRoot, `probe-${process.pid}`)).catch((err: unknown) => ({ link: err, update: undefined }));
    found.set('cgroup_link', r.link === undefined ? undefined : answer(r.link));
    found.set('link_update', r.link !== undefined ? 'not probed: no cgroup link' : r.update === undefined ? undefined : answer(r.update));
  } else {
    found.set('cgroup_link', 'not probed: cgroup/connect4 does not load');
    found.set('link_update', 'not probed: cgroup/connect4 does not load');
  }
  try {
    await kernel.tcxLink();
    found.set('tcx', 'the kernel attached to a device that does not exist');
  } catch (err) {
    // ENODEV: the kernel knows BPF_TCX_INGRESS and looked for the device.
    found.set('tcx', isErrno(err, 'ENODEV') ? undefined : answer(err));
  }
  const udp = await kernel.udpTermination().catch((err: unknown) => ({ kfunc: answer(err), inetDiag: answer(err) }));
  found.set('sock_destroy_kfunc', udp.kfunc);
  found.set('inet_diag_destroy', udp.inetDiag);
  const results = SPECS.map((s): FeatureResult => {
    const why = found.get(s.name);
    const available = why === undefined;
    const detail = available ? (s.yes ?? 'present') : s.no ? `${s.no} (${why})` : why!;
    return { name: s.name, required: s.required, available, since: s.since, what: s.what, detail };
  });
  return { kernel: kernel.release(), results };
}

/** Throws a ConfigError naming every missing required feature. */
export function requireFeatures(features: DatapathFeatures): void {
  const missing = missingRequired(features);
  if (missing.length === 0) return;
  if (missing.every((r) => r.detail.startsWith('EPERM') || r.detail.startsWith('not probed'))) {
    // Not the kernel: the process may not use bpf(2) at all.
    throw new ConfigError(
      `bpf(2) refused every probe with EPERM (${missing.length} required features unproven, first ${missing[0]!.name}): ` +
        'lbctl needs CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN (or CAP_SYS_ADMIN alone before 5.8), and kernel.unprivileged_bpf_disabled does not apply to them',
    );
  }
  const list = missing.map((r) => `${r.what} [${r.name}, Linux ${r.since}]: ${r.detail}`).join('; ');
  throw new ConfigError(
    `this kernel (${features.kernel}) lacks ${missing.length === 1 ? 'a feature' : `${missing.length} features`} lbctl needs: ${list}. ` +
      `lbctl needs Linux ${MINIMUM_KERNEL} or later with CONFIG_BPF_SYSCALL and CONFIG_CGROUP_BPF, run with CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN (docs/kernels.md)`,
  );
}

/** One line for the log: every feature, yes or no. */
export function featureLine(features: DatapathFeatures): string {
  const req = features.results.filter((r) => r.required);
  const reqMissing = req.filter((r) => !r.available).map((r) => r.name);
  const opt = features.results.filter((r) => !r.required).map((r) => `${r.name}=${r.available ? 'yes' : 'no'}`);
  return `kernel ${features.kernel}: ${reqMissing.length === 0 ? `all ${req.length} required features present` : `MISSING ${reqMissing.join(', ')}`}; optional: ${opt.join(' ')}`;
}

let setRetvalCache: Promise<boolean> | undefined;
/** Whether this kernel has bpf_set_retval in cgroup sock_addr programs (the running kernel's answer is probed once per process). */
export function hasSetRetval(kernel?: ProbeKernel): Promise<boolean> {
  const probe = (k: ProbeKernel): Promise<boolean> => k.loadProgram(PROGRAM.set_retval!).then(() => true, () => false);
  if (kernel) return probe(kernel);
  setRetvalCache ??= probe(realKernel());
  return setRetvalCache;
}
