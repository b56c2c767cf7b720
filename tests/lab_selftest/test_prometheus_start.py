"""The Prometheus tiers start Debian's Prometheus on a port that was free a moment before
(tests/prometheus/history.py `start_prometheus`); somebody may bind it first (the test
helpers' check-then-act shapes). Started on a taken port it exits, and is started again on
another; what answers is the process that was started, never another program on the port."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.prometheus import history


def test_a_taken_port_is_given_up_for_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = socket.create_server(("127.0.0.1", 0))  # listens, answers nothing
    taken = held.getsockname()[1]
    ports = iter([taken])
    monkeypatch.setattr(history, "free_port", lambda: next(ports, 0) or _free())
    text = f"# TYPE x gauge\nx 1 {int(time.time()) - 600}\n# EOF\n"
    with held, history.history_prometheus(text, tmp_path) as prom:
        assert prom.url != f"http://127.0.0.1:{taken}"
        assert prom.proc.poll() is None
        assert prom.api("/api/v1/query?query=count_over_time(x[1h])")["result"]  # type: ignore[index]
    log = (tmp_path / "prometheus.log").read_text()
    assert log.count("address already in use") >= 1


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
