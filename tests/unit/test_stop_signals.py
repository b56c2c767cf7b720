"""serve's stop: a SIGTERM that comes while the agent starts (its port already accepts, the
accept loop not yet running) stops it as cleanly as one that comes while it serves."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from agent.views.server import StopSignals, make_server


@pytest.fixture(autouse=True)
def _keep_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def _closed(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_between_bind_and_serve_stops_at_once(sig: signal.Signals) -> None:
    signals = StopSignals()
    server = make_server("127.0.0.1", 0, CollectorRegistry())
    port = server.server_address[1]
    socket.create_connection(("127.0.0.1", port), 1).close()  # the backlog accepts already
    os.kill(os.getpid(), sig)  # the handler runs in this thread before the next line
    started = time.monotonic()
    signals.serve(server)
    assert time.monotonic() - started < 1.0
    assert _closed(port)


def test_signal_while_serving_stops_and_closes() -> None:
    signals = StopSignals()
    server = make_server("127.0.0.1", 0, CollectorRegistry())
    port = server.server_address[1]
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    started = time.monotonic()
    signals.serve(server)
    assert 0.3 <= time.monotonic() - started < 3.0
    assert _closed(port)
