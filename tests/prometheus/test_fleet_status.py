"""`fleet status` against the real Prometheus, on hold-down history backfilled with promtool:
each node's verdict is the first check it fails; a node of another cluster never counts; firing
alerts pause (exit 3); several clusters without a scope and a dead Prometheus refuse (exit 4)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.fleet.prom import Prometheus
from agent.fleet.status import AgentPods, read_fleet
from tests.conftest import AGENT
from tests.prometheus.history import (
    HistoryPrometheus,
    NodeHistory,
    history_prometheus,
    openmetrics,
    steady,
)

pytestmark = pytest.mark.prometheus
T = float(int(time.time()))  # the history's "now" (the module's start)
M = 60.0


def between(t: float, a: float, b: float) -> bool:
    return T + a < t < T + b


NODES = [
    NodeHistory("lab", "ready", lambda t: steady()),
    NodeHistory("lab", "iptables", lambda t: steady(ipvs_leftovers_stale=0,
                                                   ipvs_leftovers_iptables_mode_chains=4)),
    # ten minutes without a sample, 80-90 minutes ago
    NodeHistory("lab", "gap", lambda t: None if between(t, -90 * M, -80 * M) else steady()),
    # ten minutes without a sample across the boundary of the gap check's two hourly stretches
    NodeHistory("lab", "gap-across", lambda t: None if between(t, -65 * M, -55 * M) else steady()),
    NodeHistory("lab", "foreign", lambda t: steady(
        ipvs_leftovers_foreign_references=2 if between(t, -60 * M, -50 * M) else 0)),
    NodeHistory("lab", "young", lambda t: steady() if t > T - 60 * M else steady(
        ipvs_leftovers_nftables_mode_confirmed=0, ipvs_leftovers_stale=0)),
    NodeHistory("lab", "clean", lambda t: steady(ipvs_leftovers_stale=0,
                                                ipvs_leftovers_kube_ipvs0_present=0)),
    NodeHistory("lab", "unhealthy", lambda t: steady() if t < T - 20 * M else steady(
        ipvs_leftovers_kube_proxy_healthy=0, ipvs_leftovers_nftables_mode_confirmed=0,
        ipvs_leftovers_stale=0)),
    NodeHistory("lab", "old", lambda t: steady() if t < T - 30 * M else None),
    NodeHistory("lab", "sources", lambda t: steady() if t < T - 10 * M else steady(
        ipvs_leftovers_source_up=0)),
    NodeHistory("lab", "shared", lambda t: steady()),
    # another cluster in the same Prometheus, one node name shared with "lab"
    NodeHistory("other", "shared", lambda t: steady(
        ipvs_leftovers_nftables_mode_confirmed=0, ipvs_leftovers_stale=0,
        ipvs_leftovers_foreign_references=3)),
    NodeHistory("other", "other-1", lambda t: steady()),
]  # fmt: skip
WANT = {
    "ready": "eligible",
    "iptables": "eligible",
    "gap": "no-gap",
    "gap-across": "no-gap",
    "foreign": "foreign",
    "young": "confirmed",
    "clean": "leftovers",
    "unhealthy": "kube-proxy",
    "old": "fresh",
    "sources": "sources",
    "shared": "eligible",
}
ARGS = ["--hold-down", "2h", "--max-gap", "2m", "--freshness", "2m"]


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HistoryPrometheus]:
    # 3 hours of 30 s samples, ending 10 minutes ahead so that they stay fresh while the
    # module runs (a query at time t sees only samples up to t)
    text = openmetrics(NODES, T - 180 * M, T + 10 * M, 30.0)
    with history_prometheus(text, tmp_path_factory.mktemp("history")) as p:
        # the rules have seen the data: the two non-leftover alerts of "lab" fire
        deadline = time.monotonic() + 60
        while len(p.firing()) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        yield p


def status(prom: HistoryPrometheus, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT, "fleet", "status", "--prometheus-url", prom.url, *ARGS, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_each_node_fails_its_first_check_and_the_other_cluster_is_left_out(
    prom: HistoryPrometheus,
) -> None:
    r = status(prom, "--cluster", "lab", "--json", "--alert-filter-regexp", ".*")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    got = {n["node"]: "eligible" if n["eligible"] else n["check"] for n in doc["nodes"]}
    assert got == WANT
    assert doc["cluster"] == "lab" and "other-1" not in got
    why = {n["node"]: n["why"] for n in doc["nodes"]}
    assert why["foreign"] == "2 foreign references during the hold-down"
    assert why["gap"].startswith("samples in 9") and "120s windows" in why["gap"]


def test_the_shared_name_in_the_other_cluster_is_judged_on_its_own_history(
    prom: HistoryPrometheus,
) -> None:
    r = status(prom, "--cluster", "other", "--json", "--alert-filter-regexp", ".*")
    assert r.returncode == 0, r.stderr
    got = {n["node"]: n["check"] or "eligible" for n in json.loads(r.stdout)["nodes"]}
    assert got == {"shared": "confirmed", "other-1": "eligible"}


def test_the_text_report_names_each_node_and_counts(prom: HistoryPrometheus) -> None:
    r = status(prom, "--cluster", "lab", "--alert-filter-regexp", ".*")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "cluster 'lab': 11 nodes, 3 eligible, 1 clean, 7 waiting"
    assert any(line.split()[:3] == ["gap", "waiting", "no-gap:"] for line in lines)


def test_firing_alerts_pause_with_exit_3_except_those_the_cleanup_resolves(
    prom: HistoryPrometheus,
) -> None:
    assert {
        ("IPVSLeftoversKubeProxyNotSynced", "unhealthy"),
        ("IPVSLeftoversSourceFailing", "sources"),
    } <= prom.firing()
    assert ("IPVSLeftoversStale", "ready") in prom.firing()  # resolved by the cleanup: no pause
    r = status(prom, "--cluster", "lab")
    assert r.returncode == 3, r.stderr
    assert r.stderr.strip() == (
        "ipvs-leftovers: paused: 2 alert(s) firing: IPVSLeftoversKubeProxyNotSynced on "
        "unhealthy, IPVSLeftoversSourceFailing on sources"
    )
    r = status(
        prom,
        "--cluster",
        "lab",
        "--alert-filter-regexp",
        "IPVSLeftoversKubeProxyNotSynced|IPVSLeftoversSourceFailing",
    )
    assert r.returncode == 0, r.stderr


def test_several_clusters_without_a_scope_refuse_with_exit_4(prom: HistoryPrometheus) -> None:
    r = status(prom)
    assert (r.returncode, r.stdout) == (4, "")
    assert r.stderr.strip() == (
        "ipvs-leftovers: fleet status refused: Prometheus holds 2 clusters ('lab', 'other'): "
        "give --cluster"
    )
    r = status(prom, "--cluster", "nowhere")
    assert r.returncode == 4 and "no ipvs-leftovers target of cluster 'nowhere'" in r.stderr


def test_the_gap_check_asked_an_hour_at_a_time_agrees_with_one_query_over_the_hold_down(
    prom: HistoryPrometheus,
) -> None:
    """Each node's coverage summed over the hourly stretches equals the one subquery over the
    whole hold-down (a millisecond short, as each stretch is), gap or not."""
    client = Prometheus(prom.url)
    at = (T // 60 + 1) * 60  # on a step: a stretch's first step is on the one before's last
    reading = read_fleet(client, at, "lab", 7200, 120, AgentPods())
    present = (
        "max by (cluster, node) (count_over_time(ipvs_leftovers_nftables_mode_confirmed"
        '{job="ipvs-leftovers",cluster="lab"}[120s])) > 0'
    )
    span = "[7199999ms:60s]"
    whole = client.query(
        f"count_over_time(({present}){span}) / scalar(count_over_time(vector(1){span}))", at
    )
    want = {labels["node"]: value for labels, value in whole}
    got = {node: data.coverage for node, data in reading.nodes.items()}
    assert got == want  # the same steps, counted once: equal, not approximately
    assert got["ready"] == 1.0 and got["gap"] < 1.0 and got["gap-across"] < 1.0
    assert reading.queries == 10 + 2 * 2  # the fixed queries, then two per hourly stretch


def test_a_killed_prometheus_refuses_with_exit_4(prom: HistoryPrometheus, tmp_path: Path) -> None:
    url = prom.url
    prom.stop()  # last test of the module: Prometheus is gone for good
    r = subprocess.run(
        [AGENT, "fleet", "status", "--prometheus-url", url, "--cluster", "lab", *ARGS],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (r.returncode, r.stdout) == (4, "")
    assert "unreachable" in r.stderr and len(r.stderr.strip().splitlines()) == 1
