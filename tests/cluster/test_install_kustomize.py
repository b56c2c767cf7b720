"""Install path c, as docs/install.md tells it: `kubectl apply -k daemonset/setup`, then the base,
on a real node (tests/cluster/node.py: containerd, runc, the kubelet, real kube-proxy migrated
from ipvs to nftables mode) joined to a real control plane. Asserted on what the kubelet and the
API server report, and on the agent's /metrics from that pod against the node's real leftovers,
counted by provenance as the real-kube-proxy tier counts them.

The base includes a PodMonitor and a PrometheusRule: the cluster gets those two CRDs of the
Prometheus Operator first (the project's build of them, `prometheus-operator-crds`), as a cluster
that runs the Operator has them (docs/install.md).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.node import Node, repo_path
from tests.cluster.pods import NAMESPACE, agent_pod, out_dir, pod_ready
from tests.realkp.pipeline import Scenario
from tests.realkp.test_real_kube_proxy import _expected_counts
from tests.upstream import upstream_binary

pytestmark = pytest.mark.cluster

METRICS = "http://127.0.0.1:9437/metrics"  # the pod is on the node's network (hostNetwork)
PROMETHEUS_OPERATOR = "v0.85.0"
# the two kinds the base holds (the other eight are megabytes the node's test does not need)
CRDS = ("monitoring.coreos.com_podmonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml")
POD_DEADLINE = 600.0


def rendered_image(node: Node) -> str:
    """The agent's image reference the base renders (its DaemonSet's one container)."""
    docs = yaml.safe_load_all(node.kubectl("kustomize", str(repo_path("daemonset"))))
    (ds,) = [d for d in docs if d and d["kind"] == "DaemonSet"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return str(container["image"])


@pytest.fixture(scope="module")
def installed(node: Node) -> Iterator[dict[str, Any]]:
    """docs/install.md, path c; the agent's Pod once Ready (and the seconds it took). Removed
    again after the module, as docs/install.md's uninstall says."""
    t0 = time.monotonic()
    image = rendered_image(node)
    node.tag(node.images["agent"], image)
    crds = upstream_binary("prometheus-operator-crds", PROMETHEUS_OPERATOR)
    node.kubectl("apply", "--server-side", *(a for k in CRDS for a in ("-f", str(crds / k))))
    node.kubectl("apply", "-k", str(repo_path("daemonset", "setup")))
    node.kubectl("apply", "-k", str(repo_path("daemonset")))
    seen: dict[str, Any] = {}

    def ready() -> bool:
        seen["pod"] = agent_pod(node)
        return pod_ready(seen["pod"])

    try:
        node.wait("the agent's Pod Ready", ready, POD_DEADLINE, lambda: json.dumps(seen)[-3000:])
    finally:
        node.timings["install to Ready"] = time.monotonic() - t0
        # check=False: a failed wait's own error is the one to see, not this read's
        events = node.kubectl("-n", NAMESPACE, "get", "events", "-o", "json", check=False)
        events = events or '{"items": []}'
        (out_dir() / "events.json").write_text(events)
        print("events:", [e.get("message") for e in json.loads(events)["items"]][-10:])
    pod = seen["pod"]
    yield {"pod": pod, "image": image, "events": json.loads(events)["items"]}
    # the next module installs its own agent on the node's port: this one leaves first
    node.kubectl("delete", "-k", str(repo_path("daemonset")), "--wait=true", "--timeout=300s")
    node.wait(
        "the base's agent Pod gone after its DaemonSet",
        lambda: agent_pod(node) is None, 300, lambda: json.dumps(agent_pod(node))[-2000:],
    )  # fmt: skip


def test_node_registers_and_is_ready(node: Node) -> None:
    doc = json.loads(node.kubectl("get", "node", "node-0", "-o", "json"))
    info = doc["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"] == "containerd://2.4.2"
    conds = {c["type"]: c["status"] for c in doc["status"]["conditions"]}
    assert conds["Ready"] == "True", doc["status"]["conditions"]
    assert node.kube_proxy is not None and node.kube_proxy.alive()
    assert node.kubectl("get", "--raw", "/api/v1/nodes/node-0").count('"node-0"') >= 1


