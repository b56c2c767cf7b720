"""`fleet step`'s refusals against the real kube-apiserver (and etcd) and the real Prometheus
on backfilled history: each is one line with its exit code, and creates no Job. The waves
themselves, with the Job controller and lab nodes, are in test_fleet_step.py."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import AGENT, REPO
from tests.control_plane import ControlPlane
from tests.prometheus.history import (
    HistoryPrometheus,
    NodeHistory,
    history_prometheus,
    openmetrics,
    steady,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.upstream]
NS = "ipvs-leftovers"
NOW = float(int(time.time()))
NODES = ["a1", "a2", "a3"]
ARGS = ["--hold-down", "1h", "--max-gap", "2m", "--freshness", "15m", "--alert-filter-regexp", ".*"]


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ControlPlane, HistoryPrometheus]]:
    work = tmp_path_factory.mktemp("fleet-refusals")
    history = openmetrics(
        [NodeHistory("lab", n, lambda t: steady()) for n in NODES]
        + [NodeHistory("elsewhere", "b1", lambda t: steady())],
        NOW - 70 * 60,
        NOW + 10 * 60,
        30.0,
    )
    with ControlPlane(work / "cp") as cp, history_prometheus(history, work / "prom") as prom:
        cp.kubectl("apply", "-k", str(REPO / "daemonset" / "setup"))
        rendered = cp.kubectl("kustomize", str(REPO / "daemonset"))
        docs = [d for d in yaml.safe_load_all(rendered)
                if d and d["kind"] in ("ServiceAccount", "ResourceQuota", "DaemonSet")]  # fmt: skip
        cp.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(d) for d in docs))
        for n in NODES:
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}
            cp.kubectl("apply", "-f", "-", stdin=json.dumps(node))
        yield cp, prom


def step(world: Any, *args: str, kubeconfig: Path | None = None) -> tuple[int, str, str]:
    cp, prom = world
    r = subprocess.run(
        [AGENT, "fleet", "step", "--prometheus-url", prom.url, *ARGS,
         "--kubeconfig", str(kubeconfig or cp.admin_kubeconfig), *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return r.returncode, r.stdout, r.stderr.strip()


def jobs(cp: ControlPlane) -> list[str]:
    doc = json.loads(cp.kubectl("-n", NS, "get", "jobs", "-o", "json"))
    return [j["metadata"]["name"] for j in doc["items"]]


@pytest.fixture(autouse=True)
def no_fleet_yet(world: Any) -> None:
    """Each test starts before the first wave, whatever ran before it: no Job, no Lease (the
    fleet's wave count and acknowledgements live on them)."""
    cp, _ = world
    cp.kubectl("-n", NS, "delete", "jobs", "--all", "--wait=true")
    cp.kubectl("-n", NS, "delete", "lease", "ipvs-leftovers-fleet", "--ignore-not-found")
    assert jobs(cp) == []


def first_wave(world: Any) -> None:
    code, out, err = step(world, "--apply", "--cluster", "lab", "--json")
    assert code == 0, err
    assert json.loads(out)["created"] == ["a1"]


def test_a_node_prometheus_knows_and_the_api_server_does_not_is_refused(world: Any) -> None:
    code, out, err = step(world, "--apply")  # no --cluster: two clusters
    assert (code, out) == (4, "")
    assert "Prometheus holds 2 clusters ('elsewhere', 'lab'): give --cluster" in err
    code, _, err = step(world, "--apply", "--cluster", "elsewhere")
    assert code == 4
    assert err == (
        "ipvs-leftovers: fleet step refused: Prometheus knows node(s) the API server does not: "
        "b1 (another cluster's? give --cluster)"
    )
    assert jobs(world[0]) == []


def test_a_user_without_rights_is_refused_403(world: Any, tmp_path: Path) -> None:
    cp, _ = world
    nobody = tmp_path / "nobody.kubeconfig"
    nobody.write_text(cp.kubeconfig("nobody", []))
    code, _, err = step(world, "--apply", "--cluster", "lab", kubeconfig=nobody)
    assert code == 4 and "HTTP 403 Forbidden" in err and len(err.splitlines()) == 1
    assert jobs(cp) == []


def test_a_job_refused_by_admission_creates_nothing(world: Any) -> None:
    """A ValidatingAdmissionPolicy denies every Job: the dryRun=All create is refused by
    admission, and no Job is made."""
    cp, _ = world
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "no-jobs"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["batch"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["jobs"],
                    }
                ]
            },
            "validations": [{"expression": "false", "message": "cleanup Jobs are frozen here"}],
        },
    }
    binding = {"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "no-jobs"},
               "spec": {"policyName": "no-jobs", "validationActions": ["Deny"]}}  # fmt: skip
    cp.kubectl("apply", "-f", "-", stdin=json.dumps(policy) + "\n---\n" + json.dumps(binding))
    try:
        deadline = time.monotonic() + 60
        probe = ["-n", NS, "create", "job", "probe", "--image=x", "--dry-run=server"]
        while cp.kubectl_run(*probe, check=False).returncode == 0:  # the policy is loaded
            assert time.monotonic() < deadline
            time.sleep(1)
        code, _, err = step(world, "--apply", "--cluster", "lab")
        assert code == 4, err
        assert "admission of the Job for a1 (dryRun=All): HTTP " in err
        assert "cleanup Jobs are frozen here" in err and len(err.splitlines()) == 1
        assert jobs(cp) == []
    finally:
        cp.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
                   "no-jobs")  # fmt: skip
        deadline = time.monotonic() + 60
        while cp.kubectl_run(*probe, check=False).returncode != 0:
            assert time.monotonic() < deadline
            time.sleep(1)


