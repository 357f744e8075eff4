// Hostile manifests for the hostile-input tests (test/unit/hostile-input.ts
// drives the sources with them in-process, test/e2e/hostile-input.ts writes
// them into a running agent's directory): fast-check generators of random and
// mutated Services and EndpointSlices, text-level damage, binary, and the
// classic bombs, plus a sentinel service that none of them may change.
import fc from 'fast-check';
import { stringify } from 'yaml';
import { MAX_STRING_CHARS } from '../../src/sources/limits.js';

export const SENTINEL_IP = '10.96.0.10';
export const SENTINEL_KEY = `${SENTINEL_IP}:80/TCP`;

export function service(name: string, ip: string, namespace = 'default', port = 80): Record<string, unknown> {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace },
    spec: { type: 'ClusterIP', clusterIP: ip, clusterIPs: [ip], ports: [{ name: 'http', port, protocol: 'TCP', targetPort: 8080 }] },
  };
}

export function slice(name: string, svc: string, addresses: string[], namespace = 'default'): Record<string, unknown> {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name, namespace, labels: { 'kubernetes.io/service-name': svc } },
    addressType: 'IPv4',
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
    endpoints: addresses.map((a) => ({ addresses: [a], conditions: { ready: true }, nodeName: 'n1' })),
  };
}

export const SENTINEL = [service('sentinel', SENTINEL_IP), slice('sentinel-1', 'sentinel', ['10.244.0.2', '10.244.0.3'])];

// ------------------------------------------------------------ generators

/** Values no manifest should hold, and values that look almost right. */
export const junk: fc.Arbitrary<unknown> = fc.oneof(
  fc.anything({ maxDepth: 3, maxKeys: 5 }),
  fc.string({ unit: 'binary', maxLength: 40 }),
  fc.string({ unit: 'grapheme', maxLength: 40 }),
  fc.constantFrom(null, '', 0, -1, 65536, 70000, 1e308, -0, true, [], {}, 'None', 'TCP', 'SCTP', 'udp', SENTINEL_IP, '::1', '10.96.0.10/32', 'default'),
  fc.integer(),
  fc.double(),
  fc.nat({ max: 2 * MAX_STRING_CHARS }).map((n) => 'x'.repeat(n)),
  fc.array(fc.constant({}), { maxLength: 3000 }),
);

/** Every path into an object, for picking a place to mutate. */
function paths(o: unknown, prefix: Array<string | number> = [], out: Array<Array<string | number>> = []): Array<Array<string | number>> {
  out.push(prefix);
  if (typeof o === 'object' && o !== null) {
    for (const [k, v] of Object.entries(o)) paths(v, [...prefix, Array.isArray(o) ? Number(k) : k], out);
  }
  return out;
}

function mutate(base: unknown, edits: ReadonlyArray<readonly [number, unknown, boolean]>): unknown {
  let root = structuredClone(base);
  for (const [pick, value, remove] of edits) {
    const all = paths(root);
    const p = all[pick % all.length]!;
    if (p.length === 0) {
      root = value;
      continue;
    }
    let parent = root as Record<string | number, unknown>;
    for (const k of p.slice(0, -1)) parent = parent[k] as Record<string | number, unknown>;
    if (remove) delete parent[p[p.length - 1]!];
    else parent[p[p.length - 1]!] = value;
  }
  return root;
}

/** A well-formed object to start from: some claim the sentinel's identity or its address. */
export const baseObject: fc.Arbitrary<unknown> = fc.oneof(
  fc.tuple(fc.constantFrom('web', 'sentinel', 'a', 'z'), fc.constantFrom('default', 'a', 'kube-system'), fc.constantFrom(SENTINEL_IP, '10.96.0.11', '10.96.0.12')).map(([n, ns, ip]) =>
    service(n, ip, ns),
  ),
  // A slice of the sentinel's under another name would add backends to it, as it should: only its own identity is claimed.
  fc.constantFrom(['web-1', 'web'], ['sentinel-1', 'sentinel']).map(([n, svc]) => slice(n!, svc!, ['10.244.9.9', '10.244.9.10'])),
);

export const mutated = fc
  .tuple(baseObject, fc.array(fc.tuple(fc.nat(), junk, fc.boolean()), { maxLength: 4 }))
  .map(([base, edits]) => mutate(base, edits));

