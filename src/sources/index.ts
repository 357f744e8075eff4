// src/sources: where Services, EndpointSlices and Nodes come from.
// source.ts is the contract (one event per validated object change, plus
// synced and complete); file.ts watches a directory of manifests
// (manifest.ts parses them, limits.ts bounds them); kubernetes.ts lists and
// watches the API as client-go's Reflector does (list-stream.ts,
// backoff.ts).
//
// May import: model, lb, base.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
