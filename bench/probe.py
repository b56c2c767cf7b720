"""Where one size's cold start and restore go (run in the VM by bench/probe): the interpreter,
imports, each restore step, each of the tools' steps. Prints one line per measure."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench import fastbuild
from bench.suite import BASELINE_CLEANUP, PIPELINE, med, timed
from lab import build as lab_build
from lab.kube_proxy import start_fake_kube_proxy


@contextmanager
def bench_node(ns: str, n: int, render: Path, out: Path) -> Iterator[dict[str, str]]:
    """The bench's node of n Services in namespace ns, beside the fake kube-proxy in
    nftables mode; yields the lab's texts. Both go when the block ends."""
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "dummy"], check=True)
    lab_build.delete_netns(ns)
    lab_build.create_netns(ns)
    kp = None
    try:
        texts = fastbuild.load(render, n)
        fastbuild.apply(ns, fastbuild.bench_node(n), texts)
        kp = start_fake_kube_proxy(ns, {"mode": "nftables", "families": ["IPv4"]}, out / "kp.json")
        yield texts
    finally:
        if kp is not None:
            kp.stop()
        lab_build.delete_netns(ns)


def main() -> int:
    n, render, out, agent = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    with bench_node(f"probe-{n}", n, render, out) as texts:
        return _probe(f"probe-{n}", n, out, agent, texts)


def _probe(ns: str, n: int, out: Path, agent: str, texts: dict[str, str]) -> int:
    py = str(Path(agent).with_name("python"))

    def t3(label: str, *cmd: str, ok: tuple[int, ...] = (0, 1)) -> None:
        xs = [timed(lab_build.in_ns(ns, *cmd), ok=ok)[0] for _ in range(3)]
        print(f"{label:40s} {med(xs):7.2f}s  {[round(x, 2) for x in xs]}", flush=True)

    timed(lab_build.in_ns(ns, agent, "audit", "--json"), ok=(1,))
    t3("python -c pass", py, "-c", "pass")
    t3("python -S -c pass", py, "-S", "-c", "pass")
    t3("python -I -S -c pass", py, "-I", "-S", "-c", "pass")
    for mod in (
        "json",
        "dataclasses",
        "click",
        "agent.cli",
        "agent.collect",
        "agent.classify",
        "agent.views.report",
    ):
        t3(f"python -c 'import {mod}'", py, "-c", f"import {mod}")
    t3("pipeline", "bash", "-c", PIPELINE, ok=(0,))
    t3("audit --json", agent, "audit", "--json")
    t3("audit", agent, "audit")
    p = subprocess.run(
        lab_build.in_ns(ns, py, "-X", "importtime", agent, "audit", "--json"),
        capture_output=True,
        text=True,
    )
    (out / f"importtime-{n}.txt").write_text(p.stderr)
    subprocess.run(
        lab_build.in_ns(
            ns, py, "-m", "cProfile", "-o", str(out / "audit.prof"), agent, "audit", "--json"
        ),
        capture_output=True,
    )
    q = subprocess.run(
        [
            py,
            "-c",
            "import pstats,sys; pstats.Stats(sys.argv[1]).sort_stats('cumulative').print_stats(60)",
            str(out / "audit.prof"),
        ],
        capture_output=True,
        text=True,
    )
    (out / f"cprofile-audit-{n}.txt").write_text(q.stdout)
    # restore, step by step
    backup = out / "backup"
    t, o = timed(
        lab_build.in_ns(
            ns,
            agent,
            "cleanup",
            "--apply",
            "--backup-dir",
            str(backup),
            "--lock-file",
            str(out / "lock"),
        )
    )
    print(f"{'cleanup --apply':40s} {t:7.2f}s", flush=True)
    bundle = next(backup.iterdir())
    s = time.perf_counter()
    p2 = subprocess.Popen(
        lab_build.in_ns(ns, agent, "restore", "--lock-file", str(out / "lock"), str(bundle)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert p2.stdout is not None
    for line in p2.stdout:
        print(f"  restore +{time.perf_counter() - s:6.2f}s {line.rstrip()}", flush=True)
    p2.wait()
    print(f"{'restore':40s} {time.perf_counter() - s:7.2f}s rc={p2.returncode}", flush=True)
    if p2.returncode != 0:
        raise RuntimeError(f"restore exited {p2.returncode}")
    subprocess.run(
        lab_build.in_ns(ns, py, "-m", "cProfile", "-o", str(out / "restore.prof"), agent, "--help"),
        capture_output=True,
    )
    timed(lab_build.in_ns(ns, "bash", "-c", BASELINE_CLEANUP))
    run, in_ns = lab_build.run, lab_build.in_ns
    for label, fn in (
        (
            "tools: ipset restore",
            lambda: run(in_ns(ns, "ipset", "restore", "-exist"), texts["ipset"]),
        ),
        (
            "tools: iptables-nft-restore",
            lambda: run(
                in_ns(ns, "iptables-nft-restore", "-w", "10", "--noflush"),
                texts["iptables-rebuild"],
            ),
        ),
        ("tools: ip -batch", lambda: run(["ip", "-n", ns, "-batch", "-"], texts["ipbatch"])),
        ("tools: ipvsadm -R", lambda: run(in_ns(ns, "ipvsadm", "-R"), texts["ipvsadm"])),
    ):
        s = time.perf_counter()
        fn()
        print(f"{label:40s} {time.perf_counter() - s:7.2f}s", flush=True)
    for f in sorted(bundle.iterdir()):
        print(f"  bundle {f.name} {f.stat().st_size} bytes", flush=True)
    print(
        json.dumps(
            {
                "ipset_lines": texts["ipset"].count("\n"),
                "ipvsadm_lines": texts["ipvsadm"].count("\n"),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
