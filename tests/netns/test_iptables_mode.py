"""Nodes that also ran kube-proxy's iptables mode (class iptables-leftover, docs/contract.md#ownership),
and the names of older releases, in namespaces of this kernel, both iptables backends
and both families: audit counts them exactly, the metrics agree, cleanup removes them and
nothing else."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests import oracle
from tests.conftest import run_agent
from tests.dumps import dump, minus_leftovers
from tests.netns.test_cleanup import apply

pytestmark = pytest.mark.netns
CONFIRMED = {"mode": "nftables", "last_sync_age": 2.0}


def _node(backend: str, dual: bool, after_ipvs: bool = True, **kw: Any) -> Any:
    return realistic_node(
        dual_stack=dual,
        backend=backend,
        ipvs_leftovers=after_ipvs,
        iptables_mode=True,
        third_party=True,
        nftables_table=True,
        old_release_orphans=after_ipvs,
        older_release_names=after_ipvs,
        **kw,
    )


def _mode_chain_metric(text: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "ipvs_leftovers_iptables_mode_chains":
            for s in fam.samples:
                out[(s.labels["backend"], s.labels["family"], s.labels["table"])] = s.value
    return out


@pytest.mark.parametrize("backend", ["nft", "legacy"])
@pytest.mark.parametrize("dual", [False, True], ids=["ipv4", "dual-stack"])
@pytest.mark.parametrize("after_ipvs", [True, False], ids=["ipvs-iptables", "iptables-only"])
def test_audit_counts_iptables_mode_chains_exactly_and_metrics_agree(
    netns: Callable[[], str], tmp_path: Path, backend: str, dual: bool, after_ipvs: bool
) -> None:
    node = _node(backend, dual, after_ipvs)
    ns = netns()
    build.build(ns, node)
    prom = tmp_path / "m.prom"
    r = run_agent(ns, "audit", "--json", "--textfile", str(prom))
    assert r.rc == 1, r.stderr  # left over, kube-proxy not reachable
    assert oracle.actual(r.json) == oracle.expected(node)
    ipt = r.json["iptables_leftovers"]
    assert ipt["chains"] and ipt["jump_rules"] > 0
    assert not any(
        f["class"] == "foreign" and f["name"].split()[-1].startswith("KUBE-")
        for f in r.json["findings"]
    )
    # the metric counts exactly the chains of the JSON block, per backend, family, table
    want = Counter((c["backend"], c["family"], c["table"]) for c in ipt["chains"])
    assert _mode_chain_metric(prom.read_text()) == {k: float(v) for k, v in want.items()}
    if not after_ipvs:  # iptables -> nftables: nothing of ipvs mode is reported
        assert r.json["leftovers"]["iptables_chains"] == []
        assert r.json["leftovers"]["iptables_jump_rules"] == 0


def test_exact_counts_of_an_iptables_only_ipv4_node(netns: Callable[[], str]) -> None:
    """Hand-checked numbers, so the oracle itself is checked once: 12 Services, v1.30.3."""
    ns = netns()
    build.build(ns, _node("legacy", False, after_ipvs=False))
    doc = run_agent(ns, "audit", "--json").json
    ipt = doc["iptables_leftovers"]
    assert ipt["jump_rules"] == 12  # iptablesJumpChains
    names = Counter(
        (
            c["table"],
            c["chain"][:9] if c["chain"][5:9] in ("SVC-", "SEP-", "EXT-", "SVL-") else c["chain"],
        )
        for c in ipt["chains"]
    )
    fw = sum(1 for c in ipt["chains"] if c["chain"].startswith("KUBE-FW-"))
    assert fw == 2  # ingress-nginx's two ports have source ranges
    assert names[("nat", "KUBE-SVC-")] == 14  # service ports with endpoints
    assert names[("nat", "KUBE-SEP-")] == 27  # their endpoints
    assert names[("nat", "KUBE-EXT-")] == 6  # NodePort, LoadBalancer, ExternalIP ports
    assert names[("nat", "KUBE-SVL-")] == 1  # edge-gateway, externalTrafficPolicy: Local
    static = {k for k in names if not k[1].endswith("-") and not k[1].startswith("KUBE-FW-")}
    assert static == {
        ("mangle", "KUBE-PROXY-CANARY"),
        ("nat", "KUBE-PROXY-CANARY"),
        ("filter", "KUBE-PROXY-CANARY"),
        ("nat", "KUBE-SERVICES"),
        ("nat", "KUBE-NODEPORTS"),
        ("nat", "KUBE-POSTROUTING"),
        ("nat", "KUBE-MARK-MASQ"),
        ("filter", "KUBE-SERVICES"),
        ("filter", "KUBE-EXTERNAL-SERVICES"),
        ("filter", "KUBE-FORWARD"),
        ("filter", "KUBE-NODEPORTS"),
        ("filter", "KUBE-PROXY-FIREWALL"),
    }
    rules = {(c["table"], c["chain"]): c["rules"] for c in ipt["chains"]}
    assert rules[("nat", "KUBE-MARK-MASQ")] == 1 and rules[("nat", "KUBE-POSTROUTING")] == 3
    assert rules[("filter", "KUBE-FORWARD")] == 3  # INVALID drop, mark, conntrack
    assert rules[("filter", "KUBE-PROXY-FIREWALL")] == 2  # one DROP per port of ingress-nginx
    assert rules[("filter", "KUBE-SERVICES")] == 1  # batch-results has no endpoints: REJECT
    assert doc["leftovers"]["ipsets"] == {"ipv4": 0, "ipv6": 0}
    assert doc["stale"] is False


def test_older_release_names_are_ipvs_leftovers(netns: Callable[[], str]) -> None:
    ns = netns()
    build.build(ns, realistic_node(backend="legacy", older_release_names=True))
    doc = run_agent(ns, "audit", "--json").json
    by_name = {f["name"]: f for f in doc["findings"]}
    for name in (
        "KUBE-SERVICE-ACCESS",
        "KUBE-MASQ-ALL",
        "KUBE-CLUSTER-CIDR",
        "KUBE-LOAD-BALANCER-MASQ",
        "KUBE-LB-INGRESS-LOCAL",
    ):
        assert by_name[name]["class"] == "ipvs-leftover", by_name[name]
    jumps = [
        f for f in doc["findings"] if f["name"] == "legacy/ipv4/filter FORWARD -> KUBE-FORWARD"
    ]
    assert [f["class"] for f in jumps] == ["ipvs-leftover", "ipvs-leftover"]
    assert doc["leftovers"]["ipsets"] == {"ipv4": 22, "ipv6": 0}
    assert not any(f["class"] == "unknown-kube" for f in doc["findings"])


@pytest.mark.parametrize("backend", ["nft", "legacy"])
@pytest.mark.parametrize("dual", [False, True], ids=["ipv4", "dual-stack"])
def test_cleanup_removes_both_modes_and_nothing_else(
    netns: Callable[[], str], tmp_path: Path, backend: str, dual: bool
) -> None:
    """ipvs -> iptables -> nftables: every cleanup used to exit 1 with KUBE-MARK-MASQ kept
    for iptables mode's KUBE-SVC-* chains. Now both modes go; foreign, kubelet and
    nftables-mode state stays byte-identical; a second run is a no-op; restore gives it back."""
    ns = netns()
    build.build(ns, _node(backend, dual))
    families = {"families": ["IPv4", "IPv6"] if dual else ["IPv4"]}
    with start_fake_kube_proxy(ns, {**CONFIRMED, **families}, tmp_path / "kp.json"):
        before = dump(ns)
        r = apply(ns, tmp_path)
        assert r.rc == 0, r.stdout + r.stderr
        assert ", 0 kept" in r.stdout and "  kept " not in r.stdout
        after = dump(ns)
        assert after == minus_leftovers(before)
        doc = run_agent(ns, "audit", "--json").json
        assert doc["iptables_leftovers"] == {"chains": [], "jump_rules": 0}
        assert doc["leftovers"]["iptables_chains"] == []
        again = apply(ns, tmp_path)
        assert again.rc == 0 and "nothing to remove" in again.stdout
        (bundle,) = (tmp_path / "backups").iterdir()
        assert (
            run_agent(ns, "restore", "--lock-file", str(tmp_path / "cleanup.lock"), str(bundle)).rc
            == 0
        )
        assert dump(ns) == before


def test_iptables_only_node_cleanup_and_verify(netns: Callable[[], str], tmp_path: Path) -> None:
    """iptables -> nftables: verify fails while iptables mode's chains remain (its stale nat
    rules still DNAT Service traffic), cleanup removes them under the same gate."""
    ns = netns()
    build.build(ns, _node("nft", False, after_ipvs=False))
    with start_fake_kube_proxy(ns, {**CONFIRMED, "families": ["IPv4"]}, tmp_path / "kp.json"):
        before = dump(ns)
        v = run_agent(ns, "verify", "--json")
        checks = {c["name"]: c for c in v.json["checks"]}
        assert checks["no-leftovers"]["status"] == "fail"
        assert "iptables-mode object(s) remain" in checks["no-leftovers"]["evidence"][0]
        r = apply(ns, tmp_path)
        assert r.rc == 0, r.stdout + r.stderr
        assert dump(ns) == minus_leftovers(before)
        v = run_agent(ns, "verify", "--json")
        checks = {c["name"]: c for c in v.json["checks"]}
        assert checks["no-leftovers"]["status"] == "pass"