def test_the_lease_held_by_another_stops_with_exit_3(world: Any) -> None:
    cp, _ = world
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "ipvs-leftovers-fleet", "namespace": NS},
             "spec": {"holderIdentity": "another-step", "leaseDurationSeconds": 600,
                      "renewTime": now, "acquireTime": now}}  # fmt: skip
    cp.kubectl("apply", "-f", "-", stdin=json.dumps(lease))
    try:
        code, _, err = step(world, "--apply", "--cluster", "lab")
        assert code == 3
        assert err.startswith(
            "ipvs-leftovers: fleet step stopped: Lease ipvs-leftovers/ipvs-leftovers-fleet is "
            "held by another-step until "
        )
        assert jobs(cp) == []
    finally:
        cp.kubectl("-n", NS, "delete", "lease", "ipvs-leftovers-fleet")


def test_the_first_wave_is_one_job_created_after_its_dry_run(world: Any) -> None:
    cp, _ = world
    code, out, err = step(world, "--cluster", "lab", "--json")  # plan only
    assert code == 0, err
    assert json.loads(out)["lines"] == ["would create wave 1: a1"] and jobs(cp) == []
    code, out, err = step(world, "--apply", "--cluster", "lab", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["wave"], doc["created"]) == (1, ["a1"])
    assert jobs(cp) == ["ipvs-leftovers-cleanup-a1"]
    print(f"\nfirst wave: {doc['api_calls']} API calls, {doc['prometheus_queries']} queries")
    job = json.loads(cp.kubectl("-n", NS, "get", "job", "ipvs-leftovers-cleanup-a1", "-o", "json"))
    assert job["metadata"]["labels"]["ipvs-leftovers.io/fleet"] == "ipvs-leftovers-fleet"
    assert job["metadata"]["annotations"]["ipvs-leftovers.io/wave"] == "1"
    image = job["spec"]["template"]["spec"]["containers"][0]["image"]
    ds = json.loads(cp.kubectl("-n", NS, "get", "ds", "ipvs-leftovers", "-o", "json"))
    assert image == ds["spec"]["template"]["spec"]["containers"][0]["image"]
    lease = json.loads(cp.kubectl("-n", NS, "get", "lease", "ipvs-leftovers-fleet", "-o", "json"))
    assert lease["metadata"]["annotations"]["ipvs-leftovers.io/next-wave-size"] == "2"
    assert lease["spec"].get("holderIdentity") is None  # released
    # the Job has not finished (no Job controller here): the next step waits, creates nothing
    code, out, err = step(world, "--apply", "--cluster", "lab", "--json")
    assert code == 0, err
    assert json.loads(out)["lines"] == ["wave 1: 1 Job(s) still running (a1)"]
    assert jobs(cp) == ["ipvs-leftovers-cleanup-a1"]


