"""audit --json on lab nodes in namespaces of this kernel: ipsets, iptables (both backends),
nftables and links. IPVS and dummy are the VM tier's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests import oracle
from tests.conftest import run_agent

pytestmark = pytest.mark.netns


@pytest.mark.parametrize("backend", ["nft", "legacy"])
@pytest.mark.parametrize("dual_stack", [False, True], ids=["ipv4", "dual-stack"])
def test_counts_equal_what_the_lab_programmed(
    netns: Callable[[], str], backend: str, dual_stack: bool
) -> None:
    node = realistic_node(
        dual_stack=dual_stack,
        backend=backend,
        third_party=True,
        nftables_table=True,
        old_release_orphans=True,
    )
    ns = netns()
    build.build(ns, node)
    r = run_agent(ns, "audit", "--json")
    assert r.rc == 1, r.stderr  # leftovers, kube-proxy not reachable: not confirmed
    assert oracle.actual(r.json) == oracle.expected(node)
    # the other backend holds nothing of kube-proxy's
    assert {c["backend"] for c in r.json["leftovers"]["iptables_chains"]} == {backend}


def test_exact_counts_of_the_realistic_ipv4_node(netns: Callable[[], str]) -> None:
    """Hand-checked numbers, so the oracle itself is checked once."""
    ns = netns()
    build.build(ns, realistic_node(backend="nft", third_party=True))
    left = run_agent(ns, "audit", "--json").json["leftovers"]
    assert left["ipsets"] == {"ipv4": 17, "ipv6": 0}
    assert left["iptables_jump_rules"] == 9
    chains = {(c["table"], c["chain"]): c["rules"] for c in left["iptables_chains"]}
    assert sorted(chains) == sorted(
        [
            ("nat", c)
            for c in (
                "KUBE-SERVICES",
                "KUBE-POSTROUTING",
                "KUBE-NODE-PORT",
                "KUBE-LOAD-BALANCER",
                "KUBE-MARK-MASQ",
            )
        ]
        + [
            ("filter", c)
            for c in (
                "KUBE-FORWARD",
                "KUBE-NODE-PORT",
                "KUBE-PROXY-FIREWALL",
                "KUBE-SOURCE-RANGES-FIREWALL",
                "KUBE-IPVS-FILTER",
                "KUBE-IPVS-OUT-FILTER",
            )
        ]
    )
    assert chains[("nat", "KUBE-MARK-MASQ")] == 1
    assert chains[("filter", "KUBE-FORWARD")] == 2


def test_survivors_are_classified_foreign_kubelet_and_nftables_mode(
    netns: Callable[[], str],
) -> None:
    ns = netns()
    build.build(ns, realistic_node(backend="legacy", third_party=True, nftables_table=True))
    findings = run_agent(ns, "audit", "--json").json["findings"]
    by_class: dict[str, set[str]] = {}
    for f in findings:
        by_class.setdefault(f["class"], set()).add(f["name"])
    assert by_class["nftables-mode"] == {"ip kube-proxy"}
    assert by_class["kubelet"] == {
        "legacy/ipv4/mangle KUBE-IPTABLES-HINT",
        "legacy/ipv4/mangle KUBE-KUBELET-CANARY",
        "legacy/ipv4/nat KUBE-KUBELET-CANARY",
        "legacy/ipv4/filter KUBE-KUBELET-CANARY",
        "legacy/ipv4/filter KUBE-FIREWALL",
        "legacy/ipv4/filter INPUT -> KUBE-FIREWALL",
        "legacy/ipv4/filter OUTPUT -> KUBE-FIREWALL",
    }
    assert {
        "office-allow",
        "inet filter-user",
        "legacy/ipv4/nat DOCKER",
        "legacy/ipv4/filter DOCKER-USER",
        "legacy/ipv4/nat CNI-HOSTPORT-DNAT",
    } <= by_class["foreign"]
    assert not any(n.startswith("KUBE-") for n in by_class["foreign"])


def test_stale_when_kube_proxy_confirms_nftables(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = netns()
    build.build(ns, realistic_node(dual_stack=True, nftables_table=True))
    state = {"mode": "nftables", "families": ["IPv4", "IPv6"], "last_sync_age": 3.0}
    with start_fake_kube_proxy(ns, state, tmp_path / "kp.json") as kp:
        doc = run_agent(ns, "audit", "--json").json
        assert doc["mode"]["detected"] == "nftables"
        assert doc["mode"]["nftables_confirmed"] is True, doc["mode"]["evidence"]
        assert doc["stale"] is True
        for fmt in ("old", "oldest"):
            kp.set(healthz_format=fmt)
            doc = run_agent(ns, "audit", "--json").json
            assert doc["mode"]["nftables_confirmed"] is True, (fmt, doc["mode"]["evidence"])
        # idle: kube-proxy re-syncs hourly, and a node being deleted fails only /healthz
        kp.set(healthz_format="json", last_sync_age=3000.0)
        assert run_agent(ns, "audit", "--json").json["mode"]["nftables_confirmed"] is True
        kp.set(node_eligible=False)
        doc = run_agent(ns, "audit", "--json").json
        assert doc["mode"]["nftables_confirmed"] is True, doc["mode"]
        kp.set(node_eligible=False, healthz_format="oldest")  # no /livez to tell: refuse
        assert run_agent(ns, "audit", "--json").json["mode"]["nftables_confirmed"] is False
        kp.set(node_eligible=True, healthz_format="json", healthy=False)  # stuck
        doc = run_agent(ns, "audit", "--json").json
        assert doc["mode"]["nftables_confirmed"] is False and doc["stale"] is False
        kp.set(healthy=True)
        kp.set(mode="ipvs", last_sync_age=3.0)
        r = run_agent(ns, "audit", "--json")
        assert r.json["mode"]["detected"] == "ipvs" and r.rc == 0  # in use, not left over


def test_nftables_mode_without_ip6_table_on_dual_stack_is_not_confirmed(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = netns()
    build.build(ns, realistic_node(nftables_table=True))  # ip kube-proxy only
    state = {"mode": "nftables", "families": ["IPv4", "IPv6"]}
    with start_fake_kube_proxy(ns, state, tmp_path / "kp.json"):
        doc = run_agent(ns, "audit", "--json").json
    assert doc["mode"]["nftables_confirmed"] is False
    assert "no nftables table ip6 kube-proxy for active family IPv6" in doc["mode"]["evidence"]


def test_human_report_groups_and_ends_with_the_verdict(netns: Callable[[], str]) -> None:
    ns = netns()
    build.build(ns, realistic_node())
    r = run_agent(ns, "audit")
    assert r.rc == 1
    lines = r.stdout.splitlines()
    assert lines[-1].startswith("LEFTOVERS: ")
    assert "ipvs-leftover (" in r.stdout and "kubelet (" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_nftables_mode_tables_match_the_nft_tool(netns: Callable[[], str]) -> None:
    import json
    import re

    ns = netns()
    build.build(ns, realistic_node(dual_stack=True, nftables_table=True))
    tables = run_agent(ns, "audit", "--json").json["nftables_mode"]["tables"]
    assert {(t["family"], t["table"]) for t in tables} == {
        ("ip", "kube-proxy"),
        ("ip6", "kube-proxy"),
    }
    for t in tables:
        text = build.run(
            ["ip", "netns", "exec", ns, "nft", "list", "table", t["family"], "kube-proxy"]
        )
        assert t["chains"] == len(re.findall(r"^\s+chain ", text, re.M))
        for name, count in t["sets"].items():
            doc = json.loads(
                build.run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        ns,
                        "nft",
                        "-j",
                        "list",
                        "set" if name in ("cluster-ips", "nodeport-ips") else "map",
                        t["family"],
                        "kube-proxy",
                        name,
                    ]
                )
            )
            (obj,) = [o for o in doc["nftables"] if "set" in o or "map" in o]
            assert count == len(next(iter(obj.values())).get("elem", [])), name


# --- iptables-save lines read as iptables-restore reads them ---------------------


def _load(ns: str, backend: str, text: str) -> None:
    """Rules put in by the real iptables-restore, as a CNI plugin or an admin would."""
    build.run(build.in_ns(ns, f"iptables-{backend}-restore", "-w", "10", "--noflush"), stdin=text)


@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_a_single_quote_in_an_interface_name_is_no_read_error(
    netns: Callable[[], str], backend: str
) -> None:
    """iptables-save writes interface names as they are: `-i cni'0`, an unbalanced quote for a
    shell, a plain character for iptables-restore. The source stays readable and counted."""
    node = realistic_node(backend=backend, third_party=True)
    ns = netns()
    build.build(ns, node)
    _load(ns, backend, "*filter\n-A INPUT -i cni'0 -j ACCEPT\nCOMMIT\n")
    assert "-A INPUT -i cni'0 -j ACCEPT" in build.run(build.in_ns(ns, f"iptables-{backend}-save"))
    r = run_agent(ns, "audit", "--json")
    assert r.json["sources"][f"iptables_{backend}"] == {
        **r.json["sources"][f"iptables_{backend}"],
        "status": "ok",
        "error": None,
    }
    assert r.rc == 1, r.stderr
    assert oracle.actual(r.json) == oracle.expected(node)


@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_a_foreign_jump_after_a_backslash_is_counted(
    netns: Callable[[], str], backend: str
) -> None:
    """`-i ext\\ -j KUBE-MARK-MASQ`: for iptables-restore the backslash ends the interface name
    and the rule jumps into kube-proxy's chain; both such rules are foreign references."""
    node = realistic_node(backend=backend)
    ns = netns()
    build.build(ns, node)
    before = run_agent(ns, "audit", "--json").json["findings"]
    _load(
        ns,
        backend,
        "*nat\n:CNI-EXT - [0:0]\n-A CNI-EXT -i ext\\ -j KUBE-MARK-MASQ\n"
        "-A PREROUTING -i ext\\ -j KUBE-MARK-MASQ\nCOMMIT\n",
    )
    r = run_agent(ns, "audit", "--json")
    assert r.rc == 1, r.stderr
    new = [f for f in r.json["findings"] if f not in before]
    mark = f"{backend}/ipv4/nat KUBE-MARK-MASQ"
    assert sorted((f["class"], f["kind"], f["name"]) for f in new) == [
        ("foreign", "chain", f"{backend}/ipv4/nat CNI-EXT"),
        ("ipvs-leftover", "chain", mark),  # the same chain, its evidence grown by the reference
        ("unknown-kube", "jump-rule", f"{backend}/ipv4/nat PREROUTING -> KUBE-MARK-MASQ"),
    ]
    (chain,) = [f for f in new if f["name"] == mark]
    assert [e for e in chain["evidence"] if e.startswith("referenced by")] == [
        "referenced by CNI-EXT: -i ext\\ -j KUBE-MARK-MASQ"
    ]
