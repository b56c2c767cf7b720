"""results.json -> results.md: the table, the ratios, the targets, the growth exponents."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

# The DaemonSet's scrape interval (daemonset/podmonitor.yaml): CPU per scrape over it.
SCRAPE_INTERVAL_S = 30.0


def node_cpu_share(r: dict[str, Any], meta: dict[str, Any]) -> float | None:
    """% of one core a real node spends scraping: the VM's CPU seconds per scrape, scaled by
    the host/VM Python speed ratio (bench/calibrate.py), over the scrape interval."""
    # a merged table's rows keep their own run's calibration: the VM's speed varies by run
    cpu, host, vm = (
        r.get("serve_cpu_per_scrape_s"),
        r.get("calibrate_host_s", meta.get("calibrate_host_s")),
        r.get("calibrate_vm_s", meta.get("calibrate_vm_s")),
    )
    if cpu is None or not host or not vm:
        return None
    return 100 * cpu * host / vm / SCRAPE_INTERVAL_S


# Targets against the tools operators already run (ratios within one run).
PEER_TARGETS = (
    ("warm scrape / node_exporter ipvs-only scrape", "scrape_s", "ne_scrape_s", 1.0),
    ("cleanup --apply / kube-proxy --cleanup", "cleanup_s", "kp_cleanup_s", 1.0),
    ("cleanup change window / kube-proxy --cleanup", "cleanup_window_s", "kp_cleanup_s", 0.5),
    ("restore / the tools loading the same state", "restore_s", "rebuild_s", 1.2),
    ("cold audit / shell pipeline", "audit_s", "pipeline_s", 1.0),
)

# (label, value, limit): the targets at 10,000 Services
TARGETS = (
    ("warm scrape / shell pipeline", lambda r: r["scrape_s"] / r["pipeline_s"], 1.0, "x"),
    ("warm scrape / raw netlink floor", lambda r: r["scrape_s"] / r["floor_s"], 3.0, "x"),
    ("cold audit / shell pipeline", lambda r: r["audit_s"] / r["pipeline_s"], 2.0, "x"),
    (
        "cleanup --apply / baseline cleanup",
        lambda r: r["cleanup_s"] / r["baseline_cleanup_s"],
        2.0,
        "x",
    ),
    ("peak RSS, audit (MB)", lambda r: r["audit_rss_mb"], 100.0, ""),
    ("peak RSS, serve (MB)", lambda r: r["serve_rss_mb"], 100.0, ""),
)
GROWTH = (
    ("shell pipeline", "pipeline_s"),
    ("floor", "floor_s"),
    ("cold audit", "audit_s"),
    ("warm scrape", "scrape_s"),
    ("cleanup --apply", "cleanup_s"),
    ("cleanup change window", "cleanup_window_s"),
    ("restore", "restore_s"),
    ("node_exporter ipvs scrape", "ne_scrape_s"),
    ("kube-proxy --cleanup", "kp_cleanup_s"),
    ("baseline cleanup", "baseline_cleanup_s"),
    ("cleanup procedure floor", "cleanup_floor_s"),
    ("audit peak RSS", "audit_rss_mb"),
    ("serve peak RSS", "serve_rss_mb"),
    ("cleanup peak RSS", "cleanup_rss_mb"),
    ("build (lab state)", "build_s"),
)


def _ratio(r: dict[str, Any], a: str, b: str) -> float | None:
    return r[a] / r[b] if r.get(a) and r.get(b) else None


def _paired(r: dict[str, Any], a: str, b: str) -> float | None:
    """The median of a / b over the rounds that timed both."""
    xs, ys = r.get("samples", {}).get(a), r.get("samples", {}).get(b)
    if not xs or not ys or len(xs) != len(ys):
        return None
    return statistics.median(x / y for x, y in zip(xs, ys, strict=True))


def _f(x: float | None, d: int = 2) -> str:
    return "—" if x is None else f"{x:.{d}f}"


UNCACHED_ROOT = "9p, uncached (every open and stat a round trip to the host)"


def by_root(meta: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by the root filesystem their run read the programs from (a merged row
    carries its own; runs before the page-cached root have none: uncached)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r.get("vm_root", meta.get("vm_root", UNCACHED_ROOT)), []).append(r)
    return groups


def _roots(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """Which root the programs were read from, per size when merged runs differ: it moves
    the ratios of Python (hundreds of files per start) to the C tools (a few)."""
    per = dict(sorted((r["n"], root) for root, grs in by_root(meta, rows).items() for r in grs))
    if len(set(per.values())) <= 1:
        return next(iter(per.values()), UNCACHED_ROOT) + "."
    return "; ".join(f"{n:,}: {root}" for n, root in per.items()) + "."


def _head(m: dict[str, Any], rs: list[dict[str, Any]]) -> list[str]:
    """The run's header and its times and peak memory."""
    out: list[str] = []
    out += [
        "# Benchmark results",
        "",
        f"Command: `{m['command']}`  ",
        f"Date: {m.get('date', '?')}; commit {m.get('commit', '?')}  ",
        f"Guest kernel: {m['kernel']} under QEMU TCG ({m['cpus']} vCPU, no KVM); Python "
        f"{m['python']}; {m['nft']}; {m['iptables']}; {m['ipvsadm']}  ",
        f"Host: {m.get('host', '?')}. Median of {m['repeat']} runs per cell. Absolute times "
        "are TCG times (10-35x a real node): compare ratios within this run only.  ",
        f"Guest root filesystem: {_roots(m, rs)}",
        "",
        "## Times (seconds, median) and peak RSS (MB)",
        "",
        "| Services | shell pipeline | floor (process) | floor (in-process) | cold audit | "
        "warm scrape | cleanup --apply | baseline cleanup | audit RSS | serve RSS | backup MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rs:
        out.append(
            f"| {r['n']:,} | {_f(r.get('pipeline_s'))} | {_f(r.get('floor_s'))} | "
            f"{_f(r.get('floor_inproc_s'))} | {_f(r.get('audit_s'))} | {_f(r.get('scrape_s'))} | "
            f"{_f(r.get('cleanup_s'))} | {_f(r.get('baseline_cleanup_s'))} | "
            f"{_f(r.get('audit_rss_mb'), 0)} | {_f(r.get('serve_rss_mb'), 0)} | "
            f"{_f(r.get('backup_mb'), 1)} |"
        )
    return out


def _ratios(m: dict[str, Any], rs: list[dict[str, Any]]) -> list[str]:
    """The agent against the shell pipeline, the floor and the baseline."""
    out: list[str] = []
    out += [
        "",
        "## Ratios",
        "",
        "| Services | scrape / pipeline (≤1.0) | scrape / floor (≤3) | audit / pipeline (≤2.0) "
        "| cleanup / baseline (≤2) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rs:
        ratios = (
            _ratio(r, "scrape_s", "pipeline_s"),
            _ratio(r, "scrape_s", "floor_s"),
            _ratio(r, "audit_s", "pipeline_s"),
            _ratio(r, "cleanup_s", "baseline_cleanup_s"),
        )
        out.append(f"| {r['n']:,} | " + " | ".join(_f(x) for x in ratios) + " |")
    return out


def _targets(m: dict[str, Any], rs: list[dict[str, Any]]) -> list[str]:
    """The targets at 10,000 Services (or the largest size)."""
    out: list[str] = []
    at = next((r for r in rs if r["n"] == 10000), rs[-1] if rs else None)
    if at is not None and "cleanup_s" in at:
        out += [
            "",
            f"## Targets at {at['n']:,} Services",
            "",
            "| target | value | limit | met |",
            "|---|---:|---:|:---:|",
        ]
        for label, fn, limit, unit in TARGETS:
            v = fn(at)
            met = "yes" if v <= limit else "**no**"
            if label.startswith("cleanup") and v > limit and at.get("cleanup_floor_s"):
                # The cleanup procedure's own minimum (docs/contract.md#cleanup): two reads
                # (plan, re-audit), the gate, the backup.
                spec_floor = at["cleanup_floor_s"] - at["floor_inproc_s"]
                least = spec_floor / at["baseline_cleanup_s"]
                if least > limit:
                    met = f"**no**: impossible, the cleanup procedure's floor is {least:.2f}x"
            out.append(f"| {label} | {v:.2f}{unit} | ≤ {limit:g}{unit} | {met} |")
    return out


def _growth(m: dict[str, Any], rs: list[dict[str, Any]]) -> list[str]:
    """Growth exponents, within one root filesystem."""
    out: list[str] = []
    groups = by_root(m, rs)
    for root, grs in groups.items():
        # Only within one root: the uncached one charges small sizes' Python starts more, so
        # an exponent across the two would measure the bench's filesystem, not the agent.
        if len(grs) < 2:
            continue
        n0, n1 = grs[0]["n"], grs[-1]["n"]
        where = f" (root: {root.split(' (')[0]})" if len(groups) > 1 else ""
        out += [
            "",
            f"## Growth exponent {n0:,} → {n1:,} Services{where}: "
            f"log(t{n1}/t{n0}) / log({n1}/{n0})",
            "",
            "1.0 is linear; the target is ≤ 1.0 (within noise) for the agent's measures.",
            "",
            "| measure | exponent | sizes |",
            "|---|---:|---|",
        ]
        for label, key in GROWTH:
            have = [r["n"] for r in grs if r.get(key)]
            span = f"{have[0]:,} → {have[-1]:,}" if len(have) >= 2 else "—"
            out.append(f"| {label} | {_f(growth(grs, key))} | {span} |")
    return out


def _peers(m: dict[str, Any], rs: list[dict[str, Any]]) -> list[str]:
    """The agent against the tools operators already run."""
    out: list[str] = []
    out += [
        "",
        "## Against the tools operators already run",
        "",
        "node_exporter: Debian's `prometheus-node-exporter --collector.disable-defaults "
        "--collector.ipvs` in the same namespace, warm scrape and VmHWM. kube-proxy: real "
        "`kube-proxy --cleanup` on the same state (no NFTablesProxyMode gate: nftables untouched). "
        "Change window: cleanup's own first-to-last-change time. restore: `ipvs-leftovers "
        "restore BUNDLE` after the cleanup; tools: `ipset restore`, `iptables-nft-restore`, "
        "`ip -batch`, `ipvsadm -R` loading the same objects from scratch. CPU per scrape: "
        "serve's user+system CPU per timed scrape in the VM, with the save tools it runs "
        "(waited-for children); runs before bf233b4 counted serve alone.",
        "",
        "| Services | warm scrape | node_exporter | ratio (≤1) | serve MB | node_exporter MB "
        "| cleanup | change window | kube-proxy --cleanup | cleanup ratio (≤1) "
        "| window ratio (≤0.5) | restore | tools | restore ratio (≤1.2) | audit / pipeline (≤1) "
        "| serve CPU s/scrape (VM) | node, % of a core at 30 s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rs:
        out.append(
            f"| {r['n']:,} | {_f(r.get('scrape_s'))} | {_f(r.get('ne_scrape_s'))} | "
            f"{_f(_ratio(r, 'scrape_s', 'ne_scrape_s'))} | {_f(r.get('serve_rss_mb'), 0)} | "
            f"{_f(r.get('ne_rss_mb'), 0)} | {_f(r.get('cleanup_s'))} | "
            f"{_f(r.get('cleanup_window_s'))} | {_f(r.get('kp_cleanup_s'))} | "
            f"{_f(_ratio(r, 'cleanup_s', 'kp_cleanup_s'))} | "
            f"{_f(_ratio(r, 'cleanup_window_s', 'kp_cleanup_s'))} | {_f(r.get('restore_s'))} | "
            f"{_f(r.get('rebuild_s'))} | {_f(_ratio(r, 'restore_s', 'rebuild_s'))} | "
            f"{_f(_ratio(r, 'audit_s', 'pipeline_s'))} | "
            f"{_f(r.get('serve_cpu_per_scrape_s'), 3)} | {_f(node_cpu_share(r, m), 3)} |"
        )
    notes = [f"- {r['n']:,}: kube-proxy --cleanup: {x}" for r in rs for x in r.get("kp_notes", [])]
    if notes:
        out += ["", *notes]
    return out


def _peer_targets(m: dict[str, Any], rs: list[dict[str, Any]]) -> list[str]:
    """The targets against those tools, per size."""
    out: list[str] = []
    for at in (r for r in rs if r["n"] in (1000, 10000, 20000) and r.get("ne_scrape_s")):
        out += [
            "",
            f"### Targets against the tools operators run, at {at['n']:,} Services",
            "",
            "| target | value | limit | met |",
            "|---|---:|---:|:---:|",
        ]
        for label, a, b, limit in PEER_TARGETS:
            v = _ratio(at, a, b)
            met = "—" if v is None else ("yes" if v <= limit else "**no**")
            out.append(f"| {label} | {_f(v)}x | ≤ {limit:g}x | {met} |")
        share = node_cpu_share(at, m)
        met = "—" if share is None else ("yes" if share < 1.0 else "**no**")
        out.append(f"| serve CPU on a node, % of one core | {_f(share, 3)} | < 1 | {met} |")
        if at["n"] == 20000:
            for label, key, limit in (
                ("peak RSS, serve (MiB)", "serve_rss_mb", 64.0),
                ("peak RSS, audit (MB)", "audit_rss_mb", 100.0),
            ):
                v = at.get(key)
                met = "—" if v is None else ("yes" if v <= limit else "**no**")
                out.append(f"| {label} | {_f(v, 0)} | ≤ {limit:g} | {met} |")
    return out


def _cleanup_floor(m: dict[str, Any], rs: list[dict[str, Any]]) -> list[str]:
    """cleanup --apply against the least the procedure can cost."""
    out: list[str] = []
    out += [
        "",
        "## Cleanup against the least the cleanup procedure can cost",
        "",
        "The baseline only deletes. `cleanup --apply` must also write the backup bundle with the",
        "operators' tools, read the node to plan, confirm again right before the first change,",
        "and re-audit after. Floor = baseline + backup tools (`ipvsadm -S -n`, `ipset save`,",
        "`iptables-nft-save`, `ip addr`) + the raw-netlink floor once as a process and twice",
        "in-process (three reads, one interpreter start). The procedure itself asks only for the",
        "gate before the first change; the agent re-reads the whole node there and compares",
        "plans (README, Decisions), so the floor without that third read is shown too.",
        "",
        "| Services | baseline | backup tools | procedure floor | floor / baseline "
        "| cleanup --apply | cleanup / floor | floor, 2 reads | cleanup / floor (2 reads) "
        "| cleanup peak RSS MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rs:
        if not r.get("cleanup_floor_s"):
            continue
        out.append(
            f"| {r['n']:,} | {_f(r['baseline_cleanup_s'])} | {_f(r['backup_tools_s'])} | "
            f"{_f(r['cleanup_floor_s'])} | "
            f"{r['cleanup_floor_s'] / r['baseline_cleanup_s']:.2f} | {_f(r['cleanup_s'])} | "
            f"{r['cleanup_s'] / r['cleanup_floor_s']:.2f} | "
            f"{_f(r['cleanup_floor_s'] - r['floor_inproc_s'])} | "
            f"{r['cleanup_s'] / (r['cleanup_floor_s'] - r['floor_inproc_s']):.2f} | "
            f"{_f(r.get('cleanup_rss_mb'), 0)} |"
        )
    return out


def _audit_floor(m: dict[str, Any], rs: list[dict[str, Any]]) -> list[str]:
    """The cold audit against the least a Python audit can cost."""
    out: list[str] = []
    starts = [r for r in rs if r.get("startup_floor_s")]
    if starts:
        out += [
            "",
            "## Cold audit against the least a Python audit can cost",
            "",
            "What any `click` + `dataclasses` + `json` program pays before its first read (the "
            "agent's interpreter importing the three), plus the raw netlink reads in-process "
            "(bench/floor.py). The shell pipeline's tools are C programs that start in "
            "milliseconds on a node; under TCG every Python import is 10-35x slower.",
            "",
            "| Services | shell pipeline | python -c pass | + click, dataclasses, json "
            "| + raw reads (audit floor) | audit floor / pipeline | cold audit "
            "| audit / pipeline | audit / pipeline, per round | audit / floor |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in starts:
            least = r["startup_floor_s"] + r["floor_inproc_s"]
            out.append(
                f"| {r['n']:,} | {_f(r['pipeline_s'])} | {_f(r.get('python_start_s'))} | "
                f"{_f(r['startup_floor_s'])} | {_f(least)} | {least / r['pipeline_s']:.2f} | "
                f"{_f(r['audit_s'])} | {r['audit_s'] / r['pipeline_s']:.2f} | "
                f"{_f(_paired(r, 'audit', 'pipeline'))} | {r['audit_s'] / least:.2f} |"
            )
        out += [
            "",
            "*per round*: the median of each round's audit / pipeline (the two run back to back), "
            "which the VM's drift within a run moves less than the ratio of the medians.",
        ]
    return out


def _build(m: dict[str, Any], rs: list[dict[str, Any]]) -> list[str]:
    """The lab state's build, and the counts both reads agree on."""
    out: list[str] = []
    out += [
        "",
        "## Lab state build (not a target)",
        "",
        "| Services | build s (tools, in VM) | steps | cleanup rebuild s |",
        "|---:|---:|---|---:|",
    ]
    for r in rs:
        steps = ", ".join(f"{k} {v:.1f}" for k, v in r.get("build_steps_s", {}).items())
        out.append(
            f"| {r['n']:,} | {_f(r.get('build_s'), 1)} | {steps} | {_f(r.get('rebuild_s'), 1)} |"
        )
    out += ["", "Counts checked equal between the shell pipeline and the floor at every size:", ""]
    for r in rs:
        if "counts" not in r:
            continue
        c = r["counts"]["floor"]
        out.append(
            f"- {r['n']:,}: {c['ipvs_services']} IPVS services, {c['ipvs_dests']} real servers, "
            f"{c['kube_ipvs0_addrs']} kube-ipvs0 addresses, {c['kube_ipsets']} KUBE- sets "
            f"({c['kube_ipset_elements']} elements), {c['nat_kube_rules']} nat KUBE- rules, "
            f"{c['nft_tables']} nf_tables tables"
        )
    return out


# The report's sections, each a table (or a few) of the results, in order.
_SECTIONS = (
    _head,
    _ratios,
    _targets,
    _growth,
    _peers,
    _peer_targets,
    _cleanup_floor,
    _audit_floor,
    _build,
)


def markdown(doc: dict[str, Any]) -> str:
    m, rs = doc["meta"], doc["results"]
    return "\n".join(line for section in _SECTIONS for line in section(m, rs)) + "\n"


def growth(results: list[dict[str, Any]], key: str) -> float | None:
    """log(t_last / t_first) / log(N_last / N_first): 1.0 is linear."""
    pts = [(r["n"], r.get(key)) for r in results if r.get(key)]
    if len(pts) < 2 or pts[0][0] == pts[-1][0]:
        return None
    (n0, t0), (n1, t1) = pts[0], pts[-1]
    return math.log(t1 / t0) / math.log(n1 / n0)


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' results.json as one table (sizes run in separate VM boots).

    Every ratio is still within one size, measured in one run; only the growth exponents
    span runs.
    """
    meta = dict(docs[0]["meta"])
    meta["command"] = "`; `".join(d["meta"]["command"] for d in docs)
    meta["commit"] = ", ".join(sorted({str(d["meta"].get("commit")) for d in docs}))
    results = sorted(
        (
            {
                "calibrate_host_s": d["meta"].get("calibrate_host_s"),
                "calibrate_vm_s": d["meta"].get("calibrate_vm_s"),
                "commit": d["meta"].get("commit"),
                "vm_root": d["meta"].get("vm_root", UNCACHED_ROOT),
                **r,
            }
            for d in docs
            for r in d["results"]
        ),
        key=lambda r: r["n"],
    )
    keys = {
        k
        for r in results
        for k, v in r.items()
        if k.endswith(("_s", "_mb"))
        and not k.startswith("calibrate_")
        and isinstance(v, int | float)
    }
    # Per root, as in the markdown: an exponent from a page-cached row to an uncached one
    # would measure the bench's filesystem.
    per_root = {
        root: {k: growth(grs, k) for k in keys}
        for root, grs in by_root(meta, results).items()
        if len(grs) >= 2
    }
    return {"meta": meta, "results": results, "growth": per_root}


if __name__ == "__main__":
    # python -m bench.report results.json [more.json ...] > results.md
    found = [json.loads(Path(p).read_text()) for p in sys.argv[1:]]
    sys.stdout.write(markdown(found[0] if len(found) == 1 else merge(found)))
