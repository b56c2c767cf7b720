"""A real Prometheus (Debian's binary) scrapes `serve` (the built image, with the DaemonSet's
flags and args) on six lab nodes plus one dead target, evaluates the shipped alert rules, and
answers the dashboard's queries.

This kernel has no IPVS and no dummy links, so the nodes here carry what it can hold: ipsets,
iptables (both backends) and nftables state, with kube-proxy's mode and health served by the
lab's fake kube-proxy. "Live ipvs" is a node whose kube-proxy answers `ipvs` over its in-use
ipvs-mode sets and chains; "foreign" is a node with only third-party state (Docker/CNI chains,
user sets) beside kube-proxy's nftables table. IPVS services themselves (kube-proxy's and
foreign ones) and kube-ipvs0 are not on these nodes:
IPVSLeftoversForeignIPVSServices and IPVSLeftoversKubeIPVS0Stale fire in the VM tier's
tests/vm/test_prometheus_vm.py, with the same fleet code on Debian's kernel.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.scenarios import realistic_node
from tests.image.containers import CLEANUP_JOB, pod_spec, run
from tests.oracle import expected
from tests.prometheus.fleet import (
    TARGET_LABELS,
    Fleet,
    LabNode,
    fleet,
    in_image,
    panel_queries,
)

pytestmark = pytest.mark.prometheus

NFT = {"mode": "nftables", "families": ["IPv4"], "last_sync_age": 2.0}
NODES = [
    # idle: kube-proxy healthy, its last sync two hours old (it re-syncs hourly when nothing
    # changes): no alert may fire on the age alone
    LabNode(
        "node-clean",
        realistic_node(ipvs_leftovers=False, nftables_table=True),
        {**NFT, "last_sync_age": 7200.0},
    ),
    # ipvs-mode leftovers, and iptables-mode ones from a node that also ran iptables mode
    LabNode("node-stale", realistic_node(nftables_table=True, iptables_mode=True), NFT),
    LabNode("node-ipvs", realistic_node(), {**NFT, "mode": "ipvs"}),
    LabNode(
        "node-foreign",
        realistic_node(ipvs_leftovers=False, third_party=True, nftables_table=True),
        NFT,
    ),
    LabNode("node-kp-down", realistic_node(nftables_table=True), None),
    LabNode(
        "node-kp-stuck",
        realistic_node(ipvs_leftovers=False, nftables_table=True),
        # kube-proxy (>= 1.33) serves its failure counter from its first failure on
        {**NFT, "healthy": False, "last_sync_age": 900.0, "sync_failures": 1},
    ),
]
GONE = ["node-gone"]
FIRING = {
    ("IPVSLeftoversStale", "node-stale"),
    ("IPVSLeftoversIptablesModeChains", "node-stale"),
    ("IPVSLeftoversKubeProxyUnreachable", "node-kp-down"),
    ("IPVSLeftoversKubeProxyNotSynced", "node-kp-stuck"),
    ("IPVSLeftoversKubeProxyNftablesSyncFailing", "node-kp-stuck"),
    ("IPVSLeftoversAgentDown", "node-gone"),
}
WITH_LEFTOVERS = ("node-stale", "node-ipvs", "node-kp-down")


@pytest.fixture(scope="module")
def lab(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with fleet(in_image(image), NODES, tmp_path_factory.mktemp("fleet"), GONE) as f:
        # every target scraped at least once, then kube-proxy on the stuck node starts failing
        # its syncs (a counter needs two samples to increase)
        f.wait_for(
            "every agent scraped",
            lambda: len(f.query('up{job="ipvs-leftovers"} == 1')) == len(NODES),
        )
        f.wait_for(
            "the stuck node's failure counter",
            lambda: f.query(
                'ipvs_leftovers_kube_proxy_nftables_sync_failures_total{node="node-kp-stuck"}'
            ),
        )
        kp = f.nodes["node-kp-stuck"].kp
        assert kp is not None
        kp.set(sync_failures=4)
        yield f


def values(f: Fleet, expr: str, by: str = "node") -> dict[str, float]:
    return {labels.get(by, ""): value for labels, value in f.query(expr)}


def test_the_agents_series_survive_common_target_labels(lab: Fleet) -> None:
    series = lab.query("ipvs_leftovers_ipvs_virtual_servers")
    assert len(series) == 2 * len(NODES)
    for labels, _ in series:
        assert labels["class"] in ("kube-proxy", "foreign")
        assert "exported_owner" not in labels and "exported_cluster" not in labels
        assert {k: labels[k] for k in TARGET_LABELS} == TARGET_LABELS
    assert values(lab, 'up{job="ipvs-leftovers"}') == {
        **{n.name: 1.0 for n in NODES},
        **{g: 0.0 for g in GONE},
    }


def test_exactly_the_expected_alerts_fire_for_exactly_their_nodes(lab: Fleet) -> None:
    lab.wait_alerts(FIRING)
    # and it holds over a few evaluations
    for _ in range(5):
        assert lab.alerts() == FIRING
        time.sleep(1)


def oracle_sum(name: str, what: str) -> float:
    spec = next(n.spec for n in NODES if n.name == name)
    got = expected(spec)
    if what == "ipsets":
        return float(sum(got["ipsets"].values()))
    if what == "iptables-mode chains":
        return float(len(got["iptables_leftovers"]["chains"]))
    return float(len(got["iptables_chains"]))


def test_dashboard_panels_give_the_fleet_and_each_node(lab: Fleet) -> None:
    lab.wait_alerts(FIRING)
    fleet_q = panel_queries(cluster="lab")

    def one(title: str, ref: str = "A", q: dict[tuple[str, str], str] = fleet_q) -> float:
        ((_, value),) = lab.query(q[(title, ref)])
        return value

    assert one("Nodes reporting") == len(NODES)
    assert one("Nodes with leftovers") == 1
    assert one("kube-ipvs0 on nftables nodes") == 0
    assert one("Foreign IPVS on nftables nodes") == 0
    assert one("Kernel not ready for nftables") == 0
    assert one("Nodes with source errors") == 0
    # the stats beside each alert (daemonset/README.md "Alerts": one panel per alert)
    assert one("kube-proxy unhealthy") == 1  # node-kp-stuck: IPVSLeftoversKubeProxyNotSynced
    assert one("kube-proxy unreachable") == 1  # node-kp-down: IPVSLeftoversKubeProxyUnreachable
    assert one("Agents down") == len(GONE)  # IPVSLeftoversAgentDown
    assert one("Agent targets") == len(NODES) + len(GONE)  # 0 is IPVSLeftoversAgentAbsent
    assert one("iptables-mode chains on nftables nodes") == 1  # node-stale
    assert one("Failed auto-cleanups (1d)") == 0  # no auto-cleanup in this lab
    assert values(lab, fleet_q[("Nodes by kube-proxy mode", "A")], by="mode") == {
        "nftables": 4.0,
        "ipvs": 1.0,
        "unknown": 1.0,
    }
    fleet_objects = "kube-proxy leftovers by kind (fleet)"
    assert one(fleet_objects, "A") == 0  # IPVS virtual servers: none on this kernel
    assert one(fleet_objects, "B") == sum(oracle_sum(n, "ipsets") for n in WITH_LEFTOVERS)
    assert one(fleet_objects, "C") == sum(oracle_sum(n, "chains") for n in WITH_LEFTOVERS)
    assert one(fleet_objects, "D") == 0
    assert one(fleet_objects, "E") == oracle_sum("node-stale", "iptables-mode chains") > 0
    # one 0 per confirmed nftables node (node-clean, idle, joins them once the gate follows
    # kube-proxy's own health)
    confirmed = values(lab, "ipvs_leftovers_nftables_mode_confirmed == 1")
    assert {"node-stale", "node-foreign"} <= confirmed.keys()
    foreign = values(lab, fleet_q[("Foreign IPVS services on nftables-mode nodes", "A")])
    assert foreign == {n: 0.0 for n in confirmed}
    assert lab.query(fleet_q[("Source errors", "A")]) == []
    failures = values(lab, fleet_q[("kube-proxy nftables sync failures", "A")])
    # only where kube-proxy's counter exists: real kube-proxy (>= 1.33, the fake's default
    # v1.37.2) serves it from its first failure on, none on the healthy nodes
    assert failures.keys() == {"node-kp-stuck"}
    assert failures["node-kp-stuck"] > 0
    ages = values(lab, fleet_q[("kube-proxy time since last sync", "A")])
    assert ages.keys() == {n.name for n in NODES if n.kube_proxy is not None}
    assert 7100 < ages["node-clean"] < 7400 and ages["node-stale"] < 120
    table = "Stale nodes: what is left"  # only stale nodes, their counts
    rows: dict[str, Any] = {
        ref: values(lab, fleet_q[(table, ref)]) for ref in ("A", "B", "C", "D", "E", "F")
    }
    assert rows == {
        "A": {"node-stale": 1.0},
        "B": {"node-stale": 0.0},
        "C": {"node-stale": oracle_sum("node-stale", "ipsets")},
        "D": {"node-stale": oracle_sum("node-stale", "chains")},
        "E": {"node-stale": 0.0},
        "F": {"node-stale": 0.0},
    }
    # the node variable narrows every stat to one node; a cluster that is not there to none
    for node, leftovers in (("node-stale", 1), ("node-clean", 0), ("node-ipvs", 0)):
        q = panel_queries(cluster="lab", node=node)
        assert one("Nodes reporting", q=q) == 1
        assert one("Nodes with leftovers", q=q) == leftovers
    other = panel_queries(cluster="elsewhere")
    assert lab.query(other[("Nodes reporting", "A")]) == []


def test_cleanup_on_the_stale_node_clears_its_alerts_and_panels(
    lab: Fleet, image: str, tmp_path: Path
) -> None:
    lab.wait_alerts(FIRING)
    node = lab.nodes["node-stale"]
    spec = pod_spec(CLEANUP_JOB, tmp_path / "host")
    r = run(image, node.ns, spec, *spec.args)
    assert r.rc == 0, r.stdout + r.stderr
    after = FIRING - {
        ("IPVSLeftoversStale", "node-stale"),
        ("IPVSLeftoversIptablesModeChains", "node-stale"),
    }
    lab.wait_alerts(after)
    q = panel_queries(cluster="lab")
    assert lab.query(q[("Nodes with leftovers", "A")])[0][1] == 0
    assert lab.query(q[("Stale nodes: what is left", "A")]) == []
    assert lab.query(q[("Stale nodes: what is left", "C")]) == []
