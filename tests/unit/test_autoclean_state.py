"""The auto-cleanup hold-down kept on the node across agent restarts: a good file carries the
streak on; any bad file starts it over (waits longer, never acts earlier)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agent.cleanup import autoclean
from agent.cleanup.autoclean import BadState, Streak, load_streak, parse_state, save_streak

NOW = 1_800_000_000.0
BOOT = "0b1e8c8e-6d1e-4d0c-9f43-5d3c2c1a0b9e"


@pytest.fixture(autouse=True)
def boot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(autoclean, "boot_id", lambda: BOOT)


def doc(**kw: Any) -> bytes:
    d: dict[str, Any] = {"version": 1, "boot_id": BOOT, "since": NOW - 3600, "last_seen": NOW - 30}
    d.update(kw)
    return json.dumps(d).encode()


def test_a_saved_streak_is_read_back_and_goes_on_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "auto-cleanup.json"
    s = Streak(hold_down=7200, max_gap=180)
    for t in [*range(-3600, -30, 60), -30]:
        s.observe(True, NOW + t)
    save_streak(path, s)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    back = load_streak(path, 7200, 180, now=NOW)
    assert (back.since, back.last_seen) == (NOW - 3600, NOW - 30)
    back.observe(True, NOW)  # 30 s after the last observation: the streak holds
    assert back.seconds(NOW) == 3600 and not back.ripe(NOW)
    back.observe(True, NOW + 3600)
    assert not back.ripe(NOW + 3600)  # but a gap longer than max_gap breaks it, as before
    assert back.since == NOW + 3600


def test_a_restart_after_the_hold_down_acts_at_once_only_with_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(doc(since=NOW - 90000))
    path.chmod(0o600)
    s = load_streak(path, 86400, 180, now=NOW)
    s.observe(True, NOW)
    assert s.ripe(NOW)


def test_a_saved_no_streak_is_no_streak(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    s = Streak(100, 30)
    s.observe(True, NOW - 10)
    s.restart()
    save_streak(path, s)
    assert json.loads(path.read_text())["since"] is None
    assert load_streak(path, 100, 30, now=NOW).since is None


BAD = {
    "empty": b"",
    "truncated": doc()[:40],
    "not JSON": b"\x00\xff garbage",
    "a list": b"[1, 2]",
    "an extra key": doc(extra=1),
    "a missing key": json.dumps({"version": 1, "boot_id": BOOT, "since": NOW}).encode(),
    "another version": doc(version=2),
    "another boot": doc(boot_id="something-else"),
    "since a string": doc(since="yesterday"),
    "since a bool": doc(since=True),
    "since negative": doc(since=-5),
    "since zero": doc(since=0),
    "since huge exponent": b'{"version":1,"boot_id":"'
    + BOOT.encode()
    + b'","since":1e999,"last_seen":1}',
    "since NaN": b'{"version":1,"boot_id":"' + BOOT.encode() + b'","since":NaN,"last_seen":1}',
    "last_seen in the future": doc(last_seen=NOW + 3600),
    "since after last_seen": doc(since=NOW - 10, last_seen=NOW - 20),
    "last_seen null": doc(last_seen=None),
    "too large": doc(boot_id=BOOT + " " * 5000),
}


@pytest.mark.parametrize("why", sorted(BAD))
def test_a_bad_file_starts_the_hold_down_over(
    tmp_path: Path, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(BAD[why])
    path.chmod(0o600)
    s = load_streak(path, 86400, 180, now=NOW)
    assert (s.since, s.last_seen) == (None, None)
    s.observe(True, NOW)
    assert not s.ripe(NOW + 86399)  # a whole hold-down from now, never earlier
    assert "starts over" in caplog.text and "\n" not in caplog.text.strip()


def test_the_checks_name_what_failed() -> None:
    with pytest.raises(BadState, match="before the node last booted"):
        parse_state(doc(boot_id="x"), NOW, BOOT)
    with pytest.raises(BadState, match="future"):
        parse_state(doc(last_seen=NOW + 60), NOW, BOOT)
    assert parse_state(doc(last_seen=NOW + 2), NOW, BOOT) == (NOW - 3600, NOW + 2)  # skew
    with pytest.raises(BadState, match="before the node last booted"):
        parse_state(doc(boot_id=""), NOW, "")  # no boot id to compare: never trusted


def test_a_symlink_a_folder_or_a_file_others_can_write_is_not_trusted(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_bytes(doc(since=NOW - 90000))
    good.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(good)
    folder = tmp_path / "folder.json"
    folder.mkdir()
    shared = tmp_path / "shared.json"
    shared.write_bytes(doc(since=NOW - 90000))
    shared.chmod(0o666)
    for path in (link, folder, shared):
        assert load_streak(path, 86400, 180, now=NOW).since is None, path
    assert load_streak(good, 86400, 180, now=NOW).since == NOW - 90000


def test_saving_replaces_a_planted_symlink_instead_of_writing_through_it(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep")
    path = tmp_path / "run" / "auto-cleanup.json"  # the folder is made on first use
    s = Streak(100, 30)
    s.observe(True, NOW)
    save_streak(path, s)
    path.unlink()
    path.symlink_to(target)
    save_streak(path, s)
    assert target.read_text() == "keep"
    assert not path.is_symlink() and json.loads(path.read_text())["since"] == NOW
    assert [p.name for p in path.parent.iterdir()] == ["auto-cleanup.json"]


def test_the_run_restarts_the_saved_streak_before_it_starts(tmp_path: Path) -> None:
    """An agent killed in the middle of a run must not run again the moment it is back."""
    from types import SimpleNamespace

    from agent.cleanup import procedure

    path = tmp_path / "s.json"
    seen: list[Any] = []

    def apply(*_: Any) -> Any:
        seen.append(json.loads(path.read_text()))
        raise procedure.CleanupError("stop here")

    col = SimpleNamespace(
        classification=SimpleNamespace(
            mode=SimpleNamespace(nftables_confirmed=True), removable=[object()]
        )
    )
    auto = autoclean.AutoCleanup(
        observe=lambda: col,  # type: ignore[arg-type,return-value]
        fresh=lambda: col,  # type: ignore[arg-type,return-value]
        settings=procedure.Settings(backup_dir=tmp_path / "b", lock_file=tmp_path / "l"),
        streak=Streak(hold_down=10, max_gap=30, since=NOW - 20, last_seen=NOW - 5),
        interval=1,
        state=path,
    )
    orig = procedure.apply
    procedure.apply = apply  # type: ignore[assignment]
    try:
        auto.tick(now=NOW)
    finally:
        procedure.apply = orig  # type: ignore[assignment]
    assert seen == [{"version": 1, "boot_id": BOOT, "since": None, "last_seen": NOW}]
    assert auto.runs == {"error": 1}
    assert os.path.exists(path)
