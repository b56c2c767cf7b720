"""Kernel release and the sysctls ipvs mode sets (read from /proc/sys of this namespace)."""

from __future__ import annotations

import os
from pathlib import Path

from agent.readers._timing import timed
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
    return Kernel(release=os.uname().release, sysctls=values)


def read(root: Path = Path("/proc/sys")) -> Reading[Kernel]:
    return timed(lambda: _read(root), Kernel(release=os.uname().release))
