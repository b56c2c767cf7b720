"""job-manifest: the Job is an object serialized as YAML, with names Kubernetes accepts."""

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from agent import __version__
from agent.cli import main
from agent.job import InvalidName, render

REPO = Path(__file__).resolve().parents[2]
# Kubernetes' own checks: a label value, an RFC 1123 subdomain (a Job's name, at most 63 here
# because its pods carry it in the job-name label).
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _job(*args: Any, **kw: Any) -> Any:
    return yaml.safe_load(render(*args, **kw))


def test_committed_example_means_what_the_command_renders() -> None:
    committed = yaml.safe_load((REPO / "daemonset" / "cleanup-job.yaml").read_text())
    image = f"ghcr.io/example/ipvs-leftovers:{__version__}"  # re-render it when the version moves
    assert committed == _job("example-node", image, apply=True)


def test_pinned_to_the_node_with_minimal_capabilities() -> None:
    job = _job("worker-3.pool-a", "img:1")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["nodeName"] == "worker-3.pool-a"
    assert container["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["NET_ADMIN", "NET_RAW"],
    }
    assert "--apply" not in container["args"]  # plan only by default
    assert (
        "--apply"
        in _job("worker-3", "img:1", apply=True)["spec"]["template"]["spec"]["containers"][0][
            "args"
        ]
    )


@pytest.mark.parametrize("image", ["foo: bar", "registry:5000/a/b@sha256:00", "x\n- y # z", "'q\""])
def test_any_image_text_gives_valid_yaml_with_that_image(image: str) -> None:
    job = _job("worker-3", image)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == image
    assert job["kind"] == "Job"


@pytest.mark.parametrize("node", ["Worker_3", "worker 3", "-worker", "a" * 254, "w3\n"])
def test_a_node_name_kubernetes_refuses_is_refused(node: str) -> None:
    with pytest.raises(InvalidName, match="not a valid node name") as caught:
        render(node, "img:1")
    assert caught.value.option == "--node"


@pytest.mark.parametrize("namespace", ["x y", "Kube", "a.b", "a" * 64, "", "ns\n"])
def test_a_namespace_kubernetes_refuses_is_refused(namespace: str) -> None:
    with pytest.raises(InvalidName, match="not a valid namespace") as caught:
        render("worker-3", "img:1", namespace)
    assert caught.value.option == "--namespace"


def test_long_node_names_give_valid_distinct_names_and_labels() -> None:
    base = "ip-10-0-12-34.eu-west-1.compute.internal.cluster-with-a-long-name"
    nodes = [f"{base}-pool-a-node-{i}" for i in (1, 2)]
    assert all(len(n) > 63 for n in nodes)
    jobs = [_job(n, "img:1", apply=True) for n in nodes]
    for node, job in zip(nodes, jobs, strict=True):
        meta = job["metadata"]
        label = meta["labels"]["ipvs-leftovers.io/node"]
        assert len(label) <= 63 and LABEL_VALUE.match(label), label
        assert len(meta["name"]) <= 63 and SUBDOMAIN.match(meta["name"]), meta["name"]
        assert meta["annotations"]["ipvs-leftovers.io/node"] == node  # the whole name
        assert job["spec"]["template"]["spec"]["nodeName"] == node
    assert jobs[0]["metadata"]["name"] != jobs[1]["metadata"]["name"]
    labels = [j["metadata"]["labels"]["ipvs-leftovers.io/node"] for j in jobs]
    assert labels[0] != labels[1]


def test_short_names_are_kept_whole() -> None:
    meta = _job("worker-3", "img:1")["metadata"]
    assert meta["name"] == "ipvs-leftovers-plan-worker-3"
    assert meta["labels"]["ipvs-leftovers.io/node"] == "worker-3"
    assert "annotations" not in meta


def test_the_command_names_the_bad_option() -> None:
    r = CliRunner().invoke(main, ["job-manifest", "--node", "w3", "--namespace", "x y"])
    assert r.exit_code == 2 and "--namespace" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["job-manifest", "--node", "w3", "--image", "foo: bar"])
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.output)["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "foo: bar"
    )
