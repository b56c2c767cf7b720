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
import time
from pathlib import Path

from bench import fastbuild
from lab import build as lab_build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import scaled_node
from tests.dumps import dump


def timed(args: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    s = time.perf_counter()
    p = subprocess.run(args, text=True, capture_output=True)
    return time.perf_counter() - s, p


def one(name: str, agent: str, n: int, backend: str, texts: dict[str, str], out: Path) -> dict:
    ns = f"rs-{n}-{backend}"
    lab_build.delete_netns(ns)
    lab_build.create_netns(ns)
    work = out / f"{name}-{n}-{backend}"
    work.mkdir(parents=True, exist_ok=True)
    row: dict[str, object] = {"agent": name, "services": n, "backend": backend}
    kp = None
    try:
        node = scaled_node(n, with_ipvs=True, nftables_table=True, backend=backend)
        fastbuild.apply(ns, node, texts, backend)
        kp = start_fake_kube_proxy(ns, {"mode": "nftables", "families": ["IPv4"]}, work / "kp")
        before = dump(ns, ipvs=True)
        lock = ["--lock-file", str(work / "lock")]
        t, p = timed(
            lab_build.in_ns(ns, agent, "cleanup", "--apply", "--backup-dir", str(work / "b"), *lock)
        )
        row.update(
            cleanup_s=round(t, 2),
            cleanup_rc=p.returncode,
            cleanup_err=p.stderr.strip().splitlines()[-1:] if p.returncode else [],
        )
        bundles = [b for b in (work / "b").iterdir() if not b.name.startswith(".")]
        if p.returncode == 0 and bundles:
            row["bundle_mb"] = round(sum(f.stat().st_size for f in bundles[0].iterdir()) / 1e6, 2)
            # an agent named old* predates restore's --lock-file (it took no lock)
            restore_lock = [] if name.startswith("old") else lock
            t, p = timed(lab_build.in_ns(ns, agent, "restore", *restore_lock, str(bundles[0])))
            row.update(
                restore_s=round(t, 2),
                restore_rc=p.returncode,
                restore_out=p.stdout.strip().splitlines()[-12:],
                restore_err=p.stderr.strip().splitlines()[-1:],
            )
            row["exact"] = dump(ns, ipvs=True) == before
    finally:
        if kp is not None:
            kp.stop()
        lab_build.delete_netns(ns)
    return row


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--render-dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--agent", action="append", required=True, help="NAME=PATH")
    ap.add_argument("--backends", default="nft,legacy")
    ap.add_argument("sizes", nargs="+", type=int)
    args = ap.parse_args(argv)
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "dummy"], check=True)
    rows = []
    failed = 0
    for n in args.sizes:
        texts = fastbuild.load(args.render_dir, n)
        for backend in args.backends.split(","):
            for spec in args.agent:
                name, _, path = spec.partition("=")
                row = one(name, path, n, backend, texts, args.out)
                rows.append(row)
                ok = row.get("cleanup_rc") == 0 and row.get("restore_rc") == 0 and row.get("exact")
                failed += not ok
                print(json.dumps(row), flush=True)
                (args.out / "restore-sizes.json").write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
