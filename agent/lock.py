"""One cleanup at a time on a node: an advisory lock on a file."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Unavailable(Exception):
    """The lock file cannot be made or opened (a read-only root without the host's folder)."""


@contextmanager
def exclusive(path: Path) -> Iterator[bool]:
    """Yields True when this process holds the lock, False when another one does; raises
    Unavailable, before anything else happens, when the lock file cannot be opened."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise Unavailable(f"cannot open the lock {path}: {exc.strerror or exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield True
    finally:
        os.close(fd)
