"""`fleet step` when the API server answers 500 or cannot be reached: one line, exit 4,
before anything else is asked (the real API server's 403 and admission refusals are in
tests/prometheus/test_fleet_step_refusals.py)."""

from __future__ import annotations

import socket
from pathlib import Path

from click.testing import CliRunner

from agent.cli import main
from tests.kube_stub import Stub, kube_stub


def run(kubeconfig: Path) -> tuple[int, str]:
    r = CliRunner().invoke(
        main,
        ["fleet", "step", "--apply", "--prometheus-url", "http://127.0.0.1:9",
         "--kubeconfig", str(kubeconfig)],
    )  # fmt: skip
    return r.exit_code, r.stderr.strip()


def test_a_500_from_the_api_server_refuses(tmp_path: Path) -> None:
    with kube_stub(Stub(status=500)) as stub:
        code, err = run(stub.kubeconfig(tmp_path / "k"))
    assert code == 4
    assert err == (
        "ipvs-leftovers: fleet step refused: the agent's DaemonSet: listing the ipvs-leftovers "
        "DaemonSet in any namespace: HTTP 500 Internal Server Error: stub says 500"
    )
    assert len(stub.requests) == 1  # nothing after it: no Lease taken, no Job


def test_an_unreachable_api_server_refuses(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, err = run(Stub(url=f"http://127.0.0.1:{port}").kubeconfig(tmp_path / "k"))
    assert code == 4 and "cannot reach the API server" in err and len(err.splitlines()) == 1
