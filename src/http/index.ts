// src/http: what the agent serves over HTTP. health.ts (/livez, /readyz,
// /healthz on kube-proxy's healthz port), metrics.ts (/metrics, kube-proxy's
// metric names and lbctl's), api.ts (the local API socket: `lbctl status`,
// `lbctl service list`, `lbctl health status`), service-health.ts (the
// healthCheckNodePort servers cloud load balancers probe), http.ts (the
// helpers they share). view.ts is AgentView: all that they read of the
// agent, so each is tested against a fake.
//
// May import: mesh, datapath, base.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
