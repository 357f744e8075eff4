// src/base: what every layer may import, and which imports nothing of
// lbctl's: errors.ts (LbError, ConfigError), defaults.ts (ports, paths and
// limits shared by the CLI and the modules that use them), clock.ts (the
// injectable clocks of the runner, the servers, the mesh and the prober),
// pool.ts (the bounded pool the mesh and the prober share), js-yaml.d.ts
// (the part of js-yaml's API lbctl uses), version.ts (what this process
// runs: lbctl, Node.js, V8, libbpf, the kernel, the commit, the BPF
// objects' build ids).
//
// May import: nothing of lbctl's.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
