"""The Prometheus client: every answer that is not a good one is one line (PromError), and
the fleet reading refuses on it; the bearer token is sent, re-read on every request."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.fleet.prom import PromError, Prometheus
from agent.fleet.status import AgentPods, Refusal, firing_alerts, read_fleet


@contextmanager
def server(answer: Any) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """answer(path) -> (status, body bytes) or a number of seconds to stall."""
    seen: list[dict[str, str]] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def _any(self) -> None:
            seen.append({"path": self.path, **{k: v for k, v in self.headers.items()}})
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            got = answer(self.path)
            if isinstance(got, float):
                time.sleep(got)
                return
            code, body = got
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _any  # noqa: N815

    s = ThreadingHTTPServer(("127.0.0.1", 0), H)
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{s.server_address[1]}", seen
    finally:
        s.shutdown()
        s.server_close()


def ok(result: list[Any]) -> tuple[int, bytes]:
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return 200, json.dumps(body).encode()


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        (lambda p: (500, b'{"status":"error","error":"boom"}'), "HTTP 500 Internal Server Error: boom"),
        (lambda p: (503, b"<html>"), "HTTP 503 Service Unavailable"),
        (lambda p: (200, b"not json"), "the answer is not JSON"),
        (lambda p: (200, b'{"status":"error","error":"bad query"}'), "not a successful answer"),
        (lambda p: (200, b'{"status":"success","data":{"resultType":"matrix","result":[]}}'),
         "did not give a vector"),
        (lambda p: (200, b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}'),
         "malformed sample"),
        (lambda p: 3.0, "no answer within 1s"),
    ],
)  # fmt: skip
def test_a_bad_answer_is_one_line(answer: Any, want: str) -> None:
    with server(answer) as (url, _):
        prom = Prometheus(url, timeout=1.0)
        with pytest.raises(PromError, match=want.replace("(", r"\(")) as exc:
            prom.query("up", 0)
        assert "\n" not in str(exc.value)
        with pytest.raises(Refusal) as refusal:
            read_fleet(prom, time.time(), None, 3600, 120, AgentPods())
        assert refusal.value.code == 4


def test_an_empty_answer_refuses() -> None:
    with server(lambda p: ok([])) as (url, _), pytest.raises(Refusal) as exc:
        read_fleet(Prometheus(url), time.time(), "lab", 3600, 120, AgentPods())
    assert (str(exc.value), exc.value.code) == (
        "Prometheus has no ipvs-leftovers target of cluster 'lab' from the pods of DaemonSet "
        "ipvs-leftovers/ipvs-leftovers (an empty answer)",
        4,
    )


def test_the_bearer_token_is_sent_and_re_read(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    with server(lambda p: ok([])) as (url, seen):
        prom = Prometheus(url, bearer_token_file=str(token))
        prom.query("up", 0)
        token.write_text("second")
        prom.query("up", 0)
    assert [s["Authorization"] for s in seen] == ["Bearer first", "Bearer second"]
    assert prom.calls == 2
    with pytest.raises(PromError, match="cannot read the bearer token file"):
        Prometheus(url, bearer_token_file=str(tmp_path / "none")).query("up", 0)


def test_a_url_that_is_not_http_is_refused_at_once() -> None:
    with pytest.raises(PromError, match="is not an http"):
        Prometheus("ftp://x")


def test_alerts_the_cleanup_resolves_and_ignored_or_foreign_cluster_ones_do_not_pause() -> None:
    alerts = [
        {"labels": {"alertname": "IPVSLeftoversStale", "node": "a"}, "state": "firing"},
        {"labels": {"alertname": "Watchdog"}, "state": "firing"},
        {"labels": {"alertname": "NodeDown", "cluster": "other"}, "state": "firing"},
        {"labels": {"alertname": "NodeDown", "cluster": "lab", "node": "b"}, "state": "firing"},
        {"labels": {"alertname": "DiskFull"}, "state": "pending"},
    ]
    body = json.dumps({"status": "success", "data": {"alerts": alerts}}).encode()
    with server(lambda p: (200, body)) as (url, seen):
        got = firing_alerts(Prometheus(url), "lab", "Watchdog|InfoInhibitor")
    assert got == [{"alertname": "NodeDown", "cluster": "lab", "node": "b"}]
    assert seen[0]["path"] == "/api/v1/alerts"


def test_the_hold_down_is_asked_in_stretches_of_an_hour_ending_on_a_whole_second() -> None:
    from agent.fleet.status import stretches

    assert stretches(10800.7, 9000) == [(10800.0, 3600.0), (7200.0, 3600.0), (3600.0, 1800.0)]
    assert stretches(100.0, 60) == [(100.0, 60.0)]
    assert len(stretches(0.0, 86400)) == 24
