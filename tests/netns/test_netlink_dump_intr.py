"""This kernel marks a dump NLM_F_DUMP_INTR when its list changes between two passes.

A dump larger than one pass (the kernel fills at most 32 KiB per pass) is read one message at
a time; after the first message the test changes the list, from inside the dump, so that a
later pass sees the change. The client must refuse that dump and read a whole one again.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lab import build
from tests.conftest import python_json

pytestmark = pytest.mark.netns

PROBE = """
import json, subprocess, sys
from agent.readers.netlink import DumpInterrupted, NfTables, RtNetlink, consistent
kind, change = sys.argv[1], sys.argv[2:]
sock = RtNetlink() if kind == "addresses" else NfTables()
dump = (lambda: sock.addresses()) if kind == "addresses" else (lambda: sock.dump(4))
seen, outcome = 0, "whole"
try:
    for _ in dump():
        seen += 1
        if seen == 1:
            subprocess.run(change, check=True)
except DumpInterrupted:
    outcome = "interrupted"
again = len(consistent(lambda: list(dump())))
print(json.dumps({"outcome": outcome, "seen": seen, "again": again}))
"""


def _probe(ns: str, kind: str, *change: str) -> dict[str, object]:
    result: dict[str, object] = python_json(ns, "-c", PROBE, kind, *change)
    return result


def test_an_address_dump_changed_midway_is_refused_and_read_again(
    netns: Callable[[], str],
) -> None:
    ns = netns()
    batch = "".join(f"addr add 10.77.{i // 250}.{i % 250 + 1}/32 dev lo\n" for i in range(3000))
    build.run(["ip", "-n", ns, "-batch", "-"], stdin=batch)
    # lo's 127.0.0.1 and ::1, the 3,000, and the one deleted midway is gone from the re-read
    result = _probe(ns, "addresses", "ip", "addr", "del", "10.77.0.1/32", "dev", "lo")
    assert result["outcome"] == "interrupted"
    assert result["again"] == 2 + 3000 - 1


def test_an_nftables_chain_dump_changed_midway_is_refused_and_read_again(
    netns: Callable[[], str],
) -> None:
    ns = netns()
    chains = "".join(f"add chain ip t c{i}\n" for i in range(3000))
    build.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], stdin=f"add table ip t\n{chains}")
    result = _probe(ns, "chains", "nft", "add", "chain", "ip", "t", "late")
    assert result["outcome"] == "interrupted"
    assert result["again"] == 3001
