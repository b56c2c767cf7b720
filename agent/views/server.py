"""`serve`: the HTTP endpoint Prometheus scrapes. Counts only; it offers no mutation."""

from __future__ import annotations

import errno
import logging
import signal
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from agent import __version__
from agent.views.metrics import scrape_deadline

log = logging.getLogger("ipvs_leftovers.server")

# A client gets this long to finish the TLS handshake, in its own thread: one idle connection
# must never hold up the others (the kubelet's probes included).
HANDSHAKE_TIMEOUT = 10.0
# Reading a request and writing an answer: an idle or stalled client lets go of its thread.
IO_TIMEOUT = 30.0
# Prometheus sends its scrape timeout; the answer is due this much earlier (blackbox_exporter's
# default offset), so that it arrives before Prometheus gives up.
SCRAPE_TIMEOUT_OFFSET = 0.5

LANDING = f"""<!doctype html>
<html><head><title>ipvs-leftovers</title></head><body>
<h1>ipvs-leftovers {__version__}</h1>
<p>What kube-proxy's ipvs mode left on this node, as Prometheus metrics.</p>
<ul><li><a href="/metrics">/metrics</a></li><li><a href="/healthz">/healthz</a> (the agent's
own liveness)</li></ul></body></html>
""".encode()


def parse_listen(value: str) -> tuple[str, int]:
    """`:9437`, `0.0.0.0:9437`, `[::]:9437` -> (host, port); ValueError otherwise."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{value!r} is not [ADDR]:PORT with PORT in 1-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{value!r}: write an IPv6 address in brackets, [::1]:9437")
    return host, int(port_text)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: CollectorRegistry
    tls: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        """With TLS, the handshake runs here, in the connection's thread, under a timeout."""
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(HANDSHAKE_TIMEOUT)
        try:
            conn = self.tls.wrap_socket(request, server_side=True)
        except OSError as exc:  # ssl.SSLError, a timeout, a reset: this client only
            log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            conn.close()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _DualStack(_Server6):
    """`[::]` with IPV6_V6ONLY off: one socket for both families (IPv4 as ::ffff:a.b.c.d)."""

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = f"ipvs-leftovers/{__version__}"
    timeout = IO_TIMEOUT

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(with_body=True)

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(with_body=False)

    def _deadline(self) -> float | None:
        """When the answer is due, from Prometheus' X-Prometheus-Scrape-Timeout-Seconds."""
        text = self.headers.get("X-Prometheus-Scrape-Timeout-Seconds")
        try:
            seconds = float(text) if text else 0.0
        except ValueError:
            return None
        if not 0 < seconds < 86400:  # also refuses nan and inf
            return None
        return time.monotonic() + max(seconds - SCRAPE_TIMEOUT_OFFSET, seconds / 2)

    def _answer(self, with_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            try:
                with scrape_deadline(self._deadline()):
                    body = generate_latest(self.server.registry)
                ctype, code = CONTENT_TYPE_LATEST, 200
            except Exception as exc:  # noqa: BLE001 - a failed collection is a 500, not a crash
                log.error("collection failed: %s", exc)
                body, ctype, code = f"collection failed: {exc}\n".encode(), "text/plain", 500
        elif path == "/healthz":
            body, ctype, code = b"ok\n", "text/plain; charset=utf-8", 200
        elif path == "/":
            body, ctype, code = LANDING, "text/html; charset=utf-8", 200
        else:
            body, ctype, code = b"not found\n", "text/plain; charset=utf-8", 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("%s %s", self.address_string(), format % args)


def _bind(host: str, port: int) -> _Server:
    """An address given is bound as given; none means both families where the node has IPv6."""
    if host:
        return (_Server6 if ":" in host else _Server)((host, port), _Handler)
    try:
        return _DualStack(("::", port), _Handler)
    except OSError as exc:
        # A kernel booted with ipv6.disable=1 has no AF_INET6 sockets at all.
        if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT):
            raise
        log.info("IPv6 unavailable (%s): listening on IPv4 only", exc.strerror or exc)
        return _Server(("0.0.0.0", port), _Handler)


def make_server(
    host: str, port: int, registry: CollectorRegistry, tls: tuple[str, str] | None = None
) -> _Server:
    """Bind (OSError if it cannot) and load the TLS files (ssl.SSLError, OSError)."""
    ctx = None
    if tls is not None:  # before binding: a bad file must not leave a socket behind
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(tls[0], tls[1])
    server = _bind(host, port)
    server.registry = registry
    server.tls = ctx
    return server


def serve_until_signalled(server: _Server) -> None:
    """Serve until SIGTERM or SIGINT, then close the socket and return."""

    def stop(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
