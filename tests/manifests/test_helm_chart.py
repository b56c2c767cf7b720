"""The Helm chart (daemonset/helm/ipvs-leftovers) as an operator uses it.

Rendered by both pinned Helm releases (v4.3.2, and the newest approved v3, v3.21.4, built
from their modules by scripts/build-upstream): the values a prometheus-node-exporter user
expects, names and labels per release, the schema's refusals, NOTES.txt and the `helm test`
pod (whose script is run against a stand-in /metrics here; the real-node tier runs the pod).

Then installed with Helm v4 into a real kube-apiserver v1.37.2 with kube-controller-manager
(tests/control_plane.py, as tests/manifests/test_real_apiserver.py): a default install before
the Prometheus Operator's CRDs exist (no PodMonitor, no PrometheusRule), a second release
beside it after the CRDs (both, with the release label), the two releases' DaemonSets each
making their own Pod on the one Node, a namespace enforcing `baseline` refused by the install
itself, a value of the wrong type refused by the schema, an upgrade and an uninstall.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.control_plane import ControlPlane
from tests.upstream import upstream_binary

pytestmark = [pytest.mark.upstream]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "daemonset" / "helm" / "ipvs-leftovers"
HELM_VERSIONS = ("v4.3.2", "v3.21.4")
PROMETHEUS_OPERATOR = "v0.85.0"
KUBE_VERSION = "1.33.0"
NODE = "node-a"
WAIT = 30.0
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
CHART_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
CORE_KINDS = ["ConfigMap", "DaemonSet", "ResourceQuota", "ServiceAccount"]


def helm_path(version: str) -> Path:
    try:
        return upstream_binary("helm", version)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


def helm_env(home: Path) -> dict[str, str]:
    """Helm's own folders in a temp dir: nothing of the machine's user is read or written."""
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def helm(
    version: str, *args: str, home: Path, check: bool = True
) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(
        [str(helm_path(version)), *args],
        capture_output=True, text=True, timeout=120, check=False, env=helm_env(home),
    )  # fmt: skip
    if check:
        assert p.returncode == 0, f"helm {' '.join(args)}: {p.stderr}"
    return p


def template(
    version: str, home: Path, *values: str, release: str = "ipvs-leftovers", ns: str = "agents"
) -> list[dict[str, Any]]:
    out = helm(
        version, "template", release, str(CHART), "--namespace", ns,
        "--kube-version", KUBE_VERSION, *values, home=home,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


def agent(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The DaemonSet's container."""
    return dict(one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0])


