"""The fleet step's CronJob in the chart (fleet.enabled, off by default) and its kustomize
component (daemonset/components/fleet, generated from the chart by scripts/render-manifests).

Rendered by both pinned Helm releases (v4.3.2, v3.21.4): off by default; on, the CronJob with
the image build's TAG-fleet variant, concurrencyPolicy Forbid, its own ServiceAccount and the
RBAC whose exactness tests/prometheus/test_fleet_step_rbac.py proves against an audit log; the
values as arguments, and those arguments parsed by the agent's own `fleet step` command (every
option known, every value accepted: what the container will run); the schema's and the
templates' refusals. Then accepted by a real kube-apiserver v1.37.2: installed with Helm v4,
the v3 render and the kustomize component applied server-side, and the CronJob's Pod admitted
by PodSecurity's `restricted` level.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from agent.cli.fleet import alert_filter, step, window_of
from tests.control_plane import KUBECTL, ControlPlane
from tests.manifests.test_helm_chart import (
    APP_VERSION,
    CHART,
    HELM_VERSIONS,
    KUBE_VERSION,
    REPO,
    helm,
    one,
    template,
)

pytestmark = [pytest.mark.upstream]

URL = "http://prometheus-operated.monitoring:9090"
ON = ("--set", "fleet.enabled=true", "--set", f"fleet.prometheus.url={URL}")
FLEET_KINDS = ["ClusterRole", "ClusterRoleBinding", "CronJob", "Role", "RoleBinding",
               "ServiceAccount"]  # fmt: skip
COMPONENT = REPO / "daemonset" / "components" / "fleet"


@pytest.fixture(params=HELM_VERSIONS)
def hv(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def fleet_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "fleet"
    ]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(docs, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return dict(pod["containers"][0])


def parsed(args: list[str]) -> dict[str, Any]:
    """The container's arguments as the agent's own CLI parses them: `fleet step`, each option
    known and each value accepted (click raises on an unknown option or a bad value)."""
    assert args[:2] == ["fleet", "step"], args
    ctx = step.make_context("step", list(args[2:]))
    kw = dict(ctx.params)
    return {**kw, "alert_filter": alert_filter(kw), "window": str(window_of(kw))}


def test_off_by_default(hv: str, tmp_path: Path) -> None:
    assert fleet_docs(template(hv, tmp_path)) == []
    p = helm(hv, "lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), *ON,
             home=tmp_path)  # fmt: skip
    assert "1 chart(s) linted, 0 chart(s) failed" in p.stdout
    assert [line for line in p.stdout.splitlines() if line.startswith("[")] == [
        "[INFO] Chart.yaml: icon is recommended"
    ]


def test_on_the_cronjob_its_service_account_and_rbac(hv: str, tmp_path: Path) -> None:
    docs = fleet_docs(template(hv, tmp_path, *ON, ns="ops"))
    assert sorted(d["kind"] for d in docs) == FLEET_KINDS
    name = "ipvs-leftovers-fleet"
    cron = one(docs, "CronJob")
    assert cron["metadata"]["name"] == name
    assert cron["spec"]["schedule"] == "*/10 * * * *"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    job = cron["spec"]["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"] == name
    assert pod["automountServiceAccountToken"] is True
    c = container(docs)
    assert c["image"] == f"ghcr.io/example/ipvs-leftovers:{APP_VERSION}-fleet"
    assert c["args"] == [
        "fleet", "step", "--apply", "--namespace=ops", f"--lease={name}",
        f"--prometheus-url={URL}", "--hold-down=24h", "--max-concurrent=10",
        "--start-time=00:00", "--end-time=23:59:59", "--time-zone=UTC",
    ]  # fmt: skip
    # the Lease the step takes is the one the Role lets it read and update
    role = one(docs, "Role")
    [named] = [r for r in role["rules"] if r.get("resourceNames")]
    assert named["resourceNames"] == [name] and named["verbs"] == ["get", "update"]
    for binding in ("RoleBinding", "ClusterRoleBinding"):
        assert one(docs, binding)["subjects"] == [
            {"kind": "ServiceAccount", "name": name, "namespace": "ops"}
        ]
    assert one(docs, "ClusterRole")["metadata"]["name"] == f"ops-{name}"
    assert one(docs, "ClusterRole")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}
    ]


def test_the_image_is_the_fleet_variant_of_whatever_tag_or_its_own_digest(
    hv: str, tmp_path: Path
) -> None:
    def image(*values: str) -> str:
        return str(container(fleet_docs(template(hv, tmp_path, *ON, *values)))["image"])

    assert image("--set", "image.tag=1.2.3") == "ghcr.io/example/ipvs-leftovers:1.2.3-fleet"
    assert image("--set", "image.tag=1.2.3,fleet.image.tag=1.2.4") == (
        "ghcr.io/example/ipvs-leftovers:1.2.4-fleet"
    )
    digest = "sha256:" + "cd" * 32
    # the agent's digest is not the variant's: it is never used for the CronJob
    assert image("--set", f"image.digest=sha256:{'ab' * 32}").endswith(f":{APP_VERSION}-fleet")
    assert image("--set", f"fleet.image.digest={digest},image.registry=reg.example.net") == (
        f"reg.example.net/example/ipvs-leftovers@{digest}"
    )


def test_every_value_becomes_an_argument_fleet_step_accepts(hv: str, tmp_path: Path) -> None:
    values = tmp_path / "fleet.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "fleet": {
                    "enabled": True,
                    "schedule": "*/5 * * * *",
                    "timeZone": "Europe/Berlin",
                    "prometheus": {
                        "url": "https://prometheus.example.net:9091/prom",
                        "bearerTokenSecret": {"name": "prom-token", "key": "token"},
                        "cluster": "prod-eu1",
                    },
                    "holdDown": "48h",
                    "maxConcurrent": 25,
                    "alertFilterRegexp": "Watchdog|InfoInhibitor|.*: #x",
                    "window": {
                        "startTime": "22:00",
                        "endTime": "04:30",
                        "days": ["mon", "tue", "wed", "thu", "fri"],
                        "timeZone": "Europe/Berlin",
                    },
                    "extraArgs": ["--max-per-zone=1", "--freshness=5m"],
                }
            }
        )
    )
    docs = fleet_docs(template(hv, tmp_path, "-f", str(values), release="prod", ns="net"))
    cron = one(docs, "CronJob")
    assert cron["spec"]["schedule"] == "*/5 * * * *"
    assert cron["spec"]["timeZone"] == "Europe/Berlin"
    c = container(docs)
    kw = parsed(c["args"])
    assert kw["apply_"] is True
    assert kw["namespace"] == "net" and kw["lease"] == "prod-ipvs-leftovers-fleet"
    assert kw["prometheus_url"] == "https://prometheus.example.net:9091/prom"
    assert kw["bearer_token_file"] == "/etc/ipvs-leftovers/prometheus/token"
    assert kw["cluster"] == "prod-eu1"
    assert kw["hold_down"] == 48 * 3600 and kw["max_concurrent"] == 25
    assert kw["alert_filter"] == "Watchdog|InfoInhibitor|.*: #x"
    assert kw["window"] == "mon,tue,wed,thu,fri 22:00-04:30 Europe/Berlin"
    assert kw["max_per_zone"] == 1 and kw["freshness"] == 300
    assert c["volumeMounts"] == [
        {"name": "prometheus-token", "mountPath": "/etc/ipvs-leftovers/prometheus",
         "readOnly": True}
    ]  # fmt: skip
    volume = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["volumes"][0]
    assert volume["secret"]["secretName"] == "prom-token"
    # the defaults parse too, and an option the command does not have would not
    assert parsed(container(fleet_docs(template(hv, tmp_path, *ON)))["args"])["apply_"] is True
    with pytest.raises(click.NoSuchOption):
        parsed(["fleet", "step", "--reboot-days=mon"])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("--set", "fleet.enabled=true"), "fleet.enabled needs fleet.prometheus.url"),
        ((*ON, "--set", "autoCleanup.enabled=true"), "two actors would clean one fleet"),
        ((*ON, "--set", "fleet.window.startTime=25:00"), "- at '/fleet/window/startTime'"),
        ((*ON, "--set", "fleet.window.days={funday}"), "- at '/fleet/window/days/0'"),
        ((*ON, "--set", "fleet.maxConcurrent=0"), "- at '/fleet/maxConcurrent'"),
        ((*ON, "--set", "fleet.prometheus.url=prometheus:9090"), "- at '/fleet/prometheus/url'"),
        ((*ON, "--set", "fleet.holdDown=a day"), "- at '/fleet/holdDown'"),
    ],
)
def test_refusals(hv: str, tmp_path: Path, values: tuple[str, ...], message: str) -> None:
    p = helm(
        hv, "template", "x", str(CHART), "--kube-version", KUBE_VERSION, *values,
        home=tmp_path, check=False,
    )  # fmt: skip
    assert p.returncode == 1
    assert message in p.stderr, p.stderr


def overlay(tmp: Path) -> str:
    """An operator's overlay: the base, the fleet component, both images set as the
    component's kustomization.yaml says."""
    tmp.mkdir(parents=True, exist_ok=True)
    base = REPO / "daemonset"
    (tmp / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(base, tmp)],
                "components": [os.path.relpath(COMPONENT, tmp)],
                "images": [
                    {
                        "name": "ghcr.io/example/ipvs-leftovers",
                        "newName": "registry.example.net/ipvs-leftovers",
                        "newTag": "1.2.3",
                    },
                    {
                        "name": "ghcr.io/example/ipvs-leftovers-fleet",
                        "newName": "registry.example.net/ipvs-leftovers",
                        "newTag": "1.2.3-fleet",
                    },
                ],
            }
        )  # fmt: skip
    )
    return subprocess.run(
        [str(KUBECTL), "kustomize", str(tmp), "--load-restrictor", "LoadRestrictionsNone"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip


def test_the_kustomize_component_is_the_charts_render_and_takes_both_images(
    tmp_path: Path,
) -> None:
    docs = [d for d in yaml.safe_load_all(overlay(tmp_path / "overlay")) if d]
    fleet = fleet_docs(docs)
    assert sorted(d["kind"] for d in fleet) == FLEET_KINDS
    assert container(fleet)["image"] == "registry.example.net/ipvs-leftovers:1.2.3-fleet"
    ds = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert ds["image"] == "registry.example.net/ipvs-leftovers:1.2.3"
    assert parsed(container(fleet)["args"])["namespace"] == "ipvs-leftovers"
    # the chart's render for the default release, but for Helm's own labels and the image's
    # name (the component's own, for an overlay's `images:`)
    chart = fleet_docs(template("v4.3.2", tmp_path, *ON, ns="ipvs-leftovers"))
    want = {(d["kind"], d["metadata"]["name"]): without_helm_labels(d) for d in chart}
    cron = want[("CronJob", "ipvs-leftovers-fleet")]["spec"]["jobTemplate"]["spec"]["template"]
    cron["spec"]["containers"][0]["image"] = container(fleet)["image"]
    assert {(d["kind"], d["metadata"]["name"]): d for d in fleet} == want


def without_helm_labels(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {
            k: without_helm_labels(v)
            for k, v in doc.items()
            if k not in ("helm.sh/chart", "app.kubernetes.io/managed-by")
        }
    if isinstance(doc, list):
        return [without_helm_labels(v) for v in doc]
    return doc


# --- accepted by a real API server -----------------------------------------------------------


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path_factory.mktemp("fleet-cp")) as plane:
        yield plane


def namespace(cp: ControlPlane, name: str, enforce: str) -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace",
          "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": enforce}}}  # fmt: skip
    cp.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(ns))


