"""Real Prometheus with the shipped rules against IPVS lab nodes (Debian's kernel): the alerts
this machine's kernel cannot show — foreign IPVS services and a stale dummy kube-ipvs0 — fire
for exactly their nodes, and clear after cleanup --apply. tests/prometheus covers the other
alerts and the dashboard on the host; the VM has no podman, so serve here is the installed
agent with the DaemonSet's args, and every wait is scaled for the emulation."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from lab.scenarios import realistic_node
from tests.conftest import run_agent
from tests.image.containers import DAEMONSET, pod_spec
from tests.prometheus.fleet import AGENT_PORT, Fleet, LabNode, fleet, panel_queries
from tests.serving import serving

pytestmark = pytest.mark.vm
SLOW = 10.0  # QEMU TCG runs this code about 10-30x slower than the host: the waits
SCRAPE_SLOW = 3.0  # scrapes every 9 s, 7.5 s timeout: serve's collection here takes seconds

NFT = {"mode": "nftables", "families": ["IPv4"], "last_sync_age": 2.0}
NODES = [
    # keepalived's IPVS services only (no kube-ipvs0), beside kube-proxy's nftables table
    LabNode(
        "node-foreign",
        realistic_node(
            with_ipvs=True,
            with_kube_ipvs0=False,
            ipvs_leftovers=False,
            third_party=True,
            nftables_table=True,
        ),
        NFT,
    ),
    # kube-proxy's IPVS services, sets, chains and the dummy kube-ipvs0, left behind
    LabNode("node-stale-ipvs", realistic_node(with_ipvs=True, nftables_table=True), NFT),
]
FIRING = {
    ("IPVSLeftoversForeignIPVSServices", "node-foreign"),
    ("IPVSLeftoversStale", "node-stale-ipvs"),
    ("IPVSLeftoversKubeIPVS0Stale", "node-stale-ipvs"),
}


def on_host(node: LabNode, host_root: Path) -> AbstractContextManager[Any]:
    args = pod_spec(DAEMONSET, host_root).args
    assert args[:1] == ["serve"]
    return serving(node.ns, *args[1:], port=AGENT_PORT)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "ip_vs_wlc", "dummy"], check=True)
    with fleet(on_host, NODES, tmp_path_factory.mktemp("fleet"), [], slow=SCRAPE_SLOW) as f:
        f.wait_for(
            "every agent scraped",
            lambda: len(f.query('up{job="ipvs-leftovers"} == 1')) == len(NODES),
            timeout=60 * SLOW,
        )
        yield f


def test_foreign_ipvs_and_kube_ipvs0_alerts_fire_then_clear_after_cleanup(
    lab: Fleet, tmp_path: Path
) -> None:
    lab.wait_alerts(FIRING, timeout=30 * SLOW)
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
    lab.wait_alerts({("IPVSLeftoversForeignIPVSServices", "node-foreign")}, timeout=30 * SLOW)
    ((_, link),) = lab.query(q[("kube-ipvs0 on nftables nodes", "A")])
    assert link == 0
