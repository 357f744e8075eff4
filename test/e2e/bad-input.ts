// Malformed manifests: a YAML syntax error and an invalid object (port
// 70000) are reported with file, document index and reason; everything else
// is still served; and a file that turns bad later keeps its services
// programmed (bad input never flushes the maps).
import t from 'tap';
import { createSandbox, HTTP_PORT, SLOW, type LogLine, type Sandbox } from '../helpers/sandbox.js';
import { serviceObject, sliceObject, yamlDocs } from '../helpers/manifests.js';

const BROKEN_YAML = 'apiVersion: v1\nkind: Service\nmetadata: {name: broken, namespace: default\nspec:\n  ports: [{port: 80\n';

function web(sb: Sandbox, name: string, ip: string, port = 80): object[] {
  return [
    serviceObject({ name, clusterIPs: [ip], ports: [{ name: 'http', port }] }),
    sliceObject({ name: `${name}-v4`, service: name, family: 4, ports: [{ name: 'http', port: HTTP_PORT }], addresses: sb.backends.map((b) => b.v4) }),
  ];
}

async function reachable(sb: Sandbox, ip: string): Promise<boolean> {
  const r = await sb.exec(['curl', '-sS', '--max-time', String(3 * SLOW), `http://${ip}/`]);
  return r.code === 0 && r.stdout.startsWith('10.244.1.');
}

const badInput = (file: string, doc: number) => (l: LogLine): boolean =>
  l.msg === 'bad input skipped' && typeof l.where === 'string' && l.where.endsWith(`${file}: document ${doc}`);

t.test('bad manifests are reported and skipped; the rest is served', async (t) => {
  const sb = await createSandbox(t, { backends: 2, agent: false });
  sb.writeManifest('a.yaml', yamlDocs(web(sb, 'svc-a', '10.96.0.10')));
  sb.writeManifest('b.yaml', yamlDocs(web(sb, 'svc-b', '10.96.0.11')));
  const first = await sb.startAgent();
  t.equal(first.frontends, 2, 'two services from the good files');
  t.ok(await reachable(sb, '10.96.0.10'), 'svc-a answers');
  t.ok(await reachable(sb, '10.96.0.11'), 'svc-b answers');

  // A syntax error after two good documents, and a port out of range after two good ones.
  const agent = sb.agent!;
  const mark = agent.logs.length;
  sb.writeManifest('syntax.yaml', yamlDocs(web(sb, 'svc-c', '10.96.0.12')) + '---\n' + BROKEN_YAML);
  sb.writeManifest(
    'invalid.yaml',
    yamlDocs([...web(sb, 'svc-d', '10.96.0.13'), serviceObject({ name: 'svc-e', clusterIPs: ['10.96.0.14'], ports: [{ name: 'http', port: 70000 }] })]),
  );
  const syntax = await agent.waitForLog(badInput('syntax.yaml', 2), mark);
  t.match(syntax.reason, /YAML|yaml/, `the syntax error is reported: ${JSON.stringify(syntax.reason)}`);
  const invalid = await agent.waitForLog(badInput('invalid.yaml', 2), mark);
  t.match(invalid.reason, /70000/, `the invalid port is reported: ${JSON.stringify(invalid.reason)}`);
  t.match(invalid.reason, /svc-e/, 'naming the object');

  await sb.waitUntil(async () => (await sb.lbList()).length === 4, 'svc-c and svc-d programmed');
  const fronts = (await sb.lbList()).map((e) => e.frontend);
  t.same(fronts, ['10.96.0.10:80/TCP', '10.96.0.11:80/TCP', '10.96.0.12:80/TCP', '10.96.0.13:80/TCP'], 'the good documents of the bad files are programmed; svc-e is not');
  for (const ip of ['10.96.0.10', '10.96.0.11', '10.96.0.12', '10.96.0.13']) t.ok(await reachable(sb, ip), `${ip} answers`);
  t.notOk(agent.logs.slice(mark).some((l) => l.msg === 'sync failed; the maps keep their last good state'), 'no sync failed');
});

t.test('a file that turns bad keeps its services programmed', async (t) => {
  const sb = await createSandbox(t, { backends: 2, agent: false });
  sb.writeManifest('a.yaml', yamlDocs(web(sb, 'svc-a', '10.96.0.10')));
  sb.writeManifest('b.yaml', yamlDocs(web(sb, 'svc-b', '10.96.0.11')));
  await sb.startAgent();
  const agent = sb.agent!;
  const before = await sb.lbList();
  t.equal(before.length, 2, 'two services programmed');

  // b.yaml becomes unparseable.
  sb.writeManifest('b.yaml', BROKEN_YAML);
  const syntax = await agent.waitForLog(badInput('b.yaml', 0), agent.logs.length);
  t.ok(syntax.reason, `reported: ${JSON.stringify(syntax.reason)}`);
  await sb.waitForSync();
  t.same(await sb.lbList(), before, 'the maps are unchanged');
  t.ok(await reachable(sb, '10.96.0.11'), 'svc-b, from the now broken file, still answers');
  t.ok(await reachable(sb, '10.96.0.10'), 'svc-a still answers');

  // b.yaml parses again, but svc-b is now invalid: its last valid version stays.
  sb.writeManifest('b.yaml', yamlDocs([serviceObject({ name: 'svc-b', clusterIPs: ['10.96.0.11'], ports: [{ name: 'http', port: 70000 }] }), web(sb, 'svc-b', '10.96.0.11')[1]!]));
  const invalid = await agent.waitForLog(badInput('b.yaml', 0), agent.logs.length);
  t.match(invalid.reason, /70000/, `reported: ${JSON.stringify(invalid.reason)}`);
  await sb.waitForSync();
  t.same(await sb.lbList(), before, 'the maps are still unchanged');
  t.ok(await reachable(sb, '10.96.0.11'), 'svc-b still answers on its last valid port');

  // Fixing the file is picked up again (the source did not get stuck).
  sb.writeManifest('b.yaml', yamlDocs(web(sb, 'svc-b', '10.96.0.11', 8081)));
  await sb.waitUntil(async () => (await sb.lbList()).some((e) => e.frontend === '10.96.0.11:8081/TCP'), 'svc-b moved to port 8081');
  const after = (await sb.lbList()).map((e) => e.frontend);
  t.same(after, ['10.96.0.10:80/TCP', '10.96.0.11:8081/TCP'], 'the fixed file replaces the old port');
});
