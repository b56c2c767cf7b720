"""Logs as text or as one JSON object a line (--log-format)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
                "level": record.levelname.lower(),
                "logger": record.name,
                "msg": record.getMessage(),
            }
        )


def setup(fmt: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    )
    root = logging.getLogger("ipvs_leftovers")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


class BatchedLines:
    """Lines to a stream, flushed at most every `interval` seconds and on flush().

    A flush per line was 15 s of an 11,000-step cleanup in the benchmark's VM; a Job's
    log still sees every line within `interval`.
    """

    def __init__(self, stream: TextIO, interval: float = 0.25) -> None:
        self._stream = stream
        self._interval = interval
        self._last = time.monotonic()

    def __call__(self, line: str) -> None:
        self._stream.write(line + "\n")
        now = time.monotonic()
        if now - self._last >= self._interval:
            self.flush()

    def flush(self) -> None:
        self._stream.flush()
        self._last = time.monotonic()
