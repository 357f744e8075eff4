// The grpc probe's client (issue 17): one grpc.health.v1.Health/Check call
// through @grpc/grpc-js, as kubelet's pkg/probe/grpc does it with grpc-go:
// plaintext, a new connection per probe (kubelet dials and closes one per
// probe; here a client with its own subchannel pool, closed after the call),
// the deadline at the probe's timeout, and the call cancelled when the
// prober's signal fires. No .proto: grpc-js's generic client with the
// hand-written codec of probe-exec.ts (a string in, an enum out).
//
// grpc-js is loaded on the first grpc probe, not with the agent: an agent
// that never probes by gRPC never pays for it.
import { decodeHealthCheckResponse, encodeHealthCheckRequest, type GrpcHealthClient, type GrpcServingStatus } from './probe-exec.js';

const METHOD = '/grpc.health.v1.Health/Check';
/** grpc status INTERNAL: what a malformed response is reported as. */
const GRPC_INTERNAL = 13;

type GrpcModule = typeof import('@grpc/grpc-js');
let loaded: Promise<GrpcModule> | undefined;
const grpcJs = (): Promise<GrpcModule> => (loaded ??= import('@grpc/grpc-js'));

/** grpc-js target text: a literal address, never a name to resolve. */
export function grpcTarget(address: string, port: number): string {
  return address.includes(':') ? `ipv6:[${address}]:${port}` : `ipv4:${address}:${port}`;
}

export class GrpcJsHealthClient implements GrpcHealthClient {
  async check(address: string, port: number, service: string, opts: { readonly timeoutMs: number; readonly signal: AbortSignal }): Promise<GrpcServingStatus> {
    const grpc = await grpcJs();
    if (opts.signal.aborted) throw { code: grpc.status.CANCELLED, details: 'cancelled before the call' };
    const client = new grpc.Client(grpcTarget(address, port), grpc.credentials.createInsecure(), {
      'grpc.use_local_subchannel_pool': 1,
      'grpc.enable_retries': 0,
      'grpc.primary_user_agent': 'kube-probe/lbctl',
      // One probe, one connection: no reconnect loop once it is closed.
      'grpc.initial_reconnect_backoff_ms': opts.timeoutMs,
    });
    try {
      return await new Promise<GrpcServingStatus>((resolve, reject) => {
        const call = client.makeUnaryRequest<string, Buffer>(
          METHOD,
          (s: string) => encodeHealthCheckRequest(s),
          (buf: Buffer) => buf,
          service,
          new grpc.Metadata(),
          { deadline: Date.now() + opts.timeoutMs },
          (err, value) => {
            opts.signal.removeEventListener('abort', cancel);
            if (err) return reject({ code: err.code, details: err.details, message: err.message });
            const status = value === undefined ? undefined : decodeHealthCheckResponse(value);
            if (status === undefined) return reject({ code: GRPC_INTERNAL, details: 'the response is not a grpc.health.v1.HealthCheckResponse' });
            resolve(status);
          },
        );
        const cancel = (): void => call.cancel();
        opts.signal.addEventListener('abort', cancel, { once: true });
      });
    } finally {
      client.close();
    }
  }
}
