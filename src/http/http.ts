// The small HTTP helpers the agent's servers share (the health port, the
// metrics port, the local API): listen, close, answer. No checks and no
// metrics live here, so health.ts and metrics.ts both import it and
// neither imports the other's server code.
import type http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface RunningServer {
  readonly port: number;
  close(): Promise<void>;
}

/** Listens on host:port (0: any free port); resolves with the port, rejects with the listen error (EADDRINUSE, …). */
export async function listen(server: http.Server, port: number, host: string): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    const onError = (err: Error): void => reject(err);
    server.once('error', onError);
    server.listen(port, host, () => {
      server.off('error', onError);
      resolve();
    });
  });
  return (server.address() as AddressInfo).port;
}

/** Stops listening and ends open connections (keep-alive ones too), so close never hangs. */
export function closeServer(server: http.Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}

/** A plain answer that no browser sniffs or caches. */
export function send(res: http.ServerResponse, status: number, body: string, type = 'text/plain; charset=utf-8'): void {
  res.writeHead(status, { 'Content-Type': type, 'X-Content-Type-Options': 'nosniff', 'Cache-Control': 'no-store' });
  res.end(body);
}
