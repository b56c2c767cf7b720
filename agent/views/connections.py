"""The connections serve's accept loop is reading, and the answers it gives by itself.

The loop (agent/views/server.py) reads every request without blocking and hands only complete
ones to the workers; these are its bounds (in all, per client address) and its quick answers
(/healthz, 503), which never wait for a worker.
"""

from __future__ import annotations

import email.utils
import logging
import platform
import resource
import socket
from http import HTTPStatus
from typing import Any

from agent import __version__

log = logging.getLogger("ipvs_leftovers.server")

HEALTHZ = b"ok\n"
# Connections whose request is still being read, in all and per client address. Past either
# limit the oldest such connection (of that address) is closed to make room: the accept loop
# never stops accepting, so a flood of idle connections cannot keep a probe out of the listen
# backlog (it stopped at 1,024, and probes waited behind the flood for the request deadline).
MAX_READING = 1024
PER_CLIENT = 64
# File descriptors kept free of the connections being read: complete requests (16 workers, a
# queue of 64, the loop's list of 256) and the node's reads. A soft RLIMIT_NOFILE under
# MAX_READING + this is raised to it, or the cap lowered to fit.
FD_RESERVE = 512


class Reading:
    """A connection whose request is being read by the accept loop."""

    def __init__(self, sock: socket.socket, address: Any, deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.deadline = deadline
        self.data = bytearray()
        self.handshaken = False


END = (b"\r\n\r\n", b"\n\n")


class Table:
    """The connections whose request is being read, oldest first: in all, and by address."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._all: dict[int, Reading] = {}  # insertion order is accept order
        self._by_client: dict[str, dict[int, Reading]] = {}

    def add(self, r: Reading) -> None:
        self._all[id(r)] = r
        self._by_client.setdefault(r.address[0], {})[id(r)] = r

    def remove(self, r: Reading) -> None:
        self._all.pop(id(r), None)
        mine = self._by_client.get(r.address[0])
        if mine is not None:
            mine.pop(id(r), None)
            if not mine:
                del self._by_client[r.address[0]]

    def make_room(self, host: str) -> list[Reading]:
        """What to close before one more connection from `host` is read: that address's
        oldest past PER_CLIENT, the oldest of all past the cap."""
        out = []
        mine = self._by_client.get(host, {})
        if len(mine) >= PER_CLIENT:
            out.append(next(iter(mine.values())))
        if len(self._all) - len(out) >= self.cap:
            out.append(next(r for r in self._all.values() if r not in out))
        return out

    def soonest(self, default: float) -> float:
        """The next request deadline (the oldest connection's: all get the same time)."""
        return next(iter(self._all.values())).deadline if self._all else default

    def expired(self, now: float) -> list[Reading]:
        out = []
        for r in self._all.values():
            if r.deadline > now:
                break
            out.append(r)
        return out

    def all(self) -> list[Reading]:
        return list(self._all.values())


def reading_cap() -> int:
    """MAX_READING, or fewer when the file descriptors do not allow it. The soft
    RLIMIT_NOFILE is raised as far as MAX_READING needs (containerd 2 gives 1,024 soft,
    524,288 hard); where the hard limit is lower, the cap is lowered instead: the loop then
    closes old idle connections rather than run out of descriptors for new ones."""
    want = MAX_READING + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        raised = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError) as exc:
            log.debug("cannot raise RLIMIT_NOFILE: %s", exc)
    if soft == resource.RLIM_INFINITY:
        return MAX_READING
    return max(min(MAX_READING, soft - FD_RESERVE), 16)


def plain(code: int, body: bytes, with_body: bool = True) -> bytes:
    """A whole HTTP/1.0 answer, headers as the workers' handler sends them."""
    head = (
        f"HTTP/1.0 {code} {HTTPStatus(code).phrase}\r\n"
        f"Server: ipvs-leftovers/{__version__} Python/{platform.python_version()}\r\n"
        f"Date: {email.utils.formatdate(usegmt=True)}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + (body if with_body else b"")


def quick_answer(request: bytes) -> bytes | None:
    """The answer to GET or HEAD /healthz, made by the accept loop itself: the kubelet's
    probes never wait for a worker (all of them may be waiting for a slow collection)."""
    words = request.split(b"\n", 1)[0].split()
    if len(words) != 3 or words[0] not in (b"GET", b"HEAD") or not words[2].startswith(b"HTTP/"):
        return None
    if words[1].split(b"?", 1)[0] != b"/healthz":
        return None
    return plain(200, HEALTHZ, with_body=words[0] == b"GET")


def send_and_close(sock: socket.socket, answer: bytes) -> None:
    """Send a small answer without blocking (a new connection's send buffer takes it whole),
    then close; a client that cannot take it at once gets nothing."""
    try:
        if sock.send(answer) == len(answer):
            sock.shutdown(socket.SHUT_WR)
    except OSError as exc:  # ssl.SSLWantWriteError too
        log.debug("quick answer not sent: %s", exc)
    finally:
        sock.close()
