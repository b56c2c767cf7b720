"""The shipped manifests applied to a real API server: kube-apiserver v1.37.2 on
etcd, with kube-controller-manager so that the real DaemonSet and Job controllers make the
Pods, all as `scripts/build-upstream` builds them (tests/control_plane.py).

`kubectl apply --server-side` of daemonset/setup, the base, each component, the test overlay
and the `ipvs-leftovers job-manifest` Jobs, rendered by `kubectl kustomize` as
scripts/check-manifests renders them; prometheus-operator's CRDs from its published module
(`scripts/build-upstream --path prometheus-operator-crds v0.85.0`).

PodSecurity checks Pods, not their controllers: a DaemonSet whose template breaks a level is
stored with a warning, and each Pod its controller makes is refused. So the refusal is proved
three ways: the warning on the DaemonSet, a Pod made from the DaemonSet's own template refused by
a server-side dry run, and the DaemonSet controller's own Pod creations refused (its
FailedCreate events) — next to the same three admitted in setup's namespace, which differs only
in its labels. A Node object (no kubelet) gives the DaemonSet controller a node to fill.

One control plane for the module (about 10 s to start); the tests run in file order and each
uses its own namespace, except the first, which runs before the CRDs are installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.control_plane import (
    KUBE_PROXY,
    KUBECTL,
    KUBERNETES_SERVICE_IP,
    KUBERNETES_VERSION,
    ControlPlane,
)
from tests.upstream import upstream_binary

pytestmark = [pytest.mark.controlplane, pytest.mark.upstream]

REPO = Path(__file__).resolve().parents[2]
DAEMONSET = REPO / "daemonset"
OVERLAY = REPO / "tests" / "manifests" / "overlay"
AGENT = str(Path(sys.executable).with_name("ipvs-leftovers"))
PROMETHEUS_OPERATOR = "v0.85.0"
NODE = "node-a"
WAIT = 30.0  # seconds for a controller to act

BASE_OBJECTS = {
    ("ResourceQuota", "ipvs-leftovers-node-critical"),
    ("ServiceAccount", "ipvs-leftovers"),
    ("ConfigMap", "ipvs-leftovers-dashboard"),
    ("DaemonSet", "ipvs-leftovers"),
    ("PodMonitor", "ipvs-leftovers"),
    ("PrometheusRule", "ipvs-leftovers"),
}
SETUP_LABELS = {
    "pod-security.kubernetes.io/enforce": "privileged",
    "pod-security.kubernetes.io/audit": "privileged",
    "pod-security.kubernetes.io/warn": "privileged",
}
# What baseline refuses in the agent's Pod (kube-apiserver v1.37.2's words). The DaemonSet's
# template is not defaulted, so its warning has no hostPort; a Pod gets hostPort = containerPort
# under hostNetwork.
CAPS = (
    'non-default capabilities (container "ipvs-leftovers" must not include "NET_ADMIN", '
    '"NET_RAW" in securityContext.capabilities.add)'
)
DAEMONSET_WARNING = (
    'Warning: would violate PodSecurity "baseline:latest": '
    f'{CAPS}, host namespaces (hostNetwork=true), hostPath volumes (volume "xtables-lock")'
)
POD_VIOLATIONS = (
    f'violates PodSecurity "baseline:latest": {CAPS}, host namespaces (hostNetwork=true), '
    'hostPath volumes (volume "xtables-lock"), hostPort (container "ipvs-leftovers" uses '
    "hostPort 9437)"
)
JOB_POD_VIOLATIONS = (
    f'violates PodSecurity "baseline:latest": {CAPS}, host namespaces (hostNetwork=true), '
    'hostPath volumes (volumes "backups", "lock", "xtables-lock")'
)


def kustomize(directory: Path) -> str:
    p = subprocess.run(
        [str(KUBECTL), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


def kustomization(
    tmp: Path, namespace: str, components: tuple[str, ...] = (), extra: str = ""
) -> str:
    """The base rendered into `namespace` (and with `components`), through a kustomization in
    `tmp`, as an operator's overlay does it."""
    tmp.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(DAEMONSET, tmp)
    text = (
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"namespace: {namespace}\nresources:\n  - {rel}\n"
    )
    if components:
        text += "components:\n" + "".join(f"  - {rel}/components/{c}\n" for c in components)
    (tmp / "kustomization.yaml").write_text(text + extra)
    return kustomize(tmp)


