"""`serve`: the HTTP endpoint Prometheus scrapes. Counts only; it offers no mutation."""

from __future__ import annotations

import logging
import signal
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from agent import __version__

log = logging.getLogger("ipvs_leftovers.server")

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


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = f"ipvs-leftovers/{__version__}"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            try:
                body, ctype, code = generate_latest(self.server.registry), CONTENT_TYPE_LATEST, 200
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
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("%s %s", self.address_string(), format % args)


def make_server(
    host: str, port: int, registry: CollectorRegistry, tls: tuple[str, str] | None = None
) -> _Server:
    """Bind (OSError if it cannot) and optionally wrap in TLS (ssl.SSLError, OSError)."""
    server = (_Server6 if ":" in host else _Server)((host, port), _Handler)
    server.registry = registry
    if tls is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(tls[0], tls[1])
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
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
