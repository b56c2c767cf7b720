"""The built image, run with the DaemonSet's and the cleanup Job's own securityContext, volumes
and args (parsed from the manifests), on lab nodes in namespaces: the container's network is
the node's, as with hostNetwork."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests.conftest import REPO, run_agent
from tests.dumps import dump, minus_leftovers
from tests.image.containers import CLEANUP_JOB, DAEMONSET, detached, pod_spec, run
from tests.serving import audit_view, metrics_view, scrape

pytestmark = pytest.mark.image
CONFIRMED = {"mode": "nftables", "families": ["IPv4", "IPv6"], "last_sync_age": 2.0}


def lab_node(netns: Callable[[], str], backend: str = "legacy") -> str:
    ns = netns()
    build.build(
        ns,
        realistic_node(
            dual_stack=True,
            backend=backend,
            third_party=True,
            nftables_table=True,
            old_release_orphans=True,
        ),
    )
    return ns


def without_timings(doc: dict[str, object]) -> dict[str, object]:
    sources = doc["sources"]
    assert isinstance(sources, dict)
    return {**doc, "sources": {k: {**v, "seconds": None} for k, v in sources.items()}}


@pytest.mark.parametrize("backend", ["legacy", "nft"])
def test_audit_json_in_the_image_equals_the_host_agent(
    image: str, netns: Callable[[], str], tmp_path: Path, backend: str
) -> None:
    ns = lab_node(netns, backend)
    spec = pod_spec(DAEMONSET, tmp_path / "host")
    with start_fake_kube_proxy(ns, CONFIRMED, tmp_path / "kp.json"):
        inside = run(image, ns, spec, "audit", "--json")
        host = run_agent(ns, "audit", "--json")
    assert (inside.rc, inside.stderr) == (host.rc, host.stderr) == (1, "")
    assert without_timings(inside.json) == without_timings(host.json)
    assert inside.json["stale"] is True and inside.json["leftovers"]["iptables_chains"]


def test_serve_with_the_daemonsets_args_answers_metrics_and_healthz(
    image: str, netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = lab_node(netns)
    spec = pod_spec(DAEMONSET, tmp_path / "host")
    assert spec.args[:1] == ["serve"]
    with (
        start_fake_kube_proxy(ns, CONFIRMED, tmp_path / "kp.json"),
        detached(image, ns, spec, *spec.args),
    ):
        metrics = scrape(ns, "http://127.0.0.1:9437/metrics")
        health = scrape(ns, "http://127.0.0.1:9437/healthz")
        doc = run_agent(ns, "audit", "--json").json
    assert metrics["codes"] == [200] and health["codes"] == [200]
    samples = metrics["samples"]
    assert metrics_view(samples) == audit_view(doc)
    assert samples['ipvs_leftovers_kube_proxy_mode_info{mode="nftables"}'] == 1
    assert all(samples[f'ipvs_leftovers_source_up{{source="{s}"}}'] == 1 for s in doc["sources"])


def test_cleanup_apply_with_the_jobs_mounts_removes_exactly_the_leftovers(
    image: str, netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = lab_node(netns)
    spec = pod_spec(CLEANUP_JOB, tmp_path / "host")
    backups = spec.host_paths["/var/lib/ipvs-leftovers"]
    lock = spec.host_paths["/run/ipvs-leftovers"]
    assert spec.args[:2] == ["cleanup", "--apply"]
    with start_fake_kube_proxy(ns, CONFIRMED, tmp_path / "kp.json"):
        before = dump(ns)
        r = run(image, ns, spec, *spec.args)
        assert r.rc == 0, r.stdout + r.stderr
        after = run_agent(ns, "audit", "--json").json
    assert dump(ns) == minus_leftovers(before)
    assert after["stale"] is False and after["leftovers"]["iptables_chains"] == []
    # the bundle is on the "host", where the Job's hostPath puts it, with the lock beside it,
    # and a container with the same mounts restores the node from it
    (bundle,) = [p for p in backups.iterdir() if p.is_dir()]
    assert {"plan.json", "ipset.save"} <= {p.name for p in bundle.iterdir()}
    assert (lock / "cleanup.lock").exists()
    rr = run(image, ns, spec, "restore", f"/var/lib/ipvs-leftovers/{bundle.name}")
    assert rr.rc == 0, rr.stdout + rr.stderr
    assert dump(ns) == before


def test_without_net_raw_one_line_and_exit_4(
    image: str, netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = lab_node(netns, "legacy")  # legacy tables exist: iptables-legacy-save needs NET_RAW
    spec = pod_spec(DAEMONSET, tmp_path / "host").without_capability("NET_RAW")
    r = run(image, ns, spec, "audit", "--json")
    assert r.rc == 4  # docs/exit-codes.md: the agent lacks CAP_NET_RAW where legacy tables exist
    assert r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert "CAP_NET_RAW" in line and "Traceback" not in r.stderr
    # and the same run with NET_RAW works: it is that capability, nothing else
    assert run(image, ns, pod_spec(DAEMONSET, tmp_path / "host2"), "audit").rc == 1


def test_the_image_is_pinned_and_its_entrypoint_is_the_agent(image: str) -> None:
    inspect = subprocess.run(
        ["podman", "image", "inspect", image], capture_output=True, text=True, check=True
    )
    (info,) = json.loads(inspect.stdout)
    assert info["Config"]["Entrypoint"] == ["ipvs-leftovers"]
    assert info["Config"]["User"] == "0:0"


def rendered_daemonset(tmp: Path, components: list[str]) -> Path:
    """The DaemonSet of the base plus `components`, rendered by kubectl kustomize as an
    operator's overlay would be (outside daemonset/: kustomize refuses an overlay inside)."""
    overlay = tmp / "overlay"
    overlay.mkdir()
    base = REPO / "daemonset"
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, overlay)],
        "components": [os.path.relpath(base / "components" / c, overlay) for c in components],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    kubectl = Path(sys.executable).with_name("kubectl")  # scripts/check-manifests installs it
    assert kubectl.exists(), "kubectl missing: run scripts/check-manifests (it installs it)"
    out = subprocess.run(
        [str(kubectl), "kustomize", str(overlay)], capture_output=True, text=True, check=True
    ).stdout
    (ds,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "DaemonSet"]
    path = tmp / "daemonset.yaml"
    path.write_text(yaml.safe_dump(ds))
    return path


