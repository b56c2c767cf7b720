"""serve on lab nodes: values equal audit --json, shared collections, broken sources, HTTP."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from agent import __version__
from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests.conftest import run_agent
from tests.serving import audit_view, broken_tool_dir, metrics_view, scrape, serving

pytestmark = pytest.mark.netns
URL = "http://127.0.0.1:9437"


@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_scrape_equals_audit_and_has_no_node_label(
    netns: Callable[[], str], tmp_path: Path, backend: str
) -> None:
    ns = netns()
    build.build(
        ns,
        realistic_node(
            dual_stack=True,
            backend=backend,
            third_party=True,
            nftables_table=True,
            old_release_orphans=True,
        ),
    )
    with (
        start_fake_kube_proxy(
            ns, {"mode": "nftables", "families": ["IPv4", "IPv6"]}, tmp_path / "kp.json"
        ),
        serving(ns),
    ):
        samples = scrape(ns, f"{URL}/metrics")["samples"]
        doc = run_agent(ns, "audit", "--json").json
    assert metrics_view(samples) == audit_view(doc)
    assert metrics_view(samples)["stale"] is True
    assert samples['ipvs_leftovers_kube_proxy_mode_info{mode="nftables"}'] == 1
    assert samples[f'ipvs_leftovers_build_info{{version="{__version__}"}}'] == 1
    assert all("node=" not in key and "instance=" not in key for key in samples)
    assert all(samples[f'ipvs_leftovers_source_up{{source="{s}"}}'] == 1 for s in doc["sources"])


def test_fifty_concurrent_scrapes_share_one_collection(netns: Callable[[], str]) -> None:
    ns = netns()
    build.build(ns, realistic_node())
    with serving(ns, "--min-interval", "60"):
        first = scrape(ns, f"{URL}/metrics", n=50)
        second = scrape(ns, f"{URL}/metrics", n=50)
    assert first["codes"] == [200] * 50 and second["codes"] == [200] * 50
    # 100 scrapes inside one 60 s interval: exactly one collection
    assert second["samples"]["ipvs_leftovers_collections_total"] == 1


def test_a_new_collection_after_the_interval(netns: Callable[[], str]) -> None:
    ns = netns()
    with serving(ns, "--min-interval", "0"):
        scrape(ns, f"{URL}/metrics")
        after = scrape(ns, f"{URL}/metrics")["samples"]
    assert after["ipvs_leftovers_collections_total"] == 2


@pytest.mark.parametrize(
    ("body", "timeout"),
    [("echo broken >&2; exit 1", "10"), ("sleep 30", "1")],
    ids=["failing", "hanging"],
)
def test_a_broken_source_is_source_up_0_and_the_rest_still_report(
    netns: Callable[[], str], tmp_path: Path, body: str, timeout: str
) -> None:
    ns = netns()
    build.build(ns, realistic_node(backend="legacy"))
    # an iptables-nft table, so that the nft reader runs its (broken) save tool: without one
    # it has nothing to read and runs no tool
    build.run(["ip", "netns", "exec", ns, "iptables-nft", "-t", "filter", "-N", "PROBE"])
    path = broken_tool_dir(tmp_path, "iptables-nft-save", body)
    with serving(ns, "--source-timeout", timeout, env={"PATH": path}):
        samples = scrape(ns, f"{URL}/metrics")["samples"]
    assert samples['ipvs_leftovers_source_up{source="iptables_nft"}'] == 0
    assert samples['ipvs_leftovers_source_up{source="iptables_legacy"}'] == 1
    assert samples['ipvs_leftovers_ipsets{family="ipv4"}'] == 17
    assert (
        samples['ipvs_leftovers_iptables_chains{backend="legacy",family="ipv4",table="nat"}'] == 5
    )
    if timeout == "1":
        assert samples['ipvs_leftovers_scrape_duration_seconds{source="iptables_nft"}'] < 5


def test_landing_page_healthz_and_404(netns: Callable[[], str]) -> None:
    ns = netns()
    with serving(ns):
        landing = scrape(ns, f"{URL}/")
        health = scrape(ns, f"{URL}/healthz")
        with pytest.raises(subprocess.CalledProcessError):
            scrape(ns, f"{URL}/nope")
    assert landing["codes"] == [200] and 'href="/metrics"' in landing["bodies"][0]
    assert health["codes"] == [200] and health["bodies"] == ["ok\n"]


def test_tls(netns: Callable[[], str], tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    ns = netns()
    with serving(ns, "--tls-cert", str(cert), "--tls-key", str(key)):
        out = scrape(ns, "https://127.0.0.1:9437/metrics", insecure=True)
    assert out["codes"] == [200] and "ipvs_leftovers_stale" in out["samples"]


def test_sigterm_stops_cleanly_with_json_logs(netns: Callable[[], str]) -> None:
    ns = netns()
    with serving(ns, env={"IPVS_LEFTOVERS_LOG_FORMAT": "json"}) as proc:
        pass
    assert proc.returncode == 0
    err = proc.stderr.read() if proc.stderr else ""
    assert '"msg": "stopped"' in err and "Traceback" not in err


@pytest.mark.parametrize(
    "listen", ["9437", "127.0.0.1:", "127.0.0.1:70000", "::1:9437", "host:port"]
)
def test_bad_listen_is_a_usage_error(netns: Callable[[], str], listen: str) -> None:
    r = run_agent(netns(), "serve", "--listen", listen)
    assert r.rc == 2 and "--listen" in r.stderr and "Traceback" not in r.stderr


def test_listen_on_a_busy_port_is_one_line_exit_4(netns: Callable[[], str]) -> None:
    ns = netns()
    with serving(ns):
        r = run_agent(ns, "serve", "--listen", "127.0.0.1:9437")
    assert r.rc == 4
    assert r.stderr.strip().endswith("cannot listen on 127.0.0.1:9437: Address already in use")


def test_textfile_is_written_with_the_same_values(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = netns()
    build.build(ns, realistic_node())
    prom = tmp_path / "ipvs_leftovers.prom"
    r = run_agent(ns, "audit", "--json", "--textfile", str(prom))
    assert r.rc == 1
    text = prom.read_text()
    assert 'ipvs_leftovers_ipsets{family="ipv4"} 17.0' in text
    assert "ipvs_leftovers_collections_total 1.0" in text
    bad = run_agent(ns, "audit", "--textfile", str(tmp_path / "missing-dir" / "x.prom"))
    assert bad.rc == 4 and "cannot write --textfile" in bad.stderr.splitlines()[-1]
