"""The fleet step's shipped RBAC is exactly what it uses.

The chart's fleet objects (fleet.enabled=true, rendered by the pinned Helm v4: ServiceAccount,
Role, RoleBinding, ClusterRole, ClusterRoleBinding) are applied to the fleet lab's real
kube-apiserver, whose audit log records every request of that ServiceAccount. `fleet step`
runs with a token of that ServiceAccount and nothing more, with the chart's CronJob's own
arguments (the lab's Prometheus as fleet.prometheus.url):
a dry run, then `--apply` on a fresh Lease (it creates it), then `--apply` again (the Lease
taken from the last holder). Both work (the wave's Job is created); and the set of
(apiGroup, resource, verb) the audit log records for the ServiceAccount equals the set the
shipped rules grant: no grant unused, none missing (a missing one would be a 403, recorded too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.scenarios import realistic_node
from tests.conftest import AGENT, REPO
from tests.fleet_lab import NAMESPACE, FleetLab, LabNode, fleet_lab
from tests.prometheus.history import NodeHistory, openmetrics, steady
from tests.upstream import upstream_binary

pytestmark = [pytest.mark.prometheus, pytest.mark.netns, pytest.mark.upstream]
CHART = REPO / "daemonset" / "helm" / "ipvs-leftovers"
NFT = {"mode": "nftables", "families": ["IPv4"], "last_sync_age": 2.0}
SA = "ipvs-leftovers-fleet"
USER = f"system:serviceaccount:{NAMESPACE}:{SA}"
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
POLICY = f"""\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["{USER}"]
  - level: None
