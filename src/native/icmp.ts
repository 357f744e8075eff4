/**
 * ICMP echo through the addon's IcmpSocket: `Pinger` multiplexes any number
 * of concurrent pings over one socket per family (opened on first use), each
 * bounded by its own timeout, and tells a reply from an ICMP error
 * ("unreachable", from a router or the local stack) from silence ("timeout").
 * Generic: who is pinged, how often, and what a failure means are the
 * caller's business (the node health mesh, issue 16).
 *
 * A probe is matched by its sequence number and a random 16-byte token in
 * its payload, so a late reply to an earlier probe that had the same
 * sequence number, or another process's reply, never settles it. The RTT is
 * measured on the event loop (process.hrtime.bigint() when the reply is
 * read), so a busy loop shows as latency, as it would to any other client.
 */
import { randomBytes } from 'node:crypto';
import { isIP } from 'node:net';
import { BpfError, guard } from './bpf.js';
import { loadBinding } from './binding.js';
import type { IcmpError, IcmpMessage, IcmpSocketOptions, RawIcmpSocket } from './native.js';

export type { IcmpError, IcmpMessage, IcmpReply, IcmpSocketOptions, RawIcmpSocket } from './native.js';

/**
 * Why a ping failed: no answer within the timeout; an ICMP or local error
 * saying the destination cannot be reached (EHOSTUNREACH, ENETUNREACH) or
 * refuses (ECONNREFUSED); the pinger was closed first; or another errno name
 * (EACCES: administratively prohibited on IPv6; EINVAL: a local blackhole
 * route; EMSGSIZE...).
 */
export type PingFailure = 'timeout' | 'unreachable' | 'refused' | 'closed' | (string & {});

export type PingResult =
  | { readonly ok: true; readonly rttMs: number; readonly from: string }
  | {
      readonly ok: false;
      readonly error: PingFailure;
      readonly detail: string;
      /** How long after sending the failure was known. */
      readonly elapsedMs: number;
      /** The ICMP error, when one said so. */
      readonly icmp?: { readonly type: number; readonly code: number; readonly offender: string; readonly errno: string };
    };

export type PingerOptions = IcmpSocketOptions;

const TOKEN_BYTES = 16;
const SEQ_SPACE = 0x10000;

interface Probe {
  readonly seq: number;
  readonly address: string;
  readonly token: Buffer;
  readonly start: bigint;
  readonly timer: NodeJS.Timeout;
  readonly settle: (r: PingResult) => void;
}

/** One family's socket and its probes in flight, by sequence number. */
interface Channel {
  readonly socket: RawIcmpSocket;
  readonly pending: Map<number, Probe>;
  nextSeq: number;
}

const elapsedMs = (start: bigint, now = process.hrtime.bigint()): number => Number(now - start) / 1e6;

/** EHOSTUNREACH/ENETUNREACH → 'unreachable', ECONNREFUSED → 'refused', else the errno name. */
export function classifyErrno(errno: string): PingFailure {
  if (errno === 'EHOSTUNREACH' || errno === 'ENETUNREACH') return 'unreachable';
  if (errno === 'ECONNREFUSED') return 'refused';
  return errno;
}

export class Pinger {
  private readonly channels = new Map<4 | 6, Channel>();
  private closed = false;

  constructor(private readonly options: PingerOptions = {}) {}

  /**
   * Sends one echo request and resolves when its reply or an error about it
   * arrives, or after timeoutMs. Never rejects for what the network does;
   * rejects (BpfError) for a bad address, or when no ICMP socket can be opened.
   */
  ping(address: string, timeoutMs: number): Promise<PingResult> {
    if (this.closed) return Promise.resolve({ ok: false, error: 'closed', detail: 'the pinger is closed', elapsedMs: 0 });
    const family = isIP(address.replace(/%.*$/, ''));
    if (family !== 4 && family !== 6) return argumentError(`not an IP address: ${address}`);
    if (!Number.isFinite(timeoutMs) || timeoutMs < 0) return argumentError('timeoutMs must be a non-negative number');
    let ch: Channel;
    try {
      ch = this.channel(family);
    } catch (err) {
      return Promise.reject(err);
    }
    if (ch.pending.size >= SEQ_SPACE) {
      return Promise.resolve({ ok: false, error: 'EBUSY', detail: `${SEQ_SPACE} probes already in flight`, elapsedMs: 0 });
    }
    while (ch.pending.has(ch.nextSeq)) ch.nextSeq = (ch.nextSeq + 1) % SEQ_SPACE;
    const seq = ch.nextSeq;
    ch.nextSeq = (seq + 1) % SEQ_SPACE;
    const token = randomBytes(TOKEN_BYTES);
    return new Promise<PingResult>((resolve, reject) => {
      const start = process.hrtime.bigint();
      const settle = (r: PingResult): void => {
        if (ch.pending.get(seq) !== probe) return;
        ch.pending.delete(seq);
        clearTimeout(probe.timer);
        resolve(r);
      };
      const timer = setTimeout(
        () => settle({ ok: false, error: 'timeout', detail: `no reply from ${address} within ${timeoutMs} ms`, elapsedMs: elapsedMs(start) }),
        timeoutMs,
      );
      const probe: Probe = { seq, address, token, start, timer, settle };
      ch.pending.set(seq, probe);
      try {
        guard(() => ch.socket.send(address, seq, token));
      } catch (err) {
        const e = err as { code?: string; op?: string; message?: string };
        if (e.op === 'argument' || typeof e.code !== 'string') {
          ch.pending.delete(seq);
          clearTimeout(timer);
          reject(err);
          return;
        }
        settle({ ok: false, error: classifyErrno(e.code), detail: e.message ?? e.code, elapsedMs: elapsedMs(start) });
      }
    });
  }

