// A worker thread that watches one frontend's master entry in a pinned
// lb4_services map and reports when its backend count becomes what it was
// asked for, stamped with the absolute time it saw it (performance.timeOrigin
// + performance.now(), comparable across threads and with the API server's
// send time). It runs beside the bench's main thread, which also serves the
// fake API server, so the server's work and its garbage collections do not
// delay the observation; it sleeps POLL_US between reads instead of spinning,
// so it leaves the CPU it shares with the server free.
import { parentPort, workerData } from 'node:worker_threads';
import { openPinnedMap } from '../src/native/bpf.js';
import { lb_service } from '../src/datapath/abi.gen.js';

/** Between two reads of the map (the observation's resolution; one read is a syscall of ~1 µs). */
const POLL_US = 20;

export interface PollerData {
  readonly mapPath: string;
  readonly key: Uint8Array;
}
/** Asks for the time the count is `want` (null: the entry absent); answered with 'armed' once polling, then a `PollerAnswer`. */
export interface PollerAsk {
  readonly want: number | null;
  readonly timeoutMs: number;
}
export type PollerAnswer = { readonly at: number } | { readonly error: string };

if (parentPort) {
  const port = parentPort;
  const { mapPath, key } = workerData as PollerData;
  const map = openPinnedMap(mapPath);
  const k = Buffer.from(key);
  const nap = new Int32Array(new SharedArrayBuffer(4));
  const now = (): number => performance.timeOrigin + performance.now();
  const count = (): number | null => {
    const v = map.lookup(k);
    return v ? lb_service.decode(v).count : null;
  };
  port.on('message', (ask: PollerAsk | 'close') => {
    if (ask === 'close') {
      map.close();
      port.close();
      return;
    }
    const deadline = now() + ask.timeoutMs;
    port.postMessage('armed');
    for (;;) {
      if (count() === ask.want) return port.postMessage({ at: now() } satisfies PollerAnswer);
      if (now() > deadline) return port.postMessage({ error: `the maps never showed count ${ask.want ?? 'absent'} in ${ask.timeoutMs} ms` } satisfies PollerAnswer);
      Atomics.wait(nap, 0, 0, POLL_US / 1000);
    }
  });
}
