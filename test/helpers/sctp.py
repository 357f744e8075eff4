#!/usr/bin/env python3
"""SCTP servers and clients for the lbctl end-to-end tests (python's socket
module speaks SCTP through the kernel: socket(AF_INET, SOCK_STREAM or
SOCK_SEQPACKET, IPPROTO_SCTP)). Each client subcommand prints one JSON object.

  sctp.py available                       {"ok": true} or {"ok": false, "error": ERRNO}: can this
                                          kernel make an SCTP socket (the sctp module loads on demand)
  sctp.py server ADDR:PORT...             one one-to-many socket per address; every message is
                                          answered with "ADDR:PORT|PEER|<payload>" (its own bound
                                          address, the peer it sees); prints "ready" once bound
  sctp.py stream HOST PORT [--count N] [--bind] [--connectx [ALSO...]]
                                          one-to-one (SOCK_STREAM) associations: [bind to the
                                          wildcard,] connect (or sctp_connectx() to HOST and ALSO),
                                          getpeername, getsockname, send, receive, close
  sctp.py survey HOST4 HOST6 PORT         {"cases": {NAME: results}}: every way of opening an
                                          association test/e2e/sctp.ts's hook survey asks about
                                          (one-to-one: connect, bind first, sctp_connectx; one-to-
                                          many: sendto, connect then sendto; IPv4 and IPv6)
  sctp.py seqpacket HOST PORT [--count N] [--connect]
                                          a one-to-many (SOCK_SEQPACKET) socket: [connect,] sendto
                                          and recvfrom, one message each

A host containing ':' is dialled on an AF_INET6 socket. --timeout S (before
the subcommand) is how long a client waits, times LBCTL_TEST_SLOW (default 3).
"""
import argparse
import errno
import json
import os
import select
import socket
import struct
import sys

IPPROTO_SCTP = 132
try:
    SLOW = max(1.0, float(os.environ.get("LBCTL_TEST_SLOW", "1")))
except ValueError:
    SLOW = 1.0
TIMEOUT = 3.0 * SLOW  # --timeout S replaces it (then S times LBCTL_TEST_SLOW)


