// src/probes: backend readiness probes in standalone mode, as kubelet runs
// them (docs/standalone.md). prober.ts keeps one worker per distinct probe
// of a backend on a bounded pool and an injected clock; probe-exec.ts holds
// the httpGet, tcpSocket and grpc executors; grpc-health.ts the gRPC health
// client over @grpc/grpc-js, loaded on the first grpc probe.
//
// May import: model, base.
// (docs/architecture.md's layering table; `make check-layers` holds src/ to
// it. Modules import the file they need, never this index.)
export {};
