"""A/B: cold `audit --json` of several installed agent copies on one node, in one VM boot.

    python -m bench.ab N RENDER OUT K AGENT [AGENT ...]     (in the VM, see bench/README.md)

Builds the bench node of N Services once, then K rounds; each round times the shell pipeline
and every AGENT's `audit --json` in turn, so the copies share the same state and the same
moments of a noisy machine. Prints each one's median and its ratio to the pipeline's median,
and its sources' read times; writes each one's `-X importtime` (OUT/importtime-I.txt) and
cProfile (OUT/audit-I.prof) of one more run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.probe import bench_node
from bench.suite import PIPELINE, med, timed
from lab import build as lab_build


def _comparable(text: str) -> str:
    doc = json.loads(text)
    for source in doc["sources"].values():
        source.pop("seconds", None)
    return json.dumps(doc, sort_keys=True)


def main() -> int:
    n, render, out, k = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    agents = sys.argv[5:]
    ns = f"ab-{n}"
    with bench_node(ns, n, render, out):
        # The copies must report the same before their times count (read times aside).
        docs = {
            a: _comparable(timed(lab_build.in_ns(ns, a, "audit", "--json"), ok=(1,))[1])
            for a in agents
        }
        if len(set(docs.values())) != 1:
            raise SystemExit(
                "the agents' audit documents differ: "
                + ", ".join(f"{a}: {hash(d)}" for a, d in docs.items())
            )
        times: dict[str, list[float]] = {"pipeline": [], **{a: [] for a in agents}}
        reads: dict[str, dict[str, list[float]]] = {}
        for _ in range(k):
            times["pipeline"].append(timed(lab_build.in_ns(ns, "bash", "-c", PIPELINE))[0])
            for a in agents:
                t, text = timed(lab_build.in_ns(ns, a, "audit", "--json"), ok=(1,))
                times[a].append(t)
                for name, source in json.loads(text)["sources"].items():
                    reads.setdefault(a, {}).setdefault(name, []).append(source["seconds"])
        pipe = med(times["pipeline"])
        for label, xs in times.items():
            print(
                f"{label:50s} {med(xs):6.2f}s {med(xs) / pipe:5.2f}x  {[round(x, 2) for x in xs]}",
                flush=True,
            )
        for a, sources in reads.items():
            print(f"{a}: " + ", ".join(f"{k} {med(v):.2f}" for k, v in sources.items()), flush=True)
        for i, a in enumerate(agents):  # where each copy's time goes, as it runs
            py = str(Path(a).with_name("python"))
            p = subprocess.run(
                lab_build.in_ns(ns, py, "-X", "importtime", a, "audit", "--json"),
                capture_output=True,
                text=True,
            )
            (out / f"importtime-{i}.txt").write_text(p.stderr)
            prof = out / f"audit-{i}.prof"
            subprocess.run(
                lab_build.in_ns(ns, py, "-m", "cProfile", "-o", str(prof), a, "audit", "--json"),
                capture_output=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
