"""tests/control_plane.py itself: the `run` wrapper's files and exit code, and its failures (a
program not built, a program not ready in time) leave nothing running and say why."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import tests.control_plane as control_plane
from tests.control_plane import ControlPlane, ControlPlaneError

pytestmark = pytest.mark.controlplane

REPO = Path(__file__).resolve().parents[2]

# Run by `run` as CMD: what a test in the VM guest would read, and the admin reaching the server.
CHILD = r"""
import json, os, subprocess, sys
from pathlib import Path
d = Path(os.environ["IPVS_LEFTOVERS_CONTROL_PLANE"])
info = json.loads((d / "control-plane.json").read_text())
kubectl = Path(sys.executable).with_name("kubectl")
ready = subprocess.run([str(kubectl), f"--kubeconfig={d / 'admin.kubeconfig'}", "get", "--raw",
                        "/readyz"], capture_output=True, text=True, timeout=30).stdout
servers = {n: json.loads((d / n).read_text())["clusters"][0]["cluster"]["server"]
           for n in ("admin.kubeconfig", "guest-admin.kubeconfig", "guest-kube-proxy.kubeconfig")}
users = {n: json.loads((d / n).read_text())["users"][0]["name"]
         for n in ("admin.kubeconfig", "guest-admin.kubeconfig", "guest-kube-proxy.kubeconfig")}
print(json.dumps({"info": info, "ready": ready, "servers": servers, "users": users,
                  "ca": (d / "ca.crt").read_text().startswith("-----BEGIN CERTIFICATE-----")}))
sys.exit(7)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not running
    return "zombie" not in Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]


def test_run_writes_the_kubeconfigs_runs_the_command_and_stops_everything(tmp_path: Path) -> None:
    out = tmp_path / "cp"
    p = subprocess.run(
        [sys.executable, "-m", "tests.control_plane", "run", "--dir", str(out), "--",
         sys.executable, "-c", CHILD],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert p.returncode == 7, p.stderr  # the command's own code
    seen = json.loads(p.stdout)
    info = seen["info"]
    port = info["port"]
    assert seen["ready"] == "ok"
    assert seen["servers"] == {
        "admin.kubeconfig": f"https://127.0.0.1:{port}",
        "guest-admin.kubeconfig": f"https://10.0.2.2:{port}",
        "guest-kube-proxy.kubeconfig": f"https://10.0.2.2:{port}",
    }
    assert seen["users"] == {
        "admin.kubeconfig": "kubernetes-admin",
        "guest-admin.kubeconfig": "kubernetes-admin",
        "guest-kube-proxy.kubeconfig": "system:kube-proxy",
    }
    assert seen["ca"] is True
    assert info["url"] == f"https://127.0.0.1:{port}"
    assert info["guest_url"] == f"https://10.0.2.2:{port}"
    assert info["service_cidrs"] == ["10.96.0.0/16", "fd00:96::/112"]
    assert set(info["pids"]) == {"etcd", "kube-apiserver"}
    assert set(info["start_seconds"]) == {"etcd", "kube-apiserver"}
    # the start's timing on stderr, and nothing left running
    assert "control-plane: etcd ready in " in p.stderr
    assert "control-plane: kube-apiserver ready in " in p.stderr
    assert [pid for pid in info["pids"].values() if alive(pid)] == []


def test_a_program_not_built_is_an_error_naming_its_build_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPVS_LEFTOVERS_UPSTREAM_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(RuntimeError) as exc:
        ControlPlane(tmp_path / "cp").start()
    assert str(exc.value) == (
        "build-upstream: etcd v3.7.4 is not built (run scripts/build-upstream etcd-v3.7.4)"
    )
    assert not (tmp_path / "cp" / "pki").exists()  # nothing made, nothing started


def test_a_program_not_ready_in_time_is_stopped_and_its_log_shown(tmp_path: Path) -> None:
    cp = ControlPlane(tmp_path / "cp", deadline=0.0)
    with pytest.raises(ControlPlaneError) as exc:
        cp.start()
    message = str(exc.value)
    assert message.startswith("etcd not healthy (GET /health) within 0 s (last probe: ")
    assert f"; the end of {tmp_path / 'cp' / 'etcd.log'}:" in message
    assert [pid for pid in cp.pids().values() if alive(pid)] == []


def test_a_port_taken_before_the_program_binds_it_is_chosen_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """free_port() and the program's bind are apart: another process may take the port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        given = [port]
        real = control_plane.free_port
        monkeypatch.setattr(control_plane, "free_port", lambda: given.pop() if given else real())
        cp = ControlPlane(tmp_path / "cp")
        cp.workdir.mkdir()
        try:
            url = cp._on_free_ports("etcd", cp._start_etcd)
            assert url != f"http://127.0.0.1:{port}"
            assert cp.programs["etcd"].proc is not None
            assert cp.programs["etcd"].proc.poll() is None
        finally:
            cp.stop()
    log = (tmp_path / "cp" / "etcd.log").read_text()
    assert f"127.0.0.1:{port}: bind: address already in use" in log
