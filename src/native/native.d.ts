/**
 * The raw surface of build/Release/lb_native.node: a generic libbpf binding
 * that moves bytes and knows nothing of lbctl's maps or struct layouts.
 * Failures throw (or reject with) an Error carrying `code` (errno name),
 * `errno`, `op`, and optionally `map`, `prog`, `path`, `log`, `count`.
 * Use it through ./bpf.js, which converts those errors to BpfError.
 */

export interface OpenOptions {
  pinRoot?: string;
  maxEntries?: Record<string, number>;
  /** map name -> fd of an existing map of the same layout, used instead of creating one (bpf_map__reuse_fd; the fd is duplicated). */
  reuseMaps?: Record<string, number>;
  /** Load only these programs (bpf_program__set_autoload); ENOENT-coded error for a name the object lacks. */
  programs?: string[];
}

/** A loaded program, as bpf_prog_info and its BTF describe it. */
export interface RawProgInfo {
  id: number;
  /** The kernel's name: the first 15 characters of the function's (BPF_OBJ_NAME_LEN). */
  name: string;
  /** A hash of the instructions as loaded (bpftool's tag). */
  tag: string;
  type: number;
  /** The main function's name in the program's BTF, whole (what bpftool shows); absent when loaded without BTF. */
  funcName?: string;
}

export interface RawBpfObject {
  readonly path: string;
  /** bpf_object__load on the thread pool; LIBBPF_PIN_BY_NAME maps are reused from pinRoot or created and pinned there. */
  load(): Promise<void>;
  mapNames(): string[];
  programNames(): string[];
  /** A map of this (loaded) object; ENOENT-coded error if unknown. Owned by the object. */
  map(name: string): RawBpfMap;
  progFd(name: string): number;
  progInfo(name: string): RawProgInfo;
  /**
   * Idempotent cgroup attach through a bpf_link pinned at linkPinPath (parent dir created):
   * an existing pinned link is updated to this program (updated=true), else the program is
   * attached and the link pinned (updated=false). The link outlives the process.
   */
  attachCgroup(progName: string, cgroupPath: string, linkPinPath: string): { linkId: number; updated: boolean };
  /**
   * Attaches an iterator program, creates one iterator (inside the network namespace
   * netnsFd when given, from a short-lived thread), reads it to EOF, releases both:
   * what the program wrote.
   */
  runIter(progName: string, netnsFd?: number): Buffer;
  /** bpf_object__close; idempotent. */
  close(): void;
  /** The BTF layouts of a map's key and value as this object declares them (also before load). */
  mapLayout(name: string): DeclaredMapLayout;
}

/** A map's entries packed: entry i's key at i * keySize of keys, its value at i * valueBufSize of values. */
export interface FlatEntries {
  readonly keys: Buffer;
  readonly values: Buffer;
  readonly count: number;
}

export interface RawBpfMap {
  readonly name: string; readonly type: number; readonly keySize: number; readonly valueSize: number;
  readonly maxEntries: number; readonly flags: number; readonly id: number; readonly fd: number;
  /** PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH */
  readonly perCpu: boolean;
  /** valueSize, or roundup(valueSize, 8) * libbpf_num_possible_cpus() for per-CPU maps */
  readonly valueBufSize: number;
  /** null on ENOENT */
  lookup(key: Buffer): Buffer | null;
  /** flags: BPF_ANY=0, BPF_NOEXIST=1, BPF_EXIST=2 */
  update(key: Buffer, value: Buffer, flags?: number): void;
  /** false on ENOENT */
  delete(key: Buffer): boolean;
  keys(): Buffer[];
  entries(): Array<[Buffer, Buffer]>;
  /**
   * Every entry as two buffers, keys back to back (keySize each) and values
   * likewise (valueBufSize each): BPF_MAP_LOOKUP_BATCH, or get_next_key +
   * lookup where the kernel or the map type has no batch lookup.
   */
  entriesFlat(): FlatEntries;
  /** keys/values concatenated; returns count written; errors carry `count` (how many were written). */
  batchUpdate(keys: Buffer, values: Buffer, count: number, flags?: number): number;
  /** Closes only an fd this wrapper owns (maps opened by path). */
  close(): void;
  /** The BTF layouts of key and value from the kernel's BTF of this map; null when it has none. */
  layout(): MapLayout | null;
}

