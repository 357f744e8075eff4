// The switch of the pinned links is all or nothing. A datapath is loaded into
// a sandbox and serves a ClusterIP service; then loads of the same object
// fail at the n-th link (n = 1..N, through the loader's `attach` injection,
// with a real kernel error: bpf_link_update with a program of another type,
// EINVAL). After each failure every pinned link must run exactly the program
// it ran before, links this load created must be gone, a resize's staging
// maps must be gone with the old maps still pinned and used by the programs,
// and connections through the sandbox must still be translated.
import { existsSync } from 'node:fs';
import path from 'node:path';
import t, { type Test } from 'tap';
import { attachCgroup, LinkSwitchError, loadDatapath, type AttachFn, type MapSizes } from '../../src/datapath/loader.js';
import { desiredState } from '../../src/model/desired.js';
import { validateEndpointSlice, validateService } from '../../src/model/k8s.js';
import { pinnedLinkInfo, pinnedLinkUpdate, unpin } from '../../src/native/bpf.js';
import { Reconciler } from '../../src/reconcile/reconciler.js';
import { service, slice } from '../fakes/objects.js';
import { createSandbox, HTTP_PORT, type Sandbox } from '../helpers/sandbox.js';

const VIP = '10.96.0.10';
const SMALL: MapSizes = { services: 64, backends: 128, sockRevNat: 4096 };
const BIG: MapSizes = { services: 128, backends: 256, sockRevNat: 4096 };

/** The real attach, except that the n-th call makes the kernel refuse the switch (EINVAL: a program of another type). */
function failAt(n: number, calls: string[]): AttachFn {
  return (object, program, cgroup, linkPin) => {
    calls.push(program);
    if (calls.length !== n) return attachCgroup(object, program, cgroup, linkPin);
    const other = object.programNames().find((p) => object.progInfo(p).type !== object.progInfo(program).type)!;
    // Through the same pinned link the real attach would update: the kernel's own error.
    if (!existsSync(linkPin)) throw new Error(`test: no pinned link ${linkPin} to fail`);
    pinnedLinkUpdate(linkPin, object.progFd(other));
    throw new Error(`test: bpf_link_update(${linkPin}) took a ${other} program`);
  };
}

type LinkState = Record<string, { id: number; progId: number }>;

function linkState(sb: Sandbox): LinkState {
  const dir = path.join(sb.bpfRoot, 'links');
  const out: LinkState = {};
  for (const name of ['lb_connect4', 'lb_connect6', 'lb_sendmsg4', 'lb_sendmsg6', 'lb_recvmsg4', 'lb_recvmsg6', 'lb_getpeername4', 'lb_getpeername6', 'lb_post_bind4', 'lb_post_bind6', 'lb_sock_release']) {
    const p = path.join(dir, name);
    if (!existsSync(p)) continue;
    const li = pinnedLinkInfo(p);
    out[name] = { id: li.id, progId: li.progId };
  }
  return out;
}

async function mapIds(sb: Sandbox): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const m of ['lb4_services', 'lb4_backends', 'lb4_reverse_nat', 'lb4_sock_revnat']) {
    out[m] = (await sb.bpftool<{ id: number }>(['map', 'show', 'pinned', path.join(sb.bpfRoot, 'maps', m)])).id;
  }
  return out;
}

/** Three HTTP requests to the service: each must reach a backend and report the service as its peer. */
async function translates(t: Test, sb: Sandbox, what: string): Promise<void> {
  const r = await sb.client<{ results: Array<{ peer?: string; body?: string; error?: string }> }>(['tcp', VIP, '80', '--count', '3']);
  const backends = sb.backends.map((b) => `${b.v4}:${HTTP_PORT}`);
  t.ok(r.results.every((x) => x.peer === `${VIP}:80` && backends.includes(x.body ?? '')), `${what}: connections to ${VIP}:80 reach a backend (${JSON.stringify(r.results)})`);
}

