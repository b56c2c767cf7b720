"""What the running kernel has, found without asking it to load anything
(docs/contract.md#safety-rules).

Opening a netlink family or an x_tables table for a subsystem the kernel has as an unloaded
module makes the kernel load it. So before a reader opens anything it asks here, and here only
files are read: /proc/modules, /sys/module, /proc/net and modules.builtin.
"""

from __future__ import annotations

import os
from enum import Enum

PathLike = str | os.PathLike[str]

# Files whose presence proves a subsystem is in the kernel now, in this network namespace.
_PROC_HINTS: dict[str, tuple[str, ...]] = {
    "ip_vs": ("/proc/net/ip_vs",),
    "ip_tables": ("/proc/net/ip_tables_names",),
    "ip6_tables": ("/proc/net/ip6_tables_names",),
}

SUBSYSTEMS = ("ip_vs", "ip_set", "nf_tables", "ip_tables", "ip6_tables")


class Presence(Enum):
    LOADED = "loaded"  # module loaded, or built in and visible
    NO_MODULES = "no-modules"  # kernel without module support: opening cannot load anything
    ABSENT = "absent"  # not loaded; opening it could load it


def read_text(path: PathLike) -> str:
    """A file's text. Not pathlib: importing it (with fnmatch, ntpath and urllib.parse) was
    a tenth of a cold audit's start-up on the benchmark's emulator."""
    with open(path) as f:
        return f.read()


def _loaded_modules(root: PathLike) -> set[str] | None:
    try:
        text = read_text(os.path.join(root, "proc/modules"))
    except FileNotFoundError:
        return None
    return {line.split(" ", 1)[0] for line in text.splitlines() if line}


def _builtin(root: PathLike, name: str, release: str) -> bool:
    try:
        text = read_text(os.path.join(root, f"lib/modules/{release}/modules.builtin"))
    except OSError:
        return False
    return any(line.rsplit("/", 1)[-1] == f"{name}.ko" for line in text.splitlines())


def presence(name: str, root: PathLike = "/") -> Presence:
    """Whether the kernel has subsystem `name` loaded, without loading it."""
    for hint in _PROC_HINTS.get(name, ()):
        if os.path.exists(os.path.join(root, hint.lstrip("/"))):
            return Presence.LOADED
    if os.path.exists(os.path.join(root, "sys/module", name)):
        return Presence.LOADED
    modules = _loaded_modules(root)
    if modules is None:
        return Presence.NO_MODULES
    if name in modules or _builtin(root, name, os.uname().release):
        return Presence.LOADED
    return Presence.ABSENT


def loaded_modules() -> frozenset[str]:
    """The module list as it is now; tests compare it before and after a read."""
    return frozenset(_loaded_modules("/") or ())
