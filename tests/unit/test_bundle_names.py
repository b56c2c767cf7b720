"""Bundle folder names sort in the order the bundles were made, even within one second."""

from __future__ import annotations

import re
from pathlib import Path

from agent.cleanup.bundle import writing


def test_bundles_made_in_one_second_sort_in_the_order_they_were_made(tmp_path: Path) -> None:
    made = []
    for _ in range(5):
        with writing(tmp_path, "0" * 64) as w:
            w.write("note.txt", "x\n")
        assert w.folder is not None
        made.append(w.folder.name)
    assert sorted(p.name for p in tmp_path.iterdir()) == made
    assert len(set(made)) == 5
    assert all(re.fullmatch(r"\d{8}T\d{6}\.\d{6}Z-\d+", n) for n in made), made
