"""The benchmark, run inside the VM by bench/run: python -m bench.suite --sizes ... --out DIR.

Per size N: build the lab node (ipvs-mode leftovers + kube-proxy's nftables table) in a fresh
namespace, start the fake kube-proxy (nftables, IPv4), check the floor's counts against the
shell pipeline's, then time (median of --repeat): the shell pipeline, the floor, a cold
`audit --json`, a warm `serve` scrape, `cleanup --apply` and the baseline shell cleanup.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import calibrate, fastbuild, report
from lab import build as lab_build
from lab.kube_proxy import start_fake_kube_proxy

REPO = Path(__file__).resolve().parent.parent
AGENT = str(Path(sys.executable).with_name("ipvs-leftovers"))
PY = sys.executable

PIPELINE = (
    "ipvsadm -L -n | wc -l; "
    "ip -brief addr show kube-ipvs0; "
    "ipset list -name | grep -c '^KUBE-'; "
    "iptables-save -t nat | grep -c '^-A KUBE-'; "
    "nft list tables"
)

# kube-proxy's ipvs-mode chains (lab/names.py CHAINS) and the jumps into them; the baseline
# finds the jumps in iptables-nft-save and removes everything in one restore per table.
BASELINE_CLEANUP = r"""
set -e
ipvsadm -C
for t in nat filter; do
  case $t in
    nat) chains="KUBE-SERVICES KUBE-POSTROUTING KUBE-NODE-PORT KUBE-LOAD-BALANCER KUBE-MARK-MASQ" ;;
    filter) chains="KUBE-FORWARD KUBE-NODE-PORT KUBE-PROXY-FIREWALL"
            chains="$chains KUBE-SOURCE-RANGES-FIREWALL KUBE-IPVS-FILTER KUBE-IPVS-OUT-FILTER" ;;
  esac
  re=$(echo $chains | sed 's/ /|/g')
  {
    echo "*$t"
    builtin="PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING"
    iptables-nft-save -t $t | grep -E "^-A ($builtin) .*-j ($re)( |\$)" | sed 's/^-A /-D /'
    for c in $chains; do echo "-F $c"; done
    for c in $chains; do echo "-X $c"; done
    echo COMMIT
  } | iptables-nft-restore --noflush
