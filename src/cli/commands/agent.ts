// `lbctl agent`: runs until SIGTERM/SIGINT; the datapath outlives it.
import path from 'node:path';
import { pino } from 'pino';
import { Agent } from '../../agent/agent.js';
import { ConfigError } from '../../errors.js';
import { cgroup2Root } from '../../datapath/loader.js';
import { FileSource } from '../../sources/file.js';
import type { Source } from '../../sources/source.js';

export interface AgentCommandOptions {
  source: string;
  cgroup?: string;
  bpfRoot: string;
  maxServices?: number;
  maxBackends?: number;
  maxSockRevnat?: number;
  logLevel: string;
}

function makeSource(spec: string, log: pino.Logger): Source {
  const m = /^file:(.+)$/.exec(spec);
  if (m) {
    const dir = path.resolve(m[1]!);
    return new FileSource({ dir, onProblem: (p) => log.warn({ where: p.where, reason: p.reason }, 'bad input skipped') });
  }
  throw new ConfigError(`--source ${spec}: expected file:DIR`);
}

export async function agentCommand(opts: AgentCommandOptions): Promise<void> {
  const log = pino({ level: opts.logLevel, base: { pid: process.pid } }, pino.destination(2));
  const sizes = {
    ...(opts.maxServices !== undefined ? { services: opts.maxServices } : {}),
    ...(opts.maxBackends !== undefined ? { backends: opts.maxBackends } : {}),
    ...(opts.maxSockRevnat !== undefined ? { sockRevNat: opts.maxSockRevnat } : {}),
  };
  const agent = new Agent({
    source: makeSource(opts.source, log),
    datapath: { bpfRoot: opts.bpfRoot, cgroup: opts.cgroup ?? cgroup2Root(), sizes },
    log,
  });
  await agent.start();
  await new Promise<void>((resolve) => {
    const done = (signal: string): void => {
      log.info({ signal }, 'stopping');
      resolve();
    };
    process.once('SIGTERM', () => done('SIGTERM'));
    process.once('SIGINT', () => done('SIGINT'));
  });
  await agent.stop();
}
