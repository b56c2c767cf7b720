"""A cleaned lab node and the ways an attacker who can write its bundle edits it: the shared
parts of the tests/netns/test_restore_*.py files (one file a worker under pytest-xdist)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lab import build
from tests.conftest import run_agent
from tests.dumps import dump
from tests.netns.test_cleanup import apply, node


@dataclass
class Cleaned:
    ns: str
    tmp: Path
    before: dict[str, list[str]]
    after: dict[str, list[str]]
    bundle: Path

    def restore(self, *extra: str, bundle: Path | None = None) -> object:
        return run_agent(
            self.ns,
            "restore",
            "--lock-file",
            str(self.tmp / "cleanup.lock"),
            *extra,
            str(bundle or self.bundle),
        )

    def arp(self) -> tuple[str, ...]:
        return tuple(
            build.run(
                ["ip", "netns", "exec", self.ns, "sysctl", "-n", f"net.ipv4.conf.all.{k}"]
            ).strip()
            for k in ("arp_ignore", "arp_announce")
        )


@contextmanager
def cleaned(
    netns: Callable[[], str], tmp: Path, backend: str = "nft", n_services: int = 12
) -> Iterator[Cleaned]:
    """A lab node cleaned with --reset-arp-sysctls, so its bundle holds every file the netns
    kernel can give (iptables both families, sets, sysctls)."""
    with node(netns, tmp, backend=backend, strict_arp=True, n_services=n_services) as (ns, _):
        before = dump(ns)
        r = apply(ns, tmp, "--reset-arp-sysctls")
        assert r.rc == 0, r.stdout + r.stderr
        (bundle,) = (tmp / "backups").iterdir()
        yield Cleaned(ns, tmp, before, dump(ns), bundle)


def rehash(bundle: Path) -> None:
    """What an attacker who can write the folder does: make the manifest agree again."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    names = [p.name for p in bundle.iterdir() if p.name != "manifest.json"]
    manifest["files"] = {n: hashlib.sha256((bundle / n).read_bytes()).hexdigest() for n in names}
    manifest["plan_sha256"] = manifest["files"]["plan.json"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def edit(bundle: Path, name: str, change: Callable[[str], str], again: bool = True) -> None:
    path = bundle / name
    path.write_text(change(path.read_text() if path.exists() else ""))
    os.chmod(path, 0o600)
    if again:
        rehash(bundle)


def add_step(bundle: Path, step: dict[str, object]) -> None:
    def change(text: str) -> str:
        doc = json.loads(text)
        doc["steps"].append(step)
        return json.dumps(doc)

    edit(bundle, "plan.json", change, again=False)


def refused(c: Cleaned, r: object, *words: str) -> None:
    rc, err = r.rc, r.stderr  # type: ignore[attr-defined]
    assert rc == 4, (rc, r.stdout, err)  # type: ignore[attr-defined]
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "nothing was changed" in err, err
    for w in words:
        assert w in err, err
    assert dump(c.ns) == c.after
    assert c.arp() == ("0", "0")


def append_rule(text: str, table: str, chain: str, rule: str) -> str:
    """`-A CHAIN RULE` after CHAIN's last rule (or its declaration) in TABLE's block."""
    lines = text.splitlines()
    start = lines.index(f"*{table}")
    end = lines.index("COMMIT", start)
    at = max(i for i in range(start, end) if lines[i].startswith((f"-A {chain} ", f":{chain} ")))
    lines.insert(at + 1, f"-A {chain} {rule}")
    return "\n".join(lines) + "\n"
