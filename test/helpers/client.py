#!/usr/bin/env python3
"""Socket-level clients for the lbctl end-to-end tests. Each subcommand
prints one JSON object on stdout, so the tests see exactly what the
application saw (peer addresses, reply sources, errno names).

  client.py tcp HOST PORT [--count N]      connect, getpeername, GET /, body
  client.py udp HOST PORT --mode connected|unconnected [--count N]
  client.py refused HOST PORT --proto tcp|udp
  client.py http-many FILE                 one HOST:PORT a line; GET / from each
  client.py dns HOST PORT NAME [--count N] A query per unconnected sendto/recvfrom
  client.py load --tcp HOST:PORT[@RATE] --udp HOST:PORT[@RATE] [--rate R]
                 [--seconds MAX] [--stop-file F] [--progress F] [--timeout S]
                 [--path P]                steady load: per target, RATE (default R)
                                           fresh sockets a second (TCP: connect, GET /,
                                           read to EOF, close; UDP: unconnected sendto,
                                           recvfrom); every failure with errno, phase and
                                           epoch ms (an attempt that takes over S seconds,
                                           default 3 times LBCTL_TEST_SLOW, fails); runs until F exists,
                                           SIGTERM/SIGINT, or MAX seconds; the progress file
                                           holds the counts and the first failures
  client.py udp-long HOST PORT [--interval S] [--seconds MAX] [--stop-file F] [--progress F]
                                           one long-lived connected UDP socket, as a resolver
                                           keeps one: a datagram every S seconds; when the
                                           socket is destroyed (recv: ECONNABORTED; send:
                                           EDESTADDRREQ, with ECONNABORTED in SO_ERROR), a fresh
                                           one is connected (balanced again); every reply and
                                           error with its socket number and epoch ms
  client.py tcp-long HOST PORT [--interval S] [--seconds MAX] [--stop-file F] [--progress F]
                                           one long-lived TCP connection to a line echo
                                           (backend.py --tcp-echo): a line every S seconds,
                                           each answered with the server's address and the
                                           peer it sees; never reconnects (a dead connection
                                           ends the run); every failure with its phase, errno
                                           name and epoch ms; closed with a FIN at the end

A host containing ':' is dialled on an AF_INET6 socket (so ::ffff:a.b.c.d
exercises the IPv4-mapped path).
"""
import argparse
import errno
import json
import socket
import struct
import os
import sys
import time

# Where everything runs slower (the vmtest guest under TCG sets
# LBCTL_TEST_SLOW), every wait for an answer is that many times longer, as
# the tests' own deadlines are (test/helpers/sandbox/run.ts, SLOW).
try:
    SLOW = max(1.0, float(os.environ.get("LBCTL_TEST_SLOW", "1")))
except ValueError:
    SLOW = 1.0
TIMEOUT = 3.0 * SLOW


