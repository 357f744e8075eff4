// src/mesh: the node health mesh (docs/health.md). mesh.ts probes every
// node's addresses on per-address timers from a bounded pool, mesh-icmp.ts
// by ICMP through the addon's ping socket, mesh-net.ts by HTTP to the
// /hello listener it runs in a worker thread; mesh-agent.ts wires them with
// logs and metrics. Nothing of the agent waits for it.
//
// May import: model, native, base.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
