"""One cleanup at a time on a node: an advisory lock on a file."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class LockError(Exception):
    """The lock file cannot be created or opened (a read-only or missing folder)."""


def reason(exc: OSError) -> str:
    """`Read-only file system: '/run/x'`, not `[Errno 30] ...`: one line an operator reads."""
    text = exc.strerror or str(exc)
    return f"{text}: '{exc.filename}'" if exc.filename else text


@contextmanager
def exclusive(path: Path) -> Iterator[bool]:
    """Yields True when this process holds the lock, False when another one does.

    Raises LockError before anything is held when the file cannot be made.
    """
    try:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:  # the folder is made on first use (a tmpfs /run)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise LockError(
            f"cannot create the lock file {path} ({reason(exc)}); point --lock-file at a "
            "writable folder"
        ) from exc
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
