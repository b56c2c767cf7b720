"""The backup bundle's container: written whole or not at all, and read back only when it proves
itself (docs/bundle.md).

A bundle is written into `<base>/.partial-<name>` and renamed to `<base>/<name>` once every file
and `manifest.json` are on disk, so a cleanup killed or out of space during its backup never
leaves a folder that `restore` accepts. The manifest holds each file's SHA-256, the node's
identity, the agent version and the format; `open_verified` refuses a folder that is not
root-owned, is group- or world-writable, holds a symlink, a file more or less than the manifest
lists, a file whose digest differs, or one written on another node.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from agent import __version__

MANIFEST = "manifest.json"
FORMAT = "ipvs-leftovers-bundle/1"
PARTIAL_PREFIX = ".partial-"
# The most a bundle file may hold: a 20,000-Service node's largest file is ~4 MB.
MAX_FILE_BYTES = 256 * 1024 * 1024
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class BundleError(ValueError):
    """The folder is not a complete, unaltered bundle of this node; nothing was changed."""


def node_identity() -> dict[str, str]:
    """The node a bundle belongs to: its hostname (a hostNetwork pod's hostname is the node's;
    a machine-id would differ between the node and the agent's container)."""
    return {"hostname": socket.gethostname()}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class BundleWriter:
    """Files written into the partial folder, each hashed as it is written."""

    def __init__(self, partial: Path) -> None:
        self.partial = partial
        self.files: dict[str, str] = {}
        self.folder: Path | None = None  # the bundle's path, once complete

    def write(self, name: str, text: str) -> None:
        data = text.encode()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
        fd = os.open(self.partial / name, flags, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        self.files[name] = _digest(data)


def _remove_partial(partial: Path) -> None:
    """Best effort: a partial folder holds only files this process wrote."""
    try:
        for entry in os.listdir(partial):
            os.unlink(partial / entry)
        os.rmdir(partial)
    except OSError:
        pass


@contextmanager
def writing(base: Path, plan_digest: str) -> Iterator[BundleWriter]:
    """Yields a writer; on a normal exit writes the manifest and renames the folder into place
    (the final path is then `writer.folder`). On any exception the partial folder is removed."""
    # Microseconds, so that names sort in the order the bundles were made: two cleanups in one
    # second (a retry, a Job and a hand run) otherwise sorted by process id, and "the newest
    # bundle" picked by name could be the older one.
    now = datetime.now(UTC)
    name = f"{now.strftime('%Y%m%dT%H%M%S.%fZ')}-{os.getpid()}"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = base / f"{PARTIAL_PREFIX}{name}"
    os.mkdir(partial, 0o700)
    writer = BundleWriter(partial)
    try:
        yield writer
        manifest = {
            "format": FORMAT,
            "agent_version": __version__,
            "node": node_identity(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "plan_sha256": plan_digest,
            "files": dict(sorted(writer.files.items())),
        }
        writer.write(MANIFEST, json.dumps(manifest, indent=2) + "\n")
        final = base / name
        os.rename(partial, final)
        writer.folder = final
        dir_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        _remove_partial(partial)
        raise


def _safely_owned(st: os.stat_result, what: str) -> None:
    if st.st_uid != 0 and st.st_uid != os.geteuid():
        raise BundleError(f"{what} is owned by uid {st.st_uid}, not root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise BundleError(f"{what} is group- or world-writable ({stat.filemode(st.st_mode)})")


def _read_file(dir_fd: int, folder: Path, name: str) -> bytes:
    where = f"{folder / name}"
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the name is a symlink
            raise BundleError(f"{where} is a symlink") from exc
        raise BundleError(f"cannot open {where}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"{where} is not a regular file")
        _safely_owned(st, where)
        if st.st_size > MAX_FILE_BYTES:
            raise BundleError(f"{where} is larger than {MAX_FILE_BYTES} bytes")
        chunks = []
        left = MAX_FILE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > MAX_FILE_BYTES:
            raise BundleError(f"{where} is larger than {MAX_FILE_BYTES} bytes")
        return data
    finally:
        os.close(fd)


def _manifest(raw: bytes, folder: Path) -> dict[str, object]:
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise BundleError(f"{folder / MANIFEST} is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BundleError(f"{folder / MANIFEST} is not a {FORMAT} manifest")
    files = doc.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise BundleError(f"{folder / MANIFEST}: 'files' must map names to SHA-256 digests")
    if not isinstance(doc.get("node"), dict):
        raise BundleError(f"{folder / MANIFEST}: 'node' is missing")
    return doc


def open_verified(folder: Path, from_other_node: bool = False) -> dict[str, bytes]:
    """Every file the manifest lists, read once through no-follow opens and checked against its
    digest; raises BundleError naming the first thing wrong. The manifest itself is not
    returned."""
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(folder):
            raise BundleError(f"{folder} is a symlink; give the bundle's real path") from exc
        raise BundleError(f"cannot open {folder}: {exc.strerror}") from exc
    try:
        _safely_owned(os.fstat(dir_fd), str(folder))
        present = set(os.listdir(dir_fd))
        if MANIFEST not in present:
            why = "the backup did not finish" if folder.name.startswith(PARTIAL_PREFIX) else ""
            raise BundleError(
                f"{folder} has no {MANIFEST}: not a complete bundle written by cleanup --apply"
                + (f" ({why})" if why else "")
            )
        doc = _manifest(_read_file(dir_fd, folder, MANIFEST), folder)
        files: dict[str, str] = doc["files"]  # type: ignore[assignment]
        listed = set(files) | {MANIFEST}
        if present - listed:
            raise BundleError(
                f"{folder} holds files its manifest does not list: "
                f"{', '.join(sorted(present - listed))}"
            )
        if listed - present:
            raise BundleError(f"{folder} is missing {', '.join(sorted(listed - present))}")
        node = doc["node"]
        here = node_identity()
        if node != here and not from_other_node:
            written_on = node.get("hostname") if isinstance(node, dict) else None
            raise BundleError(
                f"{folder} was written on {written_on!r}, this node is "
                f"{here['hostname']!r}; pass --from-other-node to restore it here anyway"
            )
        out: dict[str, bytes] = {}
        for name in sorted(files):
            data = _read_file(dir_fd, folder, name)
            if _digest(data) != files[name]:
                raise BundleError(f"{folder / name} was altered or truncated (SHA-256 differs)")
            out[name] = data
        if doc.get("plan_sha256") != _digest(out.get("plan.json", b"")):
            raise BundleError(f"{folder / MANIFEST}: plan_sha256 does not match plan.json")
        return out
    finally:
        os.close(dir_fd)
