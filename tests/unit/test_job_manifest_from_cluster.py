"""job-manifest takes the image and namespace from the running DaemonSet (never the
placeholder), through the official client; when it cannot, one line and exit 4."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import main
from tests.kube_stub import Stub, daemonset, kube_stub

IMAGE = "registry.example.net/ipvs-leftovers:1.2.3"


def run(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(
        main, ["job-manifest", "--node", "worker-1", "--kubeconfig", str(kubeconfig), *args]
    )
    return r.exit_code, r.stdout, r.stderr


def test_image_and_namespace_come_from_the_daemonset(tmp_path: Path) -> None:
    with kube_stub(Stub([daemonset("monitoring", IMAGE)])) as stub:
        code, out, err = run(stub.kubeconfig(tmp_path / "k"), "--apply")
    assert code == 0, err
    job = yaml.safe_load(out)
    assert job["metadata"]["namespace"] == "monitoring"
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    assert job["spec"]["activeDeadlineSeconds"] == 1800
    assert stub.requests[0].startswith("/apis/apps/v1/daemonsets?labelSelector=")


def test_the_namespace_given_narrows_the_search(tmp_path: Path) -> None:
    two = [daemonset("a", "img:a"), daemonset("b", "img:b")]
    with kube_stub(Stub(two)) as stub:
        code, _, err = run(stub.kubeconfig(tmp_path / "k"))
        assert (
            code == 4 and "2 ipvs-leftovers DaemonSets (a/ipvs-leftovers, b/ipvs-leftovers)" in err
        )
        code, out, err = run(stub.kubeconfig(tmp_path / "k"), "--namespace", "b")
    assert code == 0, err
    assert yaml.safe_load(out)["spec"]["template"]["spec"]["containers"][0]["image"] == "img:b"
    assert stub.requests[-1].startswith("/apis/apps/v1/namespaces/b/daemonsets?")


def test_with_image_given_the_api_is_not_asked(tmp_path: Path) -> None:
    with kube_stub(Stub([daemonset("monitoring", IMAGE)])) as stub:
        code, out, _ = run(stub.kubeconfig(tmp_path / "k"), "--image", "mine:1")
    assert code == 0 and stub.requests == []
    job = yaml.safe_load(out)
    assert job["metadata"]["namespace"] == "ipvs-leftovers"
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "mine:1"


@pytest.mark.parametrize(
    ("status", "daemonsets", "want"),
    [
        (200, [], "no DaemonSet labelled app.kubernetes.io/name=ipvs-leftovers"),
        (403, [], "HTTP 403 Forbidden: stub says 403"),
        (500, [], "HTTP 500 Internal Server Error: stub says 500"),
    ],
)
def test_no_daemonset_one_line_and_exit_4(
    tmp_path: Path, status: int, daemonsets: list[object], want: str
) -> None:
    with kube_stub(Stub(daemonsets, status=status)) as stub:  # type: ignore[arg-type]
        code, out, err = run(stub.kubeconfig(tmp_path / "k"))
    assert (code, out) == (4, "")
    assert want in err and "give --image" in err and len(err.strip().splitlines()) == 1


def test_an_unreachable_api_server_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the with ends: nothing listens there
    stub = Stub(url=f"http://127.0.0.1:{port}")
    code, out, err = run(stub.kubeconfig(tmp_path / "k"))
    assert (code, out) == (4, "")
    assert "cannot reach the API server" in err and len(err.strip().splitlines()) == 1


def test_a_missing_kubeconfig_is_one_line(tmp_path: Path) -> None:
    code, _, err = run(tmp_path / "nothing-here")
    assert code == 4 and "no usable kubeconfig" in err and len(err.strip().splitlines()) == 1
