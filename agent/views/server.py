"""`serve`: the HTTP endpoint Prometheus scrapes. Counts only; it offers no mutation."""

from __future__ import annotations

import errno
import io
import logging
import queue
import selectors
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import FrameType
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from agent import __version__
from agent.views.metrics import scrape_deadline

log = logging.getLogger("ipvs_leftovers.server")

# From accept to the end of the request's headers, TLS handshake included. Requests are read
# by the accept loop itself, all at once without blocking (a selector), and only a complete one
# goes to a worker: a client sending its request a byte a second (slow-loris) holds no worker,
# and is dropped at this deadline whatever its pace.
REQUEST_TIMEOUT = 10.0
REQUEST_LIMIT = 64 * 1024  # a request's line and headers
MAX_READING = 1024  # connections whose request is still being read; more wait in the backlog
# Writing an answer: a client that stops reading lets go of its worker by then.
WRITE_TIMEOUT = 10.0
IO_TIMEOUT = 30.0  # any one read or write
# A fixed pool of workers answers complete requests; more wait in a bounded queue (it was one
# thread per connection, no cap, and a backlog of 5: 200 concurrent scrapes had a p95 of 14 s).
#
WORKERS = 16
PENDING = 64
BACKLOG = 128
# accept() failing for want of file descriptors leaves the listening socket readable: the loop
# stops watching it this long instead of spinning at 100 % CPU.
ACCEPT_BACKOFF = 0.5
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


class _Reading:
    """A connection whose request is being read by the accept loop."""

    def __init__(self, sock: socket.socket, address: Any, deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.deadline = deadline
        self.data = bytearray()
        self.handshaken = False


_END = (b"\r\n\r\n", b"\n\n")


class _Server(HTTPServer):
    """HTTPServer whose accept loop also reads the requests (a selector, nothing blocks) and
    hands each complete one to a bounded pool of workers.

    A watchdog thread shuts down the socket of an answer not written by its deadline, which
    ends the write blocked on it.
    """

    request_queue_size = BACKLOG
    registry: CollectorRegistry
    tls: ssl.SSLContext | None = None
    _serving = False

    def server_activate(self) -> None:
        super().server_activate()
        self._pending: queue.Queue[tuple[socket.socket, Any, bytes] | None] = queue.Queue(PENDING)
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._deadlines: dict[int, float] = {}  # fd -> time.monotonic() its answer is due
        self._deadlines_lock = threading.Lock()
        self._local = threading.local()
        self._fd_warned = 0.0
        for i in range(WORKERS):
            threading.Thread(target=self._work, name=f"http-{i}", daemon=True).start()
        threading.Thread(target=self._watch, name="http-watchdog", daemon=True).start()

    # --- the accept loop: accepts, TLS handshakes and request reads, none blocking ----------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._serving = True
        sel = selectors.DefaultSelector()
        self.socket.setblocking(False)
        sel.register(self.socket, selectors.EVENT_READ, None)
        listening, resume = True, 0.0
        reading: dict[int, _Reading] = {}
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                if not listening and now >= resume and len(reading) < MAX_READING:
                    sel.register(self.socket, selectors.EVENT_READ, None)
                    listening = True
                soonest = min((r.deadline for r in reading.values()), default=now + poll_interval)
                wait = max(min(soonest - now, poll_interval), 0.0)
                if not listening:
                    wait = min(wait, max(resume - now, 0.0) or poll_interval)
                for key, _ in sel.select(wait):
                    if key.data is None:
                        if not self._accept(sel, reading):
                            sel.unregister(self.socket)
                            listening, resume = False, time.monotonic() + ACCEPT_BACKOFF
                    else:
                        self._advance(sel, reading, key.data)
                now = time.monotonic()
                for r in [r for r in reading.values() if r.deadline <= now]:
                    self._drop(sel, reading, r)
                if listening and len(reading) >= MAX_READING:
                    sel.unregister(self.socket)
                    listening, resume = False, 0.0
        finally:
            for r in list(reading.values()):
                self._drop(sel, reading, r)
            sel.close()
            self._stopped.set()

    def _accept(self, sel: selectors.BaseSelector, reading: dict[int, _Reading]) -> bool:
        """Accept what is waiting; False when out of file descriptors (or memory)."""
        for _ in range(64):
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    now = time.monotonic()
                    if now - self._fd_warned > 60:
                        self._fd_warned = now
                        log.warning("cannot accept connections: %s; pausing", exc.strerror or exc)
                    return False
                log.debug("accept failed: %s", exc)  # ECONNABORTED and the like: that client only
                return True
            sock.setblocking(False)
            if self.tls is not None:
                try:
                    sock = self.tls.wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False
                    )
                except OSError as exc:
                    log.debug("TLS with %s failed: %s", address[0], exc)
                    sock.close()
                    continue
            r = _Reading(sock, address, time.monotonic() + REQUEST_TIMEOUT)
            r.handshaken = self.tls is None
            reading[sock.fileno()] = r
            sel.register(sock, selectors.EVENT_READ, r)
            self._advance(sel, reading, r)
        return True

    def _advance(
        self, sel: selectors.BaseSelector, reading: dict[int, _Reading], r: _Reading
    ) -> None:
        """Take the handshake and the request as far as the bytes at hand allow."""
        try:
            if not r.handshaken:
                r.sock.do_handshake()  # type: ignore[attr-defined]
                r.handshaken = True
            while True:
                chunk = r.sock.recv(65536)
                if not chunk:  # the client went away
                    self._drop(sel, reading, r)
                    return
                r.data += chunk
                if any(end in r.data for end in _END) or len(r.data) > REQUEST_LIMIT:
                    self._hand_over(sel, reading, r)
                    return
        except ssl.SSLWantWriteError:
            sel.modify(r.sock, selectors.EVENT_WRITE, r)
        except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
            sel.modify(r.sock, selectors.EVENT_READ, r)
        except OSError as exc:  # ssl.SSLError (a plain-HTTP client on the TLS port), a reset
            log.debug("connection from %s dropped: %s", r.address[0], exc)
            self._drop(sel, reading, r)

    def _drop(self, sel: selectors.BaseSelector, reading: dict[int, _Reading], r: _Reading) -> None:
        reading.pop(r.sock.fileno(), None)
        sel.unregister(r.sock)
        r.sock.close()

    def _hand_over(
        self, sel: selectors.BaseSelector, reading: dict[int, _Reading], r: _Reading
    ) -> None:
        reading.pop(r.sock.fileno(), None)
        sel.unregister(r.sock)
        r.sock.settimeout(IO_TIMEOUT)
        while not self._stopping.is_set():  # workers all busy: the accept loop waits
            try:
                self._pending.put((r.sock, r.address, bytes(r.data)), timeout=0.5)
                return
            except queue.Full:
                continue
        r.sock.close()

    # --- the workers: complete requests only ------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                return
            request, client_address, data = item
            fd = request.fileno()
            self._local.request = data
            try:
                self.finish_request(request, client_address)
            except OSError as exc:  # the client went away, or the watchdog cut its answer
                log.debug("answer to %s not written: %s", client_address[0], exc)
            except Exception:  # noqa: BLE001 - one connection, never the server
                self.handle_error(request, client_address)
            finally:
                with self._deadlines_lock:  # before the close: the fd may be reused at once
                    self._deadlines.pop(fd, None)
                self.shutdown_request(request)

    def request_bytes(self) -> bytes:
        """The request the accept loop read for this worker's connection."""
        data: bytes = self._local.request
        return data

    def writing(self, fd: int) -> None:
        """The answer on `fd` is being written: due within WRITE_TIMEOUT."""
        with self._deadlines_lock:
            self._deadlines[fd] = time.monotonic() + WRITE_TIMEOUT

    def _watch(self) -> None:
        while not self._stopping.wait(0.25):
            now = time.monotonic()
            with self._deadlines_lock:  # held, so that no fd is closed and reused meanwhile
                for fd in [fd for fd, due in self._deadlines.items() if due <= now]:
                    del self._deadlines[fd]
                    _shutdown_fd(fd)

    def shutdown(self) -> None:
        self._stopping.set()
        if self._serving:
            self._stopped.wait()
        for _ in range(WORKERS):
            try:
                self._pending.put_nowait(None)
            except queue.Full:
                break


