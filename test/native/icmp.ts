// ICMP echo through the addon (native/icmp.cc) and its Pinger (src/native/icmp.ts).
// Traffic goes only to loopback or into two network namespaces of the test's
// own: A, where the sockets are made (by fd: the addon opens them there), and
// B behind a veth, a router with a blackhole and an unreachable route, so a
// lost probe, a refused one and a live one can be told apart.
//
//   A: ia 10.77.0.1/24 fd00:77::1/64 ── veth ── B: ib 10.77.0.2/24 fd00:77::2/64
//   A routes 10.78.0.0/16, fd00:78::/32 via B; A itself has unreachable 10.79.0.1, fd00:79::1
//   B forwards: blackhole 10.78.9.9, fd00:78::9 (silence); unreachable 10.78.8.8, fd00:78::8 (ICMP error)
import { execFileSync } from 'node:child_process';
import { closeSync, openSync, readdirSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import t from 'tap';
import { loadBinding } from '../../src/native/binding.js';
import { Pinger, type PingResult } from '../../src/native/icmp.js';
import type { IcmpMessage } from '../../src/native/native.js';
import { SLOW } from '../helpers/sandbox.js';

if (process.getuid?.() !== 0) t.bailout('the native suites need root (network namespaces, SOCK_RAW): run `make test` as root');

const A = `lbctl-test-${process.pid}-icmp-a`;
const B = `lbctl-test-${process.pid}-icmp-b`;
const sh = (ns: string, script: string): void => void execFileSync('ip', ['netns', 'exec', ns, 'sh', '-ec', script]);
const ip = (ns: string, ...args: string[]): void => void execFileSync('ip', ['-n', ns, ...args]);
const fds: number[] = [];
t.teardown(() => {
  for (const fd of fds) closeSync(fd);
  for (const ns of [A, B]) {
    try {
      execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
    } catch {
      // not made (setup failed before it)
    }
  }
});
for (const ns of [A, B]) {
  execFileSync('ip', ['netns', 'add', ns]);
  ip(ns, 'link', 'set', 'lo', 'up');
}
ip(A, 'link', 'add', 'ia', 'type', 'veth', 'peer', 'name', 'ib', 'netns', B);
ip(A, 'addr', 'add', '10.77.0.1/24', 'dev', 'ia');
ip(A, '-6', 'addr', 'add', 'fd00:77::1/64', 'dev', 'ia', 'nodad');
ip(B, 'addr', 'add', '10.77.0.2/24', 'dev', 'ib');
ip(B, '-6', 'addr', 'add', 'fd00:77::2/64', 'dev', 'ib', 'nodad');
ip(A, 'link', 'set', 'ia', 'up');
ip(B, 'link', 'set', 'ib', 'up');
ip(A, 'route', 'add', '10.78.0.0/16', 'via', '10.77.0.2');
ip(A, '-6', 'route', 'add', 'fd00:78::/32', 'via', 'fd00:77::2');
ip(A, 'route', 'add', 'unreachable', '10.79.0.1');
ip(A, '-6', 'route', 'add', 'unreachable', 'fd00:79::1');
// B routes (forwarding on: a host that does not forward answers "unreachable" for everything),
// and sends its ICMP errors without the per-destination rate limit.
sh(B, `echo 1 > /proc/sys/net/ipv4/ip_forward
echo 1 > /proc/sys/net/ipv6/conf/all/forwarding
echo 0 > /proc/sys/net/ipv4/icmp_ratelimit
echo 0 > /proc/sys/net/ipv6/icmp/ratelimit`);
ip(B, 'route', 'add', 'blackhole', '10.78.9.9');
ip(B, '-6', 'route', 'add', 'blackhole', 'fd00:78::9');
ip(B, 'route', 'add', 'unreachable', '10.78.8.8');
ip(B, '-6', 'route', 'add', 'unreachable', 'fd00:78::8');
const nsA = openSync(`/run/netns/${A}`, 'r');
fds.push(nsA);

const openFds = (): number => readdirSync('/proc/self/fd').length;
const ok = (r: PingResult): number => {
  if (!r.ok) throw new Error(`ping failed: ${r.error}: ${r.detail}`);
  return r.rttMs;
};
const addr = {
  4: { live: '10.77.0.2', blackhole: '10.78.9.9', remoteUnreachable: '10.78.8.8', localUnreachable: '10.79.0.1', loopback: '127.0.0.1' },
  6: { live: 'fd00:77::2', blackhole: 'fd00:78::9', remoteUnreachable: 'fd00:78::8', localUnreachable: 'fd00:79::1', loopback: '::1' },
} as const;

// A new veth's IPv6 answers neighbour solicitations only about a second after
// link up (measured: a first probe 0.2 s after it waited 1 s for its reply, one
// at 0.8 s came back at once): wait until both families answer, so the timings
// below measure the prober, not the link coming up.
{
  const p = new Pinger({ netnsFd: nsA });
  for (const family of [4, 6] as const) {
    const until = Date.now() + 10_000 * SLOW;
    while (!(await p.ping(addr[family].live, 200)).ok) {
      if (Date.now() > until) throw new Error(`${addr[family].live} does not answer: the test topology is broken`);
    }
  }
  p.close();
}

t.test('auto: SOCK_RAW where ping sockets are not allowed, a ping socket where they are', async (t) => {
  const { IcmpSocket } = loadBinding();
  // A new namespace's ping_group_range is "1 0": nobody, root included.
  for (const family of [4, 6] as const) {
    const s = new IcmpSocket(family, () => {}, { netnsFd: nsA });
    t.equal(s.kind, 'raw', `IPv${family}: fell back to SOCK_RAW`);
    t.ok(s.id > 0 && s.id <= 0xffff, 'with an identifier of its own');
    s.close();
    t.throws(() => new IcmpSocket(family, () => {}, { kind: 'dgram', netnsFd: nsA }), { code: 'EACCES' }, 'dgram only: EACCES');
  }
  sh(A, 'echo "0 2147483647" > /proc/sys/net/ipv4/ping_group_range');
  for (const family of [4, 6] as const) {
    const s = new IcmpSocket(family, () => {}, { netnsFd: nsA });
    t.equal(s.kind, 'dgram', `IPv${family}: a ping socket once the range holds group 0`);
    t.ok(s.id > 0, `its identifier is the kernel's (${s.id})`);
    s.close();
    t.equal(s.closed, true);
    t.throws(() => s.send(addr[family].loopback, 1), { code: 'EBADF' }, 'send after close: EBADF');
  }
  t.throws(() => new IcmpSocket(5 as 4, () => {}), { code: 'EINVAL', op: 'argument' });
});

t.test("loopback in the test's own namespace: a reply with a small RTT", async (t) => {
  const p = new Pinger();
  t.teardown(() => p.close());
  for (const family of [4, 6] as const) {
    const rtt = ok(await p.ping(addr[family].loopback, 2000 * SLOW));
    t.ok(rtt > 0 && rtt < 200 * SLOW, `IPv${family} (${p.socketInfo(family).kind}): ${rtt.toFixed(3)} ms`);
  }
  const raw: IcmpMessage[] = [];
  const s = new (loadBinding().IcmpSocket)(4, (m) => raw.push(...m));
  t.teardown(() => s.close());
  s.send('127.0.0.1', 4242, Buffer.from('a token'));
  const until = Date.now() + 2000 * SLOW;
  while (raw.length === 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 5));
  t.match(raw, [{ type: 'reply', from: '127.0.0.1', id: s.id, seq: 4242, payload: Buffer.from('a token') }], 'the raw message');
});

