"""What precheck and verify share: a check and its statuses, listing evidence, the JSON document
and the text report (docs/precheck-verify.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["pass", "warn", "fail"]


SCHEMA = 1


LIST_LIMIT = 20  # objects listed in one check's evidence


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    evidence: tuple[str, ...]


def _check(name: str, status: Status, *evidence: str) -> Check:
    return Check(name, status, tuple(evidence))


def _listed(items: list[str], limit: int = LIST_LIMIT) -> list[str]:
    if len(items) <= limit:
        return items
    return items[:limit] + [f"... and {len(items) - limit} more"]


def ready(checks: list[Check], warn_ok: bool = False) -> bool:
    """Every check passed; with `warn_ok` (verify), none failed."""
    return all(ch.status == "pass" or (warn_ok and ch.status == "warn") for ch in checks)


def document(command: str, checks: list[Check]) -> dict[str, Any]:
    """The stable `precheck --json` / `verify --json` document (docs/precheck-verify.md)."""
    counts = Counter(ch.status for ch in checks)
    return {
        "schema": SCHEMA,
        "command": command,
        "ok": ready(checks, warn_ok=command == "verify"),
        "summary": {s: counts.get(s, 0) for s in ("pass", "warn", "fail")},
        "checks": [
            {"name": ch.name, "status": ch.status, "evidence": list(ch.evidence)} for ch in checks
        ],
    }


def render(command: str, checks: list[Check]) -> str:
    width = max(len(ch.name) for ch in checks)
    lines = []
    for ch in checks:
        first, *rest = ch.evidence or ("",)
        lines.append(f"{ch.status.upper():4}  {ch.name:{width}}  {first}")
        lines += [f"{'':4}  {'':{width}}  {e}" for e in rest]
    counts = Counter(ch.status for ch in checks)
    tally = f"{counts['fail']} fail, {counts['warn']} warn, {counts['pass']} pass"
    if command == "precheck":
        verdict = "READY" if ready(checks) else "NOT READY"
    else:
        verdict = "OK" if ready(checks, warn_ok=True) else "FAILED"
    lines.append(f"{verdict}: {tally}")
    return "\n".join(lines)
