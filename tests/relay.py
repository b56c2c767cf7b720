"""A TCP byte relay for the tests' forwarders (an API server reached through a veth peer, a
node's namespace reached from the host)."""

from __future__ import annotations

import select
import socket
from collections.abc import Callable


def relay(
    a: socket.socket,
    b: socket.socket,
    stopped: Callable[[], bool] = lambda: False,
    idle: float | None = None,
) -> None:
    """Copy bytes both ways until a side closes, `stopped()` turns true or, with `idle`,
    nothing moved for that many seconds; then close both."""
    pair = {a: b, b: a}
    quiet = 0.0
    try:
        while not stopped():
            ready, _, _ = select.select(list(pair), [], [], 1.0)
            if not ready:
                quiet += 1.0
                if idle is not None and quiet >= idle:
                    return
                continue
            quiet = 0.0
            for s in ready:
                data = s.recv(65536)
                if not data:
                    return
                pair[s].sendall(data)
    except OSError:
        return
    finally:
        a.close()
        b.close()
