"""Scrape client for the warm-scrape measure: python bench/scrape.py URL K.

Waits for /healthz, scrapes /metrics once to warm the server, then times K scrapes (the
request only: a new connection each, as Prometheus does). Prints JSON. Fails if any
source_up is 0, so a timed-out source cannot pass for a fast scrape.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from urllib.parse import urlparse


def get(host: str, port: int, path: str) -> tuple[int, bytes]:
    c = http.client.HTTPConnection(host, port, timeout=3600)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def main() -> int:
    u = urlparse(sys.argv[1])
    k = int(sys.argv[2])
    host, port = u.hostname or "127.0.0.1", u.port or 9437
    deadline = time.monotonic() + 300
    while True:
        try:
            if get(host, port, "/healthz")[0] == 200:
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
    for _ in range(k):
        s = time.perf_counter()
        code, body = get(host, port, "/metrics")
        timed.append(time.perf_counter() - s)
        if code != 200:
            print(f"/metrics answered {code}: {body[:500]!r}", file=sys.stderr)
            return 1
    down = [
        line
        for line in body.decode().splitlines()
        if line.startswith("ipvs_leftovers_source_up{") and line.endswith(" 0.0")
    ]
    if down or b"ipvs_leftovers_stale 1.0" not in body:
        print(f"unexpected scrape: sources down {down}; stale must be 1", file=sys.stderr)
        return 1
    print(json.dumps({"first": first, "timed": timed, "bytes": len(body)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
