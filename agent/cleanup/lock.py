"""One cleanup at a time on a node: an advisory lock on a file."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class LockError(Exception):
    """The lock file cannot be created or opened (a read-only or missing folder)."""


def reason(exc: OSError) -> str:
    """`Read-only file system: '/run/x'`, not `[Errno 30] ...`: one line an operator reads."""
    text = exc.strerror or str(exc)
    return f"{text}: '{exc.filename}'" if exc.filename else text


def _refuse_unless_own_file(fd: int, path: Path) -> None:
    """Closes `fd` and raises LockError unless it is a plain file with no other name: the
    lock is truncated and gets the PID, which must never land in a FIFO, a device, or a file
    reached through a hard link (O_NOFOLLOW does not see one)."""
    st = os.fstat(fd)
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = "is not a regular file"
    elif st.st_nlink != 1:
        why = f"has {st.st_nlink} hard links (another name for the same file)"
    if why is not None:
        os.close(fd)
        raise LockError(f"the lock file {path} {why}; point --lock-file at a plain file of its own")


@contextmanager
def exclusive(path: Path) -> Iterator[bool]:
    """Yields True when this process holds the lock, False when another one does.

    Raises LockError before anything is held when the file cannot be made.
    """
    # O_NOFOLLOW: a symlink at `path` (planted, or left by a mistake) is refused, never
    # followed: the target was truncated and overwritten with the PID.
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:  # the folder is made on first use (a tmpfs /run)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LockError(
                f"the lock file {path} is a symbolic link; refusing to follow it (remove it, "
                "or point --lock-file at a plain file)"
            ) from exc
        raise LockError(
            f"cannot create the lock file {path} ({reason(exc)}); point --lock-file at a "
            "writable folder"
        ) from exc
    _refuse_unless_own_file(fd, path)
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
