"""serve's HTTP server under a flood of idle connections: probes and scrapes still answered.

Real clients on the namespace's loopback. The flood and the probes come from the same address
(127.0.0.1), as a hostNetwork pod's connections share the node's address with the kubelet's.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.conftest import REPO, python_json
from tests.serving import serving

pytestmark = pytest.mark.netns
FETCH = str(REPO / "tests" / "fetch.py")

# Opens N connections to :9437 without blocking (the kernel finishes each handshake, or keeps
# retrying its SYN while the listen backlog is full) and then says nothing on any of them.
IDLE_FLOOD = """
import resource, select, socket, sys, time
n = int(sys.argv[1])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 256), hard))
conns = []
for _ in range(n):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", 9437))
    conns.append(s)
time.sleep(1)
print(len(conns), flush=True)
time.sleep(120)
"""

# A kubelet's probes: a fresh connection each, a 1 s timeout each, one every 0.5 s.
PROBES = """
import json, sys, time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
results = []
for _ in range(int(sys.argv[1])):
    start = time.monotonic()
    try:
        with opener.open("http://127.0.0.1:9437/healthz", timeout=1) as r:
            ok = r.status == 200 and r.read() == b"ok\\n"
    except OSError:
        ok = False
    results.append([ok, round(time.monotonic() - start, 3)])
    time.sleep(max(0.5 - (time.monotonic() - start), 0))
print(json.dumps(results))
"""


# containerd 2.x gives a container 1,024 file descriptors (soft) and 524,288 (hard); the hard
# limit here is this machine's, at most that
CONTAINERD = (1024, min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 524288))


@pytest.mark.parametrize(("n", "nofile"), [(1200, CONTAINERD), (3000, CONTAINERD), (3000, None)])
def test_idle_connections_starve_neither_probes_nor_scrapes(
    netns: Callable[[], str], n: int, nofile: tuple[int, int] | None
) -> None:
    """n idle connections from the probes' own address: 10 /healthz probes over 5 s, each
    with a kubelet's 1 s timeout, all answered, and a scrape too. Before, the accept loop
    stopped accepting at 1,024 connections being read, and probes queued behind them in the
    listen backlog until the 10 s request deadline freed room."""
    ns = netns()
    with serving(ns, nofile=nofile):
        flood = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", IDLE_FLOOD, str(n)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert flood.stdout is not None and int(flood.stdout.readline()) == n
            probes = python_json(ns, "-c", PROBES, "10", timeout=60)
            scrape = python_json(
                ns,
                FETCH,
                "http://127.0.0.1:9437/metrics",
                "--header",
                "X-Prometheus-Scrape-Timeout-Seconds:10",
                "--timeout",
                "10",
            )
        finally:
            flood.kill()
            flood.wait()
    answered = sum(ok for ok, _ in probes)
    assert answered == 10, f"{answered}/10 probes answered: {json.dumps(probes)}"
    assert scrape.get("status") == 200, scrape
    assert "ipvs_leftovers_stale" in scrape["body"]
