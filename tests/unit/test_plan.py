"""The cleanup plan's order and what it keeps (docs/contract.md#cleanup), on plain data."""

from __future__ import annotations

from agent.classify import classify
from agent.cleanup.plan import ChangeTable, make_plan
from agent.snapshot import Ipset, IpvsDest, IpvsService, Link, Links
from tests.unit.builders import NOW, snapshot

LINK = Link("kube-ipvs0", 3, "dummy", False, ("10.96.0.1/32", "10.96.0.10/32"))
LINKS = Links(LINK, node_addresses=("192.168.50.10",))
CLUSTER_IP = Ipset("KUBE-CLUSTER-IP", "hash:ip,port", 4, 1, 0, ("10.96.0.1,tcp:443",))
NAT = """*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
COMMIT
"""


def svc(addr: str, port: int) -> IpvsService:
    return IpvsService(
        4, "TCP", addr, port, None, "rr", 2, 0, (IpvsDest("10.244.0.3", port, "masq", 1),)
    )


def test_order_is_ipvs_then_link_then_iptables_then_sets() -> None:
    """Upstream's order: Service IPs stop being local before KUBE-IPVS-FILTER's guard goes."""
    snap = snapshot(ipvs=(svc("10.96.0.1", 443),), ipsets=(CLUSTER_IP,), legacy=NAT, links=LINKS)
    plan = make_plan(snap, classify(snap, NOW))
    assert [s.action for s in plan.steps] == [
        "delete-ipvs-service",
        "delete-link",
        "iptables-table",
        "destroy-ipset",
    ]
    assert [s.phase for s in plan.steps] == [1, 2, 3, 4]


def test_link_is_kept_while_a_service_that_stays_uses_its_address() -> None:
    """10.96.0.10:53 is only weakly kube-proxy's (its address is bound, no set names the
    port): it is never touched, so its address must stay local."""
    weak = svc("10.96.0.10", 53)
    snap = snapshot(ipvs=(svc("10.96.0.1", 443), weak), ipsets=(CLUSTER_IP,), links=LINKS)
    plan = make_plan(snap, classify(snap, NOW))
    assert [(s.action, s.target) for s in plan.steps] == [
        ("delete-ipvs-service", "TCP 10.96.0.1:443"),
        ("destroy-ipset", "KUBE-CLUSTER-IP"),
    ]
    kept = {k.kind: k for k in plan.kept}
    assert kept["link"].name == "kube-ipvs0"
    assert kept["link"].reason == (
        "1 IPVS service(s) not removed use its addresses: TCP 10.96.0.10:53"
    )


MASQ_NAT = """*nat
:POSTROUTING ACCEPT [0:0]
:CNI-HOSTPORT-MASQ - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -j CNI-HOSTPORT-MASQ
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j KUBE-MARK-MASQ
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
COMMIT
"""
LOOP_BACK = Ipset("KUBE-LOOP-BACK", "hash:ip,port,ip", 4, 0, 0)


def _masq_plan(nft_mark: int | None) -> tuple[list[str], dict[str, str]]:
    from agent.snapshot import NftTable

    tables = (NftTable("ip", "kube-proxy", masquerade_mark=nft_mark),)
    snap = snapshot(legacy=MASQ_NAT, ipsets=(LOOP_BACK,), nftables=tables)
    plan = make_plan(snap, classify(snap, NOW))
    chains = [c for s in plan.steps if isinstance(s, ChangeTable) for c in s.table.chains]
    return chains, {f"{k.kind} {k.name}": k.reason for k in plan.kept}


def test_kept_mark_masq_keeps_its_masquerade_unless_nftables_mode_honours_the_mark() -> None:
    """A CNI rule still marks for masquerade through KUBE-MARK-MASQ."""
    chains, kept = _masq_plan(0x4000)  # nftables mode masquerades the same bit
    assert chains == ["KUBE-POSTROUTING"]
    assert set(kept) == {"chain legacy/ipv4/nat KUBE-MARK-MASQ"}

    for other in (0x8000, None):
        chains, kept = _masq_plan(other)
        assert chains == []
        assert set(kept) == {
            "chain legacy/ipv4/nat KUBE-MARK-MASQ",
            "chain legacy/ipv4/nat KUBE-POSTROUTING",
            "jump-rule legacy/ipv4/nat POSTROUTING -> KUBE-POSTROUTING",
            "ipset KUBE-LOOP-BACK",
        }
        shown = f"{other:#x}" if other else "no mark"
        assert kept["chain legacy/ipv4/nat KUBE-POSTROUTING"] == (
            "it masquerades what KUBE-MARK-MASQ marks, which is kept (referenced by "
            "legacy/ipv4/nat -A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j KUBE-MARK-MASQ)"
            f"; nftables mode (ip kube-proxy) masquerades {shown}, not KUBE-MARK-MASQ's 0x4000"
        )


def test_verify_passes_over_an_object_kept_for_foreign_state() -> None:
    """After cleanup a CNI rule still jumps to KUBE-MARK-MASQ (real kube-proxy tier, every
    scenario): the chain is kept on purpose, so verify's no-leftovers says so and passes."""
    from agent.views import checks

    nat = """*nat
:POSTROUTING ACCEPT [0:0]
:CNI-HOSTPORT-SETMARK - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A POSTROUTING -j CNI-HOSTPORT-SETMARK
-A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
COMMIT
"""
    snap = snapshot(legacy=nat)
    cls = classify(snap, NOW)
    c = checks.check_no_leftovers(snap, cls, make_plan(snap, cls).kept_reasons())
    assert c.status == "pass"
    assert c.evidence == (
        "no ipvs-mode object on the node",
        "kept, still used by foreign state: chain legacy/ipv4/nat KUBE-MARK-MASQ (referenced by "
        "legacy/ipv4/nat -A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ)",
    )
    stale = snapshot(legacy=nat.replace("-A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ\n", ""))
    cls = classify(stale, NOW)
    assert (
        checks.check_no_leftovers(stale, cls, make_plan(stale, cls).kept_reasons()).status == "fail"
    )


def test_a_table_step_deletes_each_backed_up_rule_then_its_chain_and_never_flushes() -> None:
    """`-F` removed whatever a chain held, a rule added after the re-check too. Each backed-up
    rule goes by its text, from the head of its chain, and then the chain: the kernel refuses
    `-X` of a chain that still holds a rule and `-D` of one that is gone."""
    from agent.cleanup.plan import TableChange
    from agent.readers.iptables_save import parse_rule

    jump = parse_rule("POSTROUTING", '-m comment --comment "kubernetes postrouting rules" -j X')
    a = parse_rule("KUBE-POSTROUTING", "-m mark ! --mark 0x4000/0x4000 -j RETURN")
    b = parse_rule("KUBE-POSTROUTING", "-j MASQUERADE --random-fully")
    change = TableChange(
        "nft", "ipv6", "nat", (jump,), ("KUBE-POSTROUTING", "KUBE-EMPTY"), (1,),
        (("KUBE-POSTROUTING", (a, b)), ("KUBE-EMPTY", ())),
    )  # fmt: skip
    assert change.restore_text().splitlines() == [
        "*nat",
        f"-D POSTROUTING {jump.text}",
        f"-D KUBE-POSTROUTING {a.text}",
        f"-D KUBE-POSTROUTING {b.text}",
        "-X KUBE-POSTROUTING",
        "-X KUBE-EMPTY",
        "COMMIT",
    ]
