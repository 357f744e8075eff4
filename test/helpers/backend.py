#!/usr/bin/env python3
"""Backend servers for the lbctl sandbox: each answers with the address it
was reached on, so a client can tell which backend served it.

  backend.py --http 10.244.1.1:8080 --http [fd00:244::1:1]:8080 --udp 10.244.1.1:9000
             [--tcp-echo 10.244.1.1:7000]

HTTP: every GET answers "ADDR:PORT\n" (the server socket's own address),
      with the client's address in an X-Client header ("ADDR:PORT");
      GET /bytes/N answers N bytes instead (a large response, for path MTU
      tests), with the same header. POST (any path) reads the body and
      answers its length in bytes, "N\n" (an upload, for path MTU tests).
UDP:  every datagram is answered with "ADDR:PORT|<payload>" from that address
      (with --udp-peer: "ADDR:PORT|PEER|<payload>", PEER the sender's address).
TCP echo (--tcp-echo): a connection stays open; every line is answered with
      "ADDR:PORT|PEER|<line>\n" (the server socket's address, the peer it sees),
      for long-lived connections kept across restarts and changes.
Prints "ready" on stdout once every socket is bound; runs until killed.
"""
import argparse
import http.server
import os
import socket
import stat
import sys
import threading


def split_hostport(text):
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return family, host, int(port)


def format_addr(sockname):
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


BYTES_MAX = 1 << 30
CHUNK = b"x" * 65536


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/bytes/"):
            self.send_bytes(self.path[len("/bytes/"):])
            return
        body = (format_addr(self.connection.getsockname()) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("X-Client", format_addr(self.client_address))
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        got = 0
        while got < n:
            chunk = self.rfile.read(min(n - got, len(CHUNK)))
            if not chunk:
                break
            got += len(chunk)
        body = f"{got}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("X-Client", format_addr(self.client_address))
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def send_bytes(self, count):
        n = int(count) if count.isdigit() else -1
        if not 0 <= n <= BYTES_MAX:
            self.send_error(400, "GET /bytes/N takes 0 <= N <= %d" % BYTES_MAX)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("X-Client", format_addr(self.client_address))
        self.send_header("Content-Length", str(n))
        self.send_header("Connection", "close")
        self.end_headers()
        while n > 0:
            chunk = CHUNK[: min(n, len(CHUNK))]
            self.wfile.write(chunk)
            n -= len(chunk)

    def log_message(self, *args):
        pass


def http_server(spec):
    family, host, port = split_hostport(spec)

    class Server(http.server.ThreadingHTTPServer):
        address_family = family
        allow_reuse_address = True
        daemon_threads = True
        request_queue_size = 256

    return Server((host, port), Handler)


def udp_socket(spec):
    family, host, port = split_hostport(spec)
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.bind((host, port))
    return s


def udp_echo(s, with_peer):
    me = format_addr(s.getsockname()).encode()
    while True:
        data, peer = s.recvfrom(65535)
        if with_peer:
            s.sendto(me + b"|" + format_addr(peer).encode() + b"|" + data, peer)
        else:
            s.sendto(me + b"|" + data, peer)


def tcp_echo_server(spec):
    family, host, port = split_hostport(spec)
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(128)
    return s


def tcp_echo_conn(conn):
    me = format_addr(conn.getsockname()).encode()
    peer = format_addr(conn.getpeername()).encode()
    buf = b""
    try:
        while True:
            data = conn.recv(65536)
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                conn.sendall(me + b"|" + peer + b"|" + line + b"\n")
    except OSError:
        pass
    finally:
        conn.close()


def tcp_echo_accept(s):
    while True:
        conn, _ = s.accept()
        threading.Thread(target=tcp_echo_conn, args=(conn,), daemon=True).start()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", action="append", default=[])
    p.add_argument("--udp", action="append", default=[])
    p.add_argument("--tcp-echo", action="append", default=[], help="ADDR:PORT: line echo on long-lived connections")
    p.add_argument("--udp-peer", action="store_true", help="UDP answers name the sender too")
    p.add_argument("--tag", help="ignored; names the run in ps output")
    args = p.parse_args()
    servers = [http_server(spec) for spec in args.http]
    sockets = [udp_socket(spec) for spec in args.udp]
    echoes = [tcp_echo_server(spec) for spec in args.tcp_echo]
    threads = [threading.Thread(target=srv.serve_forever, daemon=True) for srv in servers]
    threads += [threading.Thread(target=udp_echo, args=(s, args.udp_peer), daemon=True) for s in sockets]
    threads += [threading.Thread(target=tcp_echo_accept, args=(s,), daemon=True) for s in echoes]
    for th in threads:
        th.start()
    print("ready", flush=True)
    # With a pipe on stdin (a test harness), exit when the parent goes away;
    # otherwise run until killed.
    try:
        mode = os.fstat(0).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            sys.stdin.read()
        else:
            threading.Event().wait()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
