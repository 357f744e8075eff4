// src/host: changes to the host outside lbctl's datapath.
// kube-proxy-cleanup.ts is `lbctl cleanup --kube-proxy`: it removes
// kube-proxy's iptables chains and nftables tables, and nothing else
// (docs/cleanup.md).
//
// May import: base.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
