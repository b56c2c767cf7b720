"""Scrapes share one collection per interval, and a new one never overlaps the old in memory."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from agent.views.metrics import SharedCollection


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
