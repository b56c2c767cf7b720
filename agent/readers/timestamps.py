"""The timestamps kube-proxy's /healthz has written, and the error for an answer kube-proxy
would not give."""

from __future__ import annotations

import re
from datetime import UTC, datetime


class Garbage(ValueError):
    """kube-proxy answered, but not in a form kube-proxy uses."""


# Go's %q of a time.Time: "2024-05-25 03:22:43.5 +0000 UTC m=+12.3"
_GO_TIME = re.compile(
    r"^(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2})(?:\.(\d+))? ([+-]\d{4})(?: \S+)?(?: m=[+-][\d.]+)?$"
)
_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:\d{2})$")


def parse_timestamp(text: str) -> float:
    """Unix seconds from either timestamp format kube-proxy's healthz has used."""
    m = _RFC3339.match(text) or _GO_TIME.match(text)
    if not m:
        raise Garbage(f"unknown timestamp format {text[:40]!r}")
    day, clock, frac, zone = m.groups()
    zone = "+00:00" if zone == "Z" else zone
    if ":" not in zone:
        zone = f"{zone[:3]}:{zone[3:]}"
    try:  # the regexes take any digits: month 13, hour 25, year 9999 at -23:59
        base = datetime.fromisoformat(f"{day}T{clock}{zone}").astimezone(UTC).timestamp()
    except (ValueError, OverflowError) as exc:
        raise Garbage(f"not a time {text[:40]!r}: {exc}") from exc
    return base + (float(f"0.{frac}") if frac else 0.0)
