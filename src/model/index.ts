// src/model: Kubernetes objects to desired frontends. k8s.ts validates the
// objects lbctl reads (probe.ts the readiness-probe annotation), from-k8s.ts
// turns them into frontends (pure), desired.ts keeps that state up to date
// object by object, north-south.ts is what a Service asks of the tc
// datapath, types.ts the desired state's shapes.
//
// May import: lb, base.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
