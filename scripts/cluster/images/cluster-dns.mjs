// The test cluster's DNS server (docs/cluster.md, "DNS"): what CoreDNS's
// kubernetes plugin answers that Kubernetes' e2e tests and our own ask, and
// no more. No registry here carries CoreDNS, so this stands in for it, run
// by Debian's node in lbctl.local/cluster-dns (images.sh) as the
// Deployment behind the kube-dns Service (10.96.0.10).
//
// Answers, for the cluster domain only (no upstream: anything else is
// REFUSED):
//   SVC.NS.svc.DOMAIN   A: the ClusterIP; a headless Service's ready
//                       endpoint addresses; an ExternalName Service's CNAME
//   _PORT._PROTO.SVC.NS.svc.DOMAIN  SRV: the named port, at SVC.NS.svc.DOMAIN
//   any other type of a name that exists: no answer (NOERROR), so that a
//   resolver asking A and AAAA gets the A
//   a name that does not: NXDOMAIN
// Services and EndpointSlices are listed every second (the watch cache
// serves resourceVersion=0 lists cheaply) from the API server named by
// APISERVER, with the pod's service-account token and CA. UDP and TCP on
// port 53.
import dgram from 'node:dgram';
import fs from 'node:fs';
import https from 'node:https';
import net from 'node:net';

const DOMAIN = (process.env.CLUSTER_DOMAIN ?? 'cluster.local').toLowerCase();
const APISERVER = new URL(process.env.APISERVER ?? `https://${process.env.KUBERNETES_SERVICE_HOST}:${process.env.KUBERNETES_SERVICE_PORT}`);
const SA = '/var/run/secrets/kubernetes.io/serviceaccount';
const TTL = 5;
const A = 1, CNAME = 5, SRV = 33;

/** name (lowercase, no trailing dot) → { a: [ip], cname?: name, srv: [[priority, weight, port, target]] } */
let zone = new Map();

function get(path) {
  return new Promise((resolve, reject) => {
    const req = https.get({
      host: APISERVER.hostname, port: APISERVER.port || 443, path,
      ca: fs.readFileSync(`${SA}/ca.crt`), headers: { authorization: `Bearer ${fs.readFileSync(`${SA}/token`, 'utf8').trim()}` },
      timeout: 5000,
    }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => (res.statusCode === 200 ? resolve(JSON.parse(body)) : reject(new Error(`${path}: ${res.statusCode} ${body.slice(0, 200)}`))));
    });
    req.on('error', reject);
    req.on('timeout', () => req.destroy(new Error(`${path}: timeout`)));
  });
}

async function refresh() {
  const [svcs, slices] = await Promise.all([get('/api/v1/services?resourceVersion=0'), get('/apis/discovery.k8s.io/v1/endpointslices?resourceVersion=0')]);
  const ready = new Map(); // ns/svc → [ip]
  for (const sl of slices.items) {
    const svc = sl.metadata.labels?.['kubernetes.io/service-name'];
    if (!svc || sl.addressType !== 'IPv4') continue;
    const key = `${sl.metadata.namespace}/${svc}`;
    for (const ep of sl.endpoints ?? []) if (ep.conditions?.ready !== false) ready.set(key, [...(ready.get(key) ?? []), ...ep.addresses]);
  }
  const z = new Map();
  for (const s of svcs.items) {
    const name = `${s.metadata.name}.${s.metadata.namespace}.svc.${DOMAIN}`;
    const rec = { a: [], srv: [] };
    if (s.spec.type === 'ExternalName') rec.cname = s.spec.externalName.toLowerCase().replace(/\.$/, '');
    else if (s.spec.clusterIP === 'None') rec.a = [...new Set(ready.get(`${s.metadata.namespace}/${s.metadata.name}`) ?? [])];
    else if (s.spec.clusterIP) rec.a = [s.spec.clusterIP];
    z.set(name, rec);
    for (const p of s.spec.ports ?? []) {
      if (!p.name) continue;
      z.set(`_${p.name}._${p.protocol.toLowerCase()}.${name}`, { a: [], srv: [[0, 100, p.port, name]] });
    }
  }
  zone = z;
}