/** One socket of an inet_diag dump (struct inet_diag_msg). */
export interface InetDiagSocket {
  family: number;
  state: number;
  sport: number;
  dport: number;
  /** 16 bytes, network order; IPv4 in the first 4. */
  src: Buffer;
  dst: Buffer;
  ifindex: number;
  cookie: bigint;
  uid: number;
  inode: number;
  /** The raw struct inet_diag_sockid (cookie included), for inetDiagDestroy. */
  id: Buffer;
}

// ---- BTF layouts and held links (layout migration, all-or-nothing link switch) ----

/** A BTF type as laid out in memory: offsets and sizes in bytes. */
export interface TypeLayout {
  readonly kind: 'int' | 'enum' | 'struct' | 'union' | 'array' | 'other';
  /** The outermost typedef's name when there is one (`__be32`), else the type's name ('' if anonymous). */
  readonly name: string;
  readonly size: number;
  /** int and enum: signed encoding */
  readonly signed?: boolean;
  /** struct and union */
  readonly members?: ReadonlyArray<{ readonly name: string; readonly offset: number; readonly bitfield?: boolean; readonly type: TypeLayout }>;
  /** array */
  readonly elem?: TypeLayout;
  readonly count?: number;
}

export interface MapLayout {
  readonly key: TypeLayout | null;
  readonly value: TypeLayout | null;
}

/** What an object declares for a map: its layouts, and the map type and flags it would be created with. */
export interface DeclaredMapLayout extends MapLayout {
  readonly type: number;
  readonly flags: number;
  /** As the object declares it (before any maxEntries override). */
  readonly maxEntries: number;
}

/** A loaded program held by fd (which keeps it loaded). */
export interface RawHeldProgram {
  readonly id: number;
  readonly fd: number;
  close(): void;
}

/** A pinned link held open together with the program it ran when held (which that fd keeps alive). */
export interface RawHeldLink {
  readonly id: number;
  readonly progId: number;
  readonly type: number;
  readonly attachType?: number;
  readonly cgroupId?: number;
  /** bpf_link_update back to progId. */
  restore(): void;
  /** Releases the link and program fds; idempotent. */
  close(): void;
}

/** A link as rtnetlink reports it (RTM_NEWLINK). */
export interface RtnlLink {
  readonly index: number;
  readonly name: string;
  /** IFF_* flags (IFF_UP = 1, IFF_LOOPBACK = 8, ...) */
  readonly flags: number;
  readonly mtu: number;
  /** ARPHRD_* (1 ethernet, 772 loopback, ...) */
  readonly type: number;
  /** IFLA_INFO_KIND: 'veth', 'bridge', 'vxlan', ... ('' for a physical device) */
  readonly kind: string;
  /** IFLA_INFO_SLAVE_KIND: 'bridge' for a bridge port, 'bond' for a bond slave ('' otherwise) */
  readonly slaveKind: string;
  /** ifindex of the master (bridge, bond, VRF), 0 if none */
  readonly master: number;
  readonly operstate: string;
  /** hardware address, "aa:bb:..." */
  readonly address: string;
}

/** An address as rtnetlink reports it (RTM_NEWADDR). */
export interface RtnlAddr {
  readonly index: number;
  readonly family: 4 | 6;
  readonly address: string;
  readonly prefixLen: number;
  /** RT_SCOPE_*: 0 universe (global), 253 link, 254 host */
  readonly scope: number;
  /** IFA_F_* (IFA_F_TENTATIVE = 0x40, IFA_F_DEPRECATED = 0x20, ...) */
  readonly flags: number;
}