@pytest.fixture(params=HELM_VERSIONS)
def hv(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# --- rendering, both Helm releases ---------------------------------------------------------------


def test_helm_lint_strict_is_clean(hv: str, tmp_path: Path) -> None:
    p = helm(hv, "lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), home=tmp_path)
    assert "1 chart(s) linted, 0 chart(s) failed" in p.stdout
    # no warning or error; the one INFO is the missing icon (the project has none)
    assert [line for line in p.stdout.splitlines() if line.startswith("[")] == [
        "[INFO] Chart.yaml: icon is recommended"
    ]
    assert helm(hv, "version", "--short", home=tmp_path).stdout.startswith(hv)


def test_defaults_render_no_operator_objects_without_the_api_and_both_with_it(
    hv: str, tmp_path: Path
) -> None:
    """podMonitor/rules.enabled "auto": `helm template` knows no cluster, so no CRD objects;
    told that the cluster serves monitoring.coreos.com/v1, both."""
    docs = template(hv, tmp_path)
    assert sorted(d["kind"] for d in docs) == sorted([*CORE_KINDS, "Pod"])  # Pod: helm test
    with_api = template(
        hv, tmp_path,
        "--api-versions", "monitoring.coreos.com/v1/PodMonitor",
        "--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
    )  # fmt: skip
    assert sorted(d["kind"] for d in with_api) == sorted(
        [*CORE_KINDS, "Pod", "PodMonitor", "PrometheusRule"]
    )
    off = template(
        hv, tmp_path, "--set", "podMonitor.enabled=false", "--set", "rules.enabled=false",
        "--api-versions", "monitoring.coreos.com/v1/PodMonitor",
        "--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
    )  # fmt: skip
    assert sorted(d["kind"] for d in off) == sorted([*CORE_KINDS, "Pod"])


def test_every_object_has_the_recommended_labels(hv: str, tmp_path: Path) -> None:
    docs = template(hv, tmp_path, "--set", "podMonitor.enabled=true,rules.enabled=true")
    want = {
        "app.kubernetes.io/name": "ipvs-leftovers",
        "app.kubernetes.io/instance": "ipvs-leftovers",
        "app.kubernetes.io/version": APP_VERSION,
        "app.kubernetes.io/managed-by": "Helm",
        "helm.sh/chart": f"ipvs-leftovers-{CHART_VERSION}",
        "app.kubernetes.io/part-of": "ipvs-leftovers",
    }
    for d in docs:
        labels = d["metadata"]["labels"]
        assert {k: labels.get(k) for k in want} == want, d["kind"]


def test_two_releases_share_no_name_and_select_only_their_own_pods(hv: str, tmp_path: Path) -> None:
    crd = ("--set", "podMonitor.enabled=true,rules.enabled=true")
    a = template(hv, tmp_path, *crd, release="ipvs-leftovers")
    b = template(hv, tmp_path, *crd, release="second")
    names_a = {(d["kind"], d["metadata"]["name"]) for d in a}
    names_b = {(d["kind"], d["metadata"]["name"]) for d in b}
    assert names_a & names_b == set()
    # release "ipvs-leftovers" keeps the kustomize base's names; another gets <release>-<name>
    assert ("DaemonSet", "ipvs-leftovers") in names_a
    assert ("DaemonSet", "second-ipvs-leftovers") in names_b
    assert ("ResourceQuota", "second-ipvs-leftovers-node-critical") in names_b
    for mine, other in ((a, b), (b, a)):
        selector = one(mine, "DaemonSet")["spec"]["selector"]["matchLabels"]
        own_pods = one(mine, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
        other_pods = one(other, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= own_pods.items()
        assert not selector.items() <= other_pods.items()
        assert one(mine, "PodMonitor")["spec"]["selector"]["matchLabels"] == selector
        # both are job="ipvs-leftovers", which every alert selects
        assert one(mine, "PodMonitor")["spec"]["jobLabel"] == "app.kubernetes.io/name"
        assert own_pods["app.kubernetes.io/name"] == "ipvs-leftovers"
        sa = one(mine, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
        assert sa == one(mine, "ServiceAccount")["metadata"]["name"]


def test_the_values_a_node_exporter_user_expects(hv: str, tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "image": {
                    "registry": "registry.example.net",
                    "repository": "ops/ipvs-leftovers",
                    "digest": digest,
                    "pullPolicy": "Always",
                },
                "imagePullSecrets": [{"name": "regcred"}],
                "resources": {
                    "requests": {"cpu": "50m", "memory": "80Mi"},
                    # null: Helm drops the chart's default cpu limit
                    "limits": {"memory": "300Mi", "cpu": None},
                },
                "tolerations": [
                    {
                        "key": "dedicated",
                        "operator": "Equal",
                        "value": "infra",
                        "effect": "NoSchedule",
                    }
                ],
                "nodeSelector": {"kubernetes.io/os": "linux", "pool": "ipvs"},
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/arch",
                                            "operator": "In",
                                            "values": ["amd64", "arm64"],
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                },
                "priorityClassName": "",
                "extraArgs": ["--min-interval=30", "--source-timeout=20"],
                "env": {
                    "IPVS_LEFTOVERS_KUBE_PROXY_METRICS_URL": "http://127.0.0.1:10249",
                    "IPVS_LEFTOVERS_TIMEOUT": 8,
                },
                "podAnnotations": {"team": "net"},
                "podLabels": {"cost-center": "infra"},
                "updateStrategy": {"type": "OnDelete"},
                "serviceAccount": {"create": False, "name": "existing-sa"},
                "fullnameOverride": "leftovers",
                "port": 19437,
            }
        )  # fmt: skip
    )
    docs = template(hv, tmp_path, "-f", str(values))
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "DaemonSet", "Pod"]  # no ServiceAccount, no quota
    ds = one(docs, "DaemonSet")
    assert ds["metadata"]["name"] == "leftovers"
    pod = ds["spec"]["template"]
    c = agent(docs)
    assert c["image"] == f"registry.example.net/ops/ipvs-leftovers@{digest}"
    assert c["imagePullPolicy"] == "Always"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert c["resources"] == {"requests": {"cpu": "50m", "memory": "80Mi"},
                              "limits": {"memory": "300Mi"}}  # fmt: skip
    assert pod["spec"]["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}
    ]
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux", "pool": "ipvs"}
    assert "nodeAffinity" in pod["spec"]["affinity"]
    assert "priorityClassName" not in pod["spec"]
    assert c["args"] == ["serve", "--listen", ":19437", "--min-interval=30", "--source-timeout=20"]
    assert c["env"] == [
        {"name": "IPVS_LEFTOVERS_KUBE_PROXY_METRICS_URL", "value": "http://127.0.0.1:10249"},
        {"name": "IPVS_LEFTOVERS_TIMEOUT", "value": "8"},
    ]
    assert c["ports"] == [{"name": "metrics", "containerPort": 19437, "protocol": "TCP"}]
    assert pod["metadata"]["annotations"] == {"team": "net"}
    assert pod["metadata"]["labels"]["cost-center"] == "infra"
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert pod["spec"]["serviceAccountName"] == "existing-sa"
    # the test pod follows the DaemonSet's node choice, image and port
    test_pod = one(docs, "Pod")
    assert test_pod["spec"]["nodeSelector"] == pod["spec"]["nodeSelector"]
    assert test_pod["spec"]["containers"][0]["image"] == c["image"]
    assert ":19437/metrics" in test_pod["spec"]["containers"][0]["args"][0]


def test_defaults_match_the_base_and_tag_defaults_to_the_agents_version(
    hv: str, tmp_path: Path
) -> None:
    docs = template(hv, tmp_path)
    c = agent(docs)
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert c["image"] == f"ghcr.io/example/ipvs-leftovers:{APP_VERSION}"
    assert pod["tolerations"] == [{"operator": "Exists"}]  # every node
    assert pod["priorityClassName"] == "system-node-critical"
    assert one(docs, "ServiceAccount")["automountServiceAccountToken"] is False
    assert "annotations" not in one(docs, "DaemonSet")["spec"]["template"]["metadata"]
    nameless = template(hv, tmp_path, "--set", "nameOverride=agent", release="prod")
    assert one(nameless, "DaemonSet")["metadata"]["name"] == "prod-agent"
    # the job label stays: the alerts select job="ipvs-leftovers"
    labels = one(nameless, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "ipvs-leftovers"


def test_tls_secret_and_scrape_annotations(hv: str, tmp_path: Path) -> None:
    docs = template(
        hv, tmp_path, "--set", "tls.enabled=true,tls.secretName=agent-tls",
        "--set", "scrapeAnnotations.enabled=true", "--set", "podMonitor.enabled=true",
    )  # fmt: skip
    c = agent(docs)
    pod = one(docs, "DaemonSet")["spec"]["template"]
    assert c["args"] == [
        "serve", "--listen", ":9437",
        "--tls-cert=/etc/ipvs-leftovers/tls/tls.crt", "--tls-key=/etc/ipvs-leftovers/tls/tls.key",
    ]  # fmt: skip
    assert {"name": "tls", "mountPath": "/etc/ipvs-leftovers/tls", "readOnly": True} in c[
        "volumeMounts"
    ]
    assert {"name": "tls", "secret": {"secretName": "agent-tls", "defaultMode": 0o400}} in pod[
        "spec"
    ]["volumes"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS"
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9437",
        "prometheus.io/path": "/metrics",
        "prometheus.io/scheme": "https",
    }
    endpoint = one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    assert "https://" in one(docs, "Pod")["spec"]["containers"][0]["args"][0]
    # without a Secret's name the render stops with what to do
    p = helm(
        hv, "template", "x", str(CHART), "--kube-version", KUBE_VERSION,
        "--set", "tls.enabled=true", home=tmp_path, check=False,
    )  # fmt: skip
    assert p.returncode == 1
    assert "tls.enabled needs tls.secretName" in p.stderr


def test_auto_cleanup_mounts_and_memory_limit(hv: str, tmp_path: Path) -> None:
    docs = template(hv, tmp_path, "--set", "autoCleanup.enabled=true,autoCleanup.holdDown=48h")
    c = agent(docs)
    assert c["args"] == [
        "serve", "--listen", ":9437", "--auto-cleanup", "--backup-dir=/var/lib/ipvs-leftovers",
        "--lock-file=/run/ipvs-leftovers/cleanup.lock", "--auto-cleanup-hold-down=48h",
    ]  # fmt: skip
    assert c["resources"]["limits"] == {"cpu": "500m", "memory": "512Mi"}
    assert c["resources"]["requests"] == {"cpu": "25m", "memory": "64Mi"}


def test_runbook_urls_are_this_versions_or_the_operators(hv: str, tmp_path: Path) -> None:
    def urls(*values: str) -> dict[str, str]:
        rule = one(template(hv, tmp_path, "--set", "rules.enabled=true", *values), "PrometheusRule")
        return {
            r["alert"]: r["annotations"]["runbook_url"]
            for g in rule["spec"]["groups"]
            for r in g["rules"]
            if "alert" in r
        }

    default = urls()
    assert len(default) == 11
    base = f"https://github.com/example/ipvs-leftovers/blob/v{APP_VERSION}/docs/runbooks"
    assert default == {a: f"{base}/{a}.md" for a in default}
    for a in default:
        assert (REPO / "docs" / "runbooks" / f"{a}.md").is_file()
    mine = urls("--set", "rules.runbookBaseURL=https://wiki.example.net/rb/")
    assert mine == {a: f"https://wiki.example.net/rb/{a}.md" for a in default}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("port=abc", "- at '/port': got string, want integer"),
        ("tolerations=yes", "- at '/tolerations': got string, want array"),
        ("podMonitor.enabled=maybe", "- at '/podMonitor/enabled': value must be one of"),
        ("image.digest=latest", "- at '/image/digest': 'latest' does not match pattern"),
        ("imagee.tag=1", "- at '': additional properties 'imagee' not allowed"),
        ("autoCleanup.enabled=yes", "- at '/autoCleanup/enabled': got string, want boolean"),
    ],
)
def test_a_value_of_the_wrong_type_fails_with_its_path(
    hv: str, tmp_path: Path, value: str, message: str
) -> None:
    p = helm(
        hv, "template", "x", str(CHART), "--kube-version", KUBE_VERSION, "--set", value,
        home=tmp_path, check=False,
    )  # fmt: skip
    assert p.returncode == 1
    lines = p.stderr.splitlines()
    assert lines[0] == (
        "Error: values don't meet the specifications of the schema(s) in the following chart(s):"
    )
    assert lines[1:2] == ["ipvs-leftovers:"]
    assert lines[2].startswith(message), p.stderr


