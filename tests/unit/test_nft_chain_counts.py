"""Chains per table from crafted NFT_MSG_NEWCHAIN answers (the netns tier counts real ones)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

from agent.readers.netlink import attr
from agent.readers.nftables import _chain_counts

CHAIN_TABLE, CHAIN_HANDLE, CHAIN_NAME = 1, 2, 3


def _chain(family: int, table: str, name: str, table_first: bool = True) -> memoryview:
    head = struct.pack("=BBH", family, 0, 0x1234)  # nfgenmsg; res_id: the ruleset generation
    t = attr(CHAIN_TABLE, table.encode() + b"\0")
    rest = attr(CHAIN_NAME, name.encode() + b"\0") + attr(CHAIN_HANDLE, struct.pack("!Q", 7))
    return memoryview(head + (t + rest if table_first else rest + t))


class _Dump:
    def __init__(self, answers: list[memoryview]) -> None:
        self.answers = answers

    def dump(self, msg: int, family: int = 0, body: bytes = b"") -> Iterator[memoryview]:
        assert msg == 4  # NFT_MSG_GETCHAIN
        return iter(self.answers)


def test_chains_are_counted_per_family_and_table_wherever_the_table_attribute_is() -> None:
    answers = [
        *(_chain(2, "kube-proxy", f"service-{i}") for i in range(5)),
        _chain(2, "kube-proxy", "late", table_first=False),
        *(_chain(10, "kube-proxy", f"c{i}") for i in range(3)),
        _chain(2, "nat", "POSTROUTING"),
        _chain(1, "filter-with-a-long-name", "input", table_first=False),
        _chain(1, "filter-with-a-long-name", "output"),
        _chain(99, "odd", "x"),
    ]
    assert _chain_counts(_Dump(answers)) == {  # type: ignore[arg-type]
        ("ip", "kube-proxy"): 6,
        ("ip6", "kube-proxy"): 3,
        ("ip", "nat"): 1,
        ("inet", "filter-with-a-long-name"): 2,
        (99, "odd"): 1,
    }


def test_a_sets_table_name_and_flags_wherever_they_are_and_flags_0_when_absent() -> None:
    from agent.readers.netlink import nul_text
    from agent.readers.nftables import _set_header

    SET_TABLE, SET_NAME, SET_FLAGS, SET_KEY_TYPE, SET_HANDLE = 1, 2, 3, 4, 16

    def header(view: memoryview) -> tuple[str, str, int]:
        table, name, flags = _set_header(view)
        return nul_text(table), nul_text(name), flags

    head = struct.pack("=BBH", 2, 0, 0)
    t, n = attr(SET_TABLE, b"kube-proxy\0"), attr(SET_NAME, b"__map3\0")
    flags = attr(SET_FLAGS, struct.pack("!I", 0x1 | 0x2 | 0x8))
    rest = attr(SET_HANDLE, struct.pack("!Q", 9)) + attr(SET_KEY_TYPE, struct.pack("!I", 7))
    assert header(memoryview(head + t + n + flags + rest)) == ("kube-proxy", "__map3", 0xB)
    assert header(memoryview(head + rest + flags + n + t)) == ("kube-proxy", "__map3", 0xB)
    named = attr(SET_NAME, b"cluster-ips\0")
    assert header(memoryview(head + t + named + rest)) == ("kube-proxy", "cluster-ips", 0)