async function loop() {
  for (;;) {
    try {
      await refresh();
    } catch (err) {
      console.error(new Date().toISOString(), String(err));
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

// ------------------------------------------------------------ the wire format (RFC 1035)
function readName(buf, off) {
  const labels = [];
  let jumped = false, end = off;
  for (let hops = 0; hops < 64; hops++) {
    const n = buf[off];
    if (n === undefined) throw new Error('truncated name');
    if ((n & 0xc0) === 0xc0) {
      if (!jumped) end = off + 2;
      off = ((n & 0x3f) << 8) | buf[off + 1];
      jumped = true;
      continue;
    }
    if (n === 0) return { name: labels.join('.'), end: jumped ? end : off + 1 };
    labels.push(buf.toString('latin1', off + 1, off + 1 + n));
    off += 1 + n;
  }
  throw new Error('name loop');
}

function encodeName(name) {
  const parts = name ? name.split('.') : [];
  return Buffer.concat([...parts.map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l, 'latin1')])), Buffer.from([0])]);
}

function rr(name, type, data) {
  const head = Buffer.alloc(10);
  head.writeUInt16BE(type, 0);
  head.writeUInt16BE(1, 2);
  head.writeUInt32BE(TTL, 4);
  head.writeUInt16BE(data.length, 8);
  return Buffer.concat([encodeName(name), head, data]);
}

function answer(query) {
  const id = query.readUInt16BE(0), flags = query.readUInt16BE(2);
  const reply = (rcode, question = Buffer.alloc(0), answers = []) => {
    const h = Buffer.alloc(12);
    h.writeUInt16BE(id, 0);
    h.writeUInt16BE(0x8000 | (flags & 0x0100) | 0x0400 | rcode, 2); // QR, RD echoed, AA
    h.writeUInt16BE(question.length ? 1 : 0, 4);
    h.writeUInt16BE(answers.length, 6);
    return Buffer.concat([h, question, ...answers]);
  };
  if (query.readUInt16BE(4) !== 1) return reply(4); // NOTIMP: one question only
  const { name: raw, end } = readName(query, 12);
  const question = query.subarray(12, end + 4);
  const qtype = query.readUInt16BE(end);
  const name = raw.toLowerCase().replace(/\.$/, '');
  if (name !== DOMAIN && !name.endsWith(`.${DOMAIN}`)) return reply(5, question); // REFUSED: no upstream
  const answers = [];
  let rec = zone.get(name), at = name;
  if (!rec) return reply(3, question); // NXDOMAIN
  for (let i = 0; rec?.cname && i < 8; i++) {
    answers.push(rr(at, CNAME, encodeName(rec.cname)));
    at = rec.cname;
    rec = zone.get(at);
  }
  if (rec && (qtype === A || qtype === 255)) for (const ip of rec.a) answers.push(rr(at, A, Buffer.from(ip.split('.').map(Number))));
  if (rec && (qtype === SRV || qtype === 255)) {
    for (const [prio, weight, port, target] of rec.srv) {
      const d = Buffer.alloc(6);
      d.writeUInt16BE(prio, 0);
      d.writeUInt16BE(weight, 2);
      d.writeUInt16BE(port, 4);
      answers.push(rr(at, SRV, Buffer.concat([d, encodeName(target)])));
    }
  }
  return reply(0, question, answers);
}

function safeAnswer(msg) {
  try {
    return msg.length >= 12 ? answer(msg) : undefined;
  } catch (err) {
    console.error(new Date().toISOString(), 'bad query:', String(err));
    return undefined;
  }
}

const udp = dgram.createSocket('udp4');
udp.on('message', (msg, rinfo) => {
  const out = safeAnswer(msg);
  if (out) udp.send(out, rinfo.port, rinfo.address);
});
udp.bind(53);
net.createServer((c) => {
  let buf = Buffer.alloc(0);
  c.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    while (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
      const out = safeAnswer(buf.subarray(2, 2 + buf.readUInt16BE(0)));
      buf = buf.subarray(2 + buf.readUInt16BE(0));
      if (out) {
        const len = Buffer.alloc(2);
        len.writeUInt16BE(out.length);
        c.write(Buffer.concat([len, out]));
      }
    }
  });
  c.on('error', () => {});
}).listen(53);
console.error(new Date().toISOString(), `serving ${DOMAIN} on :53 (udp, tcp) from ${APISERVER.origin}`);
loop();
