"""The re-check's window: change the node while `cleanup --apply` waits
between its backup and its re-check (the tests' hook --pause-before-execute, tests/agent_hooks.py), then judge the run."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab import build
from tests.conftest import AGENT_HOOKS
from tests.dumps import dump


def changed_during_the_pause(
    ns: str, tmp: Path, change: Callable[[], None], ipvs: bool = False
) -> tuple[Any, dict[str, list[str]]]:
    """Run `cleanup --apply`, make `change` once the backup is written (the re-check's window),
    and return the run with the node as the change left it."""
    cmd = [
        *build.in_ns(ns, *AGENT_HOOKS),
        "cleanup",
        "--apply",
        "--backup-dir",
        str(tmp / "b"),
        "--lock-file",
        str(tmp / "l"),
        "--pause-before-execute",
        "5",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    assert proc.stderr.readline().strip() == "re-checking the gate"  # plan + backup done
    change()
    changed = dump(ns, ipvs)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), changed


def one_more_line(before: dict[str, list[str]], after: dict[str, list[str]], where: str) -> str:
    """The single line `after` has beyond `before` (in `where` only); nothing else differs."""
    assert {k: v for k, v in after.items() if k != where} == {
        k: v for k, v in before.items() if k != where
    }
    added = [line for line in after[where] if line not in before[where]]
    assert len(added) == 1 and len(after[where]) == len(before[where]) + 1, added
    return added[0]


def refused_for(r: Any, what: str) -> None:
    assert r.returncode == 3, r.stdout + r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("ipvs-leftovers: refused: the node changed since its backup was read (")
    assert what in line, line
    assert line.endswith("(nothing was changed)")
    assert not any(o.startswith(("done ", "failed ")) for o in r.stdout.splitlines())
