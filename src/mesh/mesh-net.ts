// The health mesh's network side: the /hello listener peers probe, and the
// HTTP probe of a peer's /hello. The listener runs in a worker thread of its
// own, so that an agent whose main thread is busy (a cold sync of 100,000
// services) still answers its peers: the mesh measures the path to the
// node, not the agent's event loop.
import http from 'node:http';
import { Worker } from 'node:worker_threads';
import { classifyErrno } from '../native/icmp.js';
import type { Outcome } from './mesh.js';

export interface HelloServer {
  readonly port: number;
  close(): Promise<void>;
}

// The worker's whole program: an HTTP server answering GET /hello with the
// node's name, nothing behind it. Plain JavaScript, evaluated in the worker
// (the agent is one bundled file: a worker script beside it would not be).
const HELLO_WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
const http = require('node:http');
const body = JSON.stringify({ node: workerData.node }) + '\\n';
const server = http.createServer((req, res) => {
  if (req.url === '/hello' && (req.method === 'GET' || req.method === 'HEAD')) {
    res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body), 'Connection': 'close' });
    res.end(req.method === 'HEAD' ? undefined : body);
    return;
  }
  res.writeHead(404, { 'Connection': 'close' });
  res.end();
});
server.keepAliveTimeout = 1000;
const tryListen = (hosts) => {
  const onError = (err) => {
    if (hosts.length > 1 && (err.code === 'EAFNOSUPPORT' || err.code === 'EADDRNOTAVAIL')) return tryListen(hosts.slice(1));
    parentPort.postMessage({ error: err.code || 'error', message: err.message });
  };
  server.once('error', onError);
  server.listen({ port: workerData.port, host: hosts[0] }, () => {
    server.off('error', onError);
    parentPort.postMessage({ port: server.address().port });
  });
};
tryListen(workerData.host === '::' ? ['::', '0.0.0.0'] : [workerData.host]);
parentPort.on('message', (m) => { if (m === 'close') server.close(() => process.exit(0)); });
`;

/**
 * Starts the /hello listener on `port` (0: any) of `host` (default: every
 * address, IPv6 and IPv4; IPv4 only where the node has no IPv6).
 */
export function startHelloServer(opts: { port: number; host?: string; node: string }): Promise<HelloServer> {
  const worker = new Worker(HELLO_WORKER, { eval: true, workerData: { port: opts.port, host: opts.host ?? '::', node: opts.node }, resourceLimits: { maxOldGenerationSizeMb: 16, maxYoungGenerationSizeMb: 4 } });
  worker.unref();
  return new Promise((resolve, reject) => {
    const onExit = (code: number): void => reject(new Error(`the /hello listener's worker exited (${code}) before listening`));
    worker.once('error', reject);
    worker.once('exit', onExit);
    worker.once('message', (m: { port?: number; error?: string; message?: string }) => {
      worker.off('exit', onExit);
      worker.off('error', reject);
      if (m.port === undefined) {
        void worker.terminate();
        reject(Object.assign(new Error(`health mesh: cannot listen on port ${opts.port}: ${m.message ?? m.error}`), { code: m.error }));
        return;
      }
      resolve({
        port: m.port,
        close: async () => {
          worker.postMessage('close');
          const t = setTimeout(() => void worker.terminate(), 1000);
          await new Promise<void>((r) => worker.once('exit', () => r()));
          clearTimeout(t);
        },
      });
    });
  });
}

/** An errno of a failed connection, named as the ICMP probe names its errors (classifyErrno). */
export function classify(code: string | undefined): string {
  if (code === undefined) return 'error';
  if (code === 'ETIMEDOUT') return 'timeout';
  return classifyErrno(code === 'EHOSTDOWN' ? 'EHOSTUNREACH' : code);
}

/** GET http://address:port/hello on a new connection, bounded by `timeoutMs`: its RTT (connect to answer) or the error. */
export function httpProbe(address: string, port: number, timeoutMs: number): Promise<Outcome> {
  return new Promise((resolve) => {
    const start = process.hrtime.bigint();
    let done = false;
    const finish = (o: Outcome): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      req.destroy();
      resolve(o);
    };
    const req = http.request({ host: address, port, path: '/hello', method: 'GET', agent: false, headers: { Connection: 'close' } }, (res) => {
      res.resume();
      res.on('end', () => {
        const rttMs = Number(process.hrtime.bigint() - start) / 1e6;
        finish(res.statusCode === 200 ? { ok: true, rttMs } : { ok: false, error: `http-${res.statusCode}`, detail: `GET /hello answered ${res.statusCode}` });
      });
      res.on('error', (err: NodeJS.ErrnoException) => finish({ ok: false, error: classify(err.code), detail: err.message }));
    });
    const timer = setTimeout(() => finish({ ok: false, error: 'timeout', detail: `no answer within ${timeoutMs} ms` }), timeoutMs);
    req.on('error', (err: NodeJS.ErrnoException) => finish({ ok: false, error: classify(err.code), detail: err.message }));
    req.end();
  });
}
