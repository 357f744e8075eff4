// The memory limit a DaemonSet sets (limits.memory: the container's cgroup
// limit) as bin/lbctl, the image's entrypoint, turns it into V8's heap cap:
// the limit less LBCTL_NON_HEAP_MIB (160), at least half the limit; none
// without a limit; a --max-old-space-size given by the operator wins. Run
// through the real wrapper in a real memory cgroup (cgroup v1's memory
// hierarchy here, where the cgroup2 mount has no controllers), with node
// asked for its own heap_size_limit.
import { execFileSync } from 'node:child_process';
import t from 'tap';
import { LBCTL } from '../helpers/sandbox.js';
import { memoryHierarchy, MemoryCgroup } from '../../bench/world.js';

const MiB = 2 ** 20;
const hierarchy = memoryHierarchy();

/** V8's heap_size_limit in MiB, of node as bin/lbctl starts it (in `cg`, when given). */
function heapLimitMiB(cg: MemoryCgroup | undefined, env: Record<string, string> = {}): number {
  // -p before the bundle's path: node prints the expression and never runs the CLI.
  const flags = `-p require("v8").getHeapStatistics().heap_size_limit`;
  const [cmd, args] = cg ? cg.wrap(LBCTL, []) : [LBCTL, []];
  const out = execFileSync(cmd, args, { encoding: 'utf8', env: { ...process.env, LBCTL_NODE_FLAGS: flags, ...env } });
  return Number(out.trim()) / MiB;
}

t.ok(hierarchy, 'a memory controller is mounted (cgroup v1 memory, or cgroup2 with memory)');

t.test('under a limit, V8 is capped at the limit less 160 MiB', async (t) => {
  const cg = MemoryCgroup.make(`lbctl-test-${process.pid}-memlimit`, 512 * MiB)!;
  t.teardown(() => cg.close());
  const heap = heapLimitMiB(cg);
  // heap_size_limit is the old space's cap plus the young generation's (3 × 2 MiB semi-spaces) and rounding.
  t.ok(heap >= 352 && heap <= 352 + 16, `512 MiB limit: heap cap ${heap.toFixed(1)} MiB (352 + young generation)`);
  t.ok(heap < 512, 'below the limit, so V8 collects before the kernel kills');

  const small = MemoryCgroup.make(`lbctl-test-${process.pid}-memlimit-small`, 256 * MiB)!;
  t.teardown(() => small.close());
  const h2 = heapLimitMiB(small);
  t.ok(h2 >= 128 && h2 <= 128 + 16, `256 MiB limit: at least half the limit, ${h2.toFixed(1)} MiB (node alone would take 262, above the limit)`);

  const own = heapLimitMiB(cg, { NODE_OPTIONS: '--max-old-space-size=200' });
  t.ok(own >= 200 && own <= 200 + 16, `an operator's --max-old-space-size wins: ${own.toFixed(1)} MiB`);
  const tuned = heapLimitMiB(cg, { LBCTL_NON_HEAP_MIB: '100' });
  t.ok(tuned >= 412 && tuned <= 412 + 16, `LBCTL_NON_HEAP_MIB=100: ${tuned.toFixed(1)} MiB`);
});

t.test('without a limit, node keeps its default', async (t) => {
  const heap = heapLimitMiB(undefined);
  const plain = Number(execFileSync('node', ['--max-semi-space-size=2', '-p', 'require("v8").getHeapStatistics().heap_size_limit'], { encoding: 'utf8' }).trim()) / MiB;
  t.equal(Math.round(heap), Math.round(plain), `the same heap cap as a plain node (${plain.toFixed(0)} MiB)`);
});
