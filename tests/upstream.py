"""The upstream programs the tests run, built by the project (scripts/build-upstream) from their
published Go modules (upstream/<module>/go.mod, go.sum) into a cache outside the clone.

The tests never build: scripts/install-deps (so scripts/test) builds every one before a tier
runs, and in the VM the cache is the host's, read-only. A missing program is an error that
names the command that builds it, never a skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "scripts" / "build-upstream"
# The newest release the project tests (tests/realkp/nodes.py runs the older ones by version).
KUBE_PROXY_VERSION = "v1.37.2"


def upstream_binary(program: str, version: str) -> Path:
    """The built binary of `program` at `version`; RuntimeError (one line) if it is not built."""
    p = subprocess.run(
        [str(BUILD), "--path", program, version], capture_output=True, text=True, timeout=60
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip() or f"{BUILD} --path {program} {version} failed")
    return Path(p.stdout.strip())


def kube_proxy(option: str | None = None, version: str = KUBE_PROXY_VERSION) -> Path:
    """The kube-proxy to test: the option (a binary's path), else the project-built release
    `version`."""
    given = option
    if given:
        path = Path(given)
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"kube-proxy binary {path} is not executable")
        return path
    return upstream_binary("kube-proxy", version)
