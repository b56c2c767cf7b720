"""Scrapes share one collection per interval, and a new one never overlaps the old in memory."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import pytest

from agent.views.metrics import SharedCollection, scrape_deadline


class Reading:
    """Stands in for a Collection: only identity and liveness matter here."""


def test_the_previous_collection_is_released_before_the_next_is_made() -> None:
    made: list[weakref.ref[Any]] = []
    alive_while_collecting: list[bool] = []

    def collect() -> Any:
        gc.collect()
        alive_while_collecting.append(any(r() is not None for r in made))
        reading = Reading()
        made.append(weakref.ref(reading))
        return reading

    shared = SharedCollection(collect, min_interval=0.0)
    first = shared.get()
    del first
    second = shared.get()
    assert alive_while_collecting == [False, False]
    assert shared.count == 2
    assert made[1]() is second


def test_within_the_interval_every_scrape_gets_the_same_collection() -> None:
    shared = SharedCollection(Reading, min_interval=3600.0)
    assert shared.get() is shared.get()
    assert shared.count == 1


def test_a_scrape_whose_deadline_passes_first_gets_its_own_answer_never_kept() -> None:
    """The collection is not cut short by the hurried scrape: it goes on, and the next
    scrape (or auto-cleanup, which has no deadline) gets it whole."""
    release = threading.Event()
    whole, cut = Reading(), Reading()
    progress_seen: list[object] = []

    def collect() -> Any:
        release.wait(10)
        return whole

    def so_far(progress: Any) -> Any:
        progress_seen.append(progress)
        return cut

    shared = SharedCollection(collect, min_interval=3600.0, so_far=so_far)
    with scrape_deadline(time.monotonic() + 0.05):
        hurried = shared.get()
    assert hurried is cut and len(progress_seen) == 1 and shared.count == 0
    release.set()
    assert shared.get() is whole  # no deadline: waits for the collection under way
    with scrape_deadline(time.monotonic() + 0.05):
        assert shared.get() is whole  # kept for the interval: even a hurried scrape has it
    assert shared.count == 1 and len(progress_seen) == 1


def test_scrapes_during_a_collection_wait_for_it_and_none_starts_another() -> None:
    release = threading.Event()
    calls: list[int] = []

    def collect() -> Any:
        calls.append(1)
        release.wait(10)
        return Reading()

    shared = SharedCollection(collect, min_interval=0.0)
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(shared.get())) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    release.set()
    for t in threads:
        t.join(10)
    assert len(calls) == 1 and len(got) == 8 and len({id(g) for g in got}) == 1


def test_without_so_far_a_passed_deadline_is_a_timeout_error() -> None:
    release = threading.Event()
    shared = SharedCollection(lambda: release.wait(10) and Reading(), min_interval=0.0)
    with scrape_deadline(time.monotonic() + 0.05), pytest.raises(TimeoutError):
        shared.get()
    release.set()
