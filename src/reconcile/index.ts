// src/reconcile: desired vs realized, as ordered map writes. plan.ts diffs
// (pure, make-before-break), reconciler.ts applies a plan through LbMaps
// and records a write only once it succeeded, realized.ts and
// frontend-table.ts hold what the maps hold, ids.ts hands out stable
// backend and rev-NAT ids (id-map.ts, number-map.ts).
//
// May import: model, datapath, lb, base.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
