"""On plain data: names of older releases, and the iptables-leftover
class (docs/contract.md#ownership) with its shared chain names, jumps and references."""

from __future__ import annotations

from agent.classify import Owner, classify
from agent.cleanup.plan import make_plan
from agent.snapshot import Ipset
from agent.views import report
from tests.unit.builders import NOW, kube_proxy, snapshot

# What kube-proxy v1.30.3 in iptables mode writes for one ClusterIP Service with one endpoint
# and one LoadBalancer with source ranges (pkg/proxy/iptables/proxier.go), no ipvs history.
IPTABLES_NODE = """*mangle
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-PROXY-CANARY - [0:0]
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-BBBBBBBBBBBBBBBB - [0:0]
:KUBE-FW-CCCCCCCCCCCCCCCC - [0:0]
:KUBE-EXT-CCCCCCCCCCCCCCCC - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SEP-AAAAAAAAAAAAAAAA -s 10.244.0.5/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.244.0.5:80
-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-BBBBBBBBBBBBBBBB
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-BBBBBBBBBBBBBBBB ! -s 10.244.0.0/16 -d 10.96.0.20/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-BBBBBBBBBBBBBBBB -m comment --comment "default/web:http -> 10.244.0.5:80" -j KUBE-SEP-AAAAAAAAAAAAAAAA
-A KUBE-EXT-CCCCCCCCCCCCCCCC -j KUBE-SVC-BBBBBBBBBBBBBBBB
-A KUBE-FW-CCCCCCCCCCCCCCCC -s 198.51.100.0/24 -j KUBE-EXT-CCCCCCCCCCCCCCCC
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-PROXY-FIREWALL -d 203.0.113.10/32 -p tcp -m comment --comment "ingress/lb:http traffic not accepted by KUBE-FW-CCCCCCCCCCCCCCCC" -m tcp --dport 80 -j DROP
COMMIT
"""

IPTABLES_CHAINS = {
    "mangle KUBE-PROXY-CANARY",
    "nat KUBE-MARK-MASQ",
    "nat KUBE-NODEPORTS",
    "nat KUBE-POSTROUTING",
    "nat KUBE-PROXY-CANARY",
    "nat KUBE-SEP-AAAAAAAAAAAAAAAA",
    "nat KUBE-SERVICES",
    "nat KUBE-SVC-BBBBBBBBBBBBBBBB",
    "nat KUBE-FW-CCCCCCCCCCCCCCCC",
    "nat KUBE-EXT-CCCCCCCCCCCCCCCC",
    "filter KUBE-EXTERNAL-SERVICES",
    "filter KUBE-FORWARD",
    "filter KUBE-NODEPORTS",
    "filter KUBE-PROXY-CANARY",
    "filter KUBE-PROXY-FIREWALL",
    "filter KUBE-SERVICES",
}


def _by_owner(dump: str, backend: str = "legacy") -> dict[Owner, set[str]]:
    c = classify(snapshot(**{backend: dump}), NOW)  # type: ignore[arg-type]
    out: dict[Owner, set[str]] = {}
    for f in c.findings:
        out.setdefault(f.owner, set()).add(f.name.split("/", 2)[2])
    return out


# --- the iptables-leftover class -----------------------------------------------------------


def test_a_node_that_ran_only_iptables_mode_has_iptables_leftovers_and_no_ipvs_ones() -> None:
    for backend in ("legacy", "nft"):
        o = _by_owner(IPTABLES_NODE, backend)
        chains = {n for n in o[Owner.IPTABLES_LEFTOVER] if "->" not in n}
        jumps = {n for n in o[Owner.IPTABLES_LEFTOVER] if "->" in n}
        assert chains == IPTABLES_CHAINS  # the shared names too: their rules are iptables mode's
        assert len(jumps) == 12  # iptablesJumpChains of v1.30.3
        assert Owner.IPVS_LEFTOVER not in o
        assert Owner.FOREIGN not in o and Owner.UNKNOWN_KUBE not in o
        assert o[Owner.KUBELET] >= {"filter KUBE-FIREWALL", "mangle KUBE-IPTABLES-HINT"}


