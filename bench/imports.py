"""Cold start of two checkouts of the agent, side by side: `audit --help` and `audit --json`.

    sudo .venv/bin/python -m bench.imports BEFORE AFTER [--runs 15]

BEFORE and AFTER are checkouts (e.g. `git worktree add /tmp/ipvs-leftovers-main main`). Each
round times, one after the other, `ipvs-leftovers audit --help` and `audit --json` (in a
network namespace of its own, made here and deleted at the end) of both, alternating which
goes first, so the two share the same moments of a noisy machine. Prints each one's median and
the ratio AFTER/BEFORE: on a shared host only the ratio means something.

Each checkout's `agent/` is installed into a venv of its own in a temporary folder, the way
the image's wheel install lays it out (bench/install-agent: the package in site-packages,
compiled, pip's console script; the pinned dependencies from this project's .venv), and its
`ipvs-leftovers` is what is timed: what a user runs, not the editable checkout (whose import
hook alone costs pathlib and urllib.parse). Without root only `audit --help` is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

NETNS = f"ipvs-leftovers-imports-{os.getpid()}"
AUDIT_OK = (0, 1, 4)  # clean, leftovers, a source failed (an empty namespace has no kube-proxy)


INSTALL = Path(__file__).resolve().parent / "install-agent"


def _command(agent: Path, measure: str, netns: bool) -> list[str]:
    cmd = [str(agent), "audit", f"--{measure}"]
    return ["ip", "netns", "exec", NETNS, *cmd] if netns else cmd


def _install(checkout: Path, into: Path) -> Path:
    """The checkout's agent/ installed into the venv INTO; its console script."""
    subprocess.run([str(INSTALL), str(into), str(checkout / "agent")], check=True)
    return into / "bin" / "ipvs-leftovers"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(agent: Path, measure: str) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of one cold run of `AGENT audit --MEASURE`. The
    CPU time (user and system, of the run's processes) waits for no other process: on a
    shared host it varies less than the wall time."""
    cpu = _cpu()
    started = time.perf_counter()
    out = subprocess.run(
        _command(agent, measure, measure == "json"),
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    seconds, cpu = time.perf_counter() - started, _cpu() - cpu
    if out.returncode not in ((0,) if measure == "help" else AUDIT_OK):
        raise SystemExit(f"{agent}: audit --{measure} exited {out.returncode}")
    return seconds, cpu, out.stdout


def _comparable(text: str) -> str:
    doc = json.loads(text)
    for source in doc["sources"].values():
        source.pop("seconds", None)
    return json.dumps(doc, sort_keys=True)


def measure(before: Path, after: Path, runs: int, measures: Sequence[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="ipvs-leftovers-imports-") as tmp:
        agents = {
            "before": _install(before, Path(tmp, "before")),
            "after": _install(after, Path(tmp, "after")),
        }
        # A first run of each warms the page cache; the two must print the same (read
        # times aside).
        for m in measures:
            seen = {k: _run(a, m)[2] for k, a in agents.items()}
            if m == "json":
                seen = {k: _comparable(v) for k, v in seen.items()}
            if seen["before"] != seen["after"]:
                raise SystemExit(f"the two checkouts' audit --{m} differ")
        times: dict[tuple[str, str], list[tuple[float, float]]] = {
            (m, k): [] for m in measures for k in agents
        }
        for i in range(runs):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for m in measures:
                for k in order:
                    times[m, k].append(_run(agents[k], m)[:2])
    print(f"median of {runs} cold runs each, interleaved; ratio = after / before")
    print("  wall: ratio of the medians; round: median of each round's ratio; cpu: user+sys")
    head = ("before s", "after s", "wall", "round", "cpu")
    print(f"{'command':<21}" + "".join(f"{h:>9}" for h in head))
    for m in measures:
        b, a = times[m, "before"], times[m, "after"]
        wb, wa = statistics.median(t[0] for t in b), statistics.median(t[0] for t in a)
        per_round = statistics.median(x[0] / y[0] for x, y in zip(a, b, strict=True))
        cpu = statistics.median(t[1] for t in a) / statistics.median(t[1] for t in b)
        name = f"audit --{m}" + (" (netns)" if m == "json" else "")
        row = (f"{wb:.3f}", f"{wa:.3f}", f"{wa / wb:.2f}", f"{per_round:.2f}", f"{cpu:.2f}")
        print(f"{name:<21}" + "".join(f"{c:>9}" for c in row))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path, help="the checkout measured first (e.g. main)")
    parser.add_argument("after", type=Path, help="the checkout compared with it")
    parser.add_argument("--runs", type=int, default=15, help="rounds (default 15)")
    args = parser.parse_args(argv)
    before, after = args.before.resolve(), args.after.resolve()
    for c in (before, after):
        if not (c / "agent" / "cli" / "__init__.py").is_file():
            raise SystemExit(f"{c} is not a checkout of the agent")
    if os.geteuid() != 0:
        print("not root: audit --json (in a network namespace) is not timed", file=sys.stderr)
        measure(before, after, args.runs, ("help",))
        return 0
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        measure(before, after, args.runs, ("help", "json"))
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
