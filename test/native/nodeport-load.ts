// The tc object's load beside the socket object: it shares the socket
// object's maps by fd, pins its own next to them, adopts them at a second
// load, and makes anew a pinned tc map whose layout is not the object's
// (rather than reading old bytes in a new layout). No device is attached.
import { execFileSync } from 'node:child_process';
import { mkdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import t from 'tap';
import { hasSetRetval } from '../../src/datapath/features.js';
import { COMPAT_OBJECT, DEFAULT_OBJECT, ensureBpffs } from '../../src/datapath/loader.js';
import { NodePortDatapath } from '../../src/datapath/nodeport.js';
import { BpfObject, openPinnedMap } from '../../src/native/bpf.js';

if (process.getuid?.() !== 0) t.bailout('the native suites need root (BPF): run `make test` as root');

const pinRoot = `/sys/fs/bpf/lbctl-test-${process.pid}-npload`;
const mapsDir = path.join(pinRoot, 'maps');
const linksDir = path.join(pinRoot, 'links');
ensureBpffs(pinRoot);
mkdirSync(mapsDir, { recursive: true });
mkdirSync(linksDir, { recursive: true });
const open: Array<{ close(): void }> = [];
t.teardown(() => {
  for (const o of open.reverse()) o.close();
  rmSync(pinRoot, { recursive: true, force: true });
});

// The socket object this kernel loads (the agent's choice): before 5.18 the compat one.
const sock = await BpfObject.openLoaded((await hasSetRetval()) ? DEFAULT_OBJECT : COMPAT_OBJECT, { pinRoot: mapsDir });
open.push(sock);
const load = (): Promise<NodePortDatapath> => NodePortDatapath.load({ bpfRoot: pinRoot, sockObject: sock, mapsDir, linksDir, mode: 'clsact', maglevM: 251 });

t.test('first load: shared maps are the socket object\'s, its own are pinned', async (t) => {
  const dp = await load();
  open.push(dp);
  t.equal(dp.object.map('lb4_services').id, sock.map('lb4_services').id, 'lb4_services is the socket object\'s map');
  t.equal(dp.object.map('lb_node_addrs').id, sock.map('lb_node_addrs').id, 'and so is lb_node_addrs');
  const ct = openPinnedMap(path.join(mapsDir, 'lb4_ct'));
  t.equal(ct.id, dp.object.map('lb4_ct').id, 'lb4_ct is pinned under maps/');
  ct.close();
  t.same(dp.replacedMaps, [], 'nothing replaced');
});

t.test('second load adopts the pins; a pin of another layout is made anew', async (t) => {
  const before = openPinnedMap(path.join(mapsDir, 'lb4_ct'));
  const ctId = before.id;
  before.close();
  // lb_devices pinned with a wrong value size, as an older build might have left it.
  rmSync(path.join(mapsDir, 'lb_devices'));
  execFileSync('bpftool', ['map', 'create', path.join(mapsDir, 'lb_devices'), 'type', 'hash', 'key', '4', 'value', '16', 'entries', '256', 'name', 'lb_devices', 'flags', '1']);
  const dp = await load();
  open.push(dp);
  t.equal(dp.object.map('lb4_ct').id, ctId, 'lb4_ct adopted: the flows survive a restart');
  t.same(dp.replacedMaps, ['lb_devices'], 'the lb_devices of another layout was replaced');
  t.equal(dp.object.map('lb_devices').valueSize, 24, 'by one of the object\'s layout');
});