def family_of(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def fmt(sockname):
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def errname(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if isinstance(e, OSError) and e.errno else type(e).__name__


def split_hostport(text):
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def cmd_available(_a):
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_SCTP).close()
        print(json.dumps({"ok": True}))
    except OSError as e:
        print(json.dumps({"ok": False, "error": errname(e)}))


def cmd_server(a):
    import selectors
    sel = selectors.DefaultSelector()
    for text in a.addrs:
        host, port = split_hostport(text)
        s = socket.socket(family_of(host), socket.SOCK_SEQPACKET, IPPROTO_SCTP)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(64)
        sel.register(s, selectors.EVENT_READ, fmt(s.getsockname()))
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            try:
                data, peer = key.fileobj.recvfrom(65535)
                if data:
                    key.fileobj.sendto(f"{key.data}|{fmt(peer)}|".encode() + data, peer)
            except OSError as e:
                print(f"server {key.data}: {errname(e)}", file=sys.stderr, flush=True)


def reply(data, source):
    server, _, rest = data.decode(errors="replace").partition("|")
    peer, _, echo = rest.partition("|")
    return {"server": server, "seen_as": peer, "echo": echo, "source": source}


SCTP_SOCKOPT_CONNECTX = 110  # linux/sctp.h: sctp_connectx(), a packed list of sockaddrs


def connectx(s, addrs):
    """sctp_connectx() as libsctp makes it: one setsockopt with every address of the peer."""
    packed = b""
    for host, port in addrs:
        if ":" in host:
            packed += struct.pack("=H", socket.AF_INET6) + struct.pack("!HI", port, 0) + socket.inet_pton(socket.AF_INET6, host) + struct.pack("=I", 0)
        else:
            packed += struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_pton(socket.AF_INET, host) + bytes(8)
    try:
        s.setsockopt(IPPROTO_SCTP, SCTP_SOCKOPT_CONNECTX, packed)
    except BlockingIOError:
        # a socket with a timeout is non-blocking underneath: wait as connect() would
        if not select.select([], [s], [], TIMEOUT)[1]:
            raise TimeoutError("sctp_connectx timed out")
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise OSError(err, os.strerror(err))


def stream(a):
    results = []
    for i in range(a.count):
        s = socket.socket(family_of(a.host), socket.SOCK_STREAM, IPPROTO_SCTP)
        s.settimeout(TIMEOUT)
        try:
            if a.bind:
                s.bind(("::" if ":" in a.host else "0.0.0.0", 0))
            if a.connectx is not None:
                connectx(s, [(a.host, a.port)] + [(h, a.port) for h in a.connectx])
            else:
                s.connect((a.host, a.port))
            peer = fmt(s.getpeername())
            s.getsockname()
            s.send(f"msg-{i}".encode())
            r = reply(s.recv(65535), peer)
            r["peer"] = peer
            results.append(r)
        except OSError as e:
            results.append({"error": errname(e)})
        finally:
            s.close()
    return results


def cmd_stream(a):
    print(json.dumps({"results": stream(a)}))


def seqpacket(a):
    results = []
    for i in range(a.count):
        s = socket.socket(family_of(a.host), socket.SOCK_SEQPACKET, IPPROTO_SCTP)
        s.settimeout(TIMEOUT)
        try:
            msg = f"msg-{i}".encode()
            if a.connect:
                s.connect((a.host, a.port))
            # A one-to-many socket names the peer on every send, connected or not.
            s.sendto(msg, (a.host, a.port))
            data, src = s.recvfrom(65535)
            results.append(reply(data, fmt(src)))
        except OSError as e:
            results.append({"error": errname(e)})
        finally:
            s.close()
    return results


def cmd_seqpacket(a):
    print(json.dumps({"results": seqpacket(a)}))


def cmd_survey(a):
    """Every way of opening an association the hook survey asks about, one after another."""
    def args(host, **kw):
        return argparse.Namespace(**{"host": host, "port": a.port, "count": 1, "bind": False, "connectx": None, "connect": False, **kw})
    cases = {
        "one-to-one, IPv4": stream(args(a.host4)),
        "one-to-one, IPv4, bound first": stream(args(a.host4, bind=True)),
        "one-to-one, IPv4, sctp_connectx()": stream(args(a.host4, connectx=[])),
        "one-to-many, IPv4, sendto()": seqpacket(args(a.host4)),
        "one-to-many, IPv4, connect() then sendto()": seqpacket(args(a.host4, connect=True)),
        "one-to-one, IPv6": stream(args(a.host6)),
        "one-to-many, IPv6, sendto()": seqpacket(args(a.host6)),
    }
    print(json.dumps({"cases": cases}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("available").set_defaults(fn=cmd_available)
    sp = sub.add_parser("server")
    sp.add_argument("addrs", nargs="+")
    sp.set_defaults(fn=cmd_server)
    sp = sub.add_parser("stream")
    sp.add_argument("host")
    sp.add_argument("port", type=int)
    sp.add_argument("--count", type=int, default=1)
    sp.add_argument("--bind", action="store_true")
    sp.add_argument("--connectx", nargs="*", metavar="ALSO", help="sctp_connectx() to HOST and these addresses")
    sp.set_defaults(fn=cmd_stream)
    sp = sub.add_parser("seqpacket")
    sp.add_argument("host")
    sp.add_argument("port", type=int)
    sp.add_argument("--count", type=int, default=1)
    sp.add_argument("--connect", action="store_true")
    sp.set_defaults(fn=cmd_seqpacket)
    sp = sub.add_parser("survey")
    sp.add_argument("host4")
    sp.add_argument("host6")
    sp.add_argument("port", type=int)
    sp.set_defaults(fn=cmd_survey)
    p.add_argument("--timeout", type=float, help="seconds each client waits (times LBCTL_TEST_SLOW; default 3)")
    a = p.parse_args()
    if a.timeout is not None:
        global TIMEOUT
        TIMEOUT = a.timeout * SLOW
    a.fn(a)


if __name__ == "__main__":
    main()