t.test('a failure at any link switches every link back; connections keep being translated', async (t) => {
  const sb = await createSandbox(t, { backends: 2, agent: false });
  const opts = { bpfRoot: sb.bpfRoot, cgroup: sb.cgroup };
  const first = await loadDatapath({ ...opts, sizes: SMALL });
  const s = validateService(service('web', [VIP], [{ name: 'http', port: 80 }]));
  const e = validateEndpointSlice(slice('web-v4', 'web', 'IPv4', [{ name: 'http', port: HTTP_PORT }], sb.backends.map((b) => ({ addresses: [b.v4] }))));
  if (!s.ok || !e.ok) throw new Error('bad fixture');
  const res = new Reconciler(first.maps).sync(desiredState({ services: [s.value], slices: [e.value] }).frontends, { prune: true });
  t.ok(res.applied > 0, `the service is programmed (${res.applied} writes)`);
  const programs = first.programs.map((p) => p.name);
  first.close();
  await translates(t, sb, 'the first load');
  const before = linkState(sb);
  t.equal(Object.keys(before).length, programs.length, `${programs.length} pinned links`);
  const idsBefore = await mapIds(sb);

  for (const [kind, sizes] of [['reload', SMALL], ['resize', BIG]] as const) {
    for (let n = 1; n <= programs.length; n++) {
      const calls: string[] = [];
      const err = await loadDatapath({ ...opts, sizes, attach: failAt(n, calls) }).then(
        (dp) => (dp.close(), undefined),
        (e: unknown) => e,
      );
      const what = `${kind}, failing at link ${n} (${programs[n - 1]})`;
      t.ok(err instanceof LinkSwitchError, `${what}: the load fails with LinkSwitchError`);
      t.equal(calls.length, n, `${what}: the switch stopped at that link`);
      t.match((err as Error).message, new RegExp(`program ${programs[n - 1]} \\(link ${n} of ${programs.length}.*EINVAL.*every link was switched back`), `${what}: the error names the program and the kernel's error`);
      t.same((err as LinkSwitchError).notReverted, [], `${what}: nothing left half-switched`);
      t.same(linkState(sb), before, `${what}: every pinned link runs the program it ran before`);
      t.notOk(existsSync(path.join(sb.bpfRoot, 'maps-next')), `${what}: no staging maps are left`);
      t.same(await mapIds(sb), idsBefore, `${what}: the old maps are still the pinned ones`);
      if (kind === 'resize') {
        // The programs the links run use the pinned maps (not a staging copy).
        const prog = await sb.bpftool<{ map_ids: number[] }>(['prog', 'show', 'id', String(before['lb_connect4']!.progId)]);
        t.ok(prog.map_ids.includes(idsBefore['lb4_services']!), `${what}: lb_connect4 still uses the pinned lb4_services`);
      }
      await translates(t, sb, what);
    }
  }

  // A link this load creates (its pin was gone) is removed again when a later one fails.
  const fresh = programs[0]!;
  unpin(path.join(sb.bpfRoot, 'links', fresh));
  const { [fresh]: _gone, ...rest } = before;
  const calls: string[] = [];
  await t.rejects(loadDatapath({ ...opts, sizes: SMALL, attach: failAt(programs.length, calls) }), LinkSwitchError, 'a load that creates a link and then fails');
  t.same(calls[0], fresh, `${fresh} was attached afresh first`);
  t.notOk(existsSync(path.join(sb.bpfRoot, 'links', fresh)), `the link it created for ${fresh} is unpinned (detached)`);
  t.same(linkState(sb), rest, 'the other links run their old programs');

  // And a load that succeeds switches everything.
  const ok = await loadDatapath({ ...opts, sizes: BIG });
  const after = linkState(sb);
  ok.close();
  t.equal(Object.keys(after).length, programs.length, 'every link pinned again');
  for (const name of Object.keys(rest)) {
    t.equal(after[name]!.id, before[name]!.id, `${name}: the same link`);
    t.not(after[name]!.progId, before[name]!.progId, `${name}: now the new program`);
  }
  t.notOk(existsSync(path.join(sb.bpfRoot, 'maps-next')), 'the resize committed');
  await translates(t, sb, 'after a successful resize');
});