def family_of(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def fmt(sockname):
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def errname(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if isinstance(e, OSError) and e.errno else type(e).__name__


def http_get(host, port):
    """One TCP connection: returns {peer, body} or {error}."""
    s = socket.socket(family_of(host), socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    try:
        s.connect((host, port))
        peer = fmt(s.getpeername())
        s.sendall(b"GET / HTTP/1.0\r\nHost: lbctl-test\r\n\r\n")
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
        raw = b"".join(chunks).decode(errors="replace")
        _, _, body = raw.partition("\r\n\r\n")
        return {"peer": peer, "body": body.strip()}
    except OSError as e:
        return {"error": errname(e)}
    finally:
        s.close()


def cmd_tcp(a):
    print(json.dumps({"results": [http_get(a.host, a.port) for _ in range(a.count)]}))


def cmd_udp(a):
    results = []
    s = socket.socket(family_of(a.host), socket.SOCK_DGRAM)
    s.settimeout(TIMEOUT)
    peer = None
    try:
        if a.mode == "connected":
            s.connect((a.host, a.port))
            peer = fmt(s.getpeername())
        for i in range(a.count):
            msg = f"ping-{i}".encode()
            if a.size:
                msg += b"-" + b"x" * max(0, a.size - len(msg) - 1)
            try:
                if a.mode == "connected":
                    s.send(msg)
                    data = s.recv(65535)
                    source = peer
                else:
                    s.sendto(msg, (a.host, a.port))
                    data, src = s.recvfrom(65535)
                    source = fmt(src)
                server, _, echoed = data.decode(errors="replace").partition("|")
                res = {"server": server, "echo": echoed[:64], "source": source}
                if a.size:
                    # the answer's payload is ours, whole (its length: the datagram came back reassembled)
                    res["sent"] = len(msg)
                    res["intact"] = echoed.encode().endswith(msg)
                results.append(res)
            except OSError as e:
                results.append({"error": errname(e)})
    except OSError as e:
        results.append({"error": errname(e)})
    finally:
        s.close()
    print(json.dumps({"peer": peer, "results": results}))


def cmd_refused(a):
    """How one connect() (tcp) or sendto() (udp) fails, and how fast."""
    kind = socket.SOCK_STREAM if a.proto == "tcp" else socket.SOCK_DGRAM
    s = socket.socket(family_of(a.host), kind)
    s.settimeout(TIMEOUT)
    t0 = time.monotonic()
    err = None
    try:
        if a.proto == "tcp":
            s.connect((a.host, a.port))
        else:
            s.sendto(b"x", (a.host, a.port))
    except OSError as e:
        err = errname(e)
    ms = (time.monotonic() - t0) * 1000
    s.close()
    print(json.dumps({"error": err, "ms": round(ms, 3)}))


def dns_query(qid, name):
    header = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)  # RD, one question
    qname = b"".join(bytes([len(label)]) + label.encode() for label in name.rstrip(".").split(".")) + b"\0"
    return header + qname + struct.pack("!HH", 1, 1)  # A, IN


def dns_answers(packet, query):
    """The A records of a reply to `query` (which it must echo)."""
    qid, flags, _, ancount, _, _ = struct.unpack("!HHHHHH", packet[:12])
    off = len(query)
    if packet[12:off] != query[12:]:
        raise ValueError("reply does not echo the question")
    out = []
    for _ in range(ancount):
        while True:  # name: labels or a compression pointer
            n = packet[off]
            if n & 0xC0 == 0xC0:
                off += 2
                break
            off += 1 + n
            if n == 0:
                break
        rtype, _, _, rdlen = struct.unpack("!HHIH", packet[off:off + 10])
        off += 10
        if rtype == 1 and rdlen == 4:
            out.append(socket.inet_ntoa(packet[off:off + 4]))
        off += rdlen
    return qid, flags & 0xF, out


def cmd_dns(a):
    """Plain resolver behaviour: unconnected socket, the reply's source must be the server asked."""
    results = []
    s = socket.socket(family_of(a.host), socket.SOCK_DGRAM)
    s.settimeout(TIMEOUT)
    try:
        for i in range(a.count):
            q = dns_query(0x1000 + i, a.name)
            try:
                s.sendto(q, (a.host, a.port))
                data, src = s.recvfrom(65535)
                qid, rcode, answers = dns_answers(data, q)
                results.append({"source": fmt(src), "id": qid == 0x1000 + i, "rcode": rcode, "answers": answers})
            except (OSError, ValueError, struct.error, IndexError) as e:
                results.append({"error": errname(e)})
    finally:
        s.close()
    print(json.dumps({"results": results}))


def cmd_http_many(a):
    with open(a.file) as f:
        targets = [line.strip() for line in f if line.strip()]
    ok = 0
    failed = []
    bodies = {}
    peers_wrong = []
    for t in targets:
        host, _, port = t.rpartition(":")
        host = host.strip("[]")
        r = http_get(host, int(port))
        if "error" in r or not r["body"]:
            failed.append({"target": t, **r})
            continue
        ok += 1
        bodies[r["body"]] = bodies.get(r["body"], 0) + 1
        if r["peer"] != t:
            peers_wrong.append({"target": t, "peer": r["peer"]})
    print(json.dumps({"total": len(targets), "ok": ok, "failed": failed[:20], "failedCount": len(failed),
                      "bodies": bodies, "peersWrong": peers_wrong[:20]}))


def split_target(text, default_rate):
    """HOST:PORT[@RATE] ([v6]:PORT too) -> (host, port, rate)."""
    spec, _, rate = text.partition("@")
    host, _, port = spec.rpartition(":")
    return host.strip("[]"), int(port), float(rate) if rate else default_rate


def load_tcp(host, port, timeout, path="/"):
    """One connection through the service: None, or (phase, errno name)."""
    s = socket.socket(family_of(host), socket.SOCK_STREAM)
    s.settimeout(timeout)
    phase = "socket"
    try:
        phase = "connect"
        s.connect((host, port))
        phase = "getpeername"
        peer = s.getpeername()
        if peer[0] != host or peer[1] != port:
            return phase, "EPEER:" + fmt(peer)
        phase = "send"
        s.sendall(b"GET " + path.encode() + b" HTTP/1.0\r\nHost: lbctl-test\r\n\r\n")
        phase = "recv"
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
        raw = b"".join(chunks).decode(errors="replace")
        head, _, body = raw.partition("\r\n\r\n")
        if not head.startswith("HTTP/1.0 200") or not body.strip():
            return phase, "EBADREPLY"
        return None, body.strip()
    except OSError as e:
        return phase, errname(e)
    finally:
        s.close()


def load_udp(host, port, timeout):
    s = socket.socket(family_of(host), socket.SOCK_DGRAM)
    s.settimeout(timeout)
    phase = "sendto"
    try:
        msg = b"load-%d" % time.monotonic_ns()
        s.sendto(msg, (host, port))
        phase = "recvfrom"
        data, src = s.recvfrom(65535)
        if src[0] != host or src[1] != port:
            return phase, "ESOURCE:" + fmt(src)
        server, _, echoed = data.decode(errors="replace").partition("|")
        if echoed.encode() != msg:
            return phase, "EBADREPLY"
        return None, server
    except OSError as e:
        return phase, errname(e)
    finally:
        s.close()


def cmd_load(a):
    import os
    import queue
    import signal
    import threading

    targets = [("tcp",) + split_target(t, a.rate) for t in a.tcp] + [("udp",) + split_target(u, a.rate) for u in a.udp]
    if not targets:
        raise SystemExit("load: give at least one --tcp or --udp target")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    lock = threading.Lock()
    stats = {f"{proto}:{host}:{port}": {"attempted": 0, "ok": 0, "failed": 0, "backends": {}} for proto, host, port, _ in targets}
    failures = []
    ok_buckets = {}  # epoch ms // 100 -> successful attempts finished then
    latency = {"max": 0.0}
    work = queue.Queue()

    def worker():
        while True:
            item = work.get()
            if item is None:
                return
            proto, host, port, due = item
            t0 = time.monotonic()
            phase, result = load_tcp(host, port, a.timeout, a.path) if proto == "tcp" else load_udp(host, port, a.timeout)
            ms = (time.monotonic() - t0) * 1000
            now = time.time()
            key = f"{proto}:{host}:{port}"
            with lock:
                st = stats[key]
                st["attempted"] += 1
                latency["max"] = max(latency["max"], ms)
                if phase is None:
                    st["ok"] += 1
                    st["backends"][result] = st["backends"].get(result, 0) + 1
                    b = int(now * 10)
                    ok_buckets[b] = ok_buckets.get(b, 0) + 1
                else:
                    st["failed"] += 1
                    failures.append({"target": key, "phase": phase, "error": result, "at": round(now * 1000), "ms": round(ms, 1)})

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(a.workers)]
    for th in threads:
        th.start()

    started = time.time()
    t_start = time.monotonic()
    next_due = [t_start] * len(targets)
    issued = 0
    max_backlog = 0
    last_progress = 0.0

    def progress():
        if not a.progress:
            return
        with lock:
            snap = {"attempted": sum(s["attempted"] for s in stats.values()), "ok": sum(s["ok"] for s in stats.values()),
                    "failed": len(failures), "failures": failures[:10], "at": round(time.time() * 1000)}
        tmp = a.progress + ".tmp"
        with open(tmp, "w") as f:
            json.dump(snap, f)
        os.replace(tmp, a.progress)

    while not stop.is_set():
        now = time.monotonic()
        if now - t_start >= a.seconds or (a.stop_file and os.path.exists(a.stop_file)):
            break
        for i, (proto, host, port, rate) in enumerate(targets):
            while next_due[i] <= now:
                work.put((proto, host, port, next_due[i]))
                issued += 1
                next_due[i] += 1.0 / rate
        max_backlog = max(max_backlog, work.qsize())
        if now - last_progress >= 0.2:
            progress()
            last_progress = now
        # The pace is the test: attempts are issued on schedule, not as fast as possible.
        time.sleep(max(0.0, min(min(next_due) - time.monotonic(), 0.01)))
    elapsed = time.monotonic() - t_start
    for _ in threads:
        work.put(None)
    # Every issued attempt is made and counted. First the backlog drains
    # (the caller's deadline bounds that): a join with a timeout while it
    # drains could give up on a worker still busy with one of the last
    # attempts, and print one attempt short. Then each worker holds at most
    # one attempt, which its socket timeouts bound. If every worker died
    # (an exception no attempt catches), nothing drains: stop waiting.
    while not work.empty() and any(th.is_alive() for th in threads):
        time.sleep(0.05)
    for th in threads:
        th.join(a.timeout * 3)
    progress()
    with lock:
        attempted = sum(s["attempted"] for s in stats.values())
        print(json.dumps({
            "started": round(started * 1000), "seconds": round(elapsed, 3), "issued": issued, "attempted": attempted,
            "ok": sum(s["ok"] for s in stats.values()), "failed": len(failures), "failures": failures[:200],
            "targets": stats, "maxLatencyMs": round(latency["max"], 1), "maxBacklog": max_backlog,
            "okPer100ms": {str(k * 100): v for k, v in sorted(ok_buckets.items())},
        }))


def cmd_udp_long(a):
    import os
    import signal

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    events = []
    sockets = []  # {"n", "peer", "cookie"}
    s = None
    t_end = time.monotonic() + a.seconds

    def progress():
        if not a.progress:
            return
        tmp = a.progress + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"sockets": sockets, "events": len(events), "last": events[-1] if events else None}, f)
        os.replace(tmp, a.progress)

    i = 0
    while not stop and time.monotonic() < t_end and not (a.stop_file and os.path.exists(a.stop_file)):
        phase = "connect"
        try:
            if s is None:
                s = socket.socket(family_of(a.host), socket.SOCK_DGRAM)
                s.settimeout((a.interval * 2 + 0.5) * SLOW)
                s.connect((a.host, a.port))
                cookie = int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 57, 8), "little")  # SO_COOKIE
                sockets.append({"n": len(sockets) + 1, "peer": fmt(s.getpeername()), "cookie": str(cookie)})
            i += 1
            phase = "send"
            msg = f"ping-{os.getpid()}-{i}".encode()
            s.send(msg)
            phase = "recv"
            data = s.recv(65535)
            server, _, rest = data.decode(errors="replace").partition("|")
            ev = {"socket": len(sockets), "server": server, "at": round(time.time() * 1000)}
            # backend.py echoes what it got (after its address, and the peer's with --udp-peer):
            # an answer that is not ours is another client's, delivered here
            if not rest.endswith(msg.decode()):
                ev["foreign"] = rest[-40:]
            events.append(ev)
        except OSError as e:
            ev = {"socket": len(sockets), "phase": phase, "error": errname(e), "at": round(time.time() * 1000)}
            # A destroyed socket is disconnected: recv() fails with ECONNABORTED,
            # send() with EDESTADDRREQ (ECONNABORTED stays pending in SO_ERROR).
            if s is not None and e.errno in (errno.ECONNABORTED, errno.EDESTADDRREQ, errno.ENOTCONN):
                pending = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if pending:
                    ev["soError"] = errno.errorcode.get(pending, str(pending))
                s.close()
                s = None
            events.append(ev)
        progress()
        # The pace is the test: a resolver's socket sends every S seconds.
        time.sleep(a.interval)
    if s is not None:
        s.close()
    print(json.dumps({"sockets": sockets, "events": events}))