done
for s in $(ipset list -n | grep '^KUBE-'); do ipset destroy "$s"; done
ip link del kube-ipvs0
"""


# What the cleanup's backup bundle (docs/contract.md#cleanup) needs from the tools on this
# node (IPv4, nft backend), as the agent runs them: part of the cleanup procedure's floor,
# with the baseline and the reads.
BACKUP_TOOLS = (
    "ipvsadm -S -n >/dev/null; ipset save >/dev/null; iptables-nft-save >/dev/null; "
    "ip -o addr show kube-ipvs0 >/dev/null"
)


# The libraries every command of the agent imports (DEVELOPERS: click for the CLI,
# dataclasses for the snapshot and findings; json for the document).
STARTUP_IMPORTS = "import click, dataclasses, json"


def sh(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, text=True, capture_output=True, **kw)


def timed(args: list[str], check: bool = True, ok: tuple[int, ...] = (0,)) -> tuple[float, str]:
    s = time.perf_counter()
    p = subprocess.run(args, text=True, capture_output=True)
    t = time.perf_counter() - s
    if check and p.returncode not in ok:
        raise RuntimeError(f"{' '.join(args)} -> {p.returncode}: {p.stderr[-2000:]}")
    return t, p.stdout


def with_peak_rss(rss_file: Path, *cmd: str) -> list[str]:
    """cmd under GNU time, which writes its peak RSS, the children it waited for included."""
    return ["/usr/bin/time", "-f", "%M", "-o", str(rss_file), *cmd]


def peak_rss_mb(rss_file: Path) -> float:
    return int(rss_file.read_text().split()[-1]) / 1024  # KiB


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def pipeline_counts(out: str) -> dict[str, int]:
    lines = out.splitlines()
    ipvs_lines = int(lines[0])
    brief = lines[1].split() if lines[1].startswith("kube-ipvs0") else []
    return {
        "ipvs_services+dests": ipvs_lines - 3,  # 3 header lines
        "kube_ipvs0_addrs": max(len(brief) - 2, 0),
        "kube_ipsets": int(lines[2 if brief else 1]),
        "nat_kube_rules": int(lines[3 if brief else 2]),
        "nft_tables": len([x for x in lines if x.startswith("table ")]),
    }


def floor_counts(d: dict[str, Any]) -> dict[str, int]:
    return {
        "ipvs_services+dests": d["ipvs_services"] + d["ipvs_dests"],
        "kube_ipvs0_addrs": d["kube_ipvs0_addrs"],
        "kube_ipsets": d["kube_ipsets"],
        "nat_kube_rules": d["nat_kube_rules"],
        "nft_tables": d["nft_tables"],
    }


def state_fingerprint(ns: str) -> str:
    """What a rebuild must give back: counts, the iptables text, ipset headers, IPVS table."""
    parts = [
        sh(lab_build.in_ns(ns, "bash", "-c", PIPELINE)).stdout,
        sh(lab_build.in_ns(ns, "iptables-nft-save")).stdout,
        sh(lab_build.in_ns(ns, "ipset", "list", "-t")).stdout,
        sh(lab_build.in_ns(ns, "ipvsadm", "-S", "-n")).stdout,
    ]
    # ipset: the hash seed (initval) is random per create, and the memory size and the
    # hashsize the set has grown to follow from it (10,000 Services: 4096 once, 2048 the next)
    volatile = ("#", "Size in memory:")
    return "\n".join(
        re.sub(r" hashsize \d+", "", x.split(" initval ")[0])
        for p in parts
        for x in p.splitlines()
        if not x.startswith(volatile)
    )


def expected_counts(n: int) -> dict[str, int]:
    nodeports = len(range(0, n, 10))
    return {"ipvs_services+dests": 4 * (n + nodeports), "kube_ipvs0_addrs": n, "kube_ipsets": 17}


def measure_size(n: int, args: argparse.Namespace, work: Path, log) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    k = args.repeat
    res: dict[str, Any] = {"n": n}
    ns = f"bench-{n}"
    lab_build.delete_netns(ns)
    lab_build.create_netns(ns)
    kp = None
    try:
        node = fastbuild.bench_node(n)
        t0 = time.perf_counter()
        texts = fastbuild.load(args.render_dir, n)
        res["render_s"] = time.perf_counter() - t0
        steps = fastbuild.apply(ns, node, texts)
        res["build_steps_s"] = steps
        res["build_s"] = sum(steps.values())
        rounded = {k_: round(v, 1) for k_, v in steps.items()}
        log(f"n={n}: built in {res['build_s']:.1f}s {json.dumps(rounded)}")
        kp = start_fake_kube_proxy(
            ns, {"mode": "nftables", "families": ["IPv4"]}, work / f"kp-{n}.json"
        )

        # --- counts: pipeline == floor (== the model) -------------------------------------
        _, out = timed(lab_build.in_ns(ns, "bash", "-c", PIPELINE))
        pc = pipeline_counts(out)
        _, fout = timed(lab_build.in_ns(ns, PY, str(REPO / "bench/floor.py"), "--json"))
        fd = json.loads(fout)
        fc = floor_counts(fd)
        res["counts"] = {"pipeline": pc, "floor": fd}
        if pc != fc:
            raise SystemExit(f"FLOOR MISMATCH at n={n}: pipeline {pc} != floor {fc}")
        for key, want in expected_counts(n).items():
            if pc[key] != want:
                raise SystemExit(f"STATE MISMATCH at n={n}: {key} = {pc[key]}, lab says {want}")
        log(f"n={n}: counts agree {pc} (+{fd['kube_ipset_elements']} set elements)")
        fingerprint = state_fingerprint(ns)

        # --- (a) pipeline, (b) floor, (c) cold audit ----------------------------------------
        pipe, floor, floor_in, audit, audit_rss, start, libs = [], [], [], [], [], [], []
        agent_py = str(Path(AGENT).with_name("python"))
        # Untimed: compiles any stale bytecode (an installed wheel ships it compiled).
        timed(lab_build.in_ns(ns, AGENT, "audit", "--json"), ok=(1,))
        for _ in range(args.audit_repeat or k):
            pipe.append(timed(lab_build.in_ns(ns, "bash", "-c", PIPELINE))[0])
            t, fout = timed(lab_build.in_ns(ns, PY, str(REPO / "bench/floor.py"), "--json"))
            floor.append(t)
            floor_in.append(json.loads(fout)["seconds"])
            # Timed as a user runs it; its peak RSS from a run of its own under GNU time,
            # whose fork and exec are no part of the audit.
            audit.append(timed(lab_build.in_ns(ns, AGENT, "audit", "--json"), ok=(1,))[0])
            rss_file = work / "audit.rss"
            timed(lab_build.in_ns(ns, *with_peak_rss(rss_file, AGENT, "audit", "--json")), ok=(1,))
            audit_rss.append(peak_rss_mb(rss_file))
            # What any click + dataclasses + json program pays before its first read: the
            # agent's interpreter, then with the three libraries the project is built on.
            start.append(timed(lab_build.in_ns(ns, agent_py, "-c", "pass"))[0])
            libs.append(timed(lab_build.in_ns(ns, agent_py, "-c", STARTUP_IMPORTS))[0])
        res.update(
            pipeline_s=med(pipe),
            floor_s=med(floor),
            floor_inproc_s=med(floor_in),
            audit_s=med(audit),
            audit_rss_mb=max(audit_rss),
            python_start_s=med(start),
            startup_floor_s=med(libs),
            samples={
                "pipeline": pipe,
                "floor": floor,
                "floor_inproc": floor_in,
                "audit": audit,
                "python_start": start,
                "startup_floor": libs,
            },
        )
        log(
            f"n={n}: pipeline {res['pipeline_s']:.2f}s floor {res['floor_s']:.2f}s "
            f"(in-process {res['floor_inproc_s']:.2f}s) audit {res['audit_s']:.2f}s "
            f"{res['audit_rss_mb']:.0f}MB; python {res['python_start_s']:.2f}s, "
            f"with click+dataclasses+json {res['startup_floor_s']:.2f}s"
        )

        # --- (d) warm scrape ------------------------------------------------------------------
        res.update(warm_scrape(ns, k, work, n))
        log(f"n={n}: warm scrape {res['scrape_s']:.2f}s, serve VmHWM {res['serve_rss_mb']:.0f}MB")
        res.update(node_exporter_scrape(ns, k, work, n, args.node_exporter))
        log(
            f"n={n}: node_exporter (ipvs only) scrape {res['ne_scrape_s']:.2f}s, "
            f"VmHWM {res['ne_rss_mb']:.0f}MB, {res['ne_backends']} backends"
        )

        if args.profile_at == n:
            res["profile"] = profile(ns, args.out, n)
            log(f"n={n}: profiles written")

        # --- (e) cleanup vs baseline ---------------------------------------------------------
        ck = args.cleanup_repeat or k
        agent_c, base_c, rebuild, backup_tools, cleanup_rss = [], [], [], [], []
        windows, restores = [], []
        for i in range(ck):
            backup_tools.append(timed(lab_build.in_ns(ns, "bash", "-c", BACKUP_TOOLS))[0])
            backup, lock = work / f"backup-{n}-{i}", work / f"lock-{n}"
            rss_file = work / "cleanup.rss"
            t, out = timed(
                lab_build.in_ns(
                    ns,
                    *with_peak_rss(
                        rss_file,
                        AGENT,
                        "cleanup",
                        "--apply",
                        "--backup-dir",
                        str(backup),
                        "--lock-file",
                        str(lock),
                    ),
                )
            )
            agent_c.append(t)
            windows.append(change_window(out))
            cleanup_rss.append(peak_rss_mb(rss_file))
            res["backup_mb"] = sum(f.stat().st_size for f in backup.rglob("*") if f.is_file()) / 1e6
            check_clean(ns, "cleanup --apply")
            # The rollback an operator runs: the bundle back, timed against the tools loading
            # the same objects from scratch (the rebuild after the baseline below).
            bundle = next(backup.iterdir())
            # exactly as an operator types it (defaults; timed() fails the run on a non-zero exit)
            t, _ = timed(
                lab_build.in_ns(ns, AGENT, "restore", "--lock-file", str(lock), str(bundle))
            )
            restores.append(t)
            shutil.rmtree(backup, ignore_errors=True)
            check_same(ns, fingerprint, "restore after cleanup --apply")
            t, _ = timed(lab_build.in_ns(ns, "bash", "-c", BASELINE_CLEANUP))
            base_c.append(t)
            check_clean(ns, "baseline cleanup")
            rebuild.append(fastbuild.rebuild_leftovers(ns, texts))
            check_same(ns, fingerprint, "rebuild after baseline cleanup")
        res.update(
            cleanup_s=med(agent_c),
            cleanup_window_s=med(windows),
            restore_s=med(restores),
            baseline_cleanup_s=med(base_c),
            rebuild_s=med(rebuild),
            backup_tools_s=med(backup_tools),
            cleanup_rss_mb=max(cleanup_rss),
        )
        res["samples"].update(cleanup_window=windows, restore=restores, rebuild=rebuild)
        if args.kube_proxy:
            res.update(kube_proxy_cleanup(ns, ck, texts, fingerprint, args.kube_proxy, log))
        # The least the cleanup procedure can cost: the deletions (the baseline), the backup
        # tools, and three reads of the node (plan, re-check before the first change,
        # re-audit) with one interpreter start.
        res["cleanup_floor_s"] = (
            res["baseline_cleanup_s"]
            + res["backup_tools_s"]
            + res["floor_s"]
            + 2 * res["floor_inproc_s"]
        )
        res["samples"].update(cleanup=agent_c, baseline_cleanup=base_c, backup_tools=backup_tools)
        if args.profile_at == n:
            res["profile"]["cleanup"] = profile_cleanup(ns, args.out, n, work)
            check_clean(ns, "cleanup --apply under cProfile")
        log(
            f"n={n}: change window {res['cleanup_window_s']:.2f}s, restore {res['restore_s']:.2f}s "
            f"vs the tools from scratch {res['rebuild_s']:.2f}s, kube-proxy --cleanup "
            f"{res.get('kp_cleanup_s', 0):.2f}s"
        )
        log(
            f"n={n}: cleanup {res['cleanup_s']:.2f}s baseline {res['baseline_cleanup_s']:.2f}s "
            f"(rebuild {res['rebuild_s']:.1f}s) procedure floor {res['cleanup_floor_s']:.2f}s "
            f"cleanup {res['cleanup_rss_mb']:.0f}MB"
        )
    finally:
        if kp is not None:
            kp.stop()
        lab_build.delete_netns(ns)
    return res


def change_window(out: str) -> float:
    """cleanup's own 'changes: first to last in Xs' line: how long the node was half-cleaned."""
    m = re.search(r"^changes: first to last in ([0-9.]+)s$", out, re.M)
    if m is None:
        raise SystemExit(f"cleanup printed no change window: {out[-1000:]}")
    return float(m.group(1))


