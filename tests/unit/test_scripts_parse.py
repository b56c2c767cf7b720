"""Every shell script the README and CI run parses, and no tracked file keeps a merge's
conflict markers: a merge once left both sides of a list in scripts/build-upstream, which
only the full run's background build would have met, half an hour in."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in [*(REPO / "scripts").iterdir(), REPO / ".ci" / "run"] if p.is_file())
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)


def _interpreter(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    return first.rsplit("/", 1)[-1].split()[-1]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_script_parses(script: Path) -> None:
    kind = _interpreter(script)
    if kind == "bash":
        p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    else:
        assert kind.startswith("python"), f"{script}: an interpreter this test does not know"
        ast.parse(script.read_text(), str(script))


def test_no_conflict_markers() -> None:
    tracked = (
        subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    found = []
    for name in filter(None, tracked):
        path = REPO / name
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        found += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}" for m in MARKER.finditer(text)]
    assert found == []
