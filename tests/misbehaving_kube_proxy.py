"""A kube-proxy that misbehaves on the wire, on both of its ports.

Run inside a test namespace: python tests/misbehaving_kube_proxy.py MODE [--record FILE]
  drip    every answer: `200 OK` and its headers at once, then the body one byte a second
  hang    accepts, reads the request, never answers
  huge    /metrics is a valid Prometheus text of --size MB (streamed, sized by Content-Length,
          or unsized and chunked with --chunked); the other endpoints answer as a healthy
          nftables-mode kube-proxy
  record  answers 404 and appends each raw request (repr of its bytes) to --record
Prints `listening` once both ports accept. Plain sockets and one thread per connection: it must
itself stay cheap, whatever the agent does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

METRICS_LINE = b'kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="%d"} 42\n'


def _request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _healthy(path: str) -> bytes:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if path == "/proxyMode":
        return b"nftables"
    if path in ("/healthz", "/livez"):
        doc = {"lastUpdated": now, "currentTime": now, "healthy": True}
        return json.dumps(doc).encode()
    return b"kubeproxy_sync_proxy_rules_last_timestamp_seconds 1\n"


def handle(conn: socket.socket, args: argparse.Namespace) -> None:
    with contextlib.suppress(OSError):  # the agent hung up: what it is meant to do
        _handle(conn, args)


def _handle(conn: socket.socket, args: argparse.Namespace) -> None:
    with conn:
        raw = _request(conn)
        path = raw.split(b" ", 2)[1].decode(errors="replace") if raw.count(b" ") >= 2 else "/"
        if args.mode == "record":
            with open(args.record, "a") as f:
                f.write(repr(raw) + "\n")
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        elif args.mode == "hang":
            time.sleep(3600)
        elif args.mode == "drip":
            body = b"x" * 600
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
            for i in range(len(body)):
                conn.sendall(body[i : i + 1])
                time.sleep(1)
        elif args.mode == "huge" and path == "/metrics":
            lines = max(1, args.size * 1024 * 1024 // len(METRICS_LINE % 0))
            block = b"".join(METRICS_LINE % 0 for _ in range(1000))
            total = lines // 1000 * len(block) + len(_healthy(path))
            if args.chunked:  # as Go's net/http sends a body it did not size
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for part in [_healthy(path)] + [block] * (lines // 1000):
                    conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
                conn.sendall(b"0\r\n\r\n")
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
            conn.sendall(_healthy(path))
            for _ in range(lines // 1000):
                conn.sendall(block)
        else:
            body = _healthy(path)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


@contextmanager
def running(ns: str, mode: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """This server in namespace `ns` on 127.0.0.1:10249 and :10256, until the block ends."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, str(Path(__file__)), mode, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["drip", "hang", "huge", "record"])
    ap.add_argument("--record")
    ap.add_argument("--size", type=int, default=200, help="MB of /metrics (huge)")
    ap.add_argument("--chunked", action="store_true", help="/metrics chunked, unsized (huge)")
    ap.add_argument("--ports", default="10249,10256")
    args = ap.parse_args()
    for port in (int(p) for p in args.ports.split(",")):
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", port))
        srv.listen(128)

        def accept(s: socket.socket = srv) -> None:
            while True:
                conn, _ = s.accept()
                threading.Thread(target=handle, args=(conn, args), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
    print("listening", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        sys.stdin.read()  # until the test closes our stdin (or kills us)


if __name__ == "__main__":
    main()
