// Probe targets for the readiness-probe tests (issue 17), run in the
// backend netns beside backend.py:
//
//   node probe-backend.mjs --control DIR --addr 10.244.1.1 [--addr …]
//        [--echo 7000] [--http 8081] [--tcp 8082] [--grpc 8083]
//
// Per address:
//   echo  a TCP line echo as backend.py --tcp-echo answers ("ADDR:PORT|PEER|line\n"):
//         client.py tcp-long's long-lived connections; never affected by the control
//   http  GET (any path): 200 "ok" while up; while down the request is never answered
//   tcp   a listener while up; closed while down (connections are refused)
//   grpc  grpc.health.v1.Health/Check: SERVING while up, NOT_SERVING while down;
//         a service name other than "" or "lbctl.test" is SERVICE_UNKNOWN ... as the
//         standard health server: NOT_FOUND
// An address is down while the file DIR/ADDR exists (checked at each request,
// and every 50 ms for the TCP listener). Prints "ready" once every socket is
// bound; runs until killed. Listening ports 0 are left out.
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import grpc from '@grpc/grpc-js';

const args = process.argv.slice(2);
const opt = { control: '', addrs: [], echo: 7000, http: 8081, tcp: 8082, grpc: 8083 };
for (let i = 0; i < args.length; i += 2) {
  const [k, v] = [args[i], args[i + 1]];
  if (k === '--control') opt.control = v;
  else if (k === '--addr') opt.addrs.push(v);
  else if (['--echo', '--http', '--tcp', '--grpc'].includes(k)) opt[k.slice(2)] = Number(v);
  else throw new Error(`unknown argument ${k}`);
}
const down = (addr) => fs.existsSync(path.join(opt.control, addr));
const fmt = (a, p) => (a.includes(':') ? `[${a}]:${p}` : `${a}:${p}`);
const listen = (server, addr, port) =>
  new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, addr, () => (server.off('error', reject), resolve()));
  });
const pending = [];

for (const addr of opt.addrs) {
  if (opt.echo) {
    const echo = net.createServer((sock) => {
      let buf = '';
      const me = fmt(sock.localAddress.replace(/^::ffff:/, ''), sock.localPort);
      const peer = fmt(sock.remoteAddress.replace(/^::ffff:/, ''), sock.remotePort);
      sock.setEncoding('utf8');
      sock.on('data', (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          sock.write(`${me}|${peer}|${line}\n`);
        }
      });
      sock.on('end', () => sock.end());
      sock.on('error', () => sock.destroy());
    });
    pending.push(listen(echo, addr, opt.echo));
  }
  if (opt.http) {
    const h = http.createServer((req, res) => {
      if (down(addr)) return; // never answered: the probe times out
      res.writeHead(200, { 'Content-Type': 'text/plain', Connection: 'close' });
      res.end('ok\n');
    });
    pending.push(listen(h, addr, opt.http));
  }
  if (opt.tcp) {
    let server;
    const open = () => {
      server = net.createServer((s) => s.destroy());
      return listen(server, addr, opt.tcp);
    };
    pending.push(open());
    let busy = false;
    setInterval(async () => {
      if (busy) return;
      busy = true;
      try {
        const isDown = down(addr);
        if (isDown && server) {
          const s = server;
          server = undefined;
          await new Promise((r) => s.close(() => r()));
        } else if (!isDown && !server) await open();
      } catch (err) {
        process.stderr.write(`tcp ${addr}: ${err.message}\n`);
      } finally {
        busy = false;
      }
    }, 50);
  }
  if (opt.grpc) {
    const server = new grpc.Server();
    server.addService(
      {
        Check: {
          path: '/grpc.health.v1.Health/Check',
          requestStream: false,
          responseStream: false,
          requestSerialize: (v) => v,
          requestDeserialize: (b) => b,
          responseSerialize: (v) => v,
          responseDeserialize: (b) => b,
        },
      },
      {
        Check: (call, cb) => {
          // HealthCheckRequest { string service = 1 }: the name, when there is one.
          const req = call.request;
          const service = req.length > 2 ? req.subarray(2).toString('utf8') : '';
          if (service !== '' && service !== 'lbctl.test') return cb({ code: grpc.status.NOT_FOUND, details: 'unknown service' });
          // HealthCheckResponse { ServingStatus status = 1 }: 1 SERVING, 2 NOT_SERVING.
          cb(null, Buffer.from([0x08, down(addr) ? 2 : 1]));
        },
      },
    );
    pending.push(
      new Promise((resolve, reject) =>
        server.bindAsync(fmt(addr, opt.grpc), grpc.ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolve())),
      ),
    );
  }
}
await Promise.all(pending);
process.stdout.write('ready\n');
