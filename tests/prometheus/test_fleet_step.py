"""`fleet step` end to end: the real control plane (etcd, kube-apiserver, the real Job
controller in kube-controller-manager), the real Prometheus scraping `serve` on lab nodes over
backfilled hold-down history, and a stand-in kubelet running each cleanup Pod on its node.

Waves of 1, 2, then the rest, each baked (the cleaned nodes shown clean by new samples)
before the next; the leftovers are really gone; then the refusals and halts, each creating
nothing."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.scenarios import realistic_node
from tests.conftest import AGENT
from tests.dumps import dump, minus_leftovers
from tests.fleet_lab import NAMESPACE, FleetLab, LabNode, fleet_lab
from tests.prometheus.history import NodeHistory, openmetrics, steady

pytestmark = [pytest.mark.prometheus, pytest.mark.netns, pytest.mark.upstream]
NFT = {"mode": "nftables", "families": ["IPv4"], "last_sync_age": 2.0}
NAMES = ["n1", "n2", "n3", "n4"]
ARGS = ["--cluster", "lab", "--hold-down", "1h", "--max-gap", "2m", "--freshness", "1m"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetLab]:
    nodes = [
        LabNode(n, realistic_node(nftables_table=True), dict(NFT), zone=f"zone-{i % 2}")
        for i, n in enumerate(NAMES)
    ]

    def history(now: float, instances: dict[str, str]) -> str:
        series = [NodeHistory("lab", n, lambda t: steady(), instances[n]) for n in NAMES]
        return openmetrics(series, now - 70 * 60, now - 1, 15.0)

    with fleet_lab(tmp_path_factory.mktemp("fleet-step"), nodes, history) as f:
        f.before = {n.name: dump(n.ns) for n in nodes}  # type: ignore[attr-defined]
        deadline = time.monotonic() + 120
        while len(f.query('up{job="ipvs-leftovers"} == 1')) < len(NAMES):
            assert time.monotonic() < deadline, "Prometheus never scraped every node"
            time.sleep(1)
        yield f


def step(lab: FleetLab, *args: str, kubeconfig: Path | None = None) -> tuple[int, Any, str]:
    r = subprocess.run(
        [AGENT, "fleet", "step", "--prometheus-url", lab.prom_url, *ARGS, "--json",
         "--kubeconfig", str(kubeconfig or lab.cp.admin_kubeconfig), *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    doc = json.loads(r.stdout) if r.returncode == 0 and r.stdout else None
    return r.returncode, doc, r.stderr.strip()


def status(lab: FleetLab) -> str:
    r = subprocess.run(
        [AGENT, "fleet", "status", "--prometheus-url", lab.prom_url, *ARGS, "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return r.stdout + r.stderr


def wait_jobs_done(lab: FleetLab, n: int, timeout: float = 180) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        states = {}
        for name, job in lab.jobs().items():
            conds = {c["type"] for c in job.get("status", {}).get("conditions") or []
                     if c["status"] == "True"}  # fmt: skip
            states[name] = "Complete" if "Complete" in conds else (
                "Failed" if "Failed" in conds else "running")  # fmt: skip
        if len(states) >= n and "running" not in states.values():
            return states
        assert time.monotonic() < deadline, f"Jobs not done: {states}"
        time.sleep(1)


def wait_clean_in_prometheus(lab: FleetLab, nodes: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        stale = lab.query("ipvs_leftovers_stale")
        if all(stale.get(n) == 0 for n in nodes):
            time.sleep(6)  # a scrape after the Job's completion time, whole seconds
            return
        assert time.monotonic() < deadline, f"stale: {stale}"
        time.sleep(1)


def test_waves_of_1_2_then_the_rest_each_baked_and_the_leftovers_gone(lab: FleetLab) -> None:
    code, doc, err = step(lab)  # without --apply: what it would do
    assert code == 0, err
    assert doc["lines"] == ["would create wave 1: n1"] and lab.jobs() == {}

    code, doc, err = step(lab, "--apply")
    assert code == 0, err
    assert (doc["wave"], doc["created"]) == (1, ["n1"])
    measured = {"api_calls_wave_1": doc["api_calls"], "queries": doc["prometheus_queries"]}
    assert wait_jobs_done(lab, 1) == {"ipvs-leftovers-cleanup-n1": "Complete"}
    job = lab.jobs()["ipvs-leftovers-cleanup-n1"]
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example.net/ipvs-leftovers:fleet-test"
    assert (
        job["spec"]["activeDeadlineSeconds"] == 1800 and job["metadata"]["namespace"] == NAMESPACE
    )

    # until n1's new samples show it clean, the bake holds the next wave back
    code, doc, err = step(lab, "--apply")
    assert code == 0, err
    if doc["created"] == []:
        assert doc["lines"] == ["wave 1: no sample yet since the Job on n1"], doc
        wait_clean_in_prometheus(lab, ["n1"])
        code, doc, err = step(lab, "--apply")
    assert code == 0, err
    assert (doc["wave"], doc["created"]) == (2, ["n2", "n3"])  # 2 nodes, two zones
    wait_jobs_done(lab, 3)
    wait_clean_in_prometheus(lab, ["n1", "n2", "n3"])

    code, doc, err = step(lab, "--apply")
    assert code == 0, err
    assert (doc["wave"], doc["created"]) == (3, ["n4"]), (doc, status(lab))  # up to 4: 1 left
    assert set(wait_jobs_done(lab, 4).values()) == {"Complete"}
    wait_clean_in_prometheus(lab, NAMES)
    for node in lab.nodes.values():
        assert dump(node.ns) == minus_leftovers(lab.before[node.name])  # type: ignore[attr-defined]

    code, doc, err = step(lab, "--apply")
    assert code == 0, err
    assert doc["created"] == [] and doc["lines"] == [
        "nothing to do: no eligible node without a Job"
    ]
    (lab.workdir / "measured.json").write_text(
        json.dumps({**measured, "api_calls_idle": doc["api_calls"]})
    )
    print(f"\nfleet step measured: {measured}, idle step {doc['api_calls']} API calls")


def test_a_node_flipped_back_to_ipvs_mode_halts_with_exit_3(lab: FleetLab) -> None:
    kp = lab.nodes["n2"].kp
    assert kp is not None
    kp.set(mode="ipvs")
    try:
        deadline = time.monotonic() + 60
        while lab.query("ipvs_leftovers_nftables_mode_confirmed").get("n2") != 0:
            assert time.monotonic() < deadline
            time.sleep(1)
        jobs = set(lab.jobs())
        code, _, err = step(lab, "--apply")
        assert code == 3
        assert err == (
            "ipvs-leftovers: fleet step stopped: halted: n2, cleaned in wave 2: nftables mode "
            "no longer confirmed"
        )
        assert set(lab.jobs()) == jobs
    finally:
        kp.set(mode="nftables")


def test_an_unhealthy_kube_proxy_firing_the_not_synced_alert_pauses_with_exit_3(
    lab: FleetLab,
) -> None:
    kp = lab.nodes["n3"].kp
    assert kp is not None
    kp.set(healthy=False)
    try:
        deadline = time.monotonic() + 90
        while ("IPVSLeftoversKubeProxyNotSynced", "n3") not in lab.firing():
            assert time.monotonic() < deadline, lab.firing()
            time.sleep(1)
        jobs = set(lab.jobs())
        code, _, err = step(lab, "--apply")
        assert code == 3
        assert err == (
            "ipvs-leftovers: fleet step stopped: paused: 1 alert(s) firing: "
            "IPVSLeftoversKubeProxyNotSynced on n3"
        )
        assert set(lab.jobs()) == jobs
        lease = json.loads(
            lab.cp.kubectl("-n", NAMESPACE, "get", "lease", "ipvs-leftovers-fleet", "-o", "json")
        )
        assert lease["metadata"]["annotations"]["ipvs-leftovers.io/next-wave-size"] == "1"
    finally:
        kp.set(healthy=True)


def test_the_lease_held_by_another_stops_with_exit_3(lab: FleetLab) -> None:
    lease = json.loads(
        lab.cp.kubectl("-n", NAMESPACE, "get", "lease", "ipvs-leftovers-fleet", "-o", "json")
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    lease["spec"].update(holderIdentity="someone-else", renewTime=now, leaseDurationSeconds=600)
    lab.cp.kubectl("replace", "-f", "-", stdin=json.dumps(lease))
    try:
        code, _, err = step(lab, "--apply")
        assert (
            code == 3 and "Lease ipvs-leftovers/ipvs-leftovers-fleet is held by someone-else" in err
        )
    finally:
        lease = json.loads(
            lab.cp.kubectl("-n", NAMESPACE, "get", "lease", "ipvs-leftovers-fleet", "-o", "json")
        )
        lease["spec"]["holderIdentity"] = None
        lab.cp.kubectl("replace", "-f", "-", stdin=json.dumps(lease))


def test_a_user_the_api_server_forbids_is_refused_with_exit_4(lab: FleetLab) -> None:
    nobody = lab.workdir / "nobody.kubeconfig"
    nobody.write_text(lab.cp.kubeconfig("nobody", []))
    code, _, err = step(lab, "--apply", kubeconfig=nobody)
    assert code == 4 and "HTTP 403 Forbidden" in err and len(err.splitlines()) == 1


def test_an_unreachable_prometheus_is_refused_with_exit_4_creating_nothing(lab: FleetLab) -> None:
    jobs = set(lab.jobs())
    r = subprocess.run(
        [AGENT, "fleet", "step", "--prometheus-url", "http://127.0.0.1:9", *ARGS, "--apply",
         "--kubeconfig", str(lab.cp.admin_kubeconfig)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 4 and "unreachable" in r.stderr
    assert set(lab.jobs()) == jobs
