"""A client's X-Prometheus-Scrape-Timeout-Seconds bounds its own answer, never anyone else's.

A lab node in nftables mode (the fake kube-proxy), one client sending a tiny scrape timeout
five times a second, and the honest readers: a Prometheus scrape and auto-cleanup's streak.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests.conftest import REPO, python_json
from tests.misbehaving_kube_proxy import running
from tests.serving import broken_tool_dir, serving

pytestmark = pytest.mark.netns
FETCH = str(REPO / "tests" / "fetch.py")
SOURCES = (
    "ipvs",
    "ipsets",
    "iptables_legacy",
    "iptables_nft",
    "nftables",
    "links",
    "kernel",
    "kube_proxy_mode",
    "kube_proxy_metrics",
    "kube_proxy_healthz",
    "kube_proxy_livez",
)

# Ten scrapes a second, each saying it times out after 1 ms; prints the status of each.
HAMMER = """
import json, sys, threading, time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
codes, stop_at = [], time.monotonic() + float(sys.argv[1])
def one():
    req = urllib.request.Request("http://127.0.0.1:9437/metrics",
                                 headers={"X-Prometheus-Scrape-Timeout-Seconds": "0.001"})
    try:
        with opener.open(req, timeout=10) as r:
            r.read()
            codes.append(r.status)
    except OSError as exc:
        codes.append(str(exc))
threads = []
while time.monotonic() < stop_at:
    t = threading.Thread(target=one)
    t.start()
    threads.append(t)
    time.sleep(0.1)
for t in threads:
    t.join()
print(json.dumps(codes), flush=True)
"""


def _sample(body: str, series: str) -> float | None:
    for line in body.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def _up(source: str) -> str:
    return f'ipvs_leftovers_source_up{{source="{source}"}}'


def _honest(ns: str) -> str:
    got = python_json(
        ns,
        FETCH,
        "http://127.0.0.1:9437/metrics",
        "--header",
        "X-Prometheus-Scrape-Timeout-Seconds:10",
        "--timeout",
        "10",
    )
    assert got.get("status") == 200, got
    body: str = got["body"]
    return body


def test_a_tiny_scrape_timeout_cuts_short_only_its_own_answer(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """A client hammering (10 a second) with a 1 ms scrape timeout: every honest scrape reads nftables mode
    confirmed and all 11 sources up, auto-cleanup's streak only grows, and the node is read
    no more often than --min-interval allows. Before, the collection its deadline cut short
    was cached for --min-interval and served to everyone: confirmed 0, sources down, the
    streak reset. iptables-nft-save takes 1 s here, so a collection outlasts the 1 s floor
    and the hostile answers stay cut short."""
    ns = netns()
    build.build(ns, realistic_node(nftables_table=True))
    build.run(["ip", "netns", "exec", ns, "iptables-nft", "-t", "filter", "-N", "PROBE"])
    slow = broken_tool_dir(
        tmp_path, "iptables-nft-save", 'sleep 1; exec /usr/sbin/iptables-nft-save "$@"'
    )
    args = ("--min-interval", "2", "--auto-cleanup", "--auto-cleanup-hold-down", "1h")
    args += ("--auto-cleanup-interval", "2", "--backup-dir", str(tmp_path / "b"))
    args += ("--lock-file", str(tmp_path / "l"))
    with (
        start_fake_kube_proxy(ns, {"mode": "nftables", "families": ["IPv4"]}, tmp_path / "kp.json"),
        serving(ns, *args, env={"PATH": slow}),
    ):
        first = _honest(ns)
        started = time.monotonic()
        hammer = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", HAMMER, "9"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            seen = []
            for _ in range(5):
                time.sleep(1.5)
                seen.append(_honest(ns))
            out, _ = hammer.communicate(timeout=60)
            elapsed = time.monotonic() - started
            last = _honest(ns)
        finally:
            hammer.kill()
            hammer.wait()
    for n, body in enumerate([first, *seen]):
        confirmed = _sample(body, "ipvs_leftovers_nftables_mode_confirmed")
        stale = _sample(body, "ipvs_leftovers_stale")
        down = [s for s in SOURCES if _sample(body, _up(s)) != 1]
        assert (confirmed, stale, down) == (1, 1, []), f"scrape {n}: {confirmed=} {stale=} {down=}"
    streak = "ipvs_leftovers_nftables_confirmed_streak_seconds"
    streaks = [_sample(body, streak) or 0.0 for body in seen]
    assert all(b > a for a, b in zip(streaks, streaks[1:], strict=False)), streaks
    # every 2 s at most, each of them whole (a hostile scrape made none of its own)
    made = (_sample(last, "ipvs_leftovers_collections_total") or 0) - (
        _sample(first, "ipvs_leftovers_collections_total") or 0
    )
    assert made <= elapsed / 2 + 1, f"{made} collections in {elapsed:.1f}s"
    hostile = json.loads(out)
    assert len(hostile) >= 45 and set(hostile) == {200}, hostile


def test_a_scrape_without_the_header_is_answered_within_30s(netns: Callable[[], str]) -> None:
    """kube-proxy accepts and never answers, its deadline is 60 s: a scrape that sends no
    X-Prometheus-Scrape-Timeout-Seconds (curl, another scraper) is answered by serve's own
    30 s bound, kube-proxy's sources down and the kernel's read. Before, it waited the 60 s."""
    ns = netns()
    env = {"IPVS_LEFTOVERS_TIMEOUT": "60"}
    with running(ns, "hang"), serving(ns, "--source-timeout", "60", env=env):
        got = python_json(ns, FETCH, "http://127.0.0.1:9437/metrics", "--timeout", "45")
    assert got.get("status") == 200, got
    assert 29 < got["seconds"] < 32, got["seconds"]
    assert _sample(got["body"], _up("kube_proxy_mode")) == 0
    assert _sample(got["body"], _up("links")) == 1
