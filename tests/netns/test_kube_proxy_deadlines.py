"""Every wait on kube-proxy bounded by a deadline, its answers by a size: a
real misbehaving server (tests/misbehaving_kube_proxy.py) on the namespace's
loopback, where kube-proxy listens."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, python_json, run_agent
from tests.misbehaving_kube_proxy import running
from tests.serving import serving

pytestmark = pytest.mark.netns
FETCH = str(REPO / "tests" / "fetch.py")


def _timed_agent(
    ns: str, *args: str, limit: float = 60
) -> tuple[float, subprocess.CompletedProcess[str]]:
    from tests.conftest import AGENT

    start = time.monotonic()
    p = subprocess.run(
        ["ip", "netns", "exec", ns, AGENT, *args], capture_output=True, text=True, timeout=limit
    )
    return time.monotonic() - start, p


def test_a_dripping_kube_proxy_is_cut_at_the_timeout(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """kube-proxy answers 200, then its body a byte a second. `--timeout 2` bounds the
    whole of kube-proxy's four answers (read at once): the gate refuses in about 2 s. Before,
    each read had its own timeout and the cleanup was still running at 60 s (here it would
    hit the 60 s limit of the run)."""
    ns = netns()
    with running(ns, "drip"):
        took, plan = _timed_agent(ns, "--timeout", "2", "cleanup")
        lock = str(tmp_path / "cleanup.lock")  # not the machine's: another test may hold it
        took_apply, applied = _timed_agent(
            ns, "--timeout", "2", "cleanup", "--apply", "--lock-file", lock
        )
        took_audit, audit = _timed_agent(ns, "--timeout", "2", "audit", "--json")
    assert took < 8, took
    assert plan.returncode == 0, plan.stderr  # an empty namespace: nothing to remove
    assert "--apply would be refused: nftables mode is not confirmed" in plan.stdout
    assert "not complete by the deadline" in plan.stdout
    assert took_apply < 8 and applied.returncode == 0, (took_apply, applied.stderr)
    assert took_audit < 8, took_audit
    assert audit.returncode == 4  # an answer begun and not finished is an error, not absent
    import json

    sources = json.loads(audit.stdout)["sources"]
    for name in ("kube_proxy_mode", "kube_proxy_metrics", "kube_proxy_healthz"):
        assert sources[name]["status"] == "error", sources[name]
        assert "not complete by the deadline" in sources[name]["error"]


def test_a_dripping_kube_proxy_is_cut_when_cleanup_applies(netns: Callable[[], str]) -> None:
    """With something to remove: the gate (both of its readings) ends by the deadline
    and refuses; the lock is not held on."""
    from lab import build
    from lab.scenarios import realistic_node

    ns = netns()
    build.build(ns, realistic_node())
    with running(ns, "drip"):
        took, p = _timed_agent(
            ns, "--timeout", "2", "cleanup", "--apply", "--lock-file", f"/tmp/{ns}.lock"
        )
    assert took < 15, took
    assert p.returncode == 3, p.stderr
    assert "nftables mode is not confirmed" in p.stderr
    Path(f"/tmp/{ns}.lock").unlink(missing_ok=True)


def test_a_stuck_kube_proxy_does_not_make_serve_miss_the_scrape_deadline(
    netns: Callable[[], str],
) -> None:
    """kube-proxy accepts and never answers, --timeout is 10 s, Prometheus' scrape
    times out after 3 s: serve answers before 3 s, kube-proxy's sources down. Before, its four
    endpoints were read one after another (12.7 s for a 10 s scrape timeout)."""
    ns = netns()
    with running(ns, "hang"), serving(ns, "--min-interval", "0", "--source-timeout", "30"):
        got = python_json(
            ns,
            FETCH,
            "http://127.0.0.1:9437/metrics",
            "--header",
            "X-Prometheus-Scrape-Timeout-Seconds:3",
            "--timeout",
            "30",
        )
    assert got.get("status") == 200, got
    assert got["seconds"] < 3, got["seconds"]
    for source in ("kube_proxy_mode", "kube_proxy_metrics", "kube_proxy_healthz"):
        assert f'ipvs_leftovers_source_up{{source="{source}"}} 0.0' in got["body"]
    assert 'ipvs_leftovers_source_up{source="links"} 1.0' in got["body"]


def _hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("chunked", [False, True], ids=["sized", "chunked"])
def test_a_200_mb_metrics_is_refused_in_bounded_memory(
    netns: Callable[[], str], chunked: bool
) -> None:
    """a 200 MB /metrics (sized, or chunked and unsized as Go sends it) is cut at the
    16 MiB cap, the source is an error, and serve's peak RSS stays far under the DaemonSet's
    256Mi. Before, serve reached 267 MB."""
    ns = netns()
    extra = ("--chunked",) if chunked else ()
    with (
        running(ns, "huge", "--size", "200", *extra),
        serving(ns, "--min-interval", "0") as proc,
    ):
        got = python_json(ns, FETCH, "http://127.0.0.1:9437/metrics", "--timeout", "60")
        peak = _hwm_kib(proc.pid)
    assert got.get("status") == 200, got
    assert 'ipvs_leftovers_source_up{source="kube_proxy_metrics"} 0.0' in got["body"]
    assert 'ipvs_leftovers_source_up{source="kube_proxy_mode"} 1.0' in got["body"]
    assert peak < 100 * 1024, f"serve peaked at {peak} KiB"


def test_a_15_mb_metrics_is_read_whole_in_bounded_memory(netns: Callable[[], str]) -> None:
    """Under the cap, a big /metrics is parsed as it arrives, never held whole."""
    ns = netns()
    with (
        running(ns, "huge", "--size", "15", "--chunked"),
        serving(ns, "--min-interval", "0") as proc,
    ):
        got = python_json(ns, FETCH, "http://127.0.0.1:9437/metrics", "--timeout", "60")
        peak = _hwm_kib(proc.pid)
    assert 'ipvs_leftovers_source_up{source="kube_proxy_metrics"} 1.0' in got["body"]
    assert peak < 100 * 1024, f"serve peaked at {peak} KiB"


@pytest.mark.parametrize(
    "option",
    [
        "--kube-proxy-metrics-url",
        "--kube-proxy-healthz-url",
        "IPVS_LEFTOVERS_KUBE_PROXY_METRICS_URL",
    ],
)
def test_a_url_with_cr_lf_is_refused_and_never_sent(
    netns: Callable[[], str], tmp_path: Path, option: str
) -> None:
    """CR/LF in a kube-proxy URL (a request-injection attempt) is a usage error, exit
    2, and nothing reaches kube-proxy's ports. Before, the request carried the extra header."""
    ns = netns()
    record = tmp_path / "requests.txt"
    record.touch()
    url = "http://127.0.0.1:10249/x\r\nX-Injected: 1\r\n"
    if option.startswith("--"):
        args, env = [option, url, "audit"], None
    else:
        args, env = ["audit"], {option: url}
    with running(ns, "record", "--record", str(record)):
        r = run_agent(ns, *args, env=env)
        time.sleep(0.5)
    assert r.rc == 2, (r.rc, r.stderr)
    assert "control character" in r.stderr and "Traceback" not in r.stderr
    assert "X-Injected" not in record.read_text()