def test_iptables_mode_leftovers_are_not_ipvs_stale_but_are_reported_apart() -> None:
    from agent.names import NFTABLES_MODE_CHAINS
    from agent.snapshot import NftTable

    table = NftTable("ip", "kube-proxy", 10, kube_proxy_chains=NFTABLES_MODE_CHAINS)
    snap = snapshot(legacy=IPTABLES_NODE, nftables=(table,))
    c = classify(snap, NOW)
    assert c.mode.nftables_confirmed and not c.stale and not c.leftovers
    doc = report.document(snap, c)
    assert (
        doc["leftovers"]["iptables_chains"] == [] and doc["leftovers"]["iptables_jump_rules"] == 0
    )
    ipt = doc["iptables_leftovers"]
    assert ipt["jump_rules"] == 12
    assert {f"{r['table']} {r['chain']}" for r in ipt["chains"]} == IPTABLES_CHAINS
    rows = {(r["table"], r["chain"]): r["rules"] for r in ipt["chains"]}
    assert rows[("filter", "KUBE-FORWARD")] == 3 and rows[("nat", "KUBE-SERVICES")] == 2
    assert report.exit_code(snap, c) == 1  # left over: kube-proxy runs nftables mode
    assert report.verdict(snap, c).startswith("LEFTOVERS: no ipvs-mode objects")
    in_use = snapshot(legacy=IPTABLES_NODE, kp=kube_proxy("iptables"))
    assert report.exit_code(in_use, classify(in_use, NOW)) == 0  # in use by iptables mode


def test_references_between_the_two_modes_are_kube_proxys_own() -> None:
    """ipvs -> iptables -> nftables: KUBE-SVC-* (iptables mode) jumps to KUBE-MARK-MASQ, which
    the ipvs chains of the same table make ipvs-mode. Before, the KUBE-SVC-* chain kept
    KUBE-MARK-MASQ (and every cleanup exited 1)."""
    dump = IPTABLES_NODE.replace(
        ":KUBE-SERVICES - [0:0]\n",
        ":KUBE-SERVICES - [0:0]\n:KUBE-NODE-PORT - [0:0]\n:KUBE-LOAD-BALANCER - [0:0]\n",
        1,
    ).replace(
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ\n",
    )
    snap = snapshot(legacy=dump)
    c = classify(snap, NOW)
    owner = {f.name.split("/", 2)[2]: f for f in c.findings}
    # rules both modes write: the table's ipvs-mode chains decide
    assert owner["nat KUBE-MARK-MASQ"].owner is Owner.IPVS_LEFTOVER
    assert owner["nat KUBE-POSTROUTING"].owner is Owner.IPVS_LEFTOVER
    # iptables mode rewrote KUBE-SERVICES: its rules decide
    assert owner["nat KUBE-SERVICES"].owner is Owner.IPTABLES_LEFTOVER
    assert owner["nat PREROUTING -> KUBE-SERVICES"].owner is Owner.IPTABLES_LEFTOVER
    assert owner["nat POSTROUTING -> KUBE-POSTROUTING"].owner is Owner.IPVS_LEFTOVER
    assert not any("referenced by" in e for e in owner["nat KUBE-MARK-MASQ"].evidence)
    plan = make_plan(snap, c)
    assert plan.kept == ()
    (nat,) = [s for s in plan.steps if s.target == "legacy/ipv4/nat"]
    assert nat.table is not None
    assert set(nat.table.chains) >= {
        "KUBE-MARK-MASQ",
        "KUBE-SVC-BBBBBBBBBBBBBBBB",
        "KUBE-NODE-PORT",
    }
    assert "chain KUBE-SVC-BBBBBBBBBBBBBBBB (2 rules): iptables-mode chain" in nat.evidence
    assert "chain KUBE-NODE-PORT (0 rules): ipvs-mode chain" in nat.evidence
    (mangle,) = [s for s in plan.steps if s.target == "legacy/ipv4/mangle"]
    assert mangle.table is not None and mangle.table.chains == ("KUBE-PROXY-CANARY",)


def test_a_foreign_rule_into_an_iptables_mode_chain_keeps_it() -> None:
    dump = IPTABLES_NODE.replace(
        ":KUBE-SERVICES - [0:0]\n", ":KUBE-SERVICES - [0:0]\n:CNI-DNAT - [0:0]\n", 1
    ).replace(
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n-A CNI-DNAT -j KUBE-SVC-BBBBBBBBBBBBBBBB\n",
    )
    snap = snapshot(nft=dump)
    plan = make_plan(snap, classify(snap, NOW))
    kept = {k.name: k.reason for k in plan.kept}
    assert kept["nft/ipv4/nat KUBE-SVC-BBBBBBBBBBBBBBBB"].startswith(
        "referenced by nft/ipv4/nat -A CNI-DNAT -j KUBE-SVC-BBBBBBBBBBBBBBBB"
    )
    # what the kept chain references is kept with it
    assert (
        "nft/ipv4/nat KUBE-SEP-AAAAAAAAAAAAAAAA" in kept and "nft/ipv4/nat KUBE-MARK-MASQ" in kept
    )


def test_a_jump_into_an_iptables_mode_chain_with_another_comment_is_foreign() -> None:
    dump = IPTABLES_NODE.replace(
        "-A INPUT -j KUBE-FIREWALL\n", "-A INPUT -p tcp --dport 30000 -j KUBE-NODEPORTS\n"
    )
    c = classify(snapshot(legacy=dump), NOW)
    jumps = [f.owner for f in c.findings if f.name.endswith("filter INPUT -> KUBE-NODEPORTS")]
    # kube-proxy's own ("kubernetes health check service ports") goes; the other stays
    assert jumps == [Owner.IPTABLES_LEFTOVER, Owner.UNKNOWN_KUBE]


