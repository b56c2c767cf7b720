"""Where a warm scrape's time goes, in the VM: python -m bench.profile_scrape N OUT [RENDER].

Builds the bench node of N Services in a namespace (kube-proxy's nftables table of 10
Services), starts the fake kube-proxy, then inside the namespace runs serve's own collection
(its options, but no per-source budget, so that every reader runs in the profiled thread: no
nftables detail, kube-proxy's configuration) and exposition twice to warm, and a third time
under cProfile. Writes OUT/profile-scrape-N.txt: each source's seconds, then the profile.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from bench import fastbuild
from lab import build as lab_build
from lab.kube_proxy import start_fake_kube_proxy

INNER = """
import cProfile, dataclasses, io, pstats, sys, time
from prometheus_client import CollectorRegistry, generate_latest
from agent.cli.common import collection as _collection
from agent.collect import Options, for_scrapes
from agent.views.metrics import AgentCollector, SharedCollection

# no per-source budget: each reader then runs in this thread, where cProfile sees it
opts = for_scrapes(Options(budget=None))  # what serve reads
shared = SharedCollection(lambda: _collection(opts, 0.0, config=True), 0.0)
registry = CollectorRegistry(auto_describe=False)
registry.register(AgentCollector(shared, None))
for _ in range(2):
    generate_latest(registry)
prof = cProfile.Profile()
start = time.perf_counter()
prof.enable()
body = generate_latest(registry)
prof.disable()
total = time.perf_counter() - start
col = shared.get()
print(f"scrape {total:.3f}s, {len(body)} bytes, collection {col.seconds:.3f}s")
for name, r in col.snapshot.sources().items():
    print(f"  {name:20} {r.status:6} {r.seconds:8.3f}s")
out = io.StringIO()
pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(45)
print(out.getvalue())
out = io.StringIO()
pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
print(out.getvalue())
"""


def main(argv: list[str]) -> int:
    n, out = int(argv[0]), Path(argv[1])
    render = Path(argv[2]) if len(argv) > 2 else None
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "dummy"], check=True)
    ns = f"prof-{n}"
    lab_build.delete_netns(ns)
    lab_build.create_netns(ns)
    try:
        # kube-proxy's table of a 10-Service node, as in bench.memprobe: a scrape reads only
        # which tables exist, and the n-Service table is most of the build's time
        small = fastbuild.load(None, 10)
        texts = {**fastbuild.load(render, n), **{f"nft-{i}": small[f"nft-{i}"] for i in range(4)}}
        fastbuild.apply(ns, fastbuild.bench_node(n), texts)
        with tempfile.TemporaryDirectory() as tmp:
            state = {"mode": "nftables", "families": ["IPv4"]}
            with start_fake_kube_proxy(ns, state, Path(tmp) / "kp.json"):
                p = subprocess.run(
                    lab_build.in_ns(ns, sys.executable, "-c", INNER),
                    capture_output=True,
                    text=True,
                )
        text = f"warm scrape profile at {n} Services (serve's collection and exposition)\n"
        (out / f"profile-scrape-{n}.txt").write_text(text + p.stdout + p.stderr[-3000:])
        print(p.stdout[:3000], p.stderr[-2000:])
        return p.returncode
    finally:
        lab_build.delete_netns(ns)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
