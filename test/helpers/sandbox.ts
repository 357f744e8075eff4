// The e2e sandbox's public API, as tests import it. The code lives in
// test/helpers/sandbox/, one module per concern (index.ts says which, and how
// a second node or an external client is added by composition).
export { AgentProcess, type LbListEntry, type LogLine, type PinnedLink, type SyncReport } from './sandbox/agent.js';
export { createSandbox, Sandbox, type FreshSync, type SandboxOptions } from './sandbox/index.js';
export { type LoadFailure, type LoadOptions, type LoadProgress, type LoadResult, type LoadRun } from './sandbox/load.js';
export { CLI_TIMEOUT_MS, CLIENT_PY, how, LBCTL, ROOT, run, SLOW, type ExecResult } from './sandbox/run.js';
export {
  CLIENT_V4, CLIENT_V6, cgroup2Mount, DNS_ANSWER, DNS_NAME, DNS_PORT, HTTP_PORT, rpsMasks, sweepLeftovers, UDP_PORT, type BackendAddrs,
} from './sandbox/topology.js';
