"""Inputs refused at the door, end to end (issue 23 rows 14, 16 and item 6's TLS files): the
agent run as a user runs it, in a throwaway namespace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests.conftest import run_agent

pytestmark = pytest.mark.netns
CONFIRMED = {"mode": "nftables", "families": ["IPv4"], "last_sync_age": 2.0}


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def _rules(ns: str) -> list[str]:
    out = build.run(["ip", "netns", "exec", ns, "iptables-save"])
    return [line for line in out.splitlines() if not line.startswith("#")]


def test_the_trailing_underscore_variable_does_not_make_plain_cleanup_apply(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """Row 16: on a node where nftables mode is confirmed, `cleanup` with
    IPVS_LEFTOVERS_CLEANUP_APPLY_=1 in its environment applied (click named the variable after
    the parameter `apply_`). Now it only plans: no backup, nothing removed."""
    ns = netns()
    build.build(ns, realistic_node(nftables_table=True))
    before = _rules(ns)
    backups = tmp_path / "backups"
    with start_fake_kube_proxy(ns, CONFIRMED, tmp_path / "kp.json"):
        r = run_agent(
            ns,
            "cleanup",
            "--backup-dir",
            str(backups),
            "--lock-file",
            str(tmp_path / "lock"),
            env={"IPVS_LEFTOVERS_CLEANUP_APPLY_": "1"},
        )
    assert r.rc == 1, r.stderr  # leftovers present, nothing done
    assert "nftables mode confirmed: --apply would run this plan" in r.stdout
    assert not backups.exists() or not any(backups.iterdir())
    assert _rules(ns) == before


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """Row 14: `--lock-file` a symlink truncated its target and wrote the PID into it. Now the
    lock file is opened with O_NOFOLLOW: one line, exit 4, the target as it was."""
    target = tmp_path / "precious"
    target.write_text("operator's data\n")
    link = tmp_path / "cleanup.lock"
    link.symlink_to(target)
    r = run_agent(
        netns(), "cleanup", "--apply", "--lock-file", str(link), "--backup-dir", str(tmp_path)
    )
    assert r.rc == 4, (r.rc, r.stdout, r.stderr)
    line = _one_line(r.stderr)
    assert f"the lock file {link} is a symbolic link" in line and "nothing was changed" in line
    assert target.read_text() == "operator's data\n"
    assert link.is_symlink()