def stored(cp: ControlPlane, ns: str, instance: str) -> set[tuple[str, str]]:
    selector = f"app.kubernetes.io/instance={instance},app.kubernetes.io/component=fleet"
    got = json.loads(cp.kubectl(
        "get", "cronjobs,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings",
        "-A", "-l", selector, "-o", "json",
    ))  # fmt: skip
    return {
        (i["kind"], i["metadata"]["name"])
        for i in got["items"]
        if i["metadata"].get("namespace", ns) == ns and (
            "namespace" in i["metadata"] or i["metadata"]["name"].startswith(f"{ns}-"))
    }  # fmt: skip


@pytest.mark.controlplane
def test_installed_by_helm_v4_into_a_real_api_server(cp: ControlPlane, tmp_path: Path) -> None:
    namespace(cp, "agents", "privileged")
    p = helm(
        "v4.3.2", "install", "ipvs-leftovers", str(CHART), "-n", "agents", *ON,
        "--kubeconfig", str(cp.admin_kubeconfig), home=tmp_path,
    )  # fmt: skip
    assert "STATUS: deployed" in p.stdout
    name = "ipvs-leftovers-fleet"
    assert stored(cp, "agents", "ipvs-leftovers") == {
        ("CronJob", name), ("ServiceAccount", name), ("Role", name), ("RoleBinding", name),
        ("ClusterRole", f"agents-{name}"), ("ClusterRoleBinding", f"agents-{name}"),
    }  # fmt: skip
    cron = json.loads(cp.kubectl("-n", "agents", "get", "cronjob", name, "-o", "json"))
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    # the step's Pod is an ordinary client's: admitted where PodSecurity enforces "restricted"
    namespace(cp, "strict", "restricted")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "fleet-step", "namespace": "strict"},
        "spec": cron["spec"]["jobTemplate"]["spec"]["template"]["spec"],
    }
    cp.kubectl("-n", "strict", "create", "serviceaccount", name)  # the Pod's, looked up
    r = cp.kubectl_run("create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod), check=False)
    assert r.returncode == 0 and "Warning" not in r.stderr, r.stderr


@pytest.mark.controlplane
def test_the_helm_v3_render_and_the_kustomize_component_are_accepted(
    cp: ControlPlane, tmp_path: Path
) -> None:
    namespace(cp, "v3", "privileged")
    v3 = fleet_docs(template("v3.21.4", tmp_path, *ON, release="three", ns="v3"))
    cp.kubectl("apply", "--server-side", "-f", "-", stdin="\n---\n".join(map(yaml.safe_dump, v3)))
    assert len(stored(cp, "v3", "three")) == 6
    namespace(cp, "ipvs-leftovers", "privileged")
    fleet = fleet_docs([d for d in yaml.safe_load_all(overlay(tmp_path / "k")) if d])
    cp.kubectl(
        "apply", "--server-side", "-f", "-", stdin="\n---\n".join(map(yaml.safe_dump, fleet))
    )
    assert len(stored(cp, "ipvs-leftovers", "ipvs-leftovers")) == 6
