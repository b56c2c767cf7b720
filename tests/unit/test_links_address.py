"""An RTM_NEWADDR's address, as links reads it without a dict of attributes."""

from __future__ import annotations

import socket
import struct

from agent.readers.links import _address_of


def _attr(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + bytes(-len(raw) % 4)


def _msg(family: int, *attrs: bytes) -> memoryview:
    return memoryview(struct.pack("=BBBBI", family, 24, 0, 0, 7) + b"".join(attrs))


def test_ipv4_takes_the_local_address_over_a_peer() -> None:
    peer, local = socket.inet_aton("10.0.0.2"), socket.inet_aton("10.0.0.1")
    label = _attr(3, b"eth0\0")
    for order in ((1, peer), (2, local)), ((2, local), (1, peer)):
        msg = _msg(socket.AF_INET, *(_attr(k, v) for k, v in order), label)
        assert bytes(_address_of(msg, socket.AF_INET) or b"") == local
    only = _msg(socket.AF_INET, _attr(1, peer), label)
    assert bytes(_address_of(only, socket.AF_INET) or b"") == peer


def test_ipv6_takes_the_address_and_a_message_without_one_is_none() -> None:
    addr = socket.inet_pton(socket.AF_INET6, "fd00:96::1")
    msg = _msg(socket.AF_INET6, _attr(1, addr), _attr(8, struct.pack("=I", 0x80)))
    assert bytes(_address_of(msg, socket.AF_INET6) or b"") == addr
    assert _address_of(_msg(socket.AF_INET6, _attr(8, b"\0\0\0\0")), socket.AF_INET6) is None
    # a truncated attribute header ends the walk
    assert _address_of(_msg(socket.AF_INET, struct.pack("=HH", 2, 1)), socket.AF_INET) is None