def kinds_and_names(rendered: str) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(rendered) if d}


def applied_lines(out: str) -> set[str]:
    return set(out.strip().splitlines())


def expected_lines(objects: set[tuple[str, str]]) -> set[str]:
    resource = {
        "ResourceQuota": "resourcequota",
        "ServiceAccount": "serviceaccount",
        "ConfigMap": "configmap",
        "DaemonSet": "daemonset.apps",
        "PodMonitor": "podmonitor.monitoring.coreos.com",
        "PrometheusRule": "prometheusrule.monitoring.coreos.com",
        "Namespace": "namespace",
        "Job": "job.batch",
    }
    return {f"{resource[k]}/{n} serverside-applied" for k, n in objects}


def get(cp: ControlPlane, *args: str) -> Any:
    return json.loads(cp.kubectl("get", *args, "-o", "json", "--show-managed-fields"))


APPLIED = {("kubectl", "Apply", "")}
# the control plane's own writes: the status subresource only (a controller's; for a quota also
# the API server's, which counts what it admits)
STATUS_WRITERS = {
    ("kube-controller-manager", "Update", "status"),
    ("kube-apiserver", "Update", "status"),
}


def assert_applied_by_kubectl(obj: dict[str, Any]) -> None:
    """kubectl's server-side apply (field manager `kubectl`) owns every field outside status;
    the control plane wrote at most the status."""
    owners = managers(obj)
    assert {m for m in owners if m[2] != "status"} == APPLIED, owners
    assert owners - APPLIED <= STATUS_WRITERS, owners


def managers(obj: dict[str, Any]) -> set[tuple[str, str, str]]:
    """Who owns the object's fields: (manager, operation, subresource)."""
    return {
        (m["manager"], m["operation"], m.get("subresource", ""))
        for m in obj["metadata"]["managedFields"]
    }


def until(what: str, probe: Any) -> Any:
    """probe() until it returns something true, at most WAIT seconds."""
    end = time.monotonic() + WAIT
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"not within {WAIT:.0f} s: {what}")
        time.sleep(0.5)


