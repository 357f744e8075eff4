// src/native: the lb_native addon, typed. native.d.ts is its raw surface,
// binding.ts loads it, bpf.ts wraps objects, maps and links (and turns
// failures into BpfError), tc.ts, rtnl.ts and icmp.ts the tc attachments,
// rtnetlink and the ping socket. Nothing else in src/ touches the addon.
//
// May import: base.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
