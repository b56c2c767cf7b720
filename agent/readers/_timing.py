"""The envelope every reader returns its data in."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from agent.snapshot import Reading

T = TypeVar("T")


class Absent(Exception):
    """The subsystem or endpoint is not there; the reading is a successful 'nothing'."""


def timed(read: Callable[[], T], empty: T) -> Reading[T]:
    """Run one reader; an expected failure becomes a status, never an exception."""
    start = time.perf_counter()
    try:
        data = read()
    except Absent as exc:
        return Reading("absent", empty, str(exc) or None, time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - a broken source must not break the others
        text = f"{type(exc).__name__}: {exc}"
        return Reading("error", empty, text, time.perf_counter() - start)
    return Reading("ok", data, None, time.perf_counter() - start)


_inflight: dict[str, threading.Thread] = {}
_inflight_lock = threading.Lock()


def bounded(name: str, read: Callable[[], Reading[T]], empty: T, budget: float) -> Reading[T]:
    """Run a reader with a time budget; past it the source is an error, not a hung scrape.

    A reader that overran is still running in its thread; the next collection does not start
    a second one beside it but reports the source as still busy.
    """
    with _inflight_lock:
        running = _inflight.get(name)
        if running is not None and running.is_alive():
            return Reading("error", empty, f"previous read still running after {budget:g}s")
    box: list[Reading[T]] = []
    thread = threading.Thread(target=lambda: box.append(read()), name=f"read-{name}", daemon=True)
    start = time.perf_counter()
    thread.start()
    thread.join(budget)
    if thread.is_alive():
        with _inflight_lock:
            _inflight[name] = thread
        return Reading("error", empty, f"no answer within {budget:g}s", time.perf_counter() - start)
    return box[0] if box else Reading("error", empty, "reader died", time.perf_counter() - start)