@pytest.mark.parametrize("component", [True, False], ids=["with-component", "base-only"])
def test_auto_cleanup_needs_the_components_host_folders(
    image: str, netns: Callable[[], str], tmp_path: Path, component: bool
) -> None:
    ns = netns()
    build.build(ns, realistic_node(third_party=True, nftables_table=True))
    before = dump(ns)
    manifest = rendered_daemonset(tmp_path, ["auto-cleanup"] if component else [])
    spec = pod_spec(manifest, tmp_path / "host")
    args = spec.args if component else [*spec.args, "--auto-cleanup"]
    assert "--auto-cleanup" in args
    fast = [
        "--auto-cleanup-hold-down",
        "2s",
        "--auto-cleanup-interval",
        "0.5",
        "--min-interval",
        "0",
    ]
    runs = 'ipvs_leftovers_cleanup_runs_total{outcome="%s"}'
    with (
        start_fake_kube_proxy(ns, CONFIRMED | {"families": ["IPv4"]}, tmp_path / "kp.json"),
        detached(image, ns, spec, *args, *fast),
    ):
        deadline = time.monotonic() + 90
        while True:
            samples = scrape(ns, "http://127.0.0.1:9437/metrics")["samples"]
            done = sum(samples[runs % o] for o in ("clean", "remains", "refused", "error"))
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    if component:
        assert samples[runs % "clean"] == 1
        assert dump(ns) == minus_leftovers(before)
        backups = spec.host_paths["/var/lib/ipvs-leftovers"]
        assert len([p for p in backups.iterdir() if p.is_dir()]) == 1  # on the host
        assert (spec.host_paths["/run/ipvs-leftovers"] / "cleanup.lock").exists()
    else:
        # the base DaemonSet's read-only root has neither folder: each run is an error that
        # changed nothing (before the fix, the lock's OSError escaped the run uncounted)
        assert samples[runs % "error"] >= 1
        assert samples[runs % "clean"] == samples[runs % "remains"] == 0
        assert dump(ns) == before