/** A route's next hop (a multipath route gives one each), as `ip route` shows it. */
export interface RtnlRoute {
  readonly family: 4 | 6;
  /** RT_TABLE_MAIN is 254, RT_TABLE_LOCAL 255 */
  readonly table: number;
  /** RTN_*: 1 unicast, 2 local, 6 blackhole, ... */
  readonly type: number;
  readonly scope: number;
  /** '' for the default route */
  readonly dst: string;
  readonly dstLen: number;
  /** 0 where the route names no device */
  readonly oif: number;
  readonly gateway: string;
  /** RTA_PREFSRC: the source address the route prefers ('' if it names none) */
  readonly prefsrc: string;
  readonly priority: number;
}

/** An echo reply to one of this socket's requests. */
export interface IcmpReply {
  readonly type: 'reply';
  readonly from: string;
  readonly id: number;
  readonly seq: number;
  readonly payload: Buffer;
}

/**
 * An error about one of this socket's requests (its error queue, IP_RECVERR):
 * an ICMP error from a router (origin 'icmp', offender = that router), or one
 * the local stack raised (origin 'local').
 */
export interface IcmpError {
  readonly type: 'error';
  /** errno name: EHOSTUNREACH, ENETUNREACH, EACCES (IPv6 prohibited), EMSGSIZE, ... */
  readonly errno: string;
  readonly origin: 'icmp' | 'local' | 'other';
  readonly icmpType: number;
  readonly icmpCode: number;
  /** ee_info: the MTU of a "fragmentation needed" / "packet too big" */
  readonly info: number;
  /** The request's destination. */
  readonly to: string;
  /** Who sent the ICMP error ('' for a local one). */
  readonly offender: string;
  /** From the quoted request; absent when the error quotes less than its ICMP header. */
  readonly id?: number;
  readonly seq?: number;
  /** What the error quotes of the request's payload (possibly truncated). */
  readonly payload?: Buffer;
}

/** The socket stopped being polled (an error condition that would not clear); close it and open another. */
export interface IcmpFatal {
  readonly type: 'fatal';
  readonly errno: string;
  readonly detail: string;
}

export type IcmpMessage = IcmpReply | IcmpError | IcmpFatal;

export interface IcmpSocketOptions {
  /** 'auto' (default): a ping socket, else SOCK_RAW (CAP_NET_RAW). */
  kind?: 'auto' | 'dgram' | 'raw';
  /** Make the socket inside this network namespace (it stays there). */
  netnsFd?: number;
}

/** An ICMP echo socket of one family, polled on the main loop (unref'd: it keeps no process alive). */
export interface RawIcmpSocket {
  readonly family: 4 | 6;
  /** 'dgram': a ping socket; 'raw': SOCK_RAW. */
  readonly kind: 'dgram' | 'raw';
  /** The echo identifier of every request it sends (a ping socket's is the kernel's). */
  readonly id: number;
  readonly closed: boolean;
  /** One echo request (sendto, non-blocking); throws the errno-coded error of a synchronous failure (EHOSTUNREACH, ...). */
  send(address: string, seq: number, payload?: Uint8Array): void;
  /** Closes the fd; idempotent. No callback after it. */
  close(): void;
}

