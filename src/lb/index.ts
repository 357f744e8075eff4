// src/lb: the load-balancing vocabulary that both the model and the
// datapath speak. types.ts names families, protocols, service types and
// the one text form of a frontend or backend key; addr.ts parses and
// encodes IP addresses; maglev.ts builds Maglev tables as Cilium does.
//
// May import: base.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
