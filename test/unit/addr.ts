// parseIp's fast path for canonical dotted quads must agree with ipaddr.js,
// which still parses everything else.
import t from 'tap';
import ipaddr from 'ipaddr.js';
import { ipv4ToUint, parseIp } from '../../src/lb/addr.js';

t.test('canonical IPv4 is kept as it is, and agrees with ipaddr.js', async (t) => {
  for (const a of ['0.0.0.0', '10.96.0.10', '255.255.255.255', '1.2.3.4', '192.168.100.200']) {
    t.same(parseIp(a), { address: ipaddr.IPv4.parse(a).toString(), family: 4 }, a);
  }
});

t.test('what is not a canonical dotted quad takes the full parser', async (t) => {
  // Leading zeros: ipaddr.js reads them (as octal); the result is canonical text.
  const z = parseIp('010.1.1.1');
  if (z) t.equal(z.address, ipaddr.IPv4.parse('010.1.1.1').toString(), 'a leading zero is normalised, not kept');
  for (const bad of ['256.1.1.1', '1.2.3', '1.2.3.4.5', '1..2.3', '1.2.3.', '.1.2.3', '1.2.3.4 ', 'a.b.c.d', '1.2.3.1000', '']) {
    t.equal(parseIp(bad), undefined, JSON.stringify(bad));
  }
  t.same(parseIp('2001:db8::1'), { address: '2001:db8::1', family: 6 });
  t.same(parseIp('2001:0db8:0:0:0:0:0:1'), { address: '2001:db8::1', family: 6 });
  t.equal(parseIp('fe80::1%eth0'), undefined, 'zones are refused');
});

t.test('ipv4ToUint agrees with ipaddr.js, canonical or not', async (t) => {
  for (const a of ['0.0.0.0', '10.96.0.10', '255.255.255.255', '1.2.3.4', '010.1.1.1']) {
    const b = ipaddr.IPv4.parse(a).toByteArray();
    t.equal(ipv4ToUint(a), ((b[0]! << 24) | (b[1]! << 16) | (b[2]! << 8) | b[3]!) >>> 0, a);
  }
});