def _shutdown_fd(fd: int) -> None:
    """shutdown(2) the socket behind `fd` without closing it (its worker closes it)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()


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

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BytesIO(self.server.request_bytes())  # read by the accept loop

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
        self.server.writing(self.connection.fileno())
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


Server = _Server  # what make_server returns, for callers' annotations


class TlsFileError(Exception):
    """--tls-cert or --tls-key cannot be used; the message names the file and why."""


def load_tls(cert: str, key: str) -> ssl.SSLContext:
    """A server context from the two PEM files; TlsFileError naming the file at fault."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise TlsFileError(_tls_blame(cert, key, exc)) from exc
    return ctx


def _tls_blame(cert: str, key: str, exc: Exception) -> str:
    """OpenSSL says `[SSL] PEM lib` for a bad certificate and a bad key alike: find which."""
    if not isinstance(exc, ssl.SSLError) and isinstance(exc, OSError):
        import os

        which = exc.filename or (cert if not os.access(cert, os.R_OK) else key)
        option = "--tls-cert" if which == cert else "--tls-key"
        return f"cannot read {option} {which}: {exc.strerror or exc}"
    if getattr(exc, "reason", None) == "KEY_VALUES_MISMATCH":
        return f"--tls-key {key} is not the private key of --tls-cert {cert}"
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        probe.load_verify_locations(cafile=cert)
    except (ssl.SSLError, OSError):
        return f"--tls-cert {cert} holds no PEM certificate ({exc})"
    return f"--tls-key {key} holds no PEM private key for --tls-cert {cert} ({exc})"


def make_server(
    host: str, port: int, registry: CollectorRegistry, tls: tuple[str, str] | None = None
) -> _Server:
    """Bind (OSError if it cannot) and load the TLS files (TlsFileError)."""
    ctx = None
    if tls is not None:  # before binding: a bad file must not leave a socket behind
        ctx = load_tls(*tls)
    server = _bind(host, port)
    server.registry = registry
    server.tls = ctx
    return server


class StopSignals:
    """SIGTERM and SIGINT, caught from before the socket is bound.

    The port accepts connections (the kernel's backlog) from bind(), before serve_forever runs: a
    kubelet or a test that stops the agent as soon as the port answers must get a clean stop
    (exit 0, "stopped" logged), not a process killed by the signal's default action.
    """

    def __init__(self) -> None:
        self._server: _Server | None = None
        self._asked = False
        # told each signal's name (serve's auto-cleanup: a run under way ends and undoes)
        self.listeners: list[Callable[[str], None]] = []
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        self._asked = True
        for listener in self.listeners:
            listener(signal.Signals(signum).name)
        if self._server is not None:  # shutdown() waits for the loop: not from the loop's thread
            threading.Thread(target=self._server.shutdown, daemon=True).start()

    def serve(self, server: _Server) -> None:
        """Serve until a signal (one that came before this call included), then close."""
        self._server = server
        try:
            if not self._asked:
                server.serve_forever(poll_interval=0.5)
        finally:
            server.server_close()
