"""The cluster tier's guest monitor (tests/cluster/monitor.py) names what used the CPU between
two readings: the shares of all CPUs and the busiest processes, as percent of one CPU."""

from __future__ import annotations

from tests.cluster.monitor import TICK, sample_line


def test_line_names_the_busiest_processes_and_the_cpu_shares() -> None:
    # user nice system idle iowait irq softirq steal: 400 ticks in all between the readings
    cpu0 = [100, 0, 50, 1000, 0, 0, 10, 0]
    cpu1 = [300, 0, 70, 1080, 20, 0, 90, 0]
    # over 2 s: the kubelet used one CPU in full, containerd a quarter; a new pid is left out
    procs0 = {10: ("kubelet", 0), 11: ("containerd", 0), 12: ("idle one", 5)}
    procs1 = {
        10: ("kubelet", 2 * TICK),
        11: ("containerd", TICK // 2),
        12: ("idle one", 5),
        13: ("new", 999),
    }
    line = sample_line(61.25, (cpu0, cpu1), (procs0, procs1), 2.0, "1.50 0.90 0.40", 812)
    assert line == (
        "   61.2s load 1.50 0.90 0.40 memavail 812M cpu usr 50% sys 5% softirq 20% iowait 5% "
        "procs 4 (+1) top kubelet[10]:100% containerd[11]:25%"
    )


def test_line_with_nothing_busy_says_so() -> None:
    cpu = [1, 0, 1, 10, 0, 0, 0, 0]
    line = sample_line(1.0, (cpu, cpu), ({1: ("a", 3)}, {1: ("a", 3)}), 1.0, "0 0 0", 100)
    assert line.endswith("procs 1 (+0) top -"), line
