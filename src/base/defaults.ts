// Defaults shared by the CLI's option parsing and the modules that use them;
// dependency-free, so `lbctl --help` loads nothing else.
export const VERSION = '0.1.0';
export const DEFAULT_BPF_ROOT = '/sys/fs/bpf/lbctl';
/** kube-proxy's healthz port. */
export const DEFAULT_HEALTH_PORT = 10256;
/** kube-proxy's metrics port and bind address. */
export const DEFAULT_METRICS_PORT = 10249;
export const DEFAULT_METRICS_HOST = '127.0.0.1';
export const DEFAULT_API_SOCKET = '/run/lbctl/agent.sock';
/**
 * How long the first sync waits for this node's Node once Services and
 * EndpointSlices have listed (--node-sync-timeout; src/sources/kubernetes.ts).
 */
export const DEFAULT_NODE_SYNC_TIMEOUT_MS = 5_000;

/**
 * Readiness probes in flight at most (standalone mode). A probe that hangs
 * holds its slot for its whole timeout: 512 keeps 1,000 backends at
 * periodSeconds 1 probed even while half of them hang for a 1 s timeout
 * (test/unit/prober-scale.ts), and stays well inside the default 1,024 open
 * files.
 */
export const PROBE_CONCURRENCY = 512;
