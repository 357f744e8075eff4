// `lbctl agent` when a listener cannot be opened: one line that names the
// flag to change, for the errors a real listen() gives (a port in use, an
// address this host lacks) and those the API socket's checks give.
import t from 'tap';
import http from 'node:http';
import { listenError } from '../../src/cli/commands/agent.js';
import { listen } from '../../src/http/http.js';

/** The error a real listen() on host:port gives. */
async function listenFailure(host: string, port: number): Promise<unknown> {
  const server = http.createServer();
  try {
    await listen(server, port, host);
  } catch (err) {
    return err;
  }
  server.close();
  throw new Error(`listening on ${host}:${port} succeeded`);
}

t.test('a port in use: the flag, its value, the address, who may hold it, what to do', async (t) => {
  const holder = http.createServer();
  const port = await listen(holder, 0, '127.0.0.1');
  t.teardown(() => holder.close());
  const err = await listenFailure('127.0.0.1', port);
  const e = listenError({ flag: '--metrics-port', value: port, bind: { flag: '--metrics-bind-address', host: '127.0.0.1' } }, err);
  t.equal(e.message, `--metrics-port ${port}: address already in use on 127.0.0.1 (another process holds it); pick another port or stop it`);
  t.equal(e.cause, err, 'the listen error is kept as the cause');
  t.notMatch(e.message, /\n/, 'one line');

  // kube-proxy's ports and Cilium's health port name their likely holder.
  const inUse = Object.assign(new Error('listen EADDRINUSE: address already in use 0.0.0.0:10256'), { code: 'EADDRINUSE' });
  t.equal(
    listenError({ flag: '--health-port', value: 10256, bind: { flag: '--health-bind-address', host: '0.0.0.0' } }, inUse).message,
    '--health-port 10256: address already in use on 0.0.0.0 (another process, maybe kube-proxy, holds it); pick another port or stop it',
  );
  t.equal(
    listenError({ flag: '--health-mesh-port', value: 4240, sameOnEveryNode: true }, inUse).message,
    "--health-mesh-port 4240: address already in use (another process, maybe Cilium's health checks, holds it); pick another port (the same on every node) or stop it",
  );
});

t.test('an address this host lacks names the bind-address flag', async (t) => {
  // TEST-NET-1 (RFC 5737): never an address of this host; bind() fails, nothing is sent.
  const err = await listenFailure('192.0.2.1', 0);
  t.match(err, { code: 'EADDRNOTAVAIL' });
  t.equal(
    listenError({ flag: '--health-port', value: 10256, bind: { flag: '--health-bind-address', host: '192.0.2.1' } }, err).message,
    '--health-bind-address 192.0.2.1: not an address of this host; pick one it has, or 0.0.0.0 for all',
  );
});

t.test('a privileged port, and anything else', async (t) => {
  const denied = Object.assign(new Error('listen EACCES: permission denied 0.0.0.0:80'), { code: 'EACCES' });
  t.equal(
    listenError({ flag: '--health-port', value: 80, bind: { flag: '--health-bind-address', host: '0.0.0.0' } }, denied).message,
    '--health-port 80: permission denied on 0.0.0.0 (ports below 1024 need CAP_NET_BIND_SERVICE); pick another port',
  );
  const other = Object.assign(new Error('listen EMFILE: too many open files'), { code: 'EMFILE' });
  t.equal(listenError({ flag: '--metrics-port', value: 10249, bind: { flag: '--metrics-bind-address', host: '127.0.0.1' } }, other).message, '--metrics-port 10249: cannot listen on 127.0.0.1: listen EMFILE: too many open files');
});

t.test('the API socket: in use, not a socket, anything else', async (t) => {
  const path = '/run/lbctl/agent.sock';
  const inUse = Object.assign(new Error(`${path}: another agent is already serving its API there`), { code: 'EADDRINUSE' });
  t.equal(listenError({ flag: '--api-socket', value: path }, inUse).message, `--api-socket ${path}: another process listens there (another lbctl agent?); stop it or pick another path`);
  const notSocket = Object.assign(new Error(`${path} exists and is not a socket: refusing to replace it`), { code: 'EEXIST' });
  t.equal(listenError({ flag: '--api-socket', value: path }, notSocket).message, `--api-socket ${path}: the path exists and is not a socket; remove it or pick another path`);
  const denied = Object.assign(new Error("EACCES: permission denied, mkdir '/run/lbctl'"), { code: 'EACCES' });
  t.equal(listenError({ flag: '--api-socket', value: path }, denied).message, `--api-socket ${path}: EACCES: permission denied, mkdir '/run/lbctl'`);
});