"""


def render_fleet(prom_url: str, home: Path) -> list[dict[str, Any]]:
    """The chart's fleet objects as the default release installs them."""
    helm = upstream_binary("helm", "v4.3.2")
    out = subprocess.run(
        [str(helm), "template", "ipvs-leftovers", str(CHART), "--namespace", NAMESPACE,
         "--kube-version", "1.33.0", "--set", "fleet.enabled=true",
         "--set", f"fleet.prometheus.url={prom_url}", "--set", "fleet.prometheus.cluster=lab",
         "--set", "fleet.holdDown=1h", "--set", "fleet.extraArgs={--freshness=1m}"],
        capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "HELM_CACHE_HOME": str(home / "cache"),
             "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")},
    ).stdout  # fmt: skip
    return [
        d
        for d in yaml.safe_load_all(out)
        if d and (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "fleet"
    ]


def granted(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        for rule in d["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetLab]:
    work = tmp_path_factory.mktemp("fleet-rbac")
    policy = work / "audit-policy.yaml"
    policy.write_text(POLICY)
    flags = (f"--audit-policy-file={policy}", f"--audit-log-path={work / 'audit.log'}")
    nodes = [LabNode("n1", realistic_node(nftables_table=True), dict(NFT))]

    def history(now: float, instances: dict[str, str]) -> str:
        series = [NodeHistory("lab", "n1", lambda t: steady(), instances["n1"])]
        return openmetrics(series, now - 70 * 60, now - 1, 15.0)

    with fleet_lab(work, nodes, history, apiserver_flags=flags) as f:
        deadline = time.monotonic() + 120
        while len(f.query('up{job="ipvs-leftovers"} == 1')) < 1:
            assert time.monotonic() < deadline, "Prometheus never scraped the node"
            time.sleep(1)
        yield f


def sa_kubeconfig(lab: FleetLab) -> Path:
    """A kubeconfig holding a token of the fleet ServiceAccount (TokenRequest), nothing else."""
    token = lab.cp.kubectl("-n", NAMESPACE, "create", "token", SA, "--duration=1h").strip()
    path = lab.workdir / "fleet-sa.kubeconfig"
    config = json.loads(lab.cp.kubeconfig("unused", []))
    config["users"] = [{"name": USER, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = USER
    path.write_text(json.dumps(config))
    return path


def audited(lab: FleetLab) -> list[dict[str, Any]]:
    log = lab.cp.workdir.parent / "audit.log"
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [e for e in events if e["user"]["username"] == USER and e["stage"] == "ResponseComplete"]


# runs the command, then writes its peak RSS (KiB) to the file $RSS_OUT
MEASURED = (
    "import os, resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
    "open(os.environ['RSS_OUT'], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN)"
    ".ru_maxrss)); sys.exit(r.returncode)"
)


def run_step(lab: FleetLab, args: list[str], kubeconfig: Path) -> tuple[int, str, str, int]:
    """The step as the CronJob's container runs it (its args), with the ServiceAccount's
    kubeconfig in place of the in-cluster one; exit code, stdout, stderr, peak RSS in KiB."""
    rss = lab.workdir / "rss"
    p = subprocess.run(
        [sys.executable, "-c", MEASURED, AGENT, *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "RSS_OUT": str(rss)},
    )  # fmt: skip
    return p.returncode, p.stdout, p.stderr, int(rss.read_text())


def test_the_step_runs_with_the_shipped_rbac_and_uses_every_grant_and_nothing_else(
    lab: FleetLab,
) -> None:
    docs = render_fleet(lab.prom_url, lab.workdir / "helm")
    assert sorted(d["kind"] for d in docs) == sorted([*RBAC_KINDS, "CronJob"])
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    lab.cp.kubectl("apply", "-f", "-", stdin="\n---\n".join(yaml.safe_dump(d) for d in rbac))
    kubeconfig = sa_kubeconfig(lab)
    # the agent's pods under a ServiceAccount of another name, as a chart release names it
    # after itself: the cleanup Jobs must run as that one (no "ipvs-leftovers" in a release
    # "prod", whose Jobs' Pods the API server would refuse)
    lab.cp.kubectl("-n", NAMESPACE, "create", "serviceaccount", "prod-ipvs-leftovers")
    lab.cp.kubectl(
        "-n", NAMESPACE, "patch", "daemonset", "ipvs-leftovers", "--type=merge",
        "-p", '{"spec": {"template": {"spec": {"serviceAccountName": "prod-ipvs-leftovers"}}}}',
    )  # fmt: skip
    [cron] = [d for d in docs if d["kind"] == "CronJob"]
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == SA
    # the CronJob's own arguments (--json only changes how the outcome is printed)
    apply = [*pod["containers"][0]["args"], "--json"]
    assert apply[:3] == ["fleet", "step", "--apply"] and f"--lease={SA}" in apply
    args = [a for a in apply if a != "--apply"]

    code, out, err, rss_dry = run_step(lab, args, kubeconfig)  # the dry run: no Lease, no Job
    assert code == 0, err
    assert json.loads(out)["lines"] == ["would create wave 1: n1"]
    assert lab.jobs() == {}

    code, out, err, rss_apply = run_step(lab, apply, kubeconfig)  # makes the Lease
    assert code == 0, err
    assert json.loads(out)["created"] == ["n1"]
    [job] = lab.jobs().values()
    assert job["metadata"]["name"] == "ipvs-leftovers-cleanup-n1"
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "prod-ipvs-leftovers"

    code, out, err, _ = run_step(lab, apply, kubeconfig)  # takes the Lease it left
    assert code == 0, err

    events = audited(lab)
    used = {
        (e["objectRef"].get("apiGroup", ""), e["objectRef"]["resource"], e["verb"]) for e in events
    }
    assert used == granted(docs)
    # every request answered, but the first read of the Lease before it existed
    failed = [
        (e["verb"], e["requestURI"], e["responseStatus"]["code"])
        for e in events
        if e["responseStatus"]["code"] >= 400
    ]
    assert failed == [
        ("get", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{SA}", 404)
    ], failed
    print(f"\nfleet step peak RSS: dry run {rss_dry} KiB, --apply {rss_apply} KiB")