  /** The socket of a family (opened now if need be): whether a ping socket or SOCK_RAW, and its echo identifier. */
  socketInfo(family: 4 | 6): { kind: 'dgram' | 'raw'; id: number } {
    const { socket } = this.channel(family);
    return { kind: socket.kind, id: socket.id };
  }

  /** Probes in flight. */
  get pending(): number {
    let n = 0;
    for (const ch of this.channels.values()) n += ch.pending.size;
    return n;
  }

  /** Closes the sockets; pending pings resolve with error 'closed'. Idempotent. */
  close(): void {
    this.closed = true;
    for (const family of [...this.channels.keys()]) this.drop(family, 'closed', 'the pinger was closed');
  }

  private channel(family: 4 | 6): Channel {
    const have = this.channels.get(family);
    if (have) return have;
    const native = loadBinding();
    const socket = guard(() => new native.IcmpSocket(family, (msgs) => this.onMessages(family, msgs), this.options));
    const ch: Channel = { socket, pending: new Map(), nextSeq: Math.floor(Math.random() * SEQ_SPACE) };
    this.channels.set(family, ch);
    return ch;
  }

  private drop(family: 4 | 6, error: PingFailure, detail: string): void {
    const ch = this.channels.get(family);
    if (!ch) return;
    this.channels.delete(family);
    ch.socket.close();
    const now = process.hrtime.bigint();
    for (const p of [...ch.pending.values()]) p.settle({ ok: false, error, detail, elapsedMs: elapsedMs(p.start, now) });
  }

  private onMessages(family: 4 | 6, msgs: IcmpMessage[]): void {
    const now = process.hrtime.bigint();
    const ch = this.channels.get(family);
    if (!ch) return;
    for (const m of msgs) {
      if (m.type === 'reply') {
        const p = ch.pending.get(m.seq);
        if (p && p.token.equals(m.payload)) p.settle({ ok: true, rttMs: elapsedMs(p.start, now), from: m.from });
      } else if (m.type === 'error') {
        for (const p of this.probesOf(ch, m)) p.settle(failure(p, m, now));
      } else {
        // The socket is unusable: its probes fail now, the next ping opens another.
        this.drop(family, m.errno, m.detail);
        return;
      }
    }
  }

  /**
   * The probes an error is about: the one its quoted request names (sequence
   * number, and as much of the token as it quotes), or, when it quotes no
   * ICMP header, every probe to its destination.
   */
  private probesOf(ch: Channel, m: IcmpError): Probe[] {
    if (m.seq === undefined) return [...ch.pending.values()].filter((p) => p.address === m.to);
    const p = ch.pending.get(m.seq);
    if (!p) return [];
    const quoted = m.payload ?? Buffer.alloc(0);
    return quoted.length <= TOKEN_BYTES && p.token.subarray(0, quoted.length).equals(quoted) ? [p] : [];
  }
}

function failure(p: Probe, m: IcmpError, now: bigint): PingResult {
  const by = m.origin === 'icmp' ? `ICMP type ${m.icmpType} code ${m.icmpCode} from ${m.offender}` : `${m.origin} error`;
  return {
    ok: false,
    error: classifyErrno(m.errno),
    detail: `${m.errno} for ${p.address}: ${by}`,
    elapsedMs: elapsedMs(p.start, now),
    icmp: { type: m.icmpType, code: m.icmpCode, offender: m.offender, errno: m.errno },
  };
}

/** A bad argument, as the addon reports one (code EINVAL, op 'argument'). */
function argumentError(message: string): Promise<never> {
  return Promise.reject(new BpfError(message, { code: 'EINVAL', errno: 22, op: 'argument' }));
}
