"""cleanup with IPVS and a dummy kube-ipvs0, on Debian's kernel: exact removal, foreign IPVS
services byte-identical, restore gives the node back."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests.conftest import run_agent
from tests.dumps import dump, minus_leftovers

pytestmark = pytest.mark.vm
FOREIGN_IPVS = ("192.168.50.100:80", "-f 100")


@pytest.fixture(scope="module", autouse=True)
def _modules() -> None:
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "ip_vs_wlc", "dummy"], check=True)


@pytest.mark.parametrize("backend", ["nft", "legacy"])
@pytest.mark.parametrize("dual", [False, True], ids=["ipv4", "dual-stack"])
def test_cleanup_and_restore_with_ipvs(
    netns: Callable[[], str], tmp_path: Path, backend: str, dual: bool
) -> None:
    ns = netns()
    build.build(
        ns,
        realistic_node(
            dual_stack=dual,
            backend=backend,
            with_ipvs=True,
            third_party=True,
            nftables_table=True,
            old_release_orphans=True,
        ),
    )
    state = {"mode": "nftables", "families": ["IPv4", "IPv6"] if dual else ["IPv4"]}
    with start_fake_kube_proxy(ns, state, tmp_path / "kp.json"):
        before = dump(ns, ipvs=True)
        assert before["kube-ipvs0"] != [""]
        r = run_agent(
            ns,
            "cleanup",
            "--apply",
            "--backup-dir",
            str(tmp_path / "b"),
            "--lock-file",
            str(tmp_path / "l"),
        )
        assert r.rc == 0, r.stdout + r.stderr
        after = dump(ns, ipvs=True)
        expected = minus_leftovers(before)
        expected["ipvsadm"] = [
            line for line in before["ipvsadm"] if any(f in line for f in FOREIGN_IPVS)
        ]
        assert len(expected["ipvsadm"]) == 6  # keepalived: 2 services, 4 real servers
        assert after == expected
        doc = run_agent(ns, "audit", "--json").json
        assert doc["stale"] is False and doc["leftovers"]["kube_ipvs0"]["present"] is False
        assert doc["foreign"] == {"ipvs_virtual_servers": 2, "ipvs_real_servers": 4}
        (bundle,) = (tmp_path / "b").iterdir()
        rr = run_agent(ns, "restore", str(bundle))
        assert rr.rc == 0, rr.stderr
        assert dump(ns, ipvs=True) == before
