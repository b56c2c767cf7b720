"""The gate's table check on real nf_tables: an empty `ip kube-proxy` table
no longer confirms nftables mode; kube-proxy's own table (as the lab writes it, from
pkg/proxy/nftables/proxier.go) still does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests.conftest import run_agent

pytestmark = pytest.mark.netns
CONFIRMED = {"mode": "nftables", "families": ["IPv4"], "last_sync_age": 2.0}


def test_an_empty_kube_proxy_table_does_not_confirm_nftables_mode(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = netns()
    build.build(ns, realistic_node())
    build.run(["ip", "netns", "exec", ns, "nft", "add table ip kube-proxy"])
    with start_fake_kube_proxy(ns, CONFIRMED, tmp_path / "kp.json"):
        audit = run_agent(ns, "audit", "--json")
        plan = run_agent(ns, "cleanup", "--lock-file", str(tmp_path / "lock"))
    mode = audit.json["mode"]
    assert mode["nftables_confirmed"] is False, mode
    assert audit.json["stale"] is False
    assert (
        "--apply would be refused: nftables mode is not confirmed (nftables table ip "
        in plan.stdout
    )
    assert "lacks kube-proxy's chains services, masquerading" in plan.stdout


def test_kube_proxys_own_table_still_confirms_it(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = netns()
    build.build(ns, realistic_node(nftables_table=True))
    with start_fake_kube_proxy(ns, CONFIRMED, tmp_path / "kp.json"):
        audit = run_agent(ns, "audit", "--json")
    assert audit.json["mode"]["nftables_confirmed"] is True, audit.json["mode"]
    assert audit.json["stale"] is True
