// src/cli: the `lbctl` program. program.ts declares the commands and their
// flags, main.ts runs them, commands/ holds one module per command (each
// loaded only when its command runs), flags.ts and config.ts parse the
// agent's flags and its --config file. `lbctl agent` (commands/agent.ts)
// wires the agent, its servers, the health mesh and the prober; the `bpf`
// and `cleanup` commands read the pinned maps with the agent down.
//
// May import: agent, http, mesh, probes, sources, reconcile, model, datapath, host, native, lb, base.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
