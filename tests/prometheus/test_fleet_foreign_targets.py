"""The fleet reads only series of the agent's own pods: `namespace` the DaemonSet's, `pod` one
of its pods. A second scrape target relabelled to job="ipvs-leftovers" and another node's name
(a PodMonitor elsewhere, a copied scrape config) must not make a node whose agent is down look
fresh, and so eligible (docs/operations.md, docs/threat-model.md).

The real Prometheus on backfilled history; the API side of `fleet step` is tests/kube_stub.py
(a step without --apply only lists)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import main
from tests.kube_stub import Stub, daemonset, kube_stub
from tests.prometheus.history import (
    HistoryPrometheus,
    NodeHistory,
    history_prometheus,
    openmetrics,
    steady,
)

pytestmark = pytest.mark.prometheus
T = float(int(time.time()))
M = 60.0
ARGS = ["--cluster", "lab", "--hold-down", "1h", "--max-gap", "2m", "--freshness", "2m",
        "--alert-filter-regexp", ".*"]  # fmt: skip


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HistoryPrometheus]:
    nodes = [
        NodeHistory("lab", "ready", lambda t: steady()),
        # the agents of "down" and "down2" stopped 30 minutes ago ...
        NodeHistory("lab", "down", lambda t: steady() if t < T - 30 * M else None),
        NodeHistory("lab", "down2", lambda t: steady() if t < T - 30 * M else None),
        # ... and a target in another namespace claims "down" ...
        NodeHistory("lab", "down", lambda t: steady(), instance="10.9.9.9:8080",
                    namespace="monitoring", pod="exporter-7d9f8-x2x4q"),
        # ... and a pod of the agent's namespace that is not the agent claims "down2"
        NodeHistory("lab", "down2", lambda t: steady(), instance="10.9.9.8:9437",
                    pod="ipvs-leftovers-cleanup-down2-k7x9p"),
    ]  # fmt: skip
    text = openmetrics(nodes, T - 70 * M, T + 10 * M, 30.0)
    with history_prometheus(text, tmp_path_factory.mktemp("foreign")) as p:
        yield p


def test_fleet_status_reads_only_the_agents_own_pods(prom: HistoryPrometheus) -> None:
    r = CliRunner().invoke(main, ["fleet", "status", "--prometheus-url", prom.url, *ARGS,
                                  "--json"])  # fmt: skip
    assert r.exit_code == 0, r.stderr
    got = {n["node"]: (n["check"] or "eligible") for n in json.loads(r.stdout)["nodes"]}
    assert got == {"ready": "eligible", "down": "fresh", "down2": "fresh"}


def test_fleet_step_reads_only_the_pods_of_the_daemonsets_namespace(
    prom: HistoryPrometheus, tmp_path: Path
) -> None:
    stub = Stub(
        daemonsets=[daemonset("ipvs-leftovers", "registry.example/ipvs-leftovers:1")],
        nodes=[{"metadata": {"name": n}} for n in ("ready", "down", "down2")],
    )
    with kube_stub(stub):
        r = CliRunner().invoke(
            main,
            ["fleet", "step", "--prometheus-url", prom.url, *ARGS,
             "--kubeconfig", str(stub.kubeconfig(tmp_path / "kubeconfig"))],
        )  # fmt: skip
    assert (r.exit_code, r.stderr) == (0, "")
    assert r.stdout.splitlines() == ["would create wave 1: ready"]


def test_another_namespace_given_to_fleet_status_reads_that_namespace_only(
    prom: HistoryPrometheus,
) -> None:
    r = CliRunner().invoke(main, ["fleet", "status", "--prometheus-url", prom.url, *ARGS,
                                  "--namespace", "elsewhere"])  # fmt: skip
    assert r.exit_code == 4
    assert r.stderr == (
        "ipvs-leftovers: fleet status refused: Prometheus has no ipvs-leftovers target of "
        "cluster 'lab' from the pods of DaemonSet elsewhere/ipvs-leftovers (an empty answer)\n"
    )
