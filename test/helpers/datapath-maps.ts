// The datapath object loaded (not attached) into a fresh pin directory under
// bpffs, for the native tests that write its maps through KernelLbMaps
// (test/native/maps.ts, resync.ts). bpffs is mounted when missing; the pin
// directory and the object are removed at teardown, even on failure.
import fs from 'node:fs';
import type { Test } from 'tap';
import { datapathObject, ensureBpffs } from '../../src/datapath/loader.js';
import { LB_MAP_NAMES, type LbMapSet } from '../../src/datapath/maps.js';
import { BpfObject } from '../../src/native/bpf.js';

/** Loads the datapath object with every lb map sized `entries`, pinned under a fresh directory named after `tag`. */
export async function loadDatapathMaps(t: Test, tag: string, entries: number): Promise<{ object: BpfObject; set: LbMapSet; maxEntries: Record<string, number> }> {
  const pinRoot = `/sys/fs/bpf/lbctl-test-${tag}-${process.pid}-${Math.random().toString(16).slice(2, 8)}`;
  ensureBpffs(pinRoot);
  fs.mkdirSync(pinRoot);
  let object: BpfObject | undefined;
  t.teardown(() => {
    object?.close();
    fs.rmSync(pinRoot, { recursive: true, force: true });
  });
  const maxEntries: Record<string, number> = {};
  for (const name of LB_MAP_NAMES) maxEntries[name] = entries;
  object = BpfObject.open(await datapathObject(), { pinRoot, maxEntries });
  await object.load();
  const set = {} as LbMapSet;
  for (const name of LB_MAP_NAMES) set[name] = object.map(name);
  return { object, set, maxEntries };
}
