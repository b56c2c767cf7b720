"""The real-kube-proxy tier's nodes share tool folders (tests/realkp/node.py); every node runs in a
thread of its own, so the folders must come out whole however many threads make them at once.

On a fresh clone `tool_dir` checked `link.exists()` and then created the link; two legacy nodes met there
and one died of FileExistsError, so the tier passed only when the threads happened not to meet.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from tests.realkp.node import path_without, tool_dir

THREADS = 16
ROUNDS = 20


def _race(work: Path, make: object) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def one() -> None:
        start.wait()
        try:
            make()  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - every failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_tool_dir_made_by_many_threads_at_once(tmp_path: Path) -> None:
    for i in range(ROUNDS):
        work = tmp_path / str(i)
        errors = _race(work, lambda w=work: tool_dir("legacy", w))
        assert errors == []
        d = work / "bin-legacy"
        assert sorted(os.listdir(d)) == [
            "ip6tables", "ip6tables-restore", "ip6tables-save",
            "iptables", "iptables-restore", "iptables-save",
        ]  # fmt: skip
        assert os.readlink(d / "iptables-restore") == "/usr/sbin/iptables-legacy-restore"
        assert [p.name for p in work.iterdir()] == ["bin-legacy"]  # no temporary left behind


def test_path_without_modprobe_made_by_many_threads_at_once(tmp_path: Path) -> None:
    expected = sorted(
        {p.name for src in (Path("/usr/sbin"), Path("/usr/bin")) for p in src.iterdir()}
        - {"modprobe"}
    )
    for i in range(3):
        work = tmp_path / str(i)
        errors = _race(work, lambda w=work: path_without("nft", w))
        assert errors == []
        assert sorted(os.listdir(work / "bin-no-modprobe")) == expected
        assert sorted(p.name for p in work.iterdir()) == ["bin-nft", "bin-no-modprobe"]
