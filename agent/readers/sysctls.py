"""Kernel release, loaded subsystems and the sysctls ipvs mode sets (this namespace's /proc/sys)."""

from __future__ import annotations

import os

from agent.readers._timing import timed
from agent.readers.kernel import SUBSYSTEMS, PathLike, Presence, presence, read_text
from agent.snapshot import Kernel, Reading

WATCHED = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/arp_ignore",
    "net/ipv4/conf/all/arp_announce",
)
IPVS_DIR = "net/ipv4/vs"  # exists only while ip_vs is loaded


def _read(root: PathLike) -> Kernel:
    values: dict[str, str] = {}
    for name in WATCHED:
        path = os.path.join(root, name)
        if os.path.exists(path):
            values[name.replace("/", ".")] = read_text(path).strip()
    vs = os.path.join(root, IPVS_DIR)
    if os.path.isdir(vs):
        for entry in sorted(os.listdir(vs)):
            try:
                values[f"net.ipv4.vs.{entry}"] = read_text(os.path.join(vs, entry)).strip()
            except OSError:
                continue  # some entries are write-only or need more privilege
    loaded = {Presence.LOADED: True, Presence.ABSENT: False, Presence.NO_MODULES: None}
    subsystems = {name: loaded[presence(name)] for name in SUBSYSTEMS}
    return Kernel(release=os.uname().release, sysctls=values, subsystems=subsystems)


def empty() -> Kernel:
    return Kernel(release=os.uname().release)


def read(root: PathLike = "/proc/sys") -> Reading[Kernel]:
    return timed(lambda: _read(root), empty())