def kube_proxy_cleanup(  # type: ignore[no-untyped-def]
    ns: str, rounds: int, texts: dict[str, str], fingerprint: str, binary: str, log
) -> dict[str, Any]:
    """Real `kube-proxy --cleanup` on the same state: its wall time. Without the
    NFTablesProxyMode gate (alpha in 1.30) it leaves nftables alone: it flushes IPVS (every
    virtual server), deletes kube-ipvs0, the iptables- and ipvs-mode chains and jumps, and
    the ipvs-mode sets (cmd/kube-proxy/app/server_linux.go platformCleanup). Whatever it
    removes that the rebuild does not put back is recorded, not fatal."""
    times, notes = [], []
    for _ in range(rounds):
        s = time.perf_counter()
        p = sh(lab_build.in_ns(ns, binary, "--cleanup", "-v=0"))
        times.append(time.perf_counter() - s)
        if p.returncode != 0:
            notes.append(f"exit {p.returncode}: {p.stderr[-300:]}")
        pc = pipeline_counts(sh(lab_build.in_ns(ns, "bash", "-c", PIPELINE)).stdout)
        left = {k: v for k, v in pc.items() if k != "nft_tables" and v}
        if left:
            notes.append(f"left {left}")
        fastbuild.rebuild_leftovers(ns, texts)
        now = state_fingerprint(ns)
        if now != fingerprint:
            diff = difflib.unified_diff(
                fingerprint.splitlines(), now.splitlines(), lineterm="", n=0
            )
            notes.append("after rebuild the node differs: " + " / ".join(list(diff)[2:12]))
            log(f"kube-proxy --cleanup: {notes[-1]}")
            break
    return {"kp_cleanup_s": med(times), "kp_notes": notes, "samples_kp_cleanup": times}


