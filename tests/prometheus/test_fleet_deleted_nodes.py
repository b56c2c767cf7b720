"""A node deleted during the hold-down (the autoscaler, an upgrade) keeps answering the
hold-down's range queries for hours: `fleet step` reports it "deleted (skipped)" and goes on
with the others, also when the node had a Job of an earlier wave; a node whose agent is live
and that the API server does not know still refuses (another cluster's series).

The real Prometheus on backfilled history; the API side is tests/kube_stub.py (a step without
--apply only lists: DaemonSets, Nodes, Jobs), as tests/unit/test_fleet_step_api_errors.py."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import main
from tests.kube_stub import Stub, daemonset, kube_stub
from tests.prometheus.history import (
    HistoryPrometheus,
    NodeHistory,
    Sample,
    history_prometheus,
    openmetrics,
    steady,
)

pytest.importorskip("kubernetes")
pytestmark = pytest.mark.prometheus
NS = "ipvs-leftovers"
T = float(int(time.time()))
M = 60.0
ARGS = ["--cluster", "lab", "--hold-down", "1h", "--max-gap", "2m", "--freshness", "15m",
        "--alert-filter-regexp", ".*"]  # fmt: skip


def until(minutes: float) -> Callable[[float], Sample | None]:
    """Steady, then no sample from `minutes` ago: the node and its agent are gone."""
    return lambda t: steady() if t < T - minutes * M else None


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HistoryPrometheus]:
    nodes = [
        NodeHistory("lab", "a1", lambda t: steady()),
        NodeHistory("lab", "a2", lambda t: steady()),
        NodeHistory("lab", "gone", until(20)),  # deleted 20 minutes ago
        NodeHistory("lab", "gone-in-wave", until(30)),  # deleted while its Job ran
    ]
    text = openmetrics(nodes, T - 70 * M, T + 10 * M, 30.0)
    with history_prometheus(text, tmp_path_factory.mktemp("deleted")) as p:
        yield p


def node(name: str) -> dict[str, object]:
    return {"metadata": {"name": name}}


def running_job(node_name: str, wave: int) -> dict[str, object]:
    return {
        "metadata": {
            "name": f"ipvs-leftovers-cleanup-{node_name}",
            "namespace": NS,
            "labels": {"ipvs-leftovers.io/fleet": "ipvs-leftovers-fleet",
                       "ipvs-leftovers.io/node": node_name},
            "annotations": {"ipvs-leftovers.io/wave": str(wave)},
        },
        "status": {"active": 1},
    }  # fmt: skip


def plan(prom: HistoryPrometheus, stub: Stub, tmp: Path) -> tuple[int, str, str]:
    stub.daemonsets = [daemonset(NS, "registry.example/ipvs-leftovers:1")]
    with kube_stub(stub):
        r = CliRunner().invoke(
            main,
            ["fleet", "step", "--prometheus-url", prom.url, *ARGS,
             "--kubeconfig", str(stub.kubeconfig(tmp / "kubeconfig"))],
        )  # fmt: skip
    return r.exit_code, r.stdout, r.stderr.strip()


def test_a_deleted_node_is_reported_and_skipped(prom: HistoryPrometheus, tmp_path: Path) -> None:
    code, out, err = plan(prom, Stub(nodes=[node("a1"), node("a2")]), tmp_path)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "gone: deleted (skipped): no Node in the API server",
        "gone-in-wave: deleted (skipped): no Node in the API server",
        "would create wave 1: a1",
    ]


def test_the_job_of_a_deleted_node_does_not_hold_the_waves(
    prom: HistoryPrometheus, tmp_path: Path
) -> None:
    stub = Stub(nodes=[node("a1"), node("a2")], jobs=[running_job("gone-in-wave", 1)])
    code, out, err = plan(prom, stub, tmp_path)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "gone: deleted (skipped): no Node in the API server",
        "gone-in-wave: deleted (skipped): no Node in the API server",
        "would create wave 2: a1",
    ]


def test_a_live_agent_on_a_node_the_api_server_does_not_know_still_refuses(
    prom: HistoryPrometheus, tmp_path: Path
) -> None:
    code, out, err = plan(prom, Stub(nodes=[node("a1")]), tmp_path)
    assert (code, out) == (4, "")
    assert err == (
        "ipvs-leftovers: fleet step refused: Prometheus knows node(s) the API server does not: "
        "a2 (another cluster's? give --cluster)"
    )


def status(prom: HistoryPrometheus, stub: Stub, tmp: Path, *args: str) -> tuple[int, str, str]:
    with kube_stub(stub):
        r = CliRunner().invoke(
            main,
            ["fleet", "status", "--prometheus-url", prom.url, *ARGS, *args,
             "--kubeconfig", str(stub.kubeconfig(tmp / "kubeconfig"))],
        )  # fmt: skip
    return r.exit_code, r.stdout, r.stderr.strip()


def test_fleet_status_with_the_api_shows_deleted_nodes(
    prom: HistoryPrometheus, tmp_path: Path
) -> None:
    code, out, err = status(prom, Stub(nodes=[node("a1"), node("a2")]), tmp_path)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "a1            eligible",
        "a2            eligible",
        "gone          deleted (skipped): no Node in the API server",
        "gone-in-wave  deleted (skipped): no Node in the API server",
        "cluster 'lab': 4 nodes, 2 eligible, 0 clean, 0 waiting, 2 deleted",
    ]
    code, out, err = status(prom, Stub(nodes=[node("a1"), node("a2")]), tmp_path, "--json")
    got = {n["node"]: (n["eligible"], n["check"]) for n in json.loads(out)["nodes"]}
    assert got == {"a1": (True, ""), "a2": (True, ""), "gone": (False, "deleted"),
                   "gone-in-wave": (False, "deleted")}  # fmt: skip
    code, out, err = status(prom, Stub(nodes=[node("a1")]), tmp_path)
    assert (code, out) == (4, "")
    assert err == (
        "ipvs-leftovers: fleet status refused: Prometheus knows node(s) the API server does "
        "not: a2 (another cluster's? give --cluster)"
    )
