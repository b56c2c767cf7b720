"""Reading must load no module (docs/contract.md#safety-rules), seen on a kernel that has loaded
none yet. Only a boot makes such a kernel, so this test carries the `pristine` marker and
tests/conftest.py runs it before every other test of the boot, whatever its file is called or
the order the others run in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from tests.conftest import run_agent

pytestmark = [pytest.mark.vm, pytest.mark.pristine]


def _modules() -> set[str]:
    return {line.split()[0] for line in Path("/proc/modules").read_text().splitlines()}


def test_audit_on_a_bare_node_loads_nothing_and_creates_nothing(netns: Callable[[], str]) -> None:
    watched = {
        "ip_vs",
        "ip_set",
        "nf_tables",
        "ip_tables",
        "ip6_tables",
        "iptable_nat",
        "iptable_filter",
        "iptable_mangle",
        "ip6table_nat",
        "ip6table_filter",
        "dummy",
    }
    before_modules = _modules()
    assert not watched & before_modules, f"a module was loaded before the test: {before_modules}"
    ns = netns()
    before_ns = build.run(["ip", "netns", "list"])
    r = run_agent(ns, "audit", "--json")
    assert r.rc == 0, r.stdout + r.stderr
    assert _modules() == before_modules
    for name in ("ipvs", "ipsets", "iptables_legacy", "iptables_nft", "nftables"):
        assert r.json["sources"][name]["status"] == "absent", name
    assert not Path("/proc/net/ip_tables_names").exists()  # x_tables still not loaded
    assert build.run(["ip", "netns", "list"]) == before_ns
