#!/usr/bin/env python3
"""Socket-level clients for the lbctl end-to-end tests. Each subcommand
prints one JSON object on stdout, so the tests see exactly what the
application saw (peer addresses, reply sources, errno names).

  client.py tcp HOST PORT [--count N]      connect, getpeername, GET /, body
  client.py udp HOST PORT --mode connected|unconnected [--count N]
  client.py refused HOST PORT --proto tcp|udp
  client.py http-many FILE                 one HOST:PORT a line; GET / from each
  client.py dns HOST PORT NAME [--count N] A query per unconnected sendto/recvfrom

A host containing ':' is dialled on an AF_INET6 socket (so ::ffff:a.b.c.d
exercises the IPv4-mapped path).
"""
import argparse
import errno
import json
import socket
import struct
import sys
import time

TIMEOUT = 3.0


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
                results.append({"server": server, "echo": echoed, "source": source})
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
    a = p.parse_args()
    a.fn(a)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
