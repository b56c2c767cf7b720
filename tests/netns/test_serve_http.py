"""serve's HTTP surface: TLS per connection, both families by default,
process_* metrics, _info series, the scrape deadline, HEAD."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lab import build
from lab.scenarios import realistic_node
from tests.conftest import REPO, python_json
from tests.serving import broken_tool_dir, scrape, serving

pytestmark = pytest.mark.netns
FETCH = str(REPO / "tests" / "fetch.py")


def fetch(ns: str, url: str, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = python_json(ns, FETCH, url, *args)
    return result


@contextmanager
def idle_connection(ns: str, port: int = 9437) -> Iterator[None]:
    """A TCP client that connects and then says nothing (a port scan, a stuck client)."""
    code = (
        "import socket, sys, time\n"
        f"s = socket.create_connection(('127.0.0.1', {port}))\n"
        "print('connected', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "connected"
        yield
    finally:
        proc.kill()
        proc.wait()


def _certificate(tmp: Path) -> tuple[Path, Path]:
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_an_idle_tls_connection_stalls_no_other_client(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    cert, key = _certificate(tmp_path)
    ns = netns()
    with serving(ns, "--tls-cert", str(cert), "--tls-key", str(key)), idle_connection(ns):
        metrics = fetch(ns, "https://127.0.0.1:9437/metrics", "--insecure", "--timeout", "5")
        health = fetch(ns, "https://127.0.0.1:9437/healthz", "--insecure", "--timeout", "5")
    assert metrics.get("status") == 200, metrics
    assert "ipvs_leftovers_stale" in metrics["body"]
    assert health.get("status") == 200 and health["body"] == "ok\n", health
    assert health["seconds"] < 2


def test_a_plain_http_client_on_the_tls_port_gets_nothing_and_stalls_nobody(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    cert, key = _certificate(tmp_path)
    ns = netns()
    with serving(ns, "--tls-cert", str(cert), "--tls-key", str(key)):
        plain = fetch(ns, "http://127.0.0.1:9437/healthz", "--timeout", "5")
        health = fetch(ns, "https://127.0.0.1:9437/healthz", "--insecure", "--timeout", "5")
    assert "status" not in plain  # the handshake failed: the connection was closed
    assert health.get("status") == 200


def test_default_listen_answers_on_ipv4_and_ipv6(netns: Callable[[], str]) -> None:
    ns = netns()
    with serving(ns, "--listen", ":9437") as proc:  # the last --listen wins: the default
        v4 = fetch(ns, "http://127.0.0.1:9437/healthz", "--timeout", "5")
        v6 = fetch(ns, "http://[::1]:9437/healthz", "--timeout", "5")
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert v4.get("status") == 200, v4
    assert v6.get("status") == 200, v6
    assert "serving on [::]:9437 (IPv4 and IPv6)" in err


def test_default_listen_with_ipv6_disabled_by_sysctl_still_answers_on_ipv4(
    netns: Callable[[], str],
) -> None:
    ns = netns()
    for key in ("all", "default", "lo"):
        build.run(
            ["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"]
        )
    with serving(ns, "--listen", ":9437"):
        v4 = fetch(ns, "http://127.0.0.1:9437/healthz", "--timeout", "5")
    assert v4.get("status") == 200, v4


def test_an_explicit_ipv4_address_stays_ipv4_only(netns: Callable[[], str]) -> None:
    ns = netns()
    with serving(ns, "--listen", "0.0.0.0:9437"):
        v4 = fetch(ns, "http://127.0.0.1:9437/healthz", "--timeout", "5")
        v6 = fetch(ns, "http://[::1]:9437/healthz", "--timeout", "5")
    assert v4.get("status") == 200
    assert "status" not in v6  # refused


def test_process_metrics_and_info_series_that_are_1(netns: Callable[[], str]) -> None:
    ns = netns()
    with serving(ns):
        samples = scrape(ns, "http://127.0.0.1:9437/metrics")["samples"]
    assert samples["process_resident_memory_bytes"] > 10_000_000
    assert samples["process_open_fds"] >= 3
    assert samples["process_start_time_seconds"] > time.time() - 600
    info = {k: v for k, v in samples.items() if k.split("{")[0].endswith("_info")}
    assert info and set(info.values()) == {1.0}, info
    assert [k for k in info if "kube_proxy_mode_info" in k] == [
        'ipvs_leftovers_kube_proxy_mode_info{mode="unknown"}'
    ]


def test_head_on_metrics_answers_headers_only(netns: Callable[[], str]) -> None:
    ns = netns()
    with serving(ns):
        head = fetch(ns, "http://127.0.0.1:9437/metrics", "--method", "HEAD")
        get = fetch(ns, "http://127.0.0.1:9437/metrics")
    assert head.get("status") == 200, head
    assert head["body"] == ""
    assert head["content_type"] == get["content_type"]
    assert head["content_type"].startswith("text/plain; version=")
    assert int(head["content_length"]) > 1000


@pytest.mark.alone  # answered within 2 s: the agent's deadline, not the machine's load
def test_the_scrape_deadline_is_honoured(netns: Callable[[], str], tmp_path: Path) -> None:
    """A source slower than Prometheus' scrape timeout costs its source_up, not the scrape.

    iptables-nft-save hangs (the per-tool --timeout of 5 s stops it); Prometheus says its
    scrape times out after 2 s: the answer comes before that, with that one source down.
    """
    ns = netns()
    build.build(ns, realistic_node(backend="legacy"))
    # an iptables-nft table, so that the nft reader runs its (hung) save tool at all
    build.run(["ip", "netns", "exec", ns, "iptables-nft", "-t", "filter", "-N", "PROBE"])
    path = broken_tool_dir(tmp_path, "iptables-nft-save", "sleep 30")
    with serving(ns, "--source-timeout", "30", "--min-interval", "0", env={"PATH": path}):
        timed = fetch(
            ns,
            "http://127.0.0.1:9437/metrics",
            "--header",
            "X-Prometheus-Scrape-Timeout-Seconds:2",
        )
        time.sleep(5)  # the stuck read ends (tool timeout) before the next collection
        untimed = fetch(ns, "http://127.0.0.1:9437/metrics")
    assert timed.get("status") == 200, timed
    assert timed["seconds"] < 2, timed["seconds"]
    assert 'ipvs_leftovers_source_up{source="iptables_nft"} 0.0' in timed["body"]
    assert 'ipvs_leftovers_source_up{source="iptables_legacy"} 1.0' in timed["body"]
    assert 'ipvs_leftovers_ipsets{family="ipv4"} 17.0' in timed["body"]
    assert untimed["seconds"] > 4  # without the header the tool's own timeout is the bound


FALLBACK = """
import errno, socket
from prometheus_client import CollectorRegistry
from agent.views import server

class NoIPv6(server._DualStack):
    def __init__(self, *args, **kwargs):  # as on a kernel booted with ipv6.disable=1
        raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")

server._DualStack = NoIPv6
s = server.make_server("", 9437, CollectorRegistry())
print(s.socket.family == socket.AF_INET, s.server_address[0])
s.server_close()
"""


def test_default_listen_falls_back_to_ipv4_without_ipv6_sockets(netns: Callable[[], str]) -> None:
    """No kernel here lacks AF_INET6, so the kernel's refusal is played by the test."""
    out = subprocess.run(
        ["ip", "netns", "exec", netns(), sys.executable, "-c", FALLBACK],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == ["True", "0.0.0.0"]
