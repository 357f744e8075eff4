// src/agent: the agent's lifecycle. agent.ts loads or adopts the datapath,
// restores ids and state from the pinned maps, reads the source and runs
// syncs (model → plan → map writes) through runner.ts, kube-proxy's
// bounded-frequency runner; drift.ts compares desired and realized per
// frontend (`lbctl service list`); nodeport.ts follows the node's devices
// for the tc datapath. The agent is the AgentView the servers read.
//
// May import: http, probes, sources, reconcile, model, datapath, native, lb, base.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
