"""NLM_F_DUMP_INTR: a dump the kernel marks as interrupted is read again, never taken as whole.

The kernel sets the flag only when an object list changes between two passes of one dump,
which a test cannot time from outside (tests/netns/test_netlink_dump_intr.py provokes it in a
namespace from inside a dump). Here the client reads answers laid out byte for byte as
rtnetlink sends them (nlmsghdr, ifinfomsg, IFLA_IFNAME), over a real datagram socket.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from agent.readers import links
from agent.readers.netlink import (
    DUMP_ATTEMPTS,
    NLM_F_DUMP_INTR,
    NLMSG_DONE,
    DumpInterrupted,
    RtNetlink,
    attr,
    consistent,
)

NLM_F_MULTI = 0x2
RTM_NEWLINK = 16


def _msg(kind: int, seq: int, payload: bytes, flags: int = NLM_F_MULTI) -> bytes:
    return struct.pack("=IHHII", 16 + len(payload), kind, flags, seq, 4242) + payload


def _link(seq: int, index: int, name: str, intr: bool = False) -> bytes:
    ifinfo = struct.pack("=BxHiII", 0, 1, index, 0x1, 0)  # AF_UNSPEC, ARPHRD_ETHER, IFF_UP
    flags = NLM_F_MULTI | (NLM_F_DUMP_INTR if intr else 0)
    return _msg(RTM_NEWLINK, seq, ifinfo + attr(3, name.encode() + b"\0"), flags)


def _done(seq: int, intr: bool = False) -> bytes:
    return _msg(NLMSG_DONE, seq, struct.pack("=i", 0), NLM_F_MULTI | (NLM_F_DUMP_INTR * intr))


class _Fed(RtNetlink):
    """An RtNetlink whose kernel side is the test: answers queued on a SOCK_SEQPACKET pair."""

    def __init__(self, batches: list[bytes]) -> None:  # noqa: D107 - no netlink socket at all
        self._sock, self.kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._seq = 0
        self._buf = bytearray(1 << 20)
        self._view = memoryview(self._buf)
        for batch in batches:  # one datagram per kernel dump pass
            self.kernel.send(batch)

    def close(self) -> None:
        super().close()
        self.kernel.close()


def _names(rt: RtNetlink) -> list[str]:
    return [row.name for row in rt.link_rows()]


def test_a_dump_marked_interrupted_is_read_to_its_end_then_refused() -> None:
    # Pass 1 is clean; the kernel marks pass 2 and the DONE after a link was added.
    with _Fed(
        [
            _link(1, 1, "lo") + _link(1, 2, "eth0"),
            _link(1, 3, "kube-ipvs0", intr=True) + _done(1, intr=True),
            _link(2, 1, "lo") + _done(2),
        ]
    ) as rt:
        seen: list[str] = []
        with pytest.raises(DumpInterrupted):
            for row in rt.link_rows():
                seen.append(row.name)
        assert seen == ["lo", "eth0", "kube-ipvs0"]  # read to DONE: the socket is free again
        assert _names(rt) == ["lo"]  # the next dump's answer, not the rest of the old one


def test_only_the_done_message_carries_the_mark() -> None:
    with _Fed([_link(1, 1, "lo") + _done(1, intr=True)]) as rt, pytest.raises(DumpInterrupted):
        _names(rt)


def test_an_unmarked_dump_is_whole() -> None:
    with _Fed([_link(1, 1, "lo"), _link(1, 2, "kube-ipvs0") + _done(1)]) as rt:
        assert _names(rt) == ["lo", "kube-ipvs0"]


def test_consistent_reads_again_until_a_dump_is_whole() -> None:
    batches = [
        _link(1, 1, "lo", intr=True) + _done(1, intr=True),
        _link(2, 1, "lo") + _link(2, 9, "kube-ipvs0", intr=True) + _done(2, intr=True),
        _link(3, 1, "lo") + _link(3, 9, "kube-ipvs0") + _done(3),
    ]
    with _Fed(batches) as rt:
        calls: list[int] = []

        def read() -> list[str]:
            calls.append(1)
            return _names(rt)

        assert consistent(read) == ["lo", "kube-ipvs0"]
        assert len(calls) == 3


def _always_interrupted(n: int) -> Iterator[bytes]:
    for seq in range(1, n + 1):
        yield _link(seq, 1, "lo", intr=True) + _done(seq, intr=True)


def test_bounded_attempts_then_a_clear_error() -> None:
    with _Fed(list(_always_interrupted(DUMP_ATTEMPTS + 1))) as rt:
        with pytest.raises(DumpInterrupted) as caught:
            consistent(lambda: _names(rt))
        assert rt._seq == DUMP_ATTEMPTS  # no more requests than the bound
        assert str(caught.value) == (
            f"netlink dump interrupted by concurrent changes {DUMP_ATTEMPTS} times in a row; "
            "the node is changing too fast to read a consistent state, try again"
        )


def test_the_links_reader_reports_a_never_consistent_dump_as_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reading is `error` (audit exits 4), not an `ok` reading of a partial node."""
    feed = [_link(1, 1, "lo", intr=True) + _done(1, intr=True)] * DUMP_ATTEMPTS
    monkeypatch.setattr(links, "RtNetlink", lambda: _Fed([feed.pop(0)]))
    reading = links.read()
    assert reading.status == "error"
    assert reading.error is not None
    assert reading.error.startswith("DumpInterrupted: netlink dump interrupted by concurrent")
    assert not feed  # one fresh socket per attempt, DUMP_ATTEMPTS attempts


def test_the_links_reader_retries_into_a_whole_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    feed = [
        _link(1, 1, "lo") + _link(1, 7, "kube-ipvs0", intr=True) + _done(1, intr=True),
        _link(1, 1, "lo") + _link(1, 7, "kube-ipvs0") + _done(1),
    ]

    def fed() -> _Fed:
        # The address dump (seq 2) of each attempt answers with nothing.
        return _Fed([feed.pop(0), _done(2)])

    monkeypatch.setattr(links, "RtNetlink", fed)
    reading = links.read()
    assert reading.status == "ok", reading.error
    assert reading.data.kube_ipvs0 is not None and reading.data.kube_ipvs0.index == 7
