"""Whole lab nodes with IPVS and a dummy kube-ipvs0, on Debian's kernel in the VM."""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from agent import names
from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests import oracle
from tests.conftest import run_agent

pytestmark = pytest.mark.vm
MODULES = ("ip_vs", "ip_vs_rr", "ip_vs_wlc", "ip_vs_sh", "dummy")


@pytest.fixture(scope="module", autouse=True)
def _modules() -> None:
    # The VM tier exists for IPVS and dummy: when they cannot load, the tier fails loudly.
    subprocess.run(["modprobe", "-a", *MODULES], check=True)


@pytest.mark.parametrize("backend", ["nft", "legacy"])
@pytest.mark.parametrize("dual_stack", [False, True], ids=["ipv4", "dual-stack"])
def test_counts_equal_what_the_lab_programmed(
    netns: Callable[[], str], backend: str, dual_stack: bool
) -> None:
    node = realistic_node(
        dual_stack=dual_stack,
        backend=backend,
        with_ipvs=True,
        third_party=True,
        nftables_table=True,
        old_release_orphans=True,
    )
    ns = netns()
    build.build(ns, node)
    r = run_agent(ns, "audit", "--json")
    assert r.rc == 1, r.stderr
    want = oracle.expected(node)
    assert want["ipvs_virtual_servers"] > 0 and want["foreign"]["ipvs_virtual_servers"] == 2
    assert oracle.actual(r.json) == want
    assert r.json["leftovers"]["kube_ipvs0"]["kind"] == "dummy"
    assert r.json["leftovers"]["kube_ipvs0"]["up"] is False


def test_exact_ipvs_numbers_of_the_realistic_ipv4_node(netns: Callable[[], str]) -> None:
    """Hand-counted from lab/scenarios.py, so the oracle is checked once on IPVS too."""
    ns = netns()
    build.build(ns, realistic_node(with_ipvs=True, third_party=True))
    doc = run_agent(ns, "audit", "--json").json
    names = {f["name"]: f["class"] for f in doc["findings"] if f["kind"] == "ipvs-service"}
    assert names["TCP 10.96.0.1:443"] == "ipvs-leftover"
    assert names["TCP 192.168.50.10:30080"] == "ipvs-leftover"  # NodePort on the node IP
    assert names["UDP 192.168.50.10:30514"] == "ipvs-leftover"
    assert names["TCP 203.0.113.10:80"] == "ipvs-leftover"  # LoadBalancer IP
    assert names["TCP 192.168.50.100:80"] == "foreign"  # keepalived
    assert names["FWM 100 IPv4"] == "foreign"
    assert doc["foreign"] == {"ipvs_virtual_servers": 2, "ipvs_real_servers": 4}
    assert doc["leftovers"]["kube_ipvs0"]["present"] is True


def test_stale_on_a_confirmed_nftables_node(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = netns()
    build.build(ns, realistic_node(dual_stack=True, with_ipvs=True, nftables_table=True))
    state = {"mode": "nftables", "families": ["IPv4", "IPv6"]}
    with start_fake_kube_proxy(ns, state, tmp_path / "kp.json"):
        r = run_agent(ns, "audit")
    assert r.rc == 1
    assert r.stdout.splitlines()[-1].startswith("STALE: ")


def _python_on_ipvs_node(netns: Callable[[], str], code: str) -> str:
    """Run `code` in a fresh namespace holding the realistic ipvs-mode node; its stdout."""
    ns = netns()
    build.build(ns, realistic_node(with_ipvs=True))
    return build.run(["ip", "netns", "exec", ns, "python", "-c", code])


def test_a_read_decodes_only_the_sets_that_name_address_and_port(
    netns: Callable[[], str],
) -> None:
    """docs/contract.md#ownership needs each virtual server's address and port in a KUBE-* set, so the sets of
    `IP,proto:port` members and the NodePort bitmaps of the protocols in use are decoded; the
    endpoint-sized sets (KUBE-LOOP-BACK, KUBE-IPVS-IPS, the source-range sets) never are."""
    code = (
        "from agent.collect import Options, collect;"
        "s = collect(Options(timeout=1));"
        "print(sorted(x.name for x in s.ipsets.data if x.entries is not None));"
        "print(sorted(x.name for x in s.ipsets.data))"
    )
    decoded_line, present_line = _python_on_ipvs_node(netns, code).strip().splitlines()
    present = set(ast.literal_eval(present_line))
    wanted = names.VIP_PORT_SETS | names.NODE_PORT_SETS["TCP"] | names.NODE_PORT_SETS["UDP"]
    assert ast.literal_eval(decoded_line) == sorted(present & wanted)
    assert "KUBE-CLUSTER-IP" in present and "KUBE-NODE-PORT-TCP" in present
    never = {"KUBE-LOOP-BACK", "KUBE-IPVS-IPS", "KUBE-LOAD-BALANCER-SOURCE-CIDR"}
    assert never <= present


def test_a_scrape_decodes_no_real_server(netns: Callable[[], str]) -> None:
    """A scrape only counts real servers: rendering the metrics must leave every one undecoded,
    while the servers themselves, listed when something needs them (RealServers, as the backup
    does), are as many."""
    code = (
        "from prometheus_client import CollectorRegistry, generate_latest;"
        "from agent.cli.common import collection as _collection;"
        "from agent.collect import Options;"
        "from agent.views.metrics import AgentCollector, SharedCollection;"
        "col = _collection(Options(timeout=1), 300.0);"
        "reg = CollectorRegistry();"
        "reg.register(AgentCollector(SharedCollection(lambda: col, 60.0)));"
        "generate_latest(reg);"
        "svcs = col.snapshot.ipvs.data;"
        "from agent.readers.ipvs import RealServers;"
        "decoded = sum(getattr(s.dests, '_decoded', None) is not None for s in svcs);"
        "listed = RealServers();"
        "print(decoded, len(svcs), sum(len(s.dests) for s in svcs),"
        " sum(len(tuple(listed(s))) for s in svcs))"
    )
    out = _python_on_ipvs_node(netns, code).split()
    decoded, services, counted, decoded_count = map(int, out)
    want = oracle.expected(realistic_node(with_ipvs=True))
    assert decoded == 0
    assert services == want["ipvs_virtual_servers"] + want["foreign"]["ipvs_virtual_servers"]
    assert counted == decoded_count
    assert counted == want["ipvs_real_servers"] + want["foreign"]["ipvs_real_servers"]
