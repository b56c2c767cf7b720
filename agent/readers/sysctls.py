"""Kernel release, loaded subsystems and the sysctls ipvs mode sets (this namespace's /proc/sys)."""

from __future__ import annotations

import os
from pathlib import Path

from agent.readers._timing import timed
from agent.readers.kernel import SUBSYSTEMS, Presence, presence
from agent.snapshot import Kernel, Reading

WATCHED = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/arp_ignore",
    "net/ipv4/conf/all/arp_announce",
)
IPVS_DIR = "net/ipv4/vs"  # exists only while ip_vs is loaded


def _read(root: Path) -> Kernel:
    values: dict[str, str] = {}
    for name in WATCHED:
        path = root / name
        if path.exists():
            values[name.replace("/", ".")] = path.read_text().strip()
    vs = root / IPVS_DIR
    if vs.is_dir():
        for path in sorted(vs.iterdir()):
            try:
                values[f"net.ipv4.vs.{path.name}"] = path.read_text().strip()
            except OSError:
                continue  # some entries are write-only or need more privilege
    loaded = {Presence.LOADED: True, Presence.ABSENT: False, Presence.NO_MODULES: None}
    subsystems = {name: loaded[presence(name)] for name in SUBSYSTEMS}
    return Kernel(release=os.uname().release, sysctls=values, subsystems=subsystems)


def empty() -> Kernel:
    return Kernel(release=os.uname().release)


def read(root: Path = Path("/proc/sys")) -> Reading[Kernel]:
    return timed(lambda: _read(root), empty())