def _ready_since(pod: dict[str, Any]) -> str:
    (ready,) = [c for c in pod["status"]["conditions"] if c["type"] == "Ready"]
    return str(ready["lastTransitionTime"])


def test_pod_running_ready_probes_pass_no_restart(node: Node, installed: dict[str, Any]) -> None:
    """Running and Ready, and still so past two liveness periods; no probe failed once the pod
    was Ready, no restart. Probe failures before the first Ready are recorded, not failed: a
    Python start under software emulation outlasts several periods of the startupProbe, which
    holds liveness and readiness back until the agent first answers (docs/install.md)."""
    ready_at = _ready_since(installed["pod"])
    time.sleep(45)  # past two liveness periods (20 s)
    pod = agent_pod(node)
    assert pod is not None
    status = pod["status"]
    assert status["phase"] == "Running"
    assert pod["spec"]["nodeName"] == "node-0"
    assert pod_ready(pod) and _ready_since(pod) == ready_at, status["conditions"]
    (cs,) = status["containerStatuses"]
    assert cs["ready"] is True and cs["started"] is True, cs
    assert cs["restartCount"] == 0, cs
    assert "running" in cs["state"], cs
    assert cs["image"].endswith(installed["image"].split("/", 1)[1]), cs
    events = json.loads(node.kubectl("-n", NAMESPACE, "get", "events", "-o", "json"))["items"]
    (out_dir() / "events-after.json").write_text(json.dumps(events, indent=1))
    unhealthy = [e for e in events if e.get("reason") == "Unhealthy"]
    late = [e["message"] for e in unhealthy if (e.get("lastTimestamp") or "") > ready_at]
    assert late == [], late
    bad = [e["message"] for e in events if e.get("reason") in ("BackOff", "Failed", "Killing")]
    assert bad == [], bad


def test_agent_logs_through_the_kubelet(node: Node, installed: dict[str, Any]) -> None:
    pod = installed["pod"]
    meta = pod["metadata"]
    d = Path("/var/log/pods") / f"{NAMESPACE}_{meta['name']}_{meta['uid']}" / "ipvs-leftovers"
    text = "".join(p.read_text() for p in sorted(d.glob("*.log")))
    assert "serving on" in text, text[-2000:]


def _metrics() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(METRICS, timeout=30) as r:
        text = r.read().decode()
    (out_dir() / "metrics.txt").write_text(text)
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_metrics_count_the_nodes_real_leftovers(node: Node, installed: dict[str, Any]) -> None:
    sc = Scenario("B", node.net, node.states["B"], node.made_ipvs, set())
    want = _expected_counts(sc)
    # `kubernetes` and `web` (ClusterIP and NodePort) at least
    assert want["ipvs_virtual_servers"] >= 3 and want["kube_ipvs0_present"], want
    m = _metrics()

    def one(name: str, **labels: str) -> float:
        key = tuple(sorted((k.rstrip("_"), v) for k, v in labels.items()))
        return m[name][key]

    assert one("ipvs_leftovers_stale") == 1.0
    assert (
        one("ipvs_leftovers_ipvs_virtual_servers", class_="kube-proxy")
        == want["ipvs_virtual_servers"]
    )
    assert one("ipvs_leftovers_ipvs_real_servers", class_="kube-proxy") == want["ipvs_real_servers"]
    assert (
        one("ipvs_leftovers_ipvs_virtual_servers", class_="foreign")
        == want["foreign"]["ipvs_virtual_servers"]
    )
    for fam in ("ipv4", "ipv6"):
        assert one("ipvs_leftovers_ipsets", family=fam) == want["ipsets"][fam]
        assert one("ipvs_leftovers_ipset_entries", family=fam) == want["ipset_entries"][fam]
        assert (
            one("ipvs_leftovers_kube_ipvs0_addresses", family=fam)
            == want["kube_ipvs0_addresses"][fam]
        )
    assert sum(m.get("ipvs_leftovers_iptables_chains", {}).values()) == len(
        want["ipvs_mode_chains"]
    )
    assert one("ipvs_leftovers_kube_ipvs0_present") == 1.0