def test_a_failed_job_halts_until_acknowledged_and_is_not_retried(world: Any) -> None:
    """After the first wave, a1's Job fails. Every step halts on it, creating nothing, until
    the operator acknowledges it with --ack (only --apply writes that down); then the waves go
    on, one node at a time again, and never give a1 another Job."""
    cp, _ = world
    first_wave(world)
    name = "ipvs-leftovers-cleanup-a1"
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # What the Job controller writes when a Job's backoff is exhausted (none runs here); the
    # API server's status validation takes it only with FailureTarget first.
    verdict = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
               "message": "Job has reached the specified backoff limit",
               "lastTransitionTime": at, "lastProbeTime": at}  # fmt: skip
    status = {"status": {"startTime": at, "failed": 1, "conditions": [
        {**verdict, "type": "FailureTarget"}, verdict]}}  # fmt: skip
    cp.kubectl(
        "-n", NS, "patch", "job", name, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    before = jobs(cp)

    code, _, err = step(world, "--apply", "--cluster", "lab")
    assert (code, err) == (
        3,
        "ipvs-leftovers: fleet step stopped: halted: the cleanup Job failed on a1 (read its "
        "log, then --ack NODE)",
    )
    code, _, err = step(world, "--apply", "--cluster", "lab", "--ack", "a2")
    assert (code, err) == (
        4,
        "ipvs-leftovers: fleet step refused: --ack a2: no failed fleet Job for that node",
    )
    code, out, err = step(world, "--cluster", "lab", "--ack", "a1", "--json")  # plan only
    assert code == 0, err
    assert json.loads(out)["lines"][0] == (
        "a1: failed Job acknowledged; fleet step will not retry it"
    )
    assert jobs(cp) == before

    def annotations() -> dict[str, str]:
        job = json.loads(cp.kubectl("-n", NS, "get", "job", name, "-o", "json"))
        return dict(job["metadata"].get("annotations") or {})

    assert "ipvs-leftovers.io/acknowledged" not in annotations()
    code, out, err = step(world, "--apply", "--cluster", "lab", "--ack", "a1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert annotations()["ipvs-leftovers.io/acknowledged"] == "true"
    assert (doc["wave"], doc["created"]) == (2, ["a2"])  # back to one node after the halt
    assert sorted(jobs(cp)) == ["ipvs-leftovers-cleanup-a1", "ipvs-leftovers-cleanup-a2"]
    code, out, err = step(world, "--apply", "--cluster", "lab", "--json")  # no --ack now
    assert code == 0, err
    assert json.loads(out)["lines"] == ["wave 2: 1 Job(s) still running (a2)"]


def test_a_daemonset_running_auto_cleanup_is_refused(world: Any) -> None:
    cp, _ = world
    patch = [{"op": "add", "path": "/spec/template/spec/containers/0/args/-",
              "value": "--auto-cleanup"}]  # fmt: skip
    cp.kubectl("-n", NS, "patch", "ds", "ipvs-leftovers", "--type=json", "-p", json.dumps(patch))
    try:
        code, _, err = step(world, "--apply", "--cluster", "lab")
        assert code == 4
        assert err == (
            "ipvs-leftovers: fleet step refused: DaemonSet ipvs-leftovers/ipvs-leftovers runs "
            "--auto-cleanup: two actors would clean one fleet (turn one off)"
        )
        assert jobs(cp) == []
    finally:  # the DaemonSet as the other tests expect it
        args = json.loads(cp.kubectl("-n", NS, "get", "ds", "ipvs-leftovers", "-o", "json"))[
            "spec"]["template"]["spec"]["containers"][0]["args"]  # fmt: skip
        last = len(args) - 1
        assert args[last] == "--auto-cleanup"
        remove = [{"op": "remove", "path": f"/spec/template/spec/containers/0/args/{last}"}]
        cp.kubectl(
            "-n", NS, "patch", "ds", "ipvs-leftovers", "--type=json", "-p", json.dumps(remove)
        )  # fmt: skip


def test_a_lease_taken_by_another_step_while_this_one_reads_creates_nothing(
    world: Any,
) -> None:
    """Reading the fleet can outlast the Lease (a query per hour of the hold-down, each up to
    --prometheus-timeout): when another step took the expired Lease meanwhile, this one stops
    before creating its wave (exit 3 from the CLI), and the other holder keeps the Lease."""
    from agent.fleet import kube
    from agent.fleet.eligibility import Params
    from agent.fleet.prom import Prometheus
    from agent.fleet.status import Refusal
    from agent.fleet.step import PAUSED, Options
    from agent.fleet.step import step as run_step

    cp, prom = world

    class SlowReading(Prometheus):
        """The first query happens after another step took the Lease this one holds."""

        taken = False

        def query(self, expr: str, at: float) -> Any:
            if not self.taken:
                self.taken = True
                lease = json.loads(
                    cp.kubectl("-n", NS, "get", "lease", "ipvs-leftovers-fleet", "-o", "json")
                )
                lease["spec"]["holderIdentity"] = "another-step"
                cp.kubectl("replace", "-f", "-", stdin=json.dumps(lease))
            return super().query(expr, at)

    options = Options(
        params=Params(3600.0, 120.0, 900.0),
        cluster="lab",
        alert_filter=".*",
        namespace=None,
        apply=True,
    )
    api = kube.api_client(str(cp.admin_kubeconfig), None)
    with pytest.raises(Refusal) as refused:
        run_step(SlowReading(prom.url), api, options, NOW)
    assert refused.value.code == PAUSED
    assert "changed while this step read the fleet" in str(refused.value)
    assert jobs(cp) == []
    lease = json.loads(cp.kubectl("-n", NS, "get", "lease", "ipvs-leftovers-fleet", "-o", "json"))
    assert lease["spec"]["holderIdentity"] == "another-step"


def _far_day() -> str:
    """A day that is neither yesterday, today nor tomorrow (UTC): outside, whatever the hour."""
    import datetime as dt

    return ("mon", "tue", "wed", "thu", "fri", "sat", "sun")[
        (dt.datetime.now(dt.UTC).weekday() + 3) % 7
    ]


def test_outside_the_maintenance_window_exit_0_one_line_and_nothing_touched(world: Any) -> None:
    cp, _ = world
    code, out, err = step(world, "--apply", "--days", _far_day(), "--start-time", "22:00",
                          "--end-time", "04:00", "--time-zone", "Europe/Berlin")  # fmt: skip
    assert (code, err) == (0, "")
    assert out == (
        f"outside the maintenance window ({_far_day()} 22:00-04:00 Europe/Berlin): nothing "
        "read, nothing created\n"
    )
    assert jobs(cp) == []
    leases = cp.kubectl_run("-n", NS, "get", "lease", "ipvs-leftovers-fleet", check=False)
    assert leases.returncode == 1 and "NotFound" in leases.stderr  # not even taken


def test_a_window_that_closed_while_the_step_read_the_fleet_creates_nothing(world: Any) -> None:
    """The window is checked again right before the wave is created: a step that began inside
    it and read the fleet past its end (a query per hour of the hold-down) creates nothing,
    releases the Lease and exits 0 (the step is called here as the CLI calls it after its own
    first check, with a window that no longer holds)."""
    from agent.fleet import kube
    from agent.fleet.eligibility import Params
    from agent.fleet.prom import Prometheus
    from agent.fleet.step import Options
    from agent.fleet.step import step as run_step
    from agent.fleet.window import window

    cp, prom = world
    closed = window("22:00", "04:00", _far_day(), "UTC")
    options = Options(
        params=Params(3600.0, 120.0, 900.0),
        cluster="lab",
        alert_filter=".*",
        namespace=None,
        apply=True,
        window=closed,
    )
    api = kube.api_client(str(cp.admin_kubeconfig), None)
    outcome = run_step(Prometheus(prom.url), api, options, NOW)
    assert (outcome.created, outcome.in_window) == ([], False)
    assert outcome.lines == [
        f"the maintenance window ({closed}) closed while this step read the fleet: wave 1 "
        "not created"
    ]
    assert jobs(cp) == []
    lease = json.loads(cp.kubectl("-n", NS, "get", "lease", "ipvs-leftovers-fleet", "-o", "json"))
    assert lease["spec"].get("holderIdentity") is None  # released
