// The feature probe's decisions, driven through its ProbeKernel seam with
// kernels that lack a feature the way real ones answer (the verifier's and
// bpf(2)'s own words): what is required refuses the start by name, what is
// optional chooses a fallback. test/native/features.ts runs the same probe
// on the real kernel, and the vmtest matrix on 5.10, 6.1 and 6.12.
import t from 'tap';
import { featureLine, has, missingRequired, probeFeatures, requireFeatures, type ProbeKernel } from '../../src/datapath/features.js';
import { BpfError } from '../../src/native/bpf.js';
import { chooseAttachMode } from '../../src/datapath/nodeport.js';

/** A kernel that refuses the named probe programs as a real one does. */
function kernel(opts: { refuse?: Record<string, string>; batch?: string; link?: string; update?: string; tcx?: 'ENODEV' | 'EINVAL'; udp?: { kfunc?: string; inetDiag?: string }; release?: string } = {}): ProbeKernel & { loaded: string[] } {
  const loaded: string[] = [];
  const fail = (code: string, log: string): BpfError => new BpfError(`bpf_object__load: ${code}`, { code, errno: 22, op: 'bpf_object__load', log });
  return {
    loaded,
    async loadProgram(program) {
      loaded.push(program);
      const why = opts.refuse?.[program];
      if (why) throw fail('EINVAL', `libbpf: prog '${program}': BPF program load failed: Invalid argument\n${why}\nprocessed 2 insns (limit 1000000)\n-- END PROG LOAD LOG --`);
    },
    async mapBatch() {
      if (opts.batch) throw fail(opts.batch, '');
    },
    async cgroupLink() {
      return {
        ...(opts.link ? { link: fail(opts.link, '') } : {}),
        ...(opts.update ? { update: fail(opts.update, '') } : {}),
      };
    },
    async tcxLink() {
      throw fail(opts.tcx ?? 'ENODEV', '');
    },
    udpTermination: async () => opts.udp ?? {},
    release: () => opts.release ?? '6.1.0-test',
  };
}

const probe = (k: ProbeKernel) => probeFeatures({ cgroup: '/nonexistent', bpfRoot: '/nonexistent', kernel: k });

t.test('a kernel with everything: nothing missing, the standard object, tcx', async (t) => {
  const f = await probe(kernel());
  t.same(missingRequired(f), []);
  t.ok(has(f, 'set_retval'));
  t.ok(has(f, 'tcx'), 'ENODEV from BPF_TCX_INGRESS on a missing device means tcx exists');
  t.doesNotThrow(() => requireFeatures(f));
  t.match(featureLine(f), /^kernel 6\.1\.0-test: all 15 required features present; optional: set_retval=yes sock_destroy_kfunc=yes inet_diag_destroy=yes tcx=yes$/);
});

