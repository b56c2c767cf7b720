"""ipvsadm -S's order: glibc's merge sort with libipvs' wrapping comparators (ipvsadm_save).

The fast path (a plain sort on rotated keys) must give exactly the merge sort's order
whenever it is taken; the replay is the reference."""

from __future__ import annotations

import random
import socket
import struct

from agent.cleanup import ipvsadm_save
from agent.cleanup.ipvsadm_save import (
    _arc_start,
    _glibc_msort,
    cmp_dests,
    cmp_services,
    sort_dests,
    sort_services,
)
from agent.snapshot import IpvsDest, IpvsService


def _v4(n: int) -> str:
    return socket.inet_ntoa(struct.pack("!I", n & 0xFFFFFFFF))


def _svc(  # type: ignore[no-untyped-def]
    address: str | None, port: int | None, proto: str = "TCP", fwmark: int | None = None, v6=False
):
    family = 6 if v6 or (address and ":" in address) else 4
    return IpvsService(family, "FWM" if fwmark else proto, address, port, fwmark, "rr", 0, 0)


def test_arc_start() -> None:
    assert _arc_start([]) == 0
    assert _arc_start([7]) == 7
    assert _arc_start([5, 9, 6]) == 5  # no wrap: the smallest
    assert _arc_start([0x0A600001, 0xC0A80002]) == 0xC0A80002  # 0x4A apart across the wrap
    assert _arc_start([0x0A000000, 0x50000000, 0xC0000000]) is None  # around the circle
    assert _arc_start([0, 1 << 31]) is None  # exactly half: the comparator is not antisymmetric


def test_clusterips_and_node_addresses_sort_like_the_merge_sort_node_addresses_first(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    rng = random.Random(7)
    services = [
        _svc(_v4(0x0A600000 + rng.randrange(1 << 20)), rng.choice((80, 443))) for _ in range(300)
    ]
    services += [_svc("192.168.0.2", 30000 + i) for i in range(30)]
    services += [_svc(None, None, fwmark=m) for m in (5, 1)]
    rng.shuffle(services)
    want = _glibc_msort(list(services), cmp_services)
    replayed: list[int] = []
    monkeypatch.setattr(ipvsadm_save, "_glibc_msort", lambda items, cmp: replayed.append(1))
    assert sort_services(services) == want
    assert not replayed  # a node's usual shape takes the plain sort
    firsts = [s.address for s in want if not s.fwmark]
    assert firsts[0] == "192.168.0.2" and firsts[-1].startswith("10.")


def test_random_tables_both_paths_agree_with_the_merge_sort(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(15)
    fast = 0
    for _ in range(200):
        centres = [rng.randrange(1 << 32) for _ in range(rng.randint(1, 3))]
        services = []
        for _ in range(rng.randint(0, 40)):
            c = rng.choice(centres)
            if rng.random() < 0.1:
                # IPv6 fwmark services too: libipvs compares their zeroed address as 4 words
                services.append(
                    _svc(None, None, fwmark=rng.choice((1, 2, c)), v6=rng.random() < 0.5)
                )
            elif rng.random() < 0.2:
                services.append(_svc(f"fd00::{rng.randrange(1 << 16):x}", rng.randrange(1, 3)))
            else:
                services.append(_svc(_v4(c + rng.randrange(1 << 24)), rng.randrange(1, 4)))
        calls = []
        monkeypatch.setattr(
            ipvsadm_save,
            "_glibc_msort",
            lambda items, cmp, calls=calls: calls.append(1) or _glibc_msort(items, cmp),
        )
        got = sort_services(services)
        monkeypatch.undo()
        assert got == _glibc_msort(list(services), cmp_services)
        fast += not calls
    assert 50 < fast < 200  # both paths were exercised


def test_real_servers_across_the_wrap() -> None:
    rng = random.Random(3)
    for _ in range(100):
        centres = [rng.randrange(1 << 32) for _ in range(rng.randint(1, 3))]
        dests = [
            IpvsDest(
                _v4(rng.choice(centres) + rng.randrange(1 << 20)), rng.randrange(1, 3), "masq", 1
            )
            for _ in range(rng.randint(0, 12))
        ]
        assert sort_dests(dests) == _glibc_msort(list(dests), cmp_dests)
