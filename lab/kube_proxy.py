"""Start and steer the fake kube-proxy inside a namespace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lab.fake_kube_proxy import DEFAULT_STATE

REPO = Path(__file__).resolve().parent.parent


class FakeKubeProxy:
    """Handle on a running fake kube-proxy; `set` rewrites the state it serves from."""

    def __init__(self, netns: str, state_file: Path, proc: subprocess.Popen[bytes]) -> None:
        self.netns = netns
        self.state_file = state_file
        self.proc = proc
        self.state: dict[str, Any] = json.loads(state_file.read_text())

    def set(self, **changes: Any) -> None:
        self.state.update(changes)
        _write_atomically(self.state_file, self.state)

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> FakeKubeProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _write_atomically(path: Path, state: dict[str, Any]) -> None:
    # The server reads on every request; a rename never shows it a half-written file.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def start_fake_kube_proxy(
    netns: str,
    state: dict[str, Any],
    state_file: Path,
    metrics_listen: str = "127.0.0.1:10249",
    healthz_listen: str = "127.0.0.1:10256",
    timeout: float = 60.0,  # Python start-up under TCG on a loaded host took > 10 s
) -> FakeKubeProxy:
    """Run the fake server in netns via `ip netns exec`; return once it has written its pid."""
    state_file = Path(state_file)
    _write_atomically(state_file, {**DEFAULT_STATE, **state})
    pid_file = Path(f"{state_file}.pid")
    pid_file.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log_path = Path(f"{state_file}.log")
    # A file, not a pipe: nobody drains a pipe and a full one would block the server.
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                netns,
                sys.executable,
                "-m",
                "lab.fake_kube_proxy",
                "--state-file",
                str(state_file),
                "--metrics-listen",
                metrics_listen,
                "--healthz-listen",
                healthz_listen,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    deadline = time.monotonic() + timeout
    # The pid file is written only after both sockets are listening.
    while not pid_file.exists():
        if proc.poll() is not None:
            err = log_path.read_text(errors="replace")
            raise RuntimeError(f"fake kube-proxy exited early ({proc.returncode}): {err}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            err = log_path.read_text(errors="replace")[-1500:]
            raise TimeoutError(f"fake kube-proxy did not start listening in time; its log: {err}")
        time.sleep(0.05)
    return FakeKubeProxy(netns, state_file, proc)
