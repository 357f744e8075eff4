// What this node does with SCTP frontends, for `lbctl status` and the local
// API. The socket hooks cannot serve them on any kernel: net/sctp runs no
// cgroup connect, sendmsg, recvmsg, bind or post_bind program for an SCTP
// socket (only getpeername and getsockname, which have nothing to translate
// back); test/e2e/sctp.ts measures it on every kernel it runs on, and
// docs/kernels.md ("SCTP") gives the call paths. SCTP is left to the tc
// datapath, which translates it only once bpf/nodeport.c uses
// bpf/lib/sctp.h (the CRC32c update a port rewrite needs).

/** Whether bpf/nodeport.c translates SCTP (NodePort, LoadBalancer, external IPs): set when it does. */
export const TC_TRANSLATES_SCTP = true;

export interface SctpStatus {
  /** ClusterIPs, for clients on the node and in its pods. */
  readonly socket: { readonly served: boolean; readonly why: string };
  /** NodePort, LoadBalancer and external IPs. */
  readonly tc: { readonly served: boolean; readonly why: string };
}

const SOCKET_WHY = 'the kernel runs no cgroup connect or sendmsg program for SCTP sockets';

/** `nodePort`: the tc datapath's state (off with --no-nodeport, failed, or serving). */
export function sctpStatus(nodePort: 'off' | 'failed' | 'serving', tcTranslates = TC_TRANSLATES_SCTP): SctpStatus {
  const tc =
    nodePort !== 'serving' ? { served: false, why: `the tc datapath is ${nodePort}` }
    : tcTranslates ? { served: true, why: 'nodeport.bpf.o translates SCTP (CRC32c updated)' }
    : { served: false, why: 'nodeport.bpf.o does not translate SCTP yet' };
  return { socket: { served: false, why: SOCKET_WHY }, tc };
}

/** One line: what is and is not balanced, and why. */
export function sctpLine(s: SctpStatus): string {
  const part = (what: string, x: SctpStatus['socket']): string => `${what} ${x.served ? 'yes' : 'no'} (${x.why})`;
  const none = !s.socket.served && !s.tc.served;
  return `${none ? 'programmed, not balanced' : 'programmed, balanced in part'}: ${part('ClusterIP at the socket hooks', s.socket)}; ${part('NodePort/LoadBalancer/external IPs at tc', s.tc)}`;
}
