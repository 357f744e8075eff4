// rtnetlink through the addon, in a network namespace of the test's own
// (by fd: the netlink socket is made there): links with their kind and
// master, addresses with their scope, and the watch calling back on changes.
import { execFileSync } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import t from 'tap';
import { addresses, IFF_UP, links, watch } from '../../src/native/rtnl.js';
import { SLOW } from '../helpers/sandbox.js';

if (process.getuid?.() !== 0) t.bailout('the native suites need root (network namespaces): run `make test` as root');

const ns = `lbctl-rtnl-${process.pid}`;
const ip = (...args: string[]): string => execFileSync('ip', ['-n', ns, ...args], { encoding: 'utf8' });
execFileSync('ip', ['netns', 'add', ns]);
const fd = openSync(`/run/netns/${ns}`, 'r');
t.teardown(() => {
  closeSync(fd);
  execFileSync('ip', ['netns', 'del', ns]);
});

const waitFor = async (cond: () => boolean, what: string): Promise<void> => {
  const end = Date.now() + 5000 * SLOW;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
};

t.test("a namespace's links and addresses, not the caller's", async (t) => {
  t.same(links(fd).map((l) => l.name), ['lo'], 'a new namespace has only lo');
  ip('link', 'add', 'rt0', 'type', 'veth', 'peer', 'name', 'rt1');
  ip('link', 'add', 'br0', 'type', 'bridge');
  ip('link', 'set', 'rt1', 'master', 'br0');
  ip('addr', 'add', '192.0.2.1/24', 'dev', 'rt0');
  ip('-6', 'addr', 'add', 'fd00:1::1/64', 'dev', 'rt0', 'nodad');
  ip('link', 'set', 'rt0', 'up');
  const l = new Map(links(fd).map((x) => [x.name, x]));
  t.match(l.get('rt0'), { kind: 'veth', master: 0, mtu: 1500, type: 1 });
  t.ok((l.get('rt0')!.flags & IFF_UP) !== 0, 'rt0 is up');
  t.match(l.get('br0'), { kind: 'bridge' });
  t.match(l.get('rt1'), { kind: 'veth', slaveKind: 'bridge', master: l.get('br0')!.index }, 'a bridge port names its master');
  t.match(l.get('rt0')!.address, /^([0-9a-f]{2}:){5}[0-9a-f]{2}$/);
  const a = addresses(fd).filter((x) => x.index === l.get('rt0')!.index);
  t.match(a.find((x) => x.family === 4), { address: '192.0.2.1', prefixLen: 24, scope: 0 });
  t.match(a.find((x) => x.family === 6 && x.scope === 0), { address: 'fd00:1::1', prefixLen: 64 });
  t.notOk(links().some((x) => x.name === 'rt0'), "the caller's namespace does not have it");
});

t.test('the watch calls back on link and address changes, and stops when closed', async (t) => {
  let calls = 0;
  const failures: unknown[] = [];
  // A callback that throws: its error is handed over, the watch goes on.
  const w = watch(() => {
    calls++;
    if (calls === 1) throw new Error('the callback failed');
  }, (err) => failures.push(err), fd);
  ip('link', 'add', 'wt0', 'type', 'veth', 'peer', 'name', 'wt1');
  await waitFor(() => calls > 0, 'a link event');
  const before = calls;
  ip('addr', 'add', '198.51.100.1/24', 'dev', 'wt0');
  await waitFor(() => calls > before, 'an address event');
  w.close();
  w.close();
  const closed = calls;
  ip('link', 'del', 'wt0');
  await new Promise((r) => setTimeout(r, 200 * SLOW));
  t.equal(calls, closed, 'no call after close');
  t.match(failures, [{ message: 'the callback failed' }], "the callback's error went to `failed`, and later events still came");
});
