"""The envelope every reader returns its data in."""

from __future__ import annotations

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
