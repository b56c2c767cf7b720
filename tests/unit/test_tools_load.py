"""tools.load: a loading tool is given up when it stops taking its input, never merely because
its input is large and it is slow (real processes, shell scripts on a private PATH)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agent.readers import tools


def _tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, script: str) -> None:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    os.chmod(path, 0o755)
    monkeypatch.setenv("PATH", str(tmp_path))


def test_a_slow_tool_that_keeps_reading_finishes_past_the_stall_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 600 lines of 100 bytes, one every 0.01 s or more: 6 s in all, against a 3 s stall
    # allowance (a one-page pipe holds 40 lines: 3 s for them leaves room for a loaded
    # machine); the tool's progress shows in what it takes of its input
    _tool(tmp_path, monkeypatch, "slow", 'while read -r l; do sleep 0.01; echo "$l"; done')
    text = "".join(f"{i:099d}\n" for i in range(600))
    seen: list[float] = []
    started = time.monotonic()
    out = tools.load(["slow"], text, stall=3.0, progress=lambda s, fed: seen.append(fed))
    assert out == text and time.monotonic() - started > 5
    assert seen and all(0 < fed <= 1 for fed in seen)  # reported while it ran


def test_a_tool_that_stops_reading_is_given_up_at_the_stall_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tool(tmp_path, monkeypatch, "stuck", "read -r l; sleep 60")
    started = time.monotonic()
    with pytest.raises(tools.ToolError, match="stuck stalled: it took"):
        tools.load(["stuck"], "line\n" * 200_000, stall=1.0)
    assert time.monotonic() - started < 10


def test_a_tool_that_never_exits_after_its_input_is_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tool(tmp_path, monkeypatch, "hang", "cat >/dev/null; sleep 60")
    started = time.monotonic()
    with pytest.raises(tools.ToolError, match="applied nothing more"):
        tools.load(["hang"], "a\nb\n", stall=1.0)
    assert time.monotonic() - started < 10


def test_a_tool_that_fails_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tool(tmp_path, monkeypatch, "bad", "echo 'line 2: no such set' >&2; exit 1")
    with pytest.raises(tools.ToolError, match="bad exited 1: line 2: no such set"):
        tools.load(["bad"], "x\n" * 100_000, stall=5.0)
