"""Errors a user can cause: one line, the documented exit code, never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests.conftest import run_agent

pytestmark = pytest.mark.netns


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.alone  # compares the machine's list of namespaces, which other workers change
def test_empty_namespace_reads_clean_and_creates_nothing(netns: Callable[[], str]) -> None:
    ns = netns()
    before_ns = build.run(["ip", "netns", "list"])
    r = run_agent(ns, "audit", "--json")
    assert r.rc == 0, r.stderr
    assert r.json["sources"]["ipvs"]["status"] == "absent"  # this kernel has no IPVS
    assert build.run(["ip", "netns", "exec", ns, "cat", "/proc/net/ip_tables_names"]) == ""
    assert build.run(["ip", "netns", "exec", ns, "cat", "/proc/net/ip6_tables_names"]) == ""
    assert build.run(["ip", "netns", "list"]) == before_ns


def test_without_cap_net_admin(netns: Callable[[], str]) -> None:
    ns = netns()
    drop = ("setpriv", "--bounding-set", "-net_admin", "--inh-caps", "-net_admin")
    r = run_agent(ns, "audit", prefix=drop)
    assert r.rc == 4
    assert "CAP_NET_ADMIN" in _one_line(r.stderr)
    nobody = ("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups")
    r = run_agent(ns, "audit", prefix=nobody)
    assert r.rc == 4 and "CAP_NET_ADMIN" in _one_line(r.stderr)


def test_kube_proxy_unreachable_is_a_warning_not_an_error(netns: Callable[[], str]) -> None:
    ns = netns()
    build.build(ns, realistic_node())
    r = run_agent(ns, "audit", "--json")
    assert r.rc == 1  # leftovers present, mode unknown
    assert "kube-proxy not reachable" in _one_line(r.stderr)
    assert r.json["sources"]["kube_proxy_mode"]["status"] == "absent"
    assert r.json["mode"]["detected"] == "unknown"


def test_kube_proxy_answering_garbage_exits_4(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = netns()
    with start_fake_kube_proxy(ns, {"garbage": True}, tmp_path / "kp.json"):
        r = run_agent(ns, "audit", "--json")
    assert r.rc == 4
    for src in ("kube_proxy_mode", "kube_proxy_metrics", "kube_proxy_healthz"):
        assert r.json["sources"][src]["status"] == "error"
    assert all(
        line.startswith("ipvs-leftovers: could not read kube_proxy_")
        for line in r.stderr.splitlines()
    )
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("args", "word"),
    [
        (["--timeout", "0", "audit"], "--timeout"),
        (["--kube-proxy-metrics-url", "localhost:10249", "audit"], "--kube-proxy-metrics-url"),
        (["--kube-proxy-healthz-url", "http://[::1:10256/", "audit"], "--kube-proxy-healthz-url"),
        (["audit", "--max-sync-age", "soon"], "--max-sync-age"),
        (["--log-format", "xml", "audit"], "--log-format"),
        (["audit", "--bogus"], "--bogus"),
    ],
)
def test_bad_options_exit_2(netns: Callable[[], str], args: list[str], word: str) -> None:
    r = run_agent(netns(), *args)
    assert r.rc == 2
    assert word in r.stderr and "Traceback" not in r.stderr


def test_env_var_mirrors_option(netns: Callable[[], str]) -> None:
    r = run_agent(netns(), "audit", env={"IPVS_LEFTOVERS_TIMEOUT": "-1"})
    assert r.rc == 2 and "--timeout" in r.stderr


def test_legacy_tables_need_cap_net_raw(netns: Callable[[], str]) -> None:
    ns = netns()
    build.build(ns, realistic_node(backend="legacy"))
    drop = ("setpriv", "--bounding-set", "-net_raw", "--inh-caps", "-net_raw")
    r = run_agent(ns, "audit", prefix=drop)
    assert r.rc == 4
    line = _one_line(r.stderr)
    assert "CAP_NET_RAW" in line and "CAP_NET_ADMIN" not in line
    # without legacy tables, CAP_NET_ADMIN alone is enough
    r = run_agent(netns(), "audit", "--json", prefix=drop)
    assert r.rc == 0, r.stderr
