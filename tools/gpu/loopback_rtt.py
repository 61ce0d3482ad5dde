#!/usr/bin/env python3
"""This machine's loopback round trip: the floor under every BN exchange
measured on it (a BN exchange is one request and one answer between two
processes). Two processes ping-pong a 64-byte message over TCP on
127.0.0.1 (TCP_NODELAY) and over a Unix socket pair, --count times each
after a warm-up, blocking reads (no polling); prints one Markdown table of
the median and 90th percentile in microseconds.

    python3 tools/gpu/loopback_rtt.py [--count 5000]

Standard library only; a benchmark (prints a table, exits 0).
"""

import argparse
import os
import socket
import statistics
import sys
import time

MESSAGE = b"x" * 64


def _recv_exact(sock, n):
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise ConnectionError("peer closed")
        got += chunk
    return got


def _echo(sock, total):
    for _ in range(total):
        sock.sendall(_recv_exact(sock, len(MESSAGE)))
    sock.close()


def _ping(sock, warmup, count):
    times = []
    for i in range(warmup + count):
        t0 = time.perf_counter_ns()
        sock.sendall(MESSAGE)
        _recv_exact(sock, len(MESSAGE))
        if i >= warmup:
            times.append((time.perf_counter_ns() - t0) / 1000.0)
    sock.close()
    return times


def _pair(kind):
    """(client, server) connected sockets of the given kind."""
    if kind == "unix":
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    for s in (client, server):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, server


def measure(kind, warmup, count):
    client, server = _pair(kind)
    pid = os.fork()
    if pid == 0:  # the echoing process
        client.close()
        try:
            _echo(server, warmup + count)
        finally:
            os._exit(0)
    server.close()
    times = _ping(client, warmup, count)
    os.waitpid(pid, 0)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=5000)
    p.add_argument("--warmup", type=int, default=500)
    args = p.parse_args(argv)
    if args.count < 1 or args.warmup < 0:
        p.error("--count must be at least 1 and --warmup at least 0")
    print("| transport | round trip p50 us | p90 us |")
    print("|---|---:|---:|")
    for kind, name in (("tcp", "TCP 127.0.0.1"), ("unix", "Unix socket")):
        p50, p90 = measure(kind, args.warmup, args.count)
        print("| %s | %.1f | %.1f |" % (name, p50, p90))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