def test_the_helm_test_pod_reads_metrics_from_the_agent_on_its_node(
    hv: str, tmp_path: Path
) -> None:
    """The hook Pod as rendered, and its script run as the Pod runs it (HOST_IP from the
    downward API) against a stand-in agent: it passes on build_info, fails without it."""
    [pod] = [d for d in template(hv, tmp_path) if d["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["metadata"]["name"] == "ipvs-leftovers-test-metrics"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert "hostNetwork" not in spec  # an ordinary pod: restricted PodSecurity level
    assert spec["securityContext"]["runAsNonRoot"] is True
    c = spec["containers"][0]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["env"] == [
        {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}
    ]
    assert c["command"] == ["python3", "-c"]
    script = c["args"][0].replace(":9437/", ":{port}/")

    def run(body: bytes) -> subprocess.CompletedProcess[str]:
        class Agent(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                ok = self.path == "/metrics"
                self.send_response(200 if ok else 404)
                self.end_headers()
                self.wfile.write(body if ok else b"")

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.HTTPServer(("127.0.0.1", 0), Agent)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            return subprocess.run(
                ["python3", "-c", script.replace("{port}", str(server.server_port))],
                env={**os.environ, "HOST_IP": "127.0.0.1"},
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
        finally:
            server.shutdown()

    good = run(b'ipvs_leftovers_build_info{version="0.1.0"} 1.0\nipvs_leftovers_stale 0.0\n')
    assert good.returncode == 0, good.stderr
    assert re.fullmatch(
        r"http://127\.0\.0\.1:\d+/metrics 200 \d+ bytes; "
        r'ipvs_leftovers_build_info\{version="0\.1\.0"\} 1\.0\n',
        good.stdout,
    )
    bad = run(b"node_exporter_build_info 1\n")
    assert bad.returncode == 1
    assert bad.stdout.endswith("no ipvs_leftovers_build_info\n")


def test_notes_say_what_to_do(tmp_path: Path) -> None:
    """Helm v4's client-side dry run renders NOTES.txt without a cluster (v3's asks the API
    server for its version first; its NOTES are checked installed, below, with v4)."""
    p = helm(
        "v4.3.2", "install", "ipvs-leftovers", str(CHART), "--namespace", "agents",
        "--dry-run=client", home=tmp_path,
    )  # fmt: skip
    notes = p.stdout.split("NOTES:", 1)[1]
    assert (
        "kubectl label namespace agents pod-security.kubernetes.io/enforce=privileged --overwrite"
        in notes
    )
    assert "0 pods? Read why the DaemonSet controller could not make them:" in notes
    assert (
        "kubectl -n agents get events --field-selector "
        "involvedObject.name=ipvs-leftovers,reason=FailedCreate" in notes
    )
    assert "PodMonitor: NOT rendered; PrometheusRule (the alerts): NOT rendered." in notes
    assert "--field-selector spec.nodeName=NODE" in notes


# --- installed into a real API server, Helm v4 ---------------------------------------------------


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path_factory.mktemp("helm-cp"), controller_manager=True) as plane:
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
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def installed(
    cp: ControlPlane, home: Path, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return helm("v4.3.2", *args, "--kubeconfig", str(cp.admin_kubeconfig), home=home, check=check)


def namespace(cp: ControlPlane, name: str, enforce: str | None) -> None:
    labels = {} if enforce is None else {"pod-security.kubernetes.io/enforce": enforce}
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    cp.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(ns))


def objects(cp: ControlPlane, ns: str, release: str) -> set[tuple[str, str]]:
    kinds = "daemonsets,serviceaccounts,resourcequotas,configmaps"
    if (
        cp.kubectl_run("get", "crd", "podmonitors.monitoring.coreos.com", check=False).returncode
        == 0
    ):
        kinds += ",podmonitors,prometheusrules"
    got = json.loads(
        cp.kubectl(
            "get", kinds, "-n", ns, "-l", f"app.kubernetes.io/instance={release}", "-o", "json"
        )
    )
    return {(i["kind"], i["metadata"]["name"]) for i in got["items"]}


def agent_pods(cp: ControlPlane, ns: str, release: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=agent"
    return list(
        json.loads(cp.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json"))["items"]
    )


def until(what: str, probe: Any) -> Any:
    end = time.monotonic() + WAIT
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"not within {WAIT:.0f} s: {what}")
        time.sleep(0.5)


def base_objects(name: str) -> set[tuple[str, str]]:
    return {
        ("DaemonSet", name),
        ("ServiceAccount", name),
        ("ResourceQuota", f"{name}-node-critical"),
        ("ConfigMap", f"{name}-dashboard"),
    }


@pytest.mark.controlplane
def test_a_default_install_without_the_operators_crds_succeeds(
    cp: ControlPlane, helm_home: Path
) -> None:
    """Issue's 3a on the API server: no CRDs, default values: installed, no PodMonitor or
    PrometheusRule, NOTES say so, and the DaemonSet controller makes the node's Pod."""
    namespace(cp, "agents", "privileged")
    p = installed(cp, helm_home, "install", "ipvs-leftovers", str(CHART), "-n", "agents")
    assert "STATUS: deployed" in p.stdout
    assert "PodMonitor: NOT rendered; PrometheusRule (the alerts): NOT rendered." in p.stdout
    assert objects(cp, "agents", "ipvs-leftovers") == base_objects("ipvs-leftovers")
    [pod] = until("the first release's Pod", lambda: agent_pods(cp, "agents", "ipvs-leftovers"))
    assert pod["spec"]["priorityClassName"] == "system-node-critical"


@pytest.mark.controlplane
def test_with_the_crds_a_second_release_gets_its_monitor_and_rules_beside_the_first(
    cp: ControlPlane, helm_home: Path
) -> None:
    folder = upstream_binary("prometheus-operator-crds", PROMETHEUS_OPERATOR)
    files = [folder / f"monitoring.coreos.com_{p}.yaml" for p in ("podmonitors", "prometheusrules")]
    cp.kubectl("apply", "--server-side", *(f"-f={f}" for f in files))
    cp.kubectl(
        "wait", "--for=condition=Established", "--timeout=30s",
        "crd/podmonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com",
    )  # fmt: skip
    release = ("--set-string", "podMonitor.labels.release=kps,rules.labels.release=kps")
    # a server-side dry run sees the CRDs too (what --dry-run=server users check first)
    dry = installed(
        cp, helm_home, "install", "second", str(CHART), "-n", "agents", "--dry-run=server", *release
    )
    assert "kind: PodMonitor" in dry.stdout and "kind: PrometheusRule" in dry.stdout
    assert objects(cp, "agents", "second") == set()
    p = installed(cp, helm_home, "install", "second", str(CHART), "-n", "agents", *release)
    assert "PodMonitor: rendered; PrometheusRule (the alerts): rendered." in p.stdout
    name = "second-ipvs-leftovers"
    assert objects(cp, "agents", "second") == base_objects(name) | {
        ("PodMonitor", name),
        ("PrometheusRule", name),
    }
    for kind in ("podmonitor", "prometheusrule"):
        obj = json.loads(cp.kubectl("get", kind, name, "-n", "agents", "-o", "json"))
        assert obj["metadata"]["labels"]["release"] == "kps"
    # the first release is untouched, and each DaemonSet owns exactly its own Pod on the node
    assert objects(cp, "agents", "ipvs-leftovers") == base_objects("ipvs-leftovers")
    for rel, ds in (("ipvs-leftovers", "ipvs-leftovers"), ("second", name)):
        [pod] = until(f"{rel}'s Pod", lambda rel=rel: agent_pods(cp, "agents", rel))
        assert pod["metadata"]["ownerReferences"][0]["name"] == ds
    listed = json.loads(installed(cp, helm_home, "list", "-n", "agents", "-o", "json").stdout)
    assert sorted((r["name"], r["status"], r["app_version"]) for r in listed) == [
        ("ipvs-leftovers", "deployed", APP_VERSION),
        ("second", "deployed", APP_VERSION),
    ]


@pytest.mark.controlplane
def test_a_namespace_enforcing_baseline_is_refused_by_the_install(
    cp: ControlPlane, helm_home: Path
) -> None:
    """Issue's 3e: never a silent zero pods. The install fails, names the level and gives the
    command; nothing is created."""
    namespace(cp, "strict", "baseline")
    p = installed(cp, helm_home, "install", "agent", str(CHART), "-n", "strict", check=False)
    assert p.returncode == 1
    assert (
        'namespace strict enforces PodSecurity "baseline", and the agent\'s pods need '
        '"privileged" (hostNetwork, NET_ADMIN, hostPath): run `kubectl label namespace strict '
        "pod-security.kubernetes.io/enforce=privileged --overwrite` (or install into a "
        "privileged namespace), then install again"
    ) in p.stderr
    assert objects(cp, "strict", "agent") == set()
    assert json.loads(installed(cp, helm_home, "list", "-n", "strict", "-o", "json").stdout) == []
    # the command it gives is the way through
    cp.kubectl(
        "label", "namespace", "strict", "pod-security.kubernetes.io/enforce=privileged",
        "--overwrite",
    )  # fmt: skip
    installed(cp, helm_home, "install", "agent", str(CHART), "-n", "strict")
    until("the Pod once the namespace is privileged", lambda: agent_pods(cp, "strict", "agent"))


@pytest.mark.controlplane
def test_a_wrong_value_type_is_refused_before_anything_is_created(
    cp: ControlPlane, helm_home: Path
) -> None:
    p = installed(
        cp, helm_home, "install", "typo", str(CHART), "-n", "agents", "--set", "port=abc",
        check=False,
    )  # fmt: skip
    assert p.returncode == 1
    assert "- at '/port': got string, want integer" in p.stderr
    assert objects(cp, "agents", "typo") == set()


@pytest.mark.controlplane
def test_upgrade_changes_the_daemonset_and_uninstall_removes_every_object(
    cp: ControlPlane, helm_home: Path
) -> None:
    before = json.loads(
        cp.kubectl("get", "ds", "second-ipvs-leftovers", "-n", "agents", "-o", "json")
    )
    installed(
        cp, helm_home, "upgrade", "second", str(CHART), "-n", "agents", "--reuse-values",
        "--set", "extraArgs={--min-interval=30}",
    )  # fmt: skip
    after = json.loads(
        cp.kubectl("get", "ds", "second-ipvs-leftovers", "-n", "agents", "-o", "json")
    )
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    assert after["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--min-interval=30"
    assert after["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "10%"
    pm = json.loads(
        cp.kubectl("get", "podmonitor", "second-ipvs-leftovers", "-n", "agents", "-o", "json")
    )
    assert pm["metadata"]["labels"]["release"] == "kps"  # --reuse-values kept it
    installed(cp, helm_home, "uninstall", "second", "-n", "agents", "--wait", "--timeout", "60s")
    assert objects(cp, "agents", "second") == set()
    # the other release is still whole
    assert objects(cp, "agents", "ipvs-leftovers") == base_objects("ipvs-leftovers")
