"""The accept loop's bounds and quick answers (agent/views/connections.py), on plain data."""

from __future__ import annotations

import socket
from typing import Any

from agent.views import connections
from agent.views.connections import Reading, Table, quick_answer


def _r(host: str, deadline: float) -> Reading:
    return Reading(socket.socket(), (host, 40000), deadline)


def test_past_the_per_client_limit_that_address_s_oldest_makes_room() -> None:
    table = Table(cap=1000)
    mine = [_r("10.0.0.9", float(i)) for i in range(connections.PER_CLIENT)]
    other = _r("10.0.0.1", 0.5)
    for r in [mine[0], other, *mine[1:]]:
        table.add(r)
    assert table.make_room("10.0.0.9") == [mine[0]]  # not the other address's, older still
    assert table.make_room("10.0.0.2") == []
    table.remove(mine[0])
    assert table.make_room("10.0.0.9") == []


def test_past_the_cap_the_oldest_of_all_makes_room() -> None:
    table = Table(cap=3)
    rs = [_r(f"10.0.0.{i}", float(i)) for i in range(3)]
    for r in rs:
        table.add(r)
    assert table.make_room("10.0.0.7") == [rs[0]]
    assert table.soonest(99.0) == 0.0
    assert table.expired(1.0) == rs[:2]


def test_one_close_can_make_room_under_both_limits() -> None:
    table = Table(cap=connections.PER_CLIENT)
    rs = [_r("10.0.0.9", float(i)) for i in range(connections.PER_CLIENT)]
    for r in rs:
        table.add(r)
    assert table.make_room("10.0.0.9") == rs[:1]


def _status_and_body(answer: Any) -> tuple[bytes, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0], body


def test_healthz_is_answered_by_the_loop_itself() -> None:
    get = quick_answer(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _status_and_body(get) == (b"HTTP/1.0 200 OK", b"ok\n")
    assert b"\r\nContent-Length: 3\r\n" in (get or b"")
    head = quick_answer(b"HEAD /healthz?x=1 HTTP/1.0\r\n\r\n")
    assert _status_and_body(head) == (b"HTTP/1.0 200 OK", b"")


def test_anything_else_goes_to_the_workers() -> None:
    for request in (
        b"GET /metrics HTTP/1.1\r\n\r\n",
        b"POST /healthz HTTP/1.1\r\n\r\n",
        b"GET /healthzz HTTP/1.1\r\n\r\n",
        b"GET /healthz\r\n\r\n",
        b"\r\n\r\n",
    ):
        assert quick_answer(request) is None, request
