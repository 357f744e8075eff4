// lbctl's entry point: parses the command line (program.ts) and runs the
// command; an LbError is reported as one line, anything else with its stack.
import { LbError } from '../base/errors.js';
import { buildProgram } from './program.js';

export async function main(argv: string[]): Promise<number> {
  try {
    await buildProgram().parseAsync(argv);
    return 0;
  } catch (err) {
    const msg = err instanceof LbError ? `${err.message}` : err instanceof Error ? (err.stack ?? err.message) : String(err);
    process.stderr.write(`lbctl: ${msg}\n`);
    return 1;
  }
}

process.exitCode = await main(process.argv);
