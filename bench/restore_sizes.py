"""`cleanup --apply` then `restore`, each exactly as an operator types it (defaults; only the
backup folder and lock file named), on the bench's node of N Services, both iptables backends.

In the VM (scripts/vm-run --cached-root), after `python -m bench.fastbuild RENDER N...` on the
host:

    python -m bench.restore_sizes --render-dir RENDER --out OUT --agent NAME=PATH [...] N [N ...]

Each (agent, N, backend) gets a fresh namespace: its node is built, the fake kube-proxy answers
nftables mode, cleanup and restore run and are timed, and the node after restore must be
byte-identical to the node before cleanup (tests.dumps.dump, IPVS included). Exit codes are
recorded, never assumed: a run that fails is reported as failed with its last stderr line.
Writes OUT/restore-sizes.json and prints one line per run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import fastbuild
from lab import build as lab_build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import scaled_node
from tests.dumps import dump


def timed(args: list[str]) -> tuple[float, int, list[str], list[str]]:
    """Seconds, exit code, stdout lines each prefixed with the second it arrived at (the agent
    echoes and flushes each step's line as it goes: the steps' times without touching it),
    stderr lines."""
    s = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(args, text=True, stdout=subprocess.PIPE, stderr=err)
        assert p.stdout is not None
        lines = [f"{time.perf_counter() - s:7.1f} {line.rstrip()}" for line in p.stdout]
        rc = p.wait()
        took = time.perf_counter() - s
        err.seek(0)
        return took, rc, lines, err.read().strip().splitlines()


def summary(d: dict[str, list[str]]) -> dict[str, int]:
    """What a node holds of the objects cleanup and restore touch, counted from a dump."""
    chains = {
        t: sum(x.startswith(":KUBE-") for x in d[t])
        for t in ("iptables-legacy-save", "iptables-nft-save")
    }
    return {
        "ipvs_services": sum(x.startswith("-A") for x in d.get("ipvsadm", [])),
        "ipvs_reals": sum(x.startswith("-a") for x in d.get("ipvsadm", [])),
        "kube_ipvs0_addrs": sum(bool(x.strip()) for x in d["kube-ipvs0"]),
        "kube_sets": sum(x.startswith("create KUBE-") for x in d["ipset"]),
        "legacy_kube_chains": chains["iptables-legacy-save"],
        "nft_kube_chains": chains["iptables-nft-save"],
    }


class Node:
    """One built node (namespace, fake kube-proxy, its dump) kept while restores leave it exact:
    the next agent's cleanup then starts from the same state without a rebuild (at 20,000
    Services a build is most of the run)."""

    def __init__(self, n: int, backend: str, texts: dict[str, str], out: Path) -> None:
        self.ns = f"rs-{n}-{backend}"
        lab_build.delete_netns(self.ns)
        lab_build.create_netns(self.ns)
        self.kp = None
        try:
            s = time.perf_counter()
            node = scaled_node(n, with_ipvs=True, nftables_table=True, backend=backend)
            self.build_steps = fastbuild.apply(self.ns, node, texts, backend)
            self.build_s = round(time.perf_counter() - s, 1)
            out.mkdir(parents=True, exist_ok=True)
            self.kp = start_fake_kube_proxy(
                self.ns, {"mode": "nftables", "families": ["IPv4"]}, out / f"kp-{n}-{backend}"
            )
            self.before = dump(self.ns, ipvs=True)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.kp is not None:
            self.kp.stop()
        lab_build.delete_netns(self.ns)


def one(name: str, agent: str, node: Node, n: int, backend: str, out: Path) -> dict:
    """cleanup --apply then restore on `node`, as typed; row["exact"] says whether the node is
    the built one again (only then may the next agent use it)."""
    ns = node.ns
    work = out / f"{name}-{n}-{backend}"
    work.mkdir(parents=True, exist_ok=True)
    row: dict[str, object] = {"agent": name, "services": n, "backend": backend}
    row["before"] = summary(node.before)
    lock = ["--lock-file", str(work / "lock")]
    t, rc, lines, err = timed(
        lab_build.in_ns(ns, agent, "cleanup", "--apply", "--backup-dir", str(work / "b"), *lock)
    )
    row.update(
        cleanup_s=round(t, 2),
        cleanup_rc=rc,
        cleanup_out=[x for x in lines if "changes:" in x or "backup:" in x or "after:" in x]
        if rc == 0
        else lines[-12:],
        cleanup_err=err[-3:],
    )
    row["exact"] = False
    folder = work / "b"
    bundles = [b for b in folder.iterdir() if b.name[0] != "."] if folder.is_dir() else []
    if rc != 0 or not bundles:
        after = dump(ns, ipvs=True)
        # refused before its first change: the node is still the built one, reused
        row["exact"] = row["unchanged_after_cleanup"] = after == node.before
        row["left_after_cleanup"] = summary(after)
        return row
    row["bundle_mb"] = round(sum(f.stat().st_size for f in bundles[0].iterdir()) / 1e6, 2)
    # an agent named old* predates restore's --lock-file (it took no lock)
    restore_lock = [] if name.startswith("old") else lock
    t, rc, lines, err = timed(lab_build.in_ns(ns, agent, "restore", *restore_lock, str(bundles[0])))
    row.update(restore_s=round(t, 2), restore_rc=rc, restore_out=lines[-20:], restore_err=err[-1:])
    after = dump(ns, ipvs=True)
    row["exact"] = after == node.before
    if not row["exact"]:
        row["left_after_restore"] = summary(after)
    return row


def _at(lines: list[str], word: str, last: bool = False) -> float | None:
    """The arrival second of the first (or last) restore line holding `word`."""
    hits = [float(x.split()[0]) for x in lines if word in x]
    return (hits[-1] if last else hits[0]) if hits else None


def steps(row: dict) -> dict[str, float]:
    """restore's steps in seconds, from its lines' arrival times: `start` (interpreter, bundle
    check, reads) until the sets step began, then each step. The new restore says how long its
    set and IPVS loads took; the old one says only that a step ended, so its `start` holds its
    set load."""
    lines = row.get("restore_out", [])
    out: dict[str, float] = {}
    sets, link = _at(lines, "ipsets"), _at(lines, "kube-ipvs0")
    ipt, ipvs = _at(lines, "restored iptables", last=True), _at(lines, "IPVS virtual servers")
    took = {
        w: float(x.split(" in ")[1].rstrip("s"))
        for x in lines
        for w in ("ipsets", "IPVS")
        if w in x and " in " in x and x.split(" in ")[1].rstrip("s").replace(".", "").isdigit()
    }
    if sets is not None:
        out["start"] = sets - took.get("ipsets", 0.0)
        if "ipsets" in took:
            out["ipset"] = took["ipsets"]
    if sets is not None and link is not None:
        out["link"] = link - sets
    if link is not None and ipt is not None:
        out["iptables"] = ipt - link
    if ipvs is not None and ipt is not None:
        out["ipvs"] = ipvs - ipt  # the new one's read of the virtual servers present too
    return {k: round(v, 1) for k, v in out.items()}


def table(rows: list[dict]) -> str:
    """The README's restore table, from restore-sizes.json."""
    head = (
        "| Services | iptables | agent | cleanup --apply | restore | exact | restore's steps: "
        "start / ipset / kube-ipvs0 / iptables / IPVS (s) | tools from scratch: ipset / "
        "iptables / ip -batch / ipvsadm -R (s) |\n|---|---|---|---|---|---|---|---|\n"
    )
    body = []
    built: dict[tuple[int, str], dict] = {}
    for r in rows:
        if "build_steps" in r:
            built[(r["services"], r["backend"])] = r["build_steps"]
    for r in rows:
        st = steps(r)
        step_text = " / ".join(
            f"{st[k]:g}" if k in st else "-" for k in ("start", "ipset", "link", "iptables", "ipvs")
        )
        b = built.get((r["services"], r["backend"]), {})
        tools_text = " / ".join(
            f"{b[k]:g}" if k in b else "-" for k in ("ipset", "iptables", "ip-batch", "ipvsadm")
        )
        restore = (
            f"exit {r['restore_rc']}, {r['restore_s']:.1f} s" if "restore_rc" in r else "not run"
        )
        if r.get("restore_rc"):
            restore += f": {' '.join(r['restore_err'])[:120]}"
        left = r.get("left_after_restore") or r.get("left_after_cleanup")
        exact = "yes" if r.get("exact") else f"no, left {left}" if left else "no"
        small = r.get("nft_table_services", r["services"]) != r["services"]
        table_note = f" (nft table of {r['nft_table_services']})" if small else ""
        body.append(
            f"| {r['services']:,}{table_note} | {r['backend']} | {r['agent']} | "
            f"exit {r['cleanup_rc']}, {r['cleanup_s']:.1f} s | {restore} | {exact} | "
            f"{step_text} | {tools_text} |"
        )
    return head + "\n".join(body) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--render-dir", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--agent", action="append", default=[], help="NAME=PATH")
    ap.add_argument("--backends", default="nft,legacy")
    ap.add_argument(
        "--cases", help="N:BACKEND,... in this order (instead of every size x --backends)"
    )
    ap.add_argument(
        "--expect-fail", default="", help="agent names whose failure is recorded, not fatal"
    )
    ap.add_argument("sizes", nargs="*", type=int)
    ap.add_argument(
        "--nft-table-services",
        type=int,
        help="kube-proxy's nftables table of this many Services (default: the node's N)",
    )
    ap.add_argument("--table", type=Path, help="print the README table of a restore-sizes.json")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(args.table.read_text())), end="")
        return 0
    if args.cases:
        # N:BACKEND[:K], K the Services of kube-proxy's own table (--nft-table-services)
        cases = [
            (
                int(c.split(":")[0]),
                c.split(":")[1],
                int(c.split(":")[2]) if c.count(":") > 1 else None,
            )
            for c in args.cases.split(",")
        ]
    else:
        k = args.nft_table_services
        cases = [(n, b, k) for n in args.sizes for b in args.backends.split(",")]
    expect_fail = set(filter(None, args.expect_fail.split(",")))
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "dummy"], check=True)
    rows = []
    failed = 0
    texts_for: dict[tuple[int, int | None], dict[str, str]] = {}
    for n, backend, k in cases:
        if (n, k) not in texts_for:
            texts_for.clear()
            texts_for[(n, k)] = fastbuild.load(args.render_dir, n)
            if k is not None:
                # kube-proxy's own nftables table of K Services instead of N: cleanup reads
                # only which nftables tables exist and restore never touches them, and at
                # 20,000 its build (super-linear in the kernel) is most of the run (memprobe)
                small = fastbuild.load(None, k)
                texts_for[(n, k)].update({f"nft-{i}": small[f"nft-{i}"] for i in range(4)})
        node = None
        for spec in args.agent:
            name, _, path = spec.partition("=")
            if node is None:
                node = Node(n, backend, texts_for[(n, k)], args.out)
                steps = {k: round(v, 1) for k, v in node.build_steps.items()}
                built = {"build_s": node.build_s, "build_steps": steps}
            else:
                built = {"build_s": 0, "reused_node": True}
            row = {**one(name, path, node, n, backend, args.out), **built}
            row["nft_table_services"] = k or n
            rows.append(row)
            ok = row.get("cleanup_rc") == 0 and row.get("restore_rc") == 0 and row["exact"]
            failed += not ok and name not in expect_fail
            print(json.dumps(row), flush=True)
            (args.out / "restore-sizes.json").write_text(json.dumps(rows, indent=1))
            if not row["exact"]:
                node.close()
                node = None
        if node is not None:
            node.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
