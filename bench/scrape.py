"""Scrape client for the warm-scrape measure: python bench/scrape.py URL K [node_exporter].

Waits for /healthz (node_exporter: /metrics), scrapes /metrics once to warm the server, then
times K scrapes (the request only: a new connection each, as Prometheus does). Prints JSON.
Fails if any source_up is 0, so a timed-out source cannot pass for a fast scrape; for
node_exporter, unless its ipvs collector succeeded and listed every real server.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse


def get(host: str, port: int, path: str) -> tuple[int, bytes]:
    c = http.client.HTTPConnection(host, port, timeout=3600)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _cpu(pid: str) -> float:
    """utime + stime + cutime + cstime: the server's CPU and that of the children it waited
    for (serve runs iptables-nft-save / iptables-legacy-save on every scrape)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    u = urlparse(sys.argv[1])
    k = int(sys.argv[2])
    host, port = u.hostname or "127.0.0.1", u.port or 9437
    peer = len(sys.argv) > 3 and sys.argv[3] == "node_exporter"
    ready = "/metrics" if peer else "/healthz"
    deadline = time.monotonic() + 300
    while True:
        try:
            if get(host, port, ready)[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            print("serve did not come up", file=sys.stderr)
            return 1
        time.sleep(0.1)
    s = time.perf_counter()
    code, body = get(host, port, "/metrics")
    first = time.perf_counter() - s
    timed = []
    cpu_pid = os.environ.get("SCRAPE_CPU_PID")
    cpu0 = _cpu(cpu_pid) if cpu_pid else 0.0
    for _ in range(k):
        s = time.perf_counter()
        code, body = get(host, port, "/metrics")
        timed.append(time.perf_counter() - s)
        if code != 200:
            print(f"/metrics answered {code}: {body[:500]!r}", file=sys.stderr)
            return 1
    # the server's CPU seconds (user + system, its waited-for children's included) per timed
    # scrape, from /proc/PID/stat
    cpu = (_cpu(cpu_pid) - cpu0) / k if cpu_pid else None
    if peer:
        text = body.decode()
        ok = 'node_scrape_collector_success{collector="ipvs"} 1' in text
        backends = sum(line.startswith("node_ipvs_backend_weight{") for line in text.splitlines())
        if not ok or not backends:
            print(f"node_exporter's ipvs collector failed: {text[-800:]}", file=sys.stderr)
            return 1
        doc = {"first": first, "timed": timed, "bytes": len(body), "backends": backends}
        print(json.dumps({**doc, "cpu_per_scrape": cpu}))
        return 0
    down = [
        line
        for line in body.decode().splitlines()
        if line.startswith("ipvs_leftovers_source_up{") and line.endswith(" 0.0")
    ]
    if down or b"ipvs_leftovers_stale 1.0" not in body:
        print(f"unexpected scrape: sources down {down}; stale must be 1", file=sys.stderr)
        return 1
    print(json.dumps({"first": first, "timed": timed, "bytes": len(body), "cpu_per_scrape": cpu}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