def pod_from(template: dict[str, Any], name: str) -> str:
    """A bare Pod made of a controller's pod template (JSON)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }
    return json.dumps(pod)


def daemonset_template(rendered: str) -> dict[str, Any]:
    ds = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "DaemonSet")
    return dict(ds["spec"]["template"])


def failed_creates(cp: ControlPlane, namespace: str, kind: str) -> list[str]:
    events = get(cp, "events", "-n", namespace, "--field-selector", "reason=FailedCreate")
    return [
        e["message"]
        for e in events["items"]
        if e["involvedObject"]["kind"] == kind and e["type"] == "Warning"
    ]


def namespace(cp: ControlPlane, name: str, enforce: str | None) -> None:
    labels = {} if enforce is None else {"pod-security.kubernetes.io/enforce": enforce}
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    cp.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(ns))


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    started = time.monotonic()
    with ControlPlane(tmp_path_factory.mktemp("control-plane"), controller_manager=True) as plane:
        print(
            f"control plane ready in {time.monotonic() - started:.1f} s: {plane.start_seconds}, "
            f"RSS KiB {plane.rss_kib()}"
        )
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE,
                "labels": {"kubernetes.io/os": "linux", "kubernetes.io/hostname": NODE},
            },
        }
        plane.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(node))
        yield plane


@pytest.fixture(scope="module")
def crds(cp: ControlPlane) -> Path:
    try:
        folder = upstream_binary("prometheus-operator-crds", PROMETHEUS_OPERATOR)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    files = [folder / f"monitoring.coreos.com_{p}.yaml" for p in ("podmonitors", "prometheusrules")]
    out = cp.kubectl("apply", "--server-side", *(f"-f={f}" for f in files))
    assert applied_lines(out) == {
        "customresourcedefinition.apiextensions.k8s.io/podmonitors.monitoring.coreos.com serverside-applied",
        "customresourcedefinition.apiextensions.k8s.io/prometheusrules.monitoring.coreos.com serverside-applied",
    }
    cp.kubectl(
        "wait", "--for=condition=Established", "--timeout=30s",
        "crd/podmonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com",
    )  # fmt: skip
    return folder


@pytest.fixture(scope="module")
def setup_applied(cp: ControlPlane) -> dict[str, Any]:
    out = cp.kubectl("apply", "--server-side", "-f", "-", stdin=kustomize(DAEMONSET / "setup"))
    assert applied_lines(out) == {"namespace/ipvs-leftovers serverside-applied"}
    return dict(get(cp, "namespace", "ipvs-leftovers"))


@pytest.fixture(scope="module")
def base_rendered() -> str:
    return kustomize(DAEMONSET)


def test_the_control_plane_is_the_real_one_with_the_tiers_service_ranges(cp: ControlPlane) -> None:
    version = json.loads(cp.kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == KUBERNETES_VERSION
    svc = get(cp, "service", "kubernetes", "-n", "default")
    assert svc["spec"]["clusterIPs"] == [KUBERNETES_SERVICE_IP]
    cidrs = get(cp, "servicecidr", "kubernetes")
    assert cidrs["spec"]["cidrs"] == ["10.96.0.0/16", "fd00:96::/112"]
    # the address a VM guest reaches it at (QEMU's user network), advertised to the cluster
    slices = get(
        cp, "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes"
    )
    [eps] = slices["items"]
    assert [e["addresses"] for e in eps["endpoints"]] == [["10.0.2.2"]]
    assert [p["port"] for p in eps["ports"]] == [cp.port]


def test_kube_proxy_is_bound_to_node_proxier_by_the_bootstrap_rbac(
    cp: ControlPlane, tmp_path: Path
) -> None:
    assert cp.bootstrap() is False  # the default binding is there: nothing created
    binding = get(cp, "clusterrolebinding", "system:node-proxier")
    assert binding["roleRef"]["name"] == "system:node-proxier"
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-proxy"}
    ]
    # kube-proxy's own client certificate, through a forwarder's name check (tls-server-name)
    kubeconfig = tmp_path / "kube-proxy.kubeconfig"
    kubeconfig.write_text(cp.kubeconfig(*KUBE_PROXY, server=cp.url, tls_server_name="kubernetes"))
    who = json.loads(cp.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig))
    assert who["status"]["userInfo"]["username"] == "system:kube-proxy"
    can = {
        check: cp.kubectl_run(
            "auth", "can-i", *check.split(), check=False, kubeconfig=kubeconfig
        ).stdout.strip()
        for check in (
            "watch services",
            "list endpointslices.discovery.k8s.io",
            f"get nodes/{NODE}",
            "create events.events.k8s.io",
            "create pods",
            "list secrets",
            "delete services",
        )
    }
    assert can == {
        "watch services": "yes",
        "list endpointslices.discovery.k8s.io": "yes",
        f"get nodes/{NODE}": "yes",
        "create events.events.k8s.io": "yes",
        "create pods": "no",
        "list secrets": "no",
        "delete services": "no",
    }
    # a name the serving certificate does not carry is refused by the client
    wrong = tmp_path / "wrong-name.kubeconfig"
    wrong.write_text(cp.kubeconfig(*KUBE_PROXY, server=cp.url, tls_server_name="example.net"))
    p = cp.kubectl_run("auth", "whoami", check=False, kubeconfig=wrong)
    assert p.returncode == 1
    assert "x509: certificate is valid for" in p.stderr and "not example.net" in p.stderr


def test_podmonitor_and_prometheusrule_need_the_operators_crds(
    cp: ControlPlane, base_rendered: str, tmp_path: Path
) -> None:
    """Before the CRDs: the core objects apply, the two custom ones are refused by name."""
    assert cp.kubectl_run("get", "crd", "podmonitors.monitoring.coreos.com", check=False).returncode
    namespace(cp, "before-crds", "privileged")
    rendered = kustomization(tmp_path, "before-crds")
    p = cp.kubectl_run("apply", "--server-side", "-f", "-", stdin=rendered, check=False)
    assert p.returncode == 1
    assert applied_lines(p.stdout) == expected_lines(
        BASE_OBJECTS - {("PodMonitor", "ipvs-leftovers"), ("PrometheusRule", "ipvs-leftovers")}
    )
    assert re.findall(r'no matches for kind "(\w+)" in version "([\w./]+)"', p.stderr) == [
        ("PodMonitor", "monitoring.coreos.com/v1"),
        ("PrometheusRule", "monitoring.coreos.com/v1"),
    ]
    cp.kubectl("delete", "namespace", "before-crds", "--wait=false")


def test_setup_and_the_base_apply_server_side_and_the_daemonset_runs_on_the_node(
    cp: ControlPlane, crds: Path, setup_applied: dict[str, Any], base_rendered: str
) -> None:
    labels = setup_applied["metadata"]["labels"]
    assert {k: v for k, v in labels.items() if k.startswith("pod-security")} == SETUP_LABELS
    assert_applied_by_kubectl(setup_applied)
    assert kinds_and_names(base_rendered) == BASE_OBJECTS
    out = cp.kubectl("apply", "--server-side", "-f", "-", stdin=base_rendered)
    assert applied_lines(out) == expected_lines(BASE_OBJECTS)
    for kind, name in BASE_OBJECTS:
        obj = get(cp, kind.lower(), name, "-n", "ipvs-leftovers")
        assert_applied_by_kubectl(obj)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "ipvs-leftovers"
    rule = get(cp, "prometheusrule", "ipvs-leftovers", "-n", "ipvs-leftovers")
    assert "IPVSLeftoversKubeIPVS0Stale" in {
        r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]
    }
    # the real DaemonSet controller makes one Pod for the one Linux node, and it is admitted
    pods = until(
        "the DaemonSet's Pod on node-a",
        lambda: get(cp, "pods", "-n", "ipvs-leftovers", "-l", "app.kubernetes.io/component=agent")[
            "items"
        ],
    )
    [pod] = pods
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [NODE]
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["priorityClassName"] == "system-node-critical"
    assert failed_creates(cp, "ipvs-leftovers", "DaemonSet") == []
    # a second apply changes nothing and keeps the one manager
    again = cp.kubectl("apply", "--server-side", "-f", "-", stdin=base_rendered)
    assert applied_lines(again) == expected_lines(BASE_OBJECTS)
    assert_applied_by_kubectl(get(cp, "daemonset", "ipvs-leftovers", "-n", "ipvs-leftovers"))


@pytest.mark.parametrize("component", ["auto-cleanup", "runbook-url"])
def test_each_component_applies_server_side(
    cp: ControlPlane, crds: Path, component: str, tmp_path: Path
) -> None:
    ns = f"component-{component}"
    namespace(cp, ns, "privileged")
    extra = ""
    if component == "runbook-url":
        extra = (
            "configMapGenerator:\n  - name: ipvs-leftovers-runbook-url\n"
            '    literals: ["baseURL=https://runbooks.example.net/ipvs"]\n'
            "    options:\n      disableNameSuffixHash: true\n"
            '      annotations: {config.kubernetes.io/local-config: "true"}\n'
        )
    rendered = kustomization(tmp_path, ns, (component,), extra)
    assert kinds_and_names(rendered) == BASE_OBJECTS  # the local-config ConfigMap is not output
    out = cp.kubectl("apply", "--server-side", "-f", "-", stdin=rendered)
    assert applied_lines(out) == expected_lines(BASE_OBJECTS)
    ds = get(cp, "daemonset", "ipvs-leftovers", "-n", ns)
    container = ds["spec"]["template"]["spec"]["containers"][0]
    volumes = {v["name"]: v.get("hostPath") for v in ds["spec"]["template"]["spec"]["volumes"]}
    if component == "auto-cleanup":
        assert container["args"] == [
            "serve", "--listen", ":9437", "--auto-cleanup",
            "--backup-dir=/var/lib/ipvs-leftovers", "--lock-file=/run/ipvs-leftovers/cleanup.lock",
        ]  # fmt: skip
        assert container["resources"]["limits"]["memory"] == "512Mi"
        assert volumes["backups"] == {
            "path": "/var/lib/ipvs-leftovers",
            "type": "DirectoryOrCreate",
        }
        assert volumes["lock"] == {"path": "/run/ipvs-leftovers", "type": "DirectoryOrCreate"}
    else:
        assert container["args"] == ["serve", "--listen", ":9437"]
        rule = get(cp, "prometheusrule", "ipvs-leftovers", "-n", ns)
        urls = {
            r["alert"]: r["annotations"]["runbook_url"]
            for g in rule["spec"]["groups"]
            for r in g["rules"]
            if "alert" in r
        }
        assert urls and all(
            u == f"https://runbooks.example.net/ipvs/{a}.md" for a, u in urls.items()
        ), urls
        assert (
            cp.kubectl_run(
                "get", "configmap", "ipvs-leftovers-runbook-url", "-n", ns, check=False
            ).returncode
            == 1
        )
    # its Pod is admitted in a privileged namespace
    until(
        f"the DaemonSet's Pod in {ns}",
        lambda: get(cp, "pods", "-n", ns, "-l", "app.kubernetes.io/component=agent")["items"],
    )


def test_the_test_overlay_applies_into_its_own_namespace(cp: ControlPlane, crds: Path) -> None:
    rendered = kustomize(OVERLAY)
    assert kinds_and_names(rendered) == BASE_OBJECTS
    assert {d["metadata"]["namespace"] for d in yaml.safe_load_all(rendered) if d} == {"monitoring"}
    # an operator's namespace, labelled for the agent as setup labels its own
    namespace(cp, "monitoring", "privileged")
    out = cp.kubectl("apply", "--server-side", "-f", "-", stdin=rendered)
    assert applied_lines(out) == expected_lines(BASE_OBJECTS)
    ds = get(cp, "daemonset", "ipvs-leftovers", "-n", "monitoring")
    assert "--auto-cleanup" in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert_applied_by_kubectl(ds)
    until(
        "the overlay DaemonSet's Pod",
        lambda: get(cp, "pods", "-n", "monitoring", "-l", "app.kubernetes.io/component=agent")[
            "items"
        ],
    )


@pytest.mark.parametrize("apply", [False, True], ids=["plan", "apply"])
def test_job_manifest_jobs_apply_and_the_job_controller_makes_their_pod(
    cp: ControlPlane, crds: Path, setup_applied: dict[str, Any], base_rendered: str, apply: bool
) -> None:
    cp.kubectl("apply", "--server-side", "-f", "-", stdin=base_rendered)  # the SA and quota
    # image and namespace from the running DaemonSet, read through the API as an operator would
    args = [AGENT, "job-manifest", "--node", NODE, "--namespace", "ipvs-leftovers"]
    args += ["--kubeconfig", str(cp.admin_kubeconfig)] + (["--apply"] if apply else [])
    manifest = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    ds = get(cp, "daemonset", "-n", "ipvs-leftovers", "-l", "app.kubernetes.io/name=ipvs-leftovers")
    [ds_image] = {
        c["image"] for d in ds["items"] for c in d["spec"]["template"]["spec"]["containers"]
    }
    job_doc = yaml.safe_load(manifest)
    assert [c["image"] for c in job_doc["spec"]["template"]["spec"]["containers"]] == [ds_image]
    name = f"ipvs-leftovers-{'cleanup' if apply else 'plan'}-{NODE}"
    out = cp.kubectl("apply", "--server-side", "-f", "-", stdin=manifest)
    assert applied_lines(out) == {f"job.batch/{name} serverside-applied"}
    job = get(cp, "job", name, "-n", "ipvs-leftovers")
    assert_applied_by_kubectl(job)
    pods = until(
        f"the Job controller's Pod of {name}",
        lambda: get(cp, "pods", "-n", "ipvs-leftovers", "-l", f"job-name={name}")["items"],
    )
    [pod] = pods
    assert pod["spec"]["nodeName"] == NODE
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
    args_seen = pod["spec"]["containers"][0]["args"]
    assert (
        args_seen == yaml.safe_load(manifest)["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert args_seen[0] == "cleanup"
    assert ("--apply" in args_seen) is apply
    assert failed_creates(cp, "ipvs-leftovers", "Job") == []


def test_the_daemonset_is_refused_in_a_baseline_namespace(
    cp: ControlPlane, crds: Path, setup_applied: dict[str, Any], tmp_path: Path
) -> None:
    """The same objects as the setup namespace's, in a namespace labelled `enforce: baseline`."""
    namespace(cp, "baseline", "baseline")
    rendered = kustomization(tmp_path, "baseline")
    p = cp.kubectl_run("apply", "--server-side", "-f", "-", stdin=rendered)
    # the DaemonSet object is stored, with PodSecurity's warning about its Pods
    assert applied_lines(p.stdout) == expected_lines(BASE_OBJECTS)
    assert p.stderr.strip() == DAEMONSET_WARNING
    # the DaemonSet controller's Pods are refused, each with the same violations
    messages = until(
        "the DaemonSet controller's refused Pods",
        lambda: failed_creates(cp, "baseline", "DaemonSet"),
    )
    normalized = {re.sub(r'pods "ipvs-leftovers-[a-z0-9]{5}"', "pods NAME", m) for m in messages}
    normalized = {m.removeprefix("(combined from similar events): ") for m in normalized}
    assert normalized == {f"Error creating: pods NAME is forbidden: {POD_VIOLATIONS}"}
    assert get(cp, "pods", "-n", "baseline")["items"] == []
    # a Pod made of the template: refused here, admitted in setup's namespace
    pod = pod_from(daemonset_template(rendered), "from-template")
    refused = cp.kubectl_run(
        "create", "--dry-run=server", "-n", "baseline", "-f", "-", stdin=pod, check=False
    )
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        'Error from server (Forbidden): error when creating "STDIN": pods "from-template" is '
        f"forbidden: {POD_VIOLATIONS}"
    )
    admitted = cp.kubectl(
        "create", "--dry-run=server", "-n", "ipvs-leftovers", "-f", "-", stdin=pod
    )
    assert admitted.strip() == "pod/from-template created (server dry run)"
    # the cleanup Job's Pod too
    manifest = subprocess.run(
        [AGENT, "job-manifest", "--node", NODE, "--apply", "--namespace", "baseline",
         "--kubeconfig", str(cp.admin_kubeconfig)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    job = yaml.safe_load(manifest)
    job_pod = pod_from(job["spec"]["template"], "job-template")
    refused = cp.kubectl_run(
        "create", "--dry-run=server", "-n", "baseline", "-f", "-", stdin=job_pod, check=False
    )
    assert refused.stderr.strip() == (
        'Error from server (Forbidden): error when creating "STDIN": pods "job-template" is '
        f"forbidden: {JOB_POD_VIOLATIONS}"
    )


def test_a_critical_pod_needs_the_resourcequota(
    cp: ControlPlane, setup_applied: dict[str, Any], base_rendered: str
) -> None:
    """With the ResourceQuota configuration GKE uses (critical classes only where a quota covers
    them: tests/control_plane.py ADMISSION_CONFIGURATION), the base's quota is what admits the
    agent's system-node-critical Pod; in a privileged namespace without it, the Pod is refused."""
    namespace(cp, "no-quota", "privileged")
    cp.kubectl("create", "serviceaccount", "ipvs-leftovers", "-n", "no-quota")
    pod = pod_from(daemonset_template(base_rendered), "critical")
    refused = cp.kubectl_run(
        "create", "--dry-run=server", "-n", "no-quota", "-f", "-", stdin=pod, check=False
    )
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        'Error from server: error when creating "STDIN": '
        "insufficient quota to match these scopes: "
        "[{PriorityClass In [system-node-critical system-cluster-critical]}]"
    )
    admitted = cp.kubectl(
        "create", "--dry-run=server", "-n", "ipvs-leftovers", "-f", "-", stdin=pod
    )
    assert admitted.strip() == "pod/critical created (server dry run)"


def test_upstreams_default_admits_a_critical_pod_without_a_quota(
    tmp_path: Path, base_rendered: str
) -> None:
    """The other half of the quota's story (daemonset/README "Priority"): without
    ResourceQuota's limitedResources, kube-apiserver admits the same Pod in a namespace with no
    quota. Its own control plane (etcd + kube-apiserver, a few seconds)."""
    with ControlPlane(tmp_path / "upstream-default", limit_critical_pods=False) as plain:
        namespace(plain, "no-quota", "privileged")
        plain.kubectl("create", "serviceaccount", "ipvs-leftovers", "-n", "no-quota")
        pod = pod_from(daemonset_template(base_rendered), "critical")
        admitted = plain.kubectl(
            "create", "--dry-run=server", "-n", "no-quota", "-f", "-", stdin=pod
        )
        assert admitted.strip() == "pod/critical created (server dry run)"
