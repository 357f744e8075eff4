// DNS through a service backed by two dnsmasq servers: dig over UDP and TCP,
// and a plain resolver-style query (unconnected sendto/recvfrom) whose reply
// must come from the service address. The latter is what proves recvmsg4's
// reverse translation: dig 9.18 connect()s its UDP socket, so it reads
// replies without looking at their source and works even without recvmsg4.
import t from 'tap';
import { createSandbox, DNS_ANSWER, DNS_NAME, DNS_PORT, SLOW } from '../helpers/sandbox.js';
import { serviceWithBackends } from '../helpers/manifests.js';

const VIP = '10.96.0.10';

interface DnsResult {
  results: Array<{ source?: string; id?: boolean; rcode?: number; answers?: string[]; error?: string }>;
}

t.test('dig through a UDP+TCP DNS service', async (t) => {
  const sb = await createSandbox(t, { backends: 0, dns: 2 });
  sb.writeManifest(
    'dns.yaml',
    serviceWithBackends(
      {
        name: 'dns',
        clusterIPs: [VIP],
        ports: [
          { name: 'dns', port: 53, protocol: 'UDP' },
          { name: 'dns-tcp', port: 53, protocol: 'TCP' },
        ],
      },
      [
        {
          name: 'dns-v4',
          family: 4,
          ports: [
            { name: 'dns', port: DNS_PORT, protocol: 'UDP' },
            { name: 'dns-tcp', port: DNS_PORT, protocol: 'TCP' },
          ],
          addresses: sb.dnsBackends,
        },
      ],
    ),
  );
  const sync = await sb.waitForSync();
  t.equal(sync.frontends, 2, 'UDP and TCP frontends programmed');

  const dig = (...args: string[]) =>
    sb.exec(['dig', `@${VIP}`, '-p', '53', ...args, '+short', `+time=${Math.ceil(2 * SLOW)}`, '+tries=1'], { timeoutMs: 10_000 });

  const udp = await dig(DNS_NAME);
  t.equal(udp.code, 0, `dig over UDP exits 0 (${udp.stderr.trim()})`);
  t.equal(udp.stdout.trim(), DNS_ANSWER, `dig over UDP answers ${DNS_ANSWER}`);
  t.notMatch(udp.stdout + udp.stderr, /unexpected source/, 'no reply from an unexpected source');

  const plain = await sb.client<DnsResult>(['dns', VIP, '53', DNS_NAME, '--count', '10']);
  t.same(plain.results.filter((x) => x.error), [], 'unconnected queries: every one answered');
  t.same([...new Set(plain.results.map((x) => x.source))], [`${VIP}:53`], 'unconnected queries: recvfrom() reports the service as the source');
  t.ok(plain.results.every((x) => x.id && x.rcode === 0 && x.answers?.[0] === DNS_ANSWER), `unconnected queries: answered ${DNS_ANSWER}`);

  const tcp = await dig('+tcp', DNS_NAME);
  t.equal(tcp.code, 0, `dig over TCP exits 0 (${tcp.stderr.trim()})`);
  t.equal(tcp.stdout.trim(), DNS_ANSWER, `dig over TCP answers ${DNS_ANSWER}`);

  // whoami.svc.test names the dnsmasq that answered.
  const seen = new Map<string, number>();
  for (let i = 0; i < 20; i++) {
    const r = await dig(`whoami.${DNS_NAME}`);
    const who = r.code === 0 ? r.stdout.trim() : `error ${r.code}`;
    seen.set(who, (seen.get(who) ?? 0) + 1);
  }
  t.comment(`answers by backend: ${JSON.stringify(Object.fromEntries(seen))}`);
  t.same([...seen.keys()].sort(), [...sb.dnsBackends].sort(), 'both dnsmasq backends answered, and nothing else');
});
