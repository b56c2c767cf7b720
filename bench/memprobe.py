"""serve's peak RSS and audit's at one size, for one or more installed agents, on one node
(run in the VM by bench/memprobe.sh): the benchmark node without kube-proxy's nftables table,
whose build is most of the bench's time at 20,000 Services and none of serve's memory (serve
reads only which nftables tables exist).

python -m bench.memprobe N RENDER OUT LABEL=AGENT [LABEL=AGENT ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import fastbuild, suite
from lab import build as lab_build
from lab.kube_proxy import start_fake_kube_proxy


def main() -> int:
    n, render, out = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    agents = dict(a.split("=", 1) for a in sys.argv[4:])
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "dummy"], check=True)
    ns = f"memprobe-{n}"
    lab_build.delete_netns(ns)
    lab_build.create_netns(ns)
    # kube-proxy's table of a 10-Service node: nftables mode is confirmed (the scrape checks
    # that the node reads as stale), without the 20-minute table of n Services
    small = fastbuild.load(None, 10)
    texts = {**fastbuild.load(render, n), **{f"nft-{i}": small[f"nft-{i}"] for i in range(4)}}
    fastbuild.apply(ns, fastbuild.bench_node(n), texts)
    kp = start_fake_kube_proxy(ns, {"mode": "nftables", "families": ["IPv4"]}, out / "kp.json")
    results = {}
    try:
        for label, agent in agents.items():
            suite.AGENT = agent
            s = suite.warm_scrape(ns, 3, out, n)
            rss = out / "audit.rss"
            cmd = suite.with_peak_rss(rss, agent, "audit", "--json")
            p = subprocess.run(lab_build.in_ns(ns, *cmd), capture_output=True, text=True)
            if p.returncode != 1:  # a node with leftovers: audit exits 1, anything else fails
                raise SystemExit(f"{label}: audit --json exited {p.returncode}: {p.stderr[-500:]}")
            results[label] = {
                "serve_vmhwm_mib": round(s["serve_rss_mb"], 1),
                "scrape_s": round(s["scrape_s"], 2),
                "audit_peak_rss_mib": round(suite.peak_rss_mb(rss), 1),
            }
            print(f"n={n} {label}: {json.dumps(results[label])}", flush=True)
    finally:
        kp.stop()
        lab_build.delete_netns(ns)
    (out / f"memprobe-{n}.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