for (const kind of ['raw', 'dgram'] as const) {
  t.test(`${kind}: 100 concurrent probes on one socket, each answered and matched to its own`, async (t) => {
    // Two pingers at once: with raw sockets each sees the other's replies too, and must ignore them.
    const p1 = new Pinger({ kind, netnsFd: nsA });
    const p2 = new Pinger({ kind, netnsFd: nsA });
    t.teardown(() => (p1.close(), p2.close()));
    const targets = Array.from({ length: 100 }, (_, i) => `127.0.0.${i + 1}`);
    const start = process.hrtime.bigint();
    const [r1, r2, r6] = await Promise.all([
      Promise.all(targets.map((a) => p1.ping(a, 3000 * SLOW))),
      Promise.all(targets.map((a) => p2.ping(a, 3000 * SLOW))),
      Promise.all(targets.map(() => p1.ping('::1', 3000 * SLOW))),
    ]);
    const ms = Number(process.hrtime.bigint() - start) / 1e6;
    for (const rs of [r1, r2]) {
      t.same(rs.map((r) => (r.ok ? r.from : r.error)), targets, 'every probe answered, by the address it was sent to');
    }
    t.ok(r6.every((r) => r.ok && r.from === '::1'), 'IPv6: all 100 answered');
    t.equal(p1.pending + p2.pending, 0, 'nothing left pending');
    t.equal(p1.socketInfo(4).kind, kind);
    t.ok(ms < 1000 * SLOW, `300 probes in ${ms.toFixed(1)} ms`);
  });

  for (const family of [4, 6] as const) {
    const a = addr[family];
    t.test(`${kind} IPv${family}: live, blackholed and unreachable destinations in a namespace`, async (t) => {
      const p = new Pinger({ kind, netnsFd: nsA });
      t.teardown(() => p.close());
      const first = ok(await p.ping(a.live, 2000 * SLOW));
      t.ok(first < 200 * SLOW, `${a.live} answers: ${first.toFixed(3)} ms`);

      // A lost probe takes its whole timeout, and delays nobody: a live probe sent with it answers at once.
      const timeout = 500 * SLOW;
      const order: string[] = [];
      const track = (name: string, pr: Promise<PingResult>): Promise<PingResult> => pr.then((r) => (order.push(name), r));
      const [lost, live] = await Promise.all([track('lost', p.ping(a.blackhole, timeout)), track('live', p.ping(a.live, timeout))]);
      t.match(lost, { ok: false, error: 'timeout' }, `${a.blackhole} (blackholed in B) times out`);
      if (!lost.ok) {
        // Not before the timeout, give or take the loop's clock: setTimeout counts from the time the
        // loop cached at the start of its iteration, which may be a few ms before the probe's hrtime.
        t.ok(lost.elapsedMs >= timeout * 0.95 && lost.elapsedMs < timeout + 250 * SLOW, `after ${lost.elapsedMs.toFixed(1)} ms (timeout ${timeout})`);
      }
      t.ok(ok(live) < 100 * SLOW, `the live probe sent with it: ${ok(live).toFixed(3)} ms`);
      t.same(order, ['live', 'lost'], 'the live probe settled first');

      // B's unreachable route: B sends an ICMP error, read from the error queue.
      const un = await p.ping(a.remoteUnreachable, timeout);
      t.match(un, { ok: false, error: 'unreachable', icmp: { offender: a.live, type: family === 4 ? 3 : 1 } }, `${a.remoteUnreachable}: ICMP unreachable from B`);
      if (!un.ok) t.ok(un.elapsedMs < timeout / 4, `known after ${un.elapsedMs.toFixed(2)} ms: ${un.detail}`);

      // A's own unreachable route: sendto fails.
      const local = await p.ping(a.localUnreachable, timeout);
      t.match(local, { ok: false, error: 'unreachable' }, `${a.localUnreachable}: unreachable locally`);
      if (!local.ok) t.ok(local.elapsedMs < timeout / 4, `known after ${local.elapsedMs.toFixed(2)} ms: ${local.detail}`);

      t.ok(ok(await p.ping(a.live, 2000 * SLOW)) < 200 * SLOW, 'the socket still works after the errors');
    });
  }

  t.test(`${kind}: close() settles pending probes with 'closed' and leaves no fd`, async (t) => {
    const before = openFds();
    const p = new Pinger({ kind, netnsFd: nsA });
    const pending = [p.ping(addr[4].blackhole, 30_000), p.ping(addr[6].blackhole, 30_000), p.ping(addr[4].blackhole, 30_000)];
    t.equal(p.pending, 3);
    t.equal(openFds(), before + 2, 'one socket per family while open');
    const start = Date.now();
    p.close();
    p.close();
    const rs = await Promise.all(pending);
    t.ok(Date.now() - start < 100 * SLOW, 'at once');
    t.same(rs.map((r) => (r.ok ? 'ok' : r.error)), ['closed', 'closed', 'closed']);
    t.equal(openFds(), before, 'both sockets closed');
    t.match(await p.ping(addr[4].live, 1000), { ok: false, error: 'closed' }, 'a ping after close');
  });
}

t.test('a socket nobody holds any more is closed by the garbage collector', async (t) => {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  const before = openFds();
  (() => {
    const { IcmpSocket } = loadBinding();
    // A callback closing over its socket: the JS object holds the callback, so the cycle is collectable.
    const s = new IcmpSocket(4, () => s.kind, { netnsFd: nsA });
    s.send('127.0.0.1', 1);
  })();
  t.equal(openFds(), before + 1);
  const until = Date.now() + 5000 * SLOW;
  while (openFds() !== before && Date.now() < until) {
    gc();
    await new Promise((r) => setImmediate(r));
  }
  t.equal(openFds(), before, 'the finalizer closed the fd');
});

t.test('bad arguments reject, they are not network failures', async (t) => {
  const p = new Pinger({ netnsFd: nsA });
  t.teardown(() => p.close());
  await t.rejects(p.ping('not-an-address', 100), { code: 'EINVAL', op: 'argument' });
  await t.rejects(p.ping('127.0.0.1', -1), { code: 'EINVAL' });
  t.equal(p.pending, 0);
});
