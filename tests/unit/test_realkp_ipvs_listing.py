"""The real-kube-proxy tier's IPVS listing (tests/realkp/node.py, IPVSADM_SAVE) with a stand-in
`ipvsadm` on PATH: taken when two dumps in a row agree, refused loudly when none do, and,
inside state.read's one shell, never the end of the tools that follow it. (Its behaviour under
the kernel's real churn is tests/vm/test_ipvs_dump_churn.py's.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.realkp.node import IPVSADM_SAVE
from tests.realkp.state import parse_ipvs

FAKE = """#!/bin/sh
n=$(cat "$COUNTER" 2>/dev/null || echo 0); echo $((n + 1)) > "$COUNTER"
case "$MODE" in
flip) echo "-A -t 10.0.0.$((n % 2)):80 -s rr" ;;
esac
"""


def _run(tmp_path: Path, mode: str, script: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "ipvsadm").write_text(FAKE)
    (tmp_path / "ipvsadm").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "MODE": mode,
        "COUNTER": str(tmp_path / "n"),
    }
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)


def test_two_agreeing_dumps_are_the_listing(tmp_path: Path) -> None:
    p = _run(tmp_path, "empty", IPVSADM_SAVE)
    assert (p.returncode, p.stdout) == (0, "\n")
    assert (tmp_path / "n").read_text().strip() == "2"


def test_no_two_agreeing_dumps_fail_loudly_and_the_next_tool_still_runs(tmp_path: Path) -> None:
    p = _run(tmp_path, "flip", f"echo @@ipvs; {IPVSADM_SAVE}; echo @@link; echo lo")
    assert (tmp_path / "n").read_text().strip() == "12"
    assert p.stdout.endswith("@@link\nlo\n"), p.stdout
    assert "no two dumps in a row agreed" in p.stderr
    ipvs = p.stdout.split("@@ipvs\n", 1)[1].split("@@link", 1)[0]
    with pytest.raises(RuntimeError, match="no two dumps in a row agreed"):
        parse_ipvs(ipvs)
    alone = _run(tmp_path, "flip", IPVSADM_SAVE)
    assert alone.returncode == 3