def test_a_shared_chain_holding_ipvs_rules_stays_ipvs_mode() -> None:
    dump = """*filter
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-NODEPORTS - [0:0]
-A KUBE-PROXY-FIREWALL -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL
COMMIT
"""
    o = _by_owner(dump)
    assert o[Owner.IPVS_LEFTOVER] == {"filter KUBE-PROXY-FIREWALL"}
    assert o[Owner.IPTABLES_LEFTOVER] == {"filter KUBE-NODEPORTS"}


def test_the_canary_in_all_three_tables_and_both_families() -> None:
    dump = "".join(
        f"*{t}\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n" for t in ("mangle", "nat", "filter")
    )
    c = classify(snapshot(nft=dump, nft_v6=dump), NOW)
    assert len(c.iptables_leftovers) == 6 and not c.leftovers


# --- names of older releases ---------------------------------------------------------------


def test_sets_of_the_first_ipset_releases_are_ipvs_leftovers() -> None:
    sets = (
        Ipset("KUBE-SERVICE-ACCESS", "hash:ip,port", 4, 3, 0),
        Ipset("KUBE-MASQ-ALL", "hash:ip,port", 4, 0, 0),
        Ipset("KUBE-CLUSTER-CIDR", "hash:net", 4, 1, 0),
        Ipset("KUBE-LOAD-BALANCER-MASQ", "hash:ip,port", 4, 0, 0),
        Ipset("KUBE-LB-INGRESS-LOCAL", "hash:ip,port", 4, 0, 0),
        Ipset("KUBE-MASQ-ALL-X", "hash:ip,port", 4, 0, 0),
        Ipset("KUBE-LB-INGRESS-LOCAL", "hash:ip", 4, 0, 0),  # not its type
    )
    c = classify(snapshot(ipsets=sets), NOW)
    owners = [(f.name, f.owner) for f in c.findings]
    assert owners == [
        ("KUBE-SERVICE-ACCESS", Owner.IPVS_LEFTOVER),
        ("KUBE-MASQ-ALL", Owner.IPVS_LEFTOVER),
        ("KUBE-CLUSTER-CIDR", Owner.IPVS_LEFTOVER),
        ("KUBE-LOAD-BALANCER-MASQ", Owner.IPVS_LEFTOVER),
        ("KUBE-LB-INGRESS-LOCAL", Owner.IPVS_LEFTOVER),
        ("KUBE-MASQ-ALL-X", Owner.UNKNOWN_KUBE),
        ("KUBE-LB-INGRESS-LOCAL", Owner.UNKNOWN_KUBE),
    ]
    assert "of an older release" in c.findings[0].evidence[0]


def test_ipv6_sets_from_before_the_kube_6_prefix_are_counted_as_ipv6() -> None:
    sets = (
        Ipset("KUBE-CLUSTER-IP", "hash:ip,port", 6, 2, 0),  # IPv6-only node, 1.13-1.15
        Ipset("KUBE-LOOP-BACK", "hash:ip,port,ip", 6, 0, 0),
        Ipset("KUBE-SERVICE-ACCESS", "hash:ip,port", 6, 1, 0),
        Ipset("KUBE-6-CLUSTER-IP", "hash:ip,port", 6, 1, 0),
        Ipset("KUBE-6-CLUSTER-IP", "hash:ip,port", 4, 0, 0),  # a KUBE-6- name is never inet
    )
    snap = snapshot(ipsets=sets)
    c = classify(snap, NOW)
    assert [f.owner for f in c.findings] == [Owner.IPVS_LEFTOVER] * 4 + [Owner.UNKNOWN_KUBE]
    assert c.findings[0].evidence == (
        "kube-proxy ipvs-mode set of an older release (hash:ip,port, IPv6)",
    )
    doc = report.document(snap, c)
    assert doc["leftovers"]["ipsets"] == {"ipv4": 0, "ipv6": 4}
    assert doc["leftovers"]["ipset_entries"] == {"ipv4": 0, "ipv6": 4}


def test_the_old_forward_jump_comment_is_kube_proxys() -> None:
    dump = """*filter
:FORWARD ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
-A FORWARD -m comment --comment "kubernetes forward rules" -j KUBE-FORWARD
-A FORWARD -m comment --comment "kubernetes forwarded rules" -j KUBE-FORWARD
COMMIT
"""
    c = classify(snapshot(legacy=dump), NOW)
    jumps = [(f.owner, f.evidence[0]) for f in c.findings if f.kind == "jump-rule"]
    assert jumps[0][0] is Owner.IPVS_LEFTOVER and "'kubernetes forward rules'" in jumps[0][1]
    assert jumps[1][0] is Owner.UNKNOWN_KUBE