t.test('5.10 as it is: no bpf_set_retval, no tcx; the compat object, clsact, and it starts', async (t) => {
  const f = await probe(kernel({ refuse: { probe_set_retval: '0: (85) call unknown#187\ninvalid func unknown#187' }, tcx: 'EINVAL', udp: { kfunc: 'the kernel has no bpf_sock_destroy kfunc' }, release: '5.10.0-32-amd64' }));
  t.same(missingRequired(f), []);
  t.notOk(has(f, 'set_retval'));
  t.notOk(has(f, 'tcx'));
  const retval = f.results.find((r) => r.name === 'set_retval')!;
  t.match(retval.detail, /sock_compat\.bpf\.o: a refused connect returns EPERM \(EINVAL: invalid func unknown#187\)/);
  t.match(f.results.find((r) => r.name === 'tcx')!.detail, /clsact/);
  t.doesNotThrow(() => requireFeatures(f));
  t.notOk(has(f, 'sock_destroy_kfunc'));
  t.ok(has(f, 'inet_diag_destroy'));
  t.match(f.results.find((r) => r.name === 'sock_destroy_kfunc')!.detail, /over inet_diag where it can \(the kernel has no bpf_sock_destroy kfunc\)/);
  t.match(featureLine(f), /set_retval=no sock_destroy_kfunc=no inet_diag_destroy=yes tcx=no/);
});

t.test('a 5.8 kernel (no cgroup/sock_release): the start is refused naming the feature, its attach type and the release that added it', async (t) => {
  const k = kernel({ refuse: { probe_sock_release: 'invalid attach type', probe_release_cookie: 'invalid attach type', probe_set_retval: 'invalid func unknown#187' }, release: '5.8.0' });
  const f = await probe(k);
  t.same(missingRequired(f).map((r) => r.name), ['cgroup_sock_release', 'release_socket_cookie']);
  t.throws(() => requireFeatures(f), {
    code: 'ECONFIG',
    message: /^this kernel \(5\.8\.0\) lacks 2 features lbctl needs: cgroup\/sock_release \(BPF_CGROUP_INET_SOCK_RELEASE\) \[cgroup_sock_release, Linux 5\.9\]: EINVAL: invalid attach type; .*lbctl needs Linux 5\.10 or later/,
  });
  t.match(featureLine(f), /MISSING cgroup_sock_release, release_socket_cookie/);
});

t.test('no BPF_LINK_UPDATE on cgroup links: refused by name', async (t) => {
  const f = await probe(kernel({ update: 'EINVAL' }));
  t.same(missingRequired(f).map((r) => r.name), ['link_update']);
  t.throws(() => requireFeatures(f), { message: /BPF_LINK_UPDATE on a cgroup link .*\[link_update, Linux 5\.7\]: EINVAL/ });
});

t.test('no cgroup links at all: the update is not probed, both are named', async (t) => {
  const f = await probe(kernel({ link: 'EINVAL' }));
  t.same(missingRequired(f).map((r) => r.name), ['cgroup_link', 'link_update']);
  t.match(f.results.find((r) => r.name === 'link_update')!.detail, /not probed: no cgroup link/);
});

t.test('no batched map updates: refused by name', async (t) => {
  const f = await probe(kernel({ batch: 'EINVAL' }));
  t.same(missingRequired(f).map((r) => r.name), ['map_batch']);
});

t.test('no BPF at all (EPERM, no capabilities): every load-probed feature is named missing, link probes are not attempted', async (t) => {
  const all = ['probe_connect4', 'probe_connect6', 'probe_sendmsg4', 'probe_sendmsg6', 'probe_recvmsg4', 'probe_recvmsg6', 'probe_getpeername4', 'probe_getpeername6', 'probe_sock_release', 'probe_socket_cookie', 'probe_release_cookie', 'probe_netns_cookie', 'probe_set_retval'];
  const k = kernel({ refuse: Object.fromEntries(all.map((p) => [p, 'Operation not permitted'])), batch: 'EPERM', tcx: 'EINVAL' });
  const f = await probe(k);
  t.equal(missingRequired(f).length, 15);
  t.match(f.results.find((r) => r.name === 'cgroup_link')!.detail, /not probed: cgroup\/connect4 does not load/);
  t.same(k.loaded, all, 'each program was loaded on its own, once');
});

t.test('--tc-attach: auto follows the probe, tcx without tcx refuses the start naming the flag, clsact anywhere', async (t) => {
  const with6 = await probe(kernel({ release: '6.6.0' }));
  const with510 = await probe(kernel({ tcx: 'EINVAL', release: '5.10.0-32-amd64' }));
  t.same(chooseAttachMode('auto', with6), { mode: 'tcx', why: '--tc-attach auto: the kernel has tcx' });
  t.same(chooseAttachMode('auto', with510), { mode: 'clsact', why: '--tc-attach auto: the kernel has no tcx' });
  t.same(chooseAttachMode('clsact', with6), { mode: 'clsact', why: '--tc-attach clsact' });
  t.same(chooseAttachMode('clsact', with510), { mode: 'clsact', why: '--tc-attach clsact' });
  t.same(chooseAttachMode('tcx', with6), { mode: 'tcx', why: '--tc-attach tcx' });
  t.throws(() => chooseAttachMode('tcx', with510), {
    code: 'ECONFIG',
    message: /^--tc-attach tcx: this kernel \(5\.10\.0-32-amd64\) has no tcx links \(Linux 6\.6\+\): use --tc-attach auto or clsact$/,
  });
});
