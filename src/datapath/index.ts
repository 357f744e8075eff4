// src/datapath: the BPF side as TypeScript sees it. abi.gen.ts (generated
// from BTF) is the only code that knows byte layouts; lbmaps.ts is LbMaps,
// the reconciler's view of the maps, and maps.ts its implementation over
// the pinned maps; loader.ts loads, adopts, migrates (migrate.ts,
// layout.ts) and attaches the socket object, nodeport.ts the tc object
// (devices.ts picks its devices, maglev-maps.ts writes its tables);
// features.ts probes the kernel; terminate.ts destroys connected UDP
// sockets whose backend left. listing.ts, ct.ts, counters.ts and sctp.ts
// read what the CLI and the agent show.
//
// May import: native, lb, base.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