export function asYaml(docs: readonly unknown[]): string {
  return docs
    .map((d) => {
      try {
        return stringify(d);
      } catch {
        return JSON.stringify(d) ?? 'null';
      }
    })
    .join('---\n');
}

/** A text-level mutation of a good manifest: truncated, bytes changed, something inserted. */
export const mangledText = fc
  .tuple(
    fc.array(mutated, { minLength: 1, maxLength: 4 }),
    fc.nat(),
    fc.oneof(fc.string({ unit: 'binary', maxLength: 20 }), fc.constantFrom('\0', '\uFFFF', '\uD800', ':', '- ', '&a ', '*a', '!!binary ', '<<: *a', '{', '[', '"', "'", '\t', '---\n', '...\n', '%YAML 1.1\n')),
    fc.constantFrom('truncate', 'insert', 'replace'),
  )
  .map(([docs, at, piece, how]) => {
    const text = asYaml(docs);
    const i = at % (text.length + 1);
    if (how === 'truncate') return text.slice(0, i);
    if (how === 'insert') return text.slice(0, i) + piece + text.slice(i);
    return text.slice(0, i) + piece + text.slice(i + piece.length);
  });

/** The classic bombs, at random sizes. */
export const bomb: fc.Arbitrary<string> = fc.oneof(
  // Billion laughs: each level an alias list of the one before.
  fc.tuple(fc.integer({ min: 3, max: 40 }), fc.integer({ min: 2, max: 12 })).map(([levels, width]) => {
    const lines = ['a0: &a0 [lol]'];
    for (let i = 1; i < levels; i++) lines.push(`a${i}: &a${i} [${Array(width).fill(`*a${i - 1}`).join(', ')}]`);
    return `apiVersion: v1\nkind: Service\nmetadata: {name: bomb, namespace: default}\nspec:\n  ports: *a${levels - 1}\n${lines.map((l) => `x${l}`).join('\n')}\n`.replace(/^x/gm, '');
  }),
  fc.integer({ min: 10, max: 20_000 }).map((n) => `kind: Service\nmetadata: ${'['.repeat(n)}${']'.repeat(n)}\n`),
  fc.integer({ min: 10, max: 5_000 }).map((n) => `kind: Service\nspec:\n${Array.from({ length: n }, (_, i) => `${' '.repeat(i + 1)}a:`).join('\n')} 1\n`),
  fc.integer({ min: 10, max: 200_000 }).map((n) => `{"kind":"Service","metadata":${'{"a":'.repeat(n)}1${'}'.repeat(n)}}`),
  fc.integer({ min: 1, max: 3 * MAX_STRING_CHARS }).map((n) => `kind: Service\nmetadata: {name: "${'n'.repeat(n)}"}\n`),
  fc.integer({ min: 1, max: 150_000 }).map((n) => '---\n{}\n'.repeat(n)),
  fc.integer({ min: 1, max: 2_000 }).map((n) => `base: &b {${Array.from({ length: 50 }, (_, i) => `k${i}: ${i}`).join(', ')}}\nitems:\n${'  - {<<: *b}\n'.repeat(n)}`),
  fc.integer({ min: 1, max: 120_000 }).map((n) => JSON.stringify({ apiVersion: 'v1', kind: 'List', items: Array(n).fill(SENTINEL[0]) })),
);

export const hostileText: fc.Arbitrary<string> = fc.oneof(
  { weight: 5, arbitrary: fc.array(mutated, { minLength: 1, maxLength: 5 }).map(asYaml) },
  { weight: 2, arbitrary: fc.array(mutated, { minLength: 1, maxLength: 5 }).map((d) => JSON.stringify({ apiVersion: 'v1', kind: 'List', items: d }) ?? '') },
  { weight: 4, arbitrary: mangledText },
  { weight: 1, arbitrary: fc.string({ unit: 'binary', maxLength: 500 }) },
  { weight: 1, arbitrary: fc.uint8Array({ maxLength: 500 }).map((b) => Buffer.from(b).toString('latin1')) },
  { weight: 1, arbitrary: bomb },
);

export const hostileFile = fc.record({ name: fc.constantFrom('a.yaml', 'z.yaml', 'a.json', 'z.yml'), text: hostileText });