export interface NativeBinding {
  /** An ICMP echo socket; onMessages gets what each wake-up read, errors first. */
  IcmpSocket: new (family: 4 | 6, onMessages: (messages: IcmpMessage[]) => void, options?: IcmpSocketOptions) => RawIcmpSocket;
  /** clsact + cls_bpf (direct action) filter (handle, priority) on ifindex; replace swaps an existing one's program, else EEXIST. */
  tcAttach(progFd: number, ifindex: number, direction: 'ingress' | 'egress', handle: number, priority: number, replace: boolean, netnsFd?: number): { progId: number };
  /** The program id of filter (handle, priority), 0 when there is none. */
  tcQuery(ifindex: number, direction: 'ingress' | 'egress', handle: number, priority: number, netnsFd?: number): number;
  tcDetach(ifindex: number, direction: 'ingress' | 'egress', handle: number, priority: number, netnsFd?: number): void;
  /** A tcx link (attach type 46 ingress, 47 egress; flags BPF_F_BEFORE = 8 for the head), pinned at pinPath. */
  tcxAttach(progFd: number, ifindex: number, attachType: number, flags: number, pinPath: string, netnsFd?: number): { linkId: number };
  /** The links of the caller's network namespace, or netnsFd's (RTM_GETLINK dump). */
  rtnlLinks(netnsFd?: number): RtnlLink[];
  /** Its IPv4 and IPv6 addresses (RTM_GETADDR dump). */
  rtnlAddrs(netnsFd?: number): RtnlAddr[];
  /** Its routes, every table (RTM_GETROUTE dump). */
  rtnlRoutes(netnsFd?: number): RtnlRoute[];
  /**
   * Calls back after each burst of link, address or route events in the caller's
   * namespace: how many messages, or -1 after an overrun (events lost). The
   * events only say when: list again.
   */
  rtnlWatch(callback: (messages: number) => void, netnsFd?: number): { close(): void };
  /** Opens a pinned link and the program it runs now (bpf_prog_get_fd_by_id), to restore it after a switch. */
  holdPinnedLink(path: string): RawHeldLink;
  /** A loaded program by id, held by fd (bpf_prog_get_fd_by_id); null when no program has that id. */
  holdProgram(id: number): RawHeldProgram | null;
  libbpfVersion(): string;
  numPossibleCpus(): number;
  /** BPF_ENABLE_STATS(BPF_STATS_RUN_TIME): an fd; programs' run time is counted while it is open. */
  enableRunTimeStats(): number;
  openObject(path: string, opts?: OpenOptions): RawBpfObject;
  openPinnedMap(path: string): RawBpfMap;
  /** bpf_map_create: a map no object declares (a map-in-map's inner maps); owns its fd. */
  mapCreate(opts: { type: number; keySize: number; valueSize: number; maxEntries: number; flags?: number; name?: string }): RawBpfMap;
  /** A map by id (what a map-in-map lookup returns); null when it is gone. */
  mapById(id: number): RawBpfMap | null;
  progInfoById(id: number): RawProgInfo | null;
  pinnedLinkInfo(path: string): { id: number; progId: number; type: number; attachType?: number; cgroupId?: number };
  /** bpf_link_update on a pinned link (atomic program replacement) */
  pinnedLinkUpdate(path: string, progFd: number): void;
  /** unlink a pinned object; throws on any error (including ENOENT) */
  unpin(path: string): void;
  // ---- off the JavaScript thread: stale-socket termination (native/netns.cc, native/sock_diag.cc).
  // Each runs on the libuv pool; a namespace is joined by a short-lived native thread only.
  /**
   * NETLINK_SOCK_DIAG dump of one family and protocol, sockets in `states` (a 1 << TCP_* mask),
   * in netnsFd's namespace when given; at most `limit` sockets (truncated: the dump had more).
   */
  inetDiagDump(family: number, protocol: number, states: number, netnsFd?: number, limit?: number): Promise<{ sockets: InetDiagSocket[]; truncated: boolean }>;
  /**
   * SOCK_DESTROY of exactly the sockets `ids` name (cookie checked by the kernel), over one netlink socket:
   * one errno per id, 0 when destroyed (ENOENT: gone; EOPNOTSUPP: no CONFIG_INET_DIAG_DESTROY).
   */
  inetDiagDestroy(family: number, protocol: number, ids: Buffer[], netnsFd?: number): Promise<number[]>;
  /**
   * One run of a loaded iterator program (by fd): a bpf_link for the run, the iterator created
   * inside netnsFd's namespace when given, read to EOF. What the program wrote.
   */
  iterRun(progFd: number, netnsFd?: number): Promise<Buffer>;
  // ---- end of stale-socket termination
  /** BPF_LINK_CREATE, the link closed again at once: whether the kernel accepts this attachment (its errno when not). */
  linkCreateProbe(progFd: number, target: number, attachType: number): void;
  progTestRun(
    progFd: number,
    opts: { data?: Buffer; ctx?: Buffer; repeat?: number; dataSizeOut?: number },
  ): { retval: number; duration: number; data: Buffer; ctx?: Buffer };
}