def check_clean(ns: str, what: str) -> None:
    pc = pipeline_counts(sh(lab_build.in_ns(ns, "bash", "-c", PIPELINE)).stdout)
    left = {k: v for k, v in pc.items() if k != "nft_tables" and v}
    if left:
        raise SystemExit(f"{what} left {left}")


def check_same(ns: str, fingerprint: str, what: str) -> None:
    now = state_fingerprint(ns)
    if now != fingerprint:
        diff = difflib.unified_diff(fingerprint.splitlines(), now.splitlines(), lineterm="", n=1)
        text = "\n".join(list(diff)[:80])
        raise SystemExit(f"{what}: the node differs from the first build:\n{text}")


def warm_scrape(ns: str, k: int, work: Path, n: int) -> dict[str, Any]:
    log_path = work / f"serve-{n}.log"
    with log_path.open("wb") as lf:
        proc = subprocess.Popen(
            lab_build.in_ns(
                ns,
                AGENT,
                "serve",
                "--listen",
                "127.0.0.1:9437",
                "--min-interval",
                "0",
                "--source-timeout",
                "600",
            ),
            stdout=subprocess.DEVNULL,
            stderr=lf,
        )
    try:
        p = sh(
            lab_build.in_ns(ns, PY, str(REPO / "bench/scrape.py"), "http://127.0.0.1:9437", str(k)),
            timeout=3600,
            env={**os.environ, "SCRAPE_CPU_PID": str(proc.pid)},  # `ip netns exec` execs
        )
        if p.returncode != 0:
            raise SystemExit(
                f"scrape failed: {p.stderr[-2000:]} serve log: {log_path.read_text()[-2000:]}"
            )
        d = json.loads(p.stdout)
        hwm = _vm_hwm(proc.pid)
        return {
            "scrape_s": med(d["timed"]),
            "scrape_first_s": d["first"],
            "serve_rss_mb": hwm,
            "scrape_bytes": d["bytes"],
            "samples_scrape": d["timed"],
            "serve_cpu_per_scrape_s": d["cpu_per_scrape"],
        }
    finally:
        _stop(proc)


