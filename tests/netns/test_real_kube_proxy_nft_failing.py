"""Real kube-proxy (the newest release) in nftables mode whose `nft` transactions fail after it
started (tests/failing_kube_proxy.py: a wrapper `nft` first on its PATH), with a Service added
after the failures began. Its /livez stays 200 (a failed transaction queues nothing, and the
queued Service turns it unhealthy only after twice the sync period), so on such a node its
table lacks that Service, which IPVS still answers through kube-ipvs0: the cleanup must refuse
and change nothing (this host has no IPVS: the node's state byte-identical). Once the failures
stop and kube-proxy has synced, the gate confirms and the cleanup runs.

Needs the project-built kube-proxy (tests/upstream.py); missing, the test fails: no skip."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from lab.scenarios import realistic_node
from tests.conftest import REPO
from tests.dumps import dump, minus_leftovers
from tests.netns.test_cleanup import apply
from tests.netns.test_real_kube_proxy_iptables_mode import kube_proxy_binary

pytestmark = [pytest.mark.netns, pytest.mark.upstream]
FAILURES = 'kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"}'
GET = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n"
    "    r = urllib.request.urlopen(sys.argv[1], timeout=5); print(r.status); print(r.read().decode())\n"
    "except urllib.error.HTTPError as e:\n"
    "    print(e.code)\n"
)


def get(ns: str, url: str) -> tuple[int, str]:
    """An HTTP GET from inside the namespace: (status, body)."""
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", GET, url],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    status, _, body = out.partition("\n")
    return int(status), body


def metric(ns: str, series: str) -> float | None:
    _, body = get(ns, "http://127.0.0.1:10249/metrics")
    found = [line.split()[-1] for line in body.splitlines() if line.startswith(series + " ")]
    return float(found[0]) if found else None


def wait(what: str, ready: Callable[[], bool], log: Path, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {seconds:g}s; kube-proxy's log {log}", pytrace=False)
        time.sleep(0.3)


def table(ns: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "list", "table", "ip", "kube-proxy"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_failing_nft_transactions_refuse_the_cleanup_until_they_stop(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = netns()
    control, log = tmp_path / "control", tmp_path / "kube-proxy.log"
    control.mkdir()
    cmd = [sys.executable, "-m", "tests.failing_kube_proxy", kube_proxy_binary(tmp_path)]
    proc = subprocess.Popen(["ip", "netns", "exec", ns, *cmd, str(log), str(control)], cwd=REPO)
    try:
        wait("kube-proxy's first sync", lambda: (control / "ready").exists(), log, 120)
        # then the ipvs-mode leftovers (nftables mode's start removes what it can of them)
        build.build(ns, realistic_node(backend="nft", third_party=True))
        (control / "fail").write_text("")
        (control / "add-late").write_text("")  # 10.96.4.90, added once the failures began
        wait("a failed transaction", lambda: (metric(ns, FAILURES) or 0) >= 1, log)
        before = dump(ns)

        # a window past the sync period between the gate's two reads
        r = apply(ns, tmp_path, "--pause-before-execute", "32")
        assert get(ns, "http://127.0.0.1:10256/livez")[0] == 200  # kube-proxy: healthy
        assert r.rc == 3, r.stdout + r.stderr
        assert re.search(
            r"^ipvs-leftovers: refused: nftables mode is not confirmed \(IPv4: a change queued "
            r"3\ds ago is not synced \(last successful sync: 3\ds ago; .*\); nothing was changed$",
            r.stderr,
            re.M,
        ), r.stderr
        # and its retry, --sync-period after the first failure, failed too: the counter rose
        assert (metric(ns, FAILURES) or 0) >= 2
        assert dump(ns) == before
        assert "10.96.4.90" not in table(ns)  # the Service kube-proxy never wrote

        (control / "fail").unlink()
        (control / "add-later").write_text("")  # a change, so it syncs now, not at its retry
        # each Service with its endpoint: kube-proxy may write a Service before its
        # EndpointSlice (to reject-chain) and change it a moment later, after `recovered`
        wait(
            "the table with both Services and their endpoints",
            lambda: all(f"dnat to 10.244.0.{n}:80" in table(ns) for n in (52, 53)),
            log,
        )
        assert "10.96.4.90" in table(ns) and "10.96.4.91" in table(ns)
        recovered = dump(ns)
        r = apply(ns, tmp_path)
        assert r.rc == 0, r.stdout + r.stderr
        assert dump(ns) == minus_leftovers(recovered)
    finally:
        (control / "stop").write_text("")
        proc.wait(30)
