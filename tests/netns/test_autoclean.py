"""serve --auto-cleanup on lab nodes: acts only after the hold-down, never when not confirmed."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests.dumps import dump, minus_leftovers
from tests.serving import scrape, serving

pytestmark = pytest.mark.netns
URL = "http://127.0.0.1:9437/metrics"


def _auto(tmp: Path, hold: str) -> tuple[str, ...]:
    return (
        "--auto-cleanup",
        "--auto-cleanup-hold-down",
        hold,
        "--auto-cleanup-interval",
        "0.5",
        "--min-interval",
        "0",
        "--backup-dir",
        str(tmp / "b"),
        "--lock-file",
        str(tmp / "l"),
    )


def _wait(ns: str, key: str, value: float, seconds: float) -> dict[str, float]:
    deadline = time.monotonic() + seconds
    while True:
        samples = scrape(ns, URL)["samples"]
        if samples.get(key) == value or time.monotonic() > deadline:
            return samples
        time.sleep(0.5)


def test_cleans_after_the_hold_down_and_reports_it(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = netns()
    build.build(ns, realistic_node(third_party=True, nftables_table=True))
    before = dump(ns)
    with (
        start_fake_kube_proxy(ns, {"mode": "nftables", "families": ["IPv4"]}, tmp_path / "kp.json"),
        serving(ns, *_auto(tmp_path, "4s")),
    ):
        early = scrape(ns, URL)["samples"]
        assert early["ipvs_leftovers_stale"] == 1  # not yet: hold-down of 4 s
        samples = _wait(ns, 'ipvs_leftovers_cleanup_runs_total{outcome="clean"}', 1, 60)
    assert samples['ipvs_leftovers_cleanup_runs_total{outcome="clean"}'] == 1
    assert samples['ipvs_leftovers_cleanup_removed{kind="destroy-ipset"}'] == 17
    assert samples['ipvs_leftovers_cleanup_removed{kind="iptables-table"}'] == 2
    assert samples["ipvs_leftovers_cleanup_failures"] == 0
    assert samples["ipvs_leftovers_cleanup_last_run_timestamp_seconds"] > 0
    assert dump(ns) == minus_leftovers(before)
    assert len(list((tmp_path / "b").iterdir())) == 1


@pytest.mark.parametrize("state", [{"mode": "ipvs"}, {"mode": "nftables", "healthy": False}])
def test_never_acts_when_nftables_mode_is_not_confirmed(
    netns: Callable[[], str], tmp_path: Path, state: dict[str, object]
) -> None:
    ns = netns()
    build.build(ns, realistic_node(nftables_table=True))
    before = dump(ns)
    with (
        start_fake_kube_proxy(ns, {"families": ["IPv4"], **state}, tmp_path / "kp.json"),
        serving(ns, *_auto(tmp_path, "1s")),
    ):
        time.sleep(4)
        samples = scrape(ns, URL)["samples"]
    assert samples["ipvs_leftovers_cleanup_last_run_timestamp_seconds"] == 0
    assert samples["ipvs_leftovers_nftables_confirmed_streak_seconds"] == 0
    assert dump(ns) == before


def test_off_by_default(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = netns()
    build.build(ns, realistic_node(nftables_table=True))
    before = dump(ns)
    with (
        start_fake_kube_proxy(ns, {"mode": "nftables", "families": ["IPv4"]}, tmp_path / "kp.json"),
        serving(ns, "--min-interval", "0"),
    ):
        time.sleep(2)
        samples = scrape(ns, URL)["samples"]
    assert "ipvs_leftovers_cleanup_runs_total" not in str(samples)
    assert dump(ns) == before


def test_an_unwritable_lock_folder_is_logged_each_run_and_serving_goes_on(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """The lock path runs through a regular file: each run logs one line and counts `error`;
    no traceback, no exception escaping the tick, and /metrics keeps answering."""
    ns = netns()
    build.build(ns, realistic_node(nftables_table=True))
    before = dump(ns)
    (tmp_path / "file").write_text("")
    args = list(_auto(tmp_path, "1s"))
    args[args.index("--lock-file") + 1] = str(tmp_path / "file" / "cleanup.lock")
    with (
        start_fake_kube_proxy(ns, {"mode": "nftables", "families": ["IPv4"]}, tmp_path / "kp.json"),
        serving(ns, *args) as proc,
    ):
        samples = _wait(ns, 'ipvs_leftovers_cleanup_runs_total{outcome="error"}', 2, 60)
        assert samples['ipvs_leftovers_cleanup_runs_total{outcome="error"}'] >= 2
        assert samples["ipvs_leftovers_stale"] == 1  # still serving the node's state
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "cannot create the lock file" in line]
    assert len(errors) >= 2
    assert all(
        f"cannot create the lock file {tmp_path / 'file' / 'cleanup.lock'} (Not a directory" in line
        for line in errors
    )
    assert dump(ns) == before


def _auto_state(tmp: Path, hold: str, interval: str) -> list[str]:
    args = list(_auto(tmp, hold))
    args[args.index("--auto-cleanup-interval") + 1] = interval
    return [*args, "--auto-cleanup-state", str(tmp / "run" / "auto-cleanup.json")]


def _streak(ns: str) -> float:
    return scrape(ns, URL)["samples"]["ipvs_leftovers_nftables_confirmed_streak_seconds"]


@pytest.mark.alone  # the restart must take less than the 3 s gap that keeps the streak
@pytest.mark.parametrize("file", ["kept", "garbled"])
def test_the_hold_down_survives_a_restart_and_a_garbled_file_starts_it_over(
    netns: Callable[[], str], tmp_path: Path, file: str
) -> None:
    """serve is stopped part-way through the hold-down and started again: with its state file
    it carries the streak on (and cleans before a fresh hold-down could have passed); with the
    file garbled between the two runs it starts over, and nothing is cleaned early."""
    ns = netns()
    build.build(ns, realistic_node(nftables_table=True))
    before = dump(ns)
    args = _auto_state(tmp_path, "14s", "1")  # a gap of up to 3 s keeps the streak
    state = tmp_path / "run" / "auto-cleanup.json"
    with start_fake_kube_proxy(
        ns, {"mode": "nftables", "families": ["IPv4"]}, tmp_path / "kp.json"
    ):
        with serving(ns, *args):
            deadline = time.monotonic() + 60
            while _streak(ns) < 6 and time.monotonic() < deadline:
                time.sleep(0.5)
        first = _streak_from(state)
        assert first is not None and first > 0
        if file == "garbled":
            state.write_bytes(state.read_bytes()[:25])  # a write cut short
        with serving(ns, *args):
            restarted = time.monotonic()
            time.sleep(1.5)  # one tick after the restart
            carried = _streak(ns)
            if file == "kept":
                assert carried >= 6
                samples = _wait(ns, 'ipvs_leftovers_cleanup_runs_total{outcome="clean"}', 1, 60)
                assert samples['ipvs_leftovers_cleanup_runs_total{outcome="clean"}'] == 1
                assert time.monotonic() - restarted < 14  # sooner than a fresh hold-down
                assert dump(ns) == minus_leftovers(before)
            else:
                assert carried < 3
                time.sleep(6)  # past where the kept streak would have cleaned
                samples = scrape(ns, URL)["samples"]
                assert samples["ipvs_leftovers_cleanup_last_run_timestamp_seconds"] == 0
                assert dump(ns) == before


def _streak_from(path: Path) -> float | None:
    import json

    doc = json.loads(path.read_text())
    return None if doc["since"] is None else doc["last_seen"] - doc["since"]
