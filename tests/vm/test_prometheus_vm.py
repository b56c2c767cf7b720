"""Real Prometheus with the shipped rules against IPVS lab nodes (Debian's kernel): the alerts
this machine's kernel cannot show — foreign IPVS services and a stale dummy kube-ipvs0 — fire
for exactly their nodes, and clear after cleanup --apply. The host's tests/prometheus covers
the other alerts and the dashboard; this tier has no podman, so serve is the installed agent
with the DaemonSet's args."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.scenarios import realistic_node
from tests.conftest import run_agent
from tests.prometheus.fleet import Fleet, LabNode, fleet, on_host, panel_queries

pytestmark = pytest.mark.vm

NFT = {"mode": "nftables", "families": ["IPv4"], "last_sync_age": 2.0}
NODES = [
    # keepalived's services only, beside kube-proxy's nftables table
    LabNode(
        "node-foreign",
        realistic_node(with_ipvs=True, ipvs_leftovers=False, third_party=True, nftables_table=True),
        NFT,
    ),
    # kube-proxy's IPVS services and the dummy kube-ipvs0 left behind
    LabNode("node-stale-ipvs", realistic_node(with_ipvs=True, nftables_table=True), NFT),
    # live ipvs mode: the same state, in use
    LabNode("node-ipvs", realistic_node(with_ipvs=True), {**NFT, "mode": "ipvs"}),
]
FIRING = {
    ("IPVSLeftoversForeignIPVSServices", "node-foreign"),
    ("IPVSLeftoversStale", "node-stale-ipvs"),
    ("IPVSLeftoversKubeIPVS0Stale", "node-stale-ipvs"),
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "ip_vs_wlc", "dummy"], check=True)
    with fleet(on_host, NODES, tmp_path_factory.mktemp("fleet"), []) as f:
        yield f


def test_foreign_ipvs_and_kube_ipvs0_alerts_fire_then_clear_after_cleanup(
    lab: Fleet, tmp_path: Path
) -> None:
    lab.wait_for("the expected alerts", lambda: lab.alerts() == FIRING or None, timeout=600)
    q = panel_queries(cluster="lab")
    ((_, foreign),) = lab.query(q[("Foreign IPVS on nftables nodes", "A")])
    ((_, link),) = lab.query(q[("kube-ipvs0 on nftables nodes", "A")])
    assert (foreign, link) == (1, 1)
    ns = lab.nodes["node-stale-ipvs"].ns
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
    after = {("IPVSLeftoversForeignIPVSServices", "node-foreign")}
    lab.wait_for("the stale alerts to clear", lambda: lab.alerts() == after or None, timeout=600)
    ((_, link),) = lab.query(q[("kube-ipvs0 on nftables nodes", "A")])
    assert link == 0