def cmd_tcp_long(a):
    import os
    import signal

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    out = {"connected": False, "local": None, "peer": None, "sent": 0, "ok": 0, "failed": 0, "failures": [],
           "servers": {}, "seenAs": {}, "maxLatencyMs": 0.0, "end": None}

    def progress():
        if not a.progress:
            return
        tmp = a.progress + ".tmp"
        with open(tmp, "w") as f:
            json.dump({k: out[k] for k in ("connected", "local", "peer", "sent", "ok", "failed", "servers", "seenAs", "end")}
                      | {"failures": out["failures"][:10], "at": round(time.time() * 1000)}, f)
        os.replace(tmp, a.progress)

    def fail(phase, error):
        out["failed"] += 1
        if len(out["failures"]) < 200:
            out["failures"].append({"n": out["sent"], "phase": phase, "error": error, "at": round(time.time() * 1000)})

    s = socket.socket(family_of(a.host), socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    try:
        if a.sport:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("::" if family_of(a.host) == socket.AF_INET6 else "0.0.0.0", a.sport))
        s.connect((a.host, a.port))
        out["connected"] = True
        out["local"] = fmt(s.getsockname())
        out["peer"] = fmt(s.getpeername())
    except OSError as e:
        fail("connect", errname(e))
        out["end"] = "connect failed"
        progress()
        s.close()
        print(json.dumps(out))
        return
    progress()
    # MAX counts from the connection's start: a connect that took a SYN retransmit still gets its requests.
    t_end = time.monotonic() + a.seconds
    buf = b""
    n = 0
    while not stop and time.monotonic() < t_end and not (a.stop_file and os.path.exists(a.stop_file)):
        n += 1
        t0 = time.monotonic()
        phase = "send"
        try:
            s.sendall(b"req-%d\n" % n)
            out["sent"] = n
            phase = "recv"
            got = None
            while got is None:
                while b"\n" not in buf:
                    data = s.recv(65536)
                    if not data:
                        raise ConnectionResetError(errno.ECONNRESET, "closed by the peer")
                    buf += data
                line, _, buf = buf.partition(b"\n")
                server, _, rest = line.decode(errors="replace").partition("|")
                seen, _, echoed = rest.partition("|")
                if echoed == "req-%d" % n:
                    got = (server, seen)
                # else: a late answer to an earlier, timed-out line: skip it
            ms = (time.monotonic() - t0) * 1000
            out["ok"] += 1
            out["maxLatencyMs"] = round(max(out["maxLatencyMs"], ms), 1)
            out["servers"][got[0]] = out["servers"].get(got[0], 0) + 1
            out["seenAs"][got[1]] = out["seenAs"].get(got[1], 0) + 1
        except socket.timeout:
            fail(phase, "ETIMEDOUT")
        except OSError as e:
            fail(phase, errname(e))
            out["end"] = "connection lost"
            break
        progress()
        # The pace is the test: a request every S seconds on the one connection.
        time.sleep(max(0.0, a.interval - (time.monotonic() - t0)))
    if out["end"] is None:
        out["end"] = "closed"
        try:
            s.shutdown(socket.SHUT_WR)
            s.settimeout(TIMEOUT)
            while s.recv(65536):
                pass
        except OSError:
            pass
    s.close()
    progress()
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tcp")
    t.add_argument("host")
    t.add_argument("port", type=int)
    t.add_argument("--count", type=int, default=1)
    t.set_defaults(fn=cmd_tcp)
    u = sub.add_parser("udp")
    u.add_argument("host")
    u.add_argument("port", type=int)
    u.add_argument("--mode", choices=["connected", "unconnected"], required=True)
    u.add_argument("--count", type=int, default=1)
    u.add_argument("--size", type=int, default=0, help="bytes of each datagram (padded); the answer must echo them whole")
    u.set_defaults(fn=cmd_udp)
    r = sub.add_parser("refused")
    r.add_argument("host")
    r.add_argument("port", type=int)
    r.add_argument("--proto", choices=["tcp", "udp"], required=True)
    r.set_defaults(fn=cmd_refused)
    d = sub.add_parser("dns")
    d.add_argument("host")
    d.add_argument("port", type=int)
    d.add_argument("name")
    d.add_argument("--count", type=int, default=1)
    d.set_defaults(fn=cmd_dns)
    m = sub.add_parser("http-many")
    m.add_argument("file")
    m.set_defaults(fn=cmd_http_many)
    ld = sub.add_parser("load")
    ld.add_argument("--tcp", action="append", default=[], help="HOST:PORT[@RATE]")
    ld.add_argument("--udp", action="append", default=[], help="HOST:PORT[@RATE]")
    ld.add_argument("--rate", type=float, default=300.0, help="attempts a second per target")
    ld.add_argument("--seconds", type=float, default=60.0, help="stop after this long at the latest")
    ld.add_argument("--stop-file", help="stop once this file exists")
    ld.add_argument("--progress", help="keep {attempted, ok, failed, failures (the first 10), at} in this file")
    ld.add_argument("--workers", type=int, default=16)
    ld.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds one attempt may take before it counts as failed")
    ld.add_argument("--path", default="/", help="the path TCP attempts GET (a backend that names itself there: /hostname)")
    ld.set_defaults(fn=cmd_load)
    ul = sub.add_parser("udp-long")
    ul.add_argument("host")
    ul.add_argument("port", type=int)
    ul.add_argument("--interval", type=float, default=0.1, help="seconds between datagrams")
    ul.add_argument("--seconds", type=float, default=60.0, help="stop after this long at the latest")
    ul.add_argument("--stop-file", help="stop once this file exists")
    ul.add_argument("--progress", help="keep {sockets, events, last} in this file")
    ul.set_defaults(fn=cmd_udp_long)
    tl = sub.add_parser("tcp-long")
    tl.add_argument("host")
    tl.add_argument("port", type=int)
    tl.add_argument("--interval", type=float, default=0.2, help="seconds between requests")
    tl.add_argument("--seconds", type=float, default=120.0, help="stop after this long at the latest")
    tl.add_argument("--stop-file", help="stop (and close with a FIN) once this file exists")
    tl.add_argument("--progress", help="keep the counts so far in this file")
    tl.add_argument("--sport", type=int, default=0, help="connect from this source port")
    tl.set_defaults(fn=cmd_tcp_long)
    a = p.parse_args()
    a.fn(a)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
