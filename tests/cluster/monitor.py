"""What the cluster tier's guest spends its CPU and memory on, written every few seconds to a
file on the host's side of the VM (VM_OUT), so that a run that stalls or is killed still says
why. CI12's node stopped posting its status after its first test while QEMU ran both vCPUs
flat out, and the kubelet's log was lost with the guest: whether a process span, the kernel
(softirq) or memory ran out could not be told.

Each line: seconds since the start, the load average, MemAvailable, the share of all CPUs in
user / system / softirq / iowait since the line before, how many processes there are (and how
many are new: short-lived ones, such as a compiler's, show there and not in the top), and the
five processes that used the most CPU since then (name, pid and percent of one CPU).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _proc_ticks() -> dict[int, tuple[str, int]]:
    """pid -> (name, utime + stime in clock ticks) for every process readable now."""
    out: dict[int, tuple[str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:  # gone since the listing
            continue
        # the name is in parentheses and may hold spaces or parentheses of its own
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        out[int(entry.name)] = (name, int(fields[11]) + int(fields[12]))
    return out


def _cpu_ticks() -> list[int]:
    """The first line of /proc/stat: user nice system idle iowait irq softirq steal."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def _mem_available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return -1


def sample_line(
    elapsed: float,
    cpu: tuple[list[int], list[int]],
    procs: tuple[dict[int, tuple[str, int]], dict[int, tuple[str, int]]],
    seconds: float,
    load: str,
    memavail_mb: int,
) -> str:
    """One line of the log from two readings `seconds` apart (pure, for its unit test)."""
    (c0, c1), (p0, p1) = cpu, procs
    d = [b - a for a, b in zip(c0, c1, strict=True)]
    total = sum(d) or 1
    user, system, iowait, softirq = d[0] + d[1], d[2] + d[5], d[4], d[6]
    busy = sorted(
        ((t - p0[pid][1], name, pid) for pid, (name, t) in p1.items() if pid in p0),
        reverse=True,
    )[:5]
    top = " ".join(
        f"{name}[{pid}]:{100 * ticks / TICK / seconds:.0f}%" for ticks, name, pid in busy if ticks
    )
    return (
        f"{elapsed:7.1f}s load {load} memavail {memavail_mb}M cpu usr {100 * user // total}% "
        f"sys {100 * system // total}% softirq {100 * softirq // total}% "
        f"iowait {100 * iowait // total}% procs {len(p1)} (+{len(p1.keys() - p0.keys())}) "
        f"top {top or '-'}"
    )


class GuestMonitor(threading.Thread):
    """Appends a sample_line to `path` every `every` seconds until stop()."""

    def __init__(self, path: Path, every: float = 15.0) -> None:
        super().__init__(name="guest-monitor", daemon=True)
        self.path, self.every = path, every
        self._stop_event = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        cpu, procs, then = _cpu_ticks(), _proc_ticks(), time.monotonic()
        with open(self.path, "a", buffering=1) as f:  # a line at a time: a killed run keeps it
            while not self._stop_event.wait(self.every):
                cpu1, procs1, now = _cpu_ticks(), _proc_ticks(), time.monotonic()
                load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
                line = sample_line(
                    now - t0, (cpu, cpu1), (procs, procs1), now - then, load, _mem_available_mb()
                )
                f.write(line + "\n")
                cpu, procs, then = cpu1, procs1, now

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=self.every + 5)

    def tail(self, lines: int = 8) -> str:
        try:
            return "\n".join(self.path.read_text().splitlines()[-lines:])
        except OSError:
            return "(no guest monitor log)"