def node_exporter_scrape(ns: str, k: int, work: Path, n: int, binary: str) -> dict[str, Any]:
    """node_exporter with only its ipvs collector (it reads /proc/net/ip_vs and
    /proc/net/ip_vs_stats of its namespace), on loopback: warm scrape time, peak RSS, CPU."""
    log_path = work / f"node-exporter-{n}.log"
    cmd = [binary, "--collector.disable-defaults", "--collector.ipvs"]
    cmd += ["--web.listen-address=127.0.0.1:9100"]
    with log_path.open("wb") as lf:
        proc = subprocess.Popen(lab_build.in_ns(ns, *cmd), stdout=subprocess.DEVNULL, stderr=lf)
    try:
        scrape = [PY, str(REPO / "bench/scrape.py"), "http://127.0.0.1:9100", str(k)]
        p = sh(
            lab_build.in_ns(ns, *scrape, "node_exporter"),
            timeout=3600,
            env={**os.environ, "SCRAPE_CPU_PID": str(proc.pid)},
        )
        if p.returncode != 0:
            log_tail = log_path.read_text()[-2000:]
            raise SystemExit(f"node_exporter scrape failed: {p.stderr[-2000:]} log: {log_tail}")
        d = json.loads(p.stdout)
        return {
            "ne_scrape_s": med(d["timed"]),
            "ne_rss_mb": _vm_hwm(proc.pid),
            "ne_scrape_bytes": d["bytes"],
            "ne_backends": d["backends"],
            "ne_cpu_per_scrape_s": d["cpu_per_scrape"],
            "samples_ne_scrape": d["timed"],
        }
    finally:
        _stop(proc)


