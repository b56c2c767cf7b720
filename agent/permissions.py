"""Whether this process may read the kernel state at all."""

from __future__ import annotations

from pathlib import Path

CAP_NET_ADMIN = 12


def effective_caps(status: str | None = None) -> int:
    text = status if status is not None else Path("/proc/self/status").read_text()
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def missing_capability(status: str | None = None) -> str | None:
    """The missing capability's name, or None when netlink dumps are allowed."""
    if not effective_caps(status) & (1 << CAP_NET_ADMIN):
        return "CAP_NET_ADMIN"
    return None
