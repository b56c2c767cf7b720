"""`--prometheus-timeout` is one deadline per query, not per read: a Prometheus (or anything on
its address) that drips its answer one byte a second is cut at the deadline, in the headers or
in the body, with one line and exit 4."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.fleet.prom import PromError, Prometheus

BODY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(
    BODY
)


@contextmanager
def dripping(prefix: bytes, drip: bytes, every: float = 0.25) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 that sends `prefix` at once, then `drip` one byte each
    `every` seconds, to every connection; stopped (its connections closed) on exit."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)  # the request (small: one POST form)
            conn.sendall(prefix)
            for byte in drip:
                if stop.wait(every):
                    return
                conn.sendall(bytes([byte]))

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


@pytest.mark.parametrize(
    ("prefix", "drip"),
    [(b"", HEAD + BODY), (HEAD, BODY)],
    ids=["headers-dripping", "body-dripping"],
)
def test_a_dripping_answer_is_cut_at_the_deadline(prefix: bytes, drip: bytes) -> None:
    # every byte comes well within the timeout: only an overall deadline stops it
    with dripping(prefix, drip) as url:
        prom = Prometheus(url, timeout=2.0)
        start = time.monotonic()
        with pytest.raises(PromError) as exc:
            prom.query("up", 0)
        took = time.monotonic() - start
    assert str(exc.value) == f"Prometheus {url}/api/v1/query: no answer within 2s"
    assert 1.9 < took < 3.0, took


def test_fleet_status_on_a_dripping_prometheus_refuses_in_time() -> None:
    with dripping(HEAD, BODY) as url:
        start = time.monotonic()
        r = CliRunner().invoke(
            main, ["fleet", "status", "--prometheus-url", url, "--prometheus-timeout", "2s"]
        )
        took = time.monotonic() - start
    assert r.exit_code == 4
    assert r.stderr == (
        f"ipvs-leftovers: fleet status refused: Prometheus {url}/api/v1/query: "
        "no answer within 2s\n"
    )
    assert took < 3.0, took