def _vm_hwm(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def profile(ns: str, out: Path, n: int) -> dict[str, str]:
    it = out / f"profile-importtime-{n}.txt"
    cp = out / f"profile-cprofile-{n}.txt"
    p = sh(lab_build.in_ns(ns, PY, "-X", "importtime", "-m", "agent.cli", "audit", "--json"))
    rows = []
    for line in p.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            self_us, cum_us, name = line[len("import time:") :].split("|")
            rows.append((int(cum_us), int(self_us), name.rstrip()))
    top = sorted((r for r in rows if not r[2].startswith("  ")), reverse=True)[:15]
    total = sum(r[0] for r in rows if not r[2].startswith("  "))
    it.write_text(
        f"python -X importtime -m agent.cli audit --json (n={n}); "
        f"top-level imports: {total / 1e6:.2f}s\n"
        + "".join(f"{c / 1e6:8.3f}s cum {s / 1e6:8.3f}s self {name}\n" for c, s, name in top)
        + "\n--- raw ---\n"
        + p.stderr
    )
    prof = out / f"audit-{n}.prof"
    sh(
        lab_build.in_ns(
            ns, PY, "-m", "cProfile", "-o", str(prof), "-m", "agent.cli", "audit", "--json"
        )
    )
    q = sh(
        [
            PY,
            "-c",
            "import pstats,sys; pstats.Stats(sys.argv[1]).sort_stats('cumulative').print_stats(40)",
            str(prof),
        ]
    )
    cp.write_text(f"python -m cProfile -s cumtime -m agent.cli audit --json (n={n})\n" + q.stdout)
    return {"importtime": it.name, "cprofile": cp.name}


def profile_cleanup(ns: str, out: Path, n: int, work: Path) -> str:
    """cProfile of one more `cleanup --apply` on the rebuilt node: where the time goes."""
    cp = out / f"profile-cleanup-{n}.txt"
    prof = out / f"cleanup-{n}.prof"
    args = ["cleanup", "--apply", "--backup-dir", str(work / "backup-prof")]
    args += ["--lock-file", str(work / f"lock-{n}")]
    run = sh(lab_build.in_ns(ns, PY, "-m", "cProfile", "-o", str(prof), "-m", "agent.cli", *args))
    if run.returncode != 0:
        raise RuntimeError(f"profiled cleanup --apply -> {run.returncode}: {run.stderr[-2000:]}")
    q = sh(
        [
            PY,
            "-c",
            "import pstats,sys; pstats.Stats(sys.argv[1]).sort_stats('cumulative').print_stats(50)",
            str(prof),
        ]
    )
    head = f"python -m cProfile -s cumtime -m agent.cli cleanup --apply (n={n})\n"
    cp.write_text(head + q.stdout)
    return cp.name


def main() -> int:
    global AGENT  # the installed copy bench/run made (what a user runs), else this checkout's
    ap = argparse.ArgumentParser(prog="python -m bench.suite")
    ap.add_argument("--sizes", default="1000,5000,10000,20000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cleanup-repeat", type=int, default=0, help="default: --repeat")
    ap.add_argument(
        "--audit-repeat",
        type=int,
        default=0,
        help="rounds of pipeline/floor/audit; default: --repeat",
    )
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("VM_OUT", "/tmp")))
    ap.add_argument("--render-dir", type=Path)
    ap.add_argument("--profile-at", type=int, default=10000)
    ap.add_argument("--command", default="bench/run", help="recorded in results.md")
    ap.add_argument("--meta", default="{}", help="JSON recorded in results.json (host facts)")
    ap.add_argument("--kube-proxy", default="", help="a kube-proxy binary: time --cleanup")
    ap.add_argument("--agent", default=AGENT, help="the ipvs-leftovers command timed")
    ap.add_argument("--node-exporter", default="/usr/bin/prometheus-node-exporter")
    args = ap.parse_args()
    AGENT = args.agent
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.profile_at not in sizes:
        args.profile_at = max((s for s in sizes if s <= args.profile_at), default=sizes[-1])
    args.out.mkdir(parents=True, exist_ok=True)
    logf = (args.out / "bench.log").open("a")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    if not os.access("/usr/bin/time", os.X_OK):
        raise SystemExit("bench: /usr/bin/time missing (Debian package 'time')")
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "dummy"], check=True)
    # the same pure-Python workload as on the host (bench/run): converts VM CPU to a node's
    calibrate_vm = sorted(calibrate.workload() for _ in range(3))[1]
    meta = {
        **json.loads(args.meta),
        "calibrate_vm_s": calibrate_vm,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "nft": sh(["nft", "--version"]).stdout.strip(),
        "iptables": sh(["iptables", "--version"]).stdout.strip(),
        "ipvsadm": sh(["ipvsadm", "--version"]).stdout.strip(),
        "sizes": sizes,
        "repeat": args.repeat,
        "command": args.command,
    }
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for n in sizes:
            results.append(measure_size(n, args, Path(tmp), log))
            doc = {"meta": meta, "results": results}
            (args.out / "results.json").write_text(json.dumps(doc, indent=2))
    keys = (
        "pipeline_s",
        "floor_s",
        "floor_inproc_s",
        "audit_s",
        "scrape_s",
        "cleanup_s",
        "baseline_cleanup_s",
        "cleanup_floor_s",
        "cleanup_window_s",
        "restore_s",
        "ne_scrape_s",
        "kp_cleanup_s",
        "build_s",
        "audit_rss_mb",
        "serve_rss_mb",
    )
    doc = {"meta": meta, "results": results, "growth": {k: report.growth(results, k) for k in keys}}
    (args.out / "results.json").write_text(json.dumps(doc, indent=2))
    (args.out / "results.md").write_text(report.markdown(doc))
    log("done: results.json, results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
