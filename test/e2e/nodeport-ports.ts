// lb_np_ports (issue 37): the tc programs pass a packet to a port no
// frontend has, outside the NodePort range, without a frontend lookup
// (LB_NP_F_PORTS), so a frontend's port must be marked before its first
// packet. Here a LoadBalancer IP gets a port no frontend had while the agent
// runs without its own tc datapath (restarted with a --tc-object that is not
// there): the earlier agent's programs still run on the devices and trust
// the pinned map, and the agent marks the port there all the same, so the
// new port is served from its first connection. An agent with its tc
// datapath again fills the map from the services maps: a removed
// frontend's port is no longer marked, a kept one is.
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import t from 'tap';
import { yamlDocs } from '../helpers/manifests.js';
import { endpoint, EXT, LAB_PORTS, LB_IP, makeLab, northSouth, POD1, requestsAnsweredBy } from '../helpers/nodeport-lab.js';
import { createSandbox } from '../helpers/sandbox.js';

const NODE_ARGS = ['--devices', 'n1e,n1b', '--node-name', 'node1'];
const NEW_PORT = 8443;

function manifests(ports: readonly number[]): string {
  const pod1 = { 4: [endpoint(1, 4)], 6: [endpoint(1, 6)] };
  return yamlDocs(ports.flatMap((port) => ({ port, i: port === 80 ? 0 : 1 })).flatMap(({ port, i }) => northSouth({
    name: `lb-${port}`, type: 'LoadBalancer', clusterIPs: [`10.96.0.${20 + i}`, `fd00:96::${20 + i}`],
    ports: [{ name: 'http', port, targetPort: LAB_PORTS.http, nodePort: 30200 + i }], ingress: [LB_IP.v4, LB_IP.v6],
  }, pod1)));
}

/** Whether `port` is marked in the pinned lb_np_ports (bpftool's dump: word port / 64, bit port % 64). */
function marked(bpfRoot: string, port: number): boolean {
  const dump = JSON.parse(execFileSync('bpftool', ['map', 'lookup', 'pinned', path.join(bpfRoot, 'maps', 'lb_np_ports'),
    'key', ...[0, 1, 2, 3].map((b) => String(((port >>> 6) >>> (8 * b)) & 0xff)), '--json'], { encoding: 'utf8' })) as { value: string[] };
  const bytes = dump.value.map((x) => parseInt(x, 16));
  return ((bytes[(port & 63) >>> 3]! >> (port & 7)) & 1) === 1;
}

t.test('lb_np_ports: a new frontend port is served by an earlier agent\'s tc programs while the agent runs without its own; a new tc datapath refills the map', async (t) => {
  const sb = await createSandbox(t, { backends: 0, agent: false });
  const lab = await makeLab(sb);
  sb.writeManifest('services.yaml', manifests([80]));
  await lab.agent.start(NODE_ARGS);
  const root = lab.agent.bpfRoot;
  t.ok(marked(root, 80) && !marked(root, NEW_PORT), 'port 80 marked, 8443 not');
  await requestsAnsweredBy(t, lab, LB_IP.v4, 80, POD1.v4, EXT.v4, 2, 'the LoadBalancer IP on port 80');

  await lab.agent.stop(10_000);
  const missing = path.join(sb.runDir, 'no-such-nodeport.bpf.o');
  await lab.agent.start([...NODE_ARGS, '--tc-object', missing]);
  const agent = lab.agent.agent!;
  t.ok(agent.logs.some((l) => String(l.msg).startsWith('tc datapath not loaded')), 'the agent runs without its own tc datapath');

  const from = agent.logs.length;
  sb.writeManifest('services.yaml', manifests([80, NEW_PORT]));
  await agent.waitForLog((l) => l.msg === 'sync done', from, 30_000);
  t.ok(marked(root, NEW_PORT), 'port 8443 marked in the pinned map by the agent without a tc datapath');
  for (const fam of [4, 6] as const) {
    await requestsAnsweredBy(t, lab, fam === 4 ? LB_IP.v4 : LB_IP.v6, NEW_PORT, fam === 4 ? POD1.v4 : POD1.v6, fam === 4 ? EXT.v4 : EXT.v6, 3,
      `IPv${fam}: the new port, served by the earlier agent's programs`);
  }

  // The port 80 frontend removed: its bit stays until an agent starts on maps without it.
  await lab.agent.stop(10_000);
  sb.writeManifest('services.yaml', manifests([NEW_PORT]));
  await lab.agent.start(NODE_ARGS);
  t.ok(marked(root, NEW_PORT) && marked(root, 80), 'an agent with its tc datapath fills the map from the services maps as it finds them: 80 and 8443');
  await lab.agent.stop(10_000);
  await lab.agent.start(NODE_ARGS);
  t.ok(marked(root, NEW_PORT) && !marked(root, 80), 'the next start: 8443 marked, 80 (its frontend gone) no longer');
  await requestsAnsweredBy(t, lab, LB_IP.v6, NEW_PORT, POD1.v6, EXT.v6, 2, 'port 8443 after the restarts');
  const http80 = await lab.inExt(['curl', '-sS', '--max-time', '2', `http://${LB_IP.v4}:80/`], 10_000);
  t.not(http80.code, 0, 'port 80, no frontend now, is not served');
  await lab.agent.stop(10_000);
});
