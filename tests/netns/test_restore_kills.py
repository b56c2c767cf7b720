"""restore killed with SIGKILL at every step boundary: the next restore completes it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.dumps import dump
from tests.netns.restore_lab import Cleaned, cleaned
from tests.netns.test_cleanup import apply, kill_after_lines

pytestmark = pytest.mark.netns


# --- kill -9 at every step boundary of restore ----------------------------------------------------


def _kill_restore_after(c: Cleaned, steps: int) -> int:
    """restore (2 s between steps) killed with SIGKILL after `steps` "restored" lines."""
    args = ["restore", "--lock-file", str(c.tmp / "cleanup.lock"), "--step-delay", "2"]
    return kill_after_lines(c.ns, [*args, str(c.bundle)], "restored ", steps)


@pytest.mark.parametrize("size", [12, 40])
def test_restore_killed_at_every_step_boundary_is_completed_by_the_next(
    netns: Callable[[], str], tmp_path: Path, size: int
) -> None:
    """After a SIGKILL no undo runs: the node is part-restored, the lock is free again, and the
    next restore of the same bundle re-creates exactly what is missing; a cleanup instead
    converges to the cleaned node."""
    with cleaned(netns, tmp_path, n_services=size) as c:
        first = c.restore()
        assert first.rc == 0, first.stderr  # type: ignore[attr-defined]
        lines = first.stdout.splitlines()  # type: ignore[attr-defined]
        phases = sum(ln.startswith("restored ") and "re-created" not in ln for ln in lines)
        assert phases >= 4  # sets, both families' tables, sysctls
        for k in range(1, phases):
            assert apply(c.ns, c.tmp, "--reset-arp-sysctls").rc == 0
            assert dump(c.ns) == c.after
            c.bundle = sorted(p for p in (c.tmp / "backups").iterdir())[-1]
            assert _kill_restore_after(c, k) == k
            middle = (dump(c.ns), c.arp())
            ends = ((c.before, ("1", "2")), (c.after, ("0", "0")))
            assert middle not in ends, f"killed after step {k}: the node is not half-way"
            r = c.restore()
            assert r.rc == 0, (k, r.stderr)  # type: ignore[attr-defined]
            assert dump(c.ns) == c.before and c.arp() == ("1", "2"), f"after a kill at step {k}"
