"""A tool past its deadline is given up at the deadline, even when a child it started keeps its
pipes open (a shell script's `sleep`): reading the pipes to their end after the kill waited for
that child, so serve's scrapes saw iptables-nft-save 'still running' for 30 s."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.readers import tools


def test_a_tool_whose_child_holds_its_pipes_ends_at_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "iptables-nft-save"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    start = time.monotonic()
    with pytest.raises(tools.ToolError, match="did not finish within 1s"):
        tools.run(["iptables-nft-save"], timeout=1)
    assert time.monotonic() - start < 5
