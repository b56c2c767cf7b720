"""Every ownership rule of docs/contract.md#ownership, on plain data."""

from __future__ import annotations

from collections.abc import Iterable

from agent.classify import Attribution, IpvsEvidence, Owner, classify
from agent.names import NFTABLES_MODE_CHAINS
from agent.snapshot import Ipset, IpvsDest, IpvsService, Link, Links, NftTable
from tests.unit.builders import NOW, kube_proxy, snapshot

KUBE_IPVS0 = Link("kube-ipvs0", 3, "dummy", False, ("10.96.0.1/32", "10.96.0.10/32"))
LINKS = Links(KUBE_IPVS0, node_addresses=("192.168.50.10", "fd00:50::10"))


def svc(
    addr: str | None, port: int | None, proto: str = "TCP", fam: int = 4, **kw: object
) -> IpvsService:
    dests = (IpvsDest("10.244.0.3", port or 0, "masq", 1),)
    return IpvsService(fam, proto, addr, port, kw.get("fwmark"), "rr", 2, 0, dests)  # type: ignore[arg-type]


def owners(snap_kwargs: dict[str, object]) -> dict[str, Owner]:
    c = classify(snapshot(**snap_kwargs), NOW)  # type: ignore[arg-type]
    return {f.name: f.owner for f in c.findings}


CLUSTER_IP = Ipset("KUBE-CLUSTER-IP", "hash:ip,port", 4, 1, 0, ("10.96.0.1,tcp:443",))


def ipvs_service_evidence(svc: IpvsService, links: Links, sets: Iterable[Ipset]) -> Attribution:
    """Why `svc` may be kube-proxy's, strong and weak."""
    return IpvsEvidence.of(links, sets).of_service(svc)


def test_a_kube_ipvs0_address_alone_is_weak_evidence() -> None:
    """docs/contract.md#ownership: a keepalived service later set up on a reused address must not be deleted."""
    ev = ipvs_service_evidence(svc("10.96.0.1", 443), LINKS, ())
    assert ev.strong == ()
    assert ev.weak == ("address 10.96.0.1 is bound to kube-ipvs0 (any port would be)",)
    o = owners({"ipvs": (svc("10.96.0.1", 443), svc("10.96.0.10", 53)), "links": LINKS})
    assert o["TCP 10.96.0.1:443"] is Owner.UNKNOWN_KUBE
    assert o["TCP 10.96.0.10:53"] is Owner.UNKNOWN_KUBE


def test_bound_address_with_its_port_in_a_kube_set_is_a_leftover() -> None:
    o = owners(
        {
            "ipvs": (svc("10.96.0.1", 443), svc("10.96.0.1", 8443)),
            "links": LINKS,
            "ipsets": (CLUSTER_IP,),
        }
    )
    assert o["TCP 10.96.0.1:443"] is Owner.IPVS_LEFTOVER
    assert o["TCP 10.96.0.1:8443"] is Owner.UNKNOWN_KUBE  # same address, a port no set names


def test_ipvs_service_in_cluster_ip_set_is_a_leftover() -> None:
    sets = (Ipset("KUBE-CLUSTER-IP", "hash:ip,port", 4, 1, 0, ("10.96.5.5,tcp:80",)),)
    ev = ipvs_service_evidence(svc("10.96.5.5", 80), Links(None), sets)
    assert ev.strong == ("10.96.5.5,tcp:80 is a member of ipset KUBE-CLUSTER-IP",)
    # same address, other protocol: no evidence
    assert ipvs_service_evidence(svc("10.96.5.5", 80, "UDP"), Links(None), sets).strong == ()


def test_ipv6_service_in_kube_6_set() -> None:
    sets = (Ipset("KUBE-6-CLUSTER-IP", "hash:ip,port", 6, 1, 0, ("fd00:10:96::1,tcp:443",)),)
    ev = ipvs_service_evidence(svc("fd00:10:96::1", 443, fam=6), Links(None), sets)
    assert ev.strong == ("fd00:10:96::1,tcp:443 is a member of ipset KUBE-6-CLUSTER-IP",)


def test_external_ip_that_is_a_node_address_is_attributed_by_its_set_member() -> None:
    """kube-proxy gives it a virtual server on the node address, not bound to kube-ipvs0."""
    sets = (
        Ipset("KUBE-EXTERNAL-IP", "hash:ip,port", 4, 1, 0, ("192.168.50.10,tcp:8080",)),
        Ipset("KUBE-LOAD-BALANCER", "hash:ip,port", 4, 1, 0, ("192.168.50.10,tcp:9090",)),
    )
    o = owners(
        {
            "ipvs": (svc("192.168.50.10", 8080), svc("192.168.50.10", 9090)),
            "links": LINKS,
            "ipsets": sets,
        }
    )
    assert o["TCP 192.168.50.10:8080"] is Owner.IPVS_LEFTOVER
    assert o["TCP 192.168.50.10:9090"] is Owner.IPVS_LEFTOVER


def test_nodeport_needs_node_address_and_port_in_the_protocols_set() -> None:
    sets = (
        Ipset("KUBE-NODE-PORT-TCP", "bitmap:port", None, 1, 0, ("30080",)),
        Ipset("KUBE-NODE-PORT-UDP", "bitmap:port", None, 1, 0, ("30053",)),
    )
    assert ipvs_service_evidence(svc("192.168.50.10", 30080), LINKS, sets).strong == (
        "NodePort 30080 on node address 192.168.50.10 is in ipset KUBE-NODE-PORT-TCP",
    )
    tcp_not_udp = ipvs_service_evidence(svc("192.168.50.10", 30053), LINKS, sets)
    assert tcp_not_udp.strong == tcp_not_udp.weak == ()
    # a port alone, off the node's addresses: weak, so unknown-kube
    off_node = ipvs_service_evidence(svc("192.168.99.1", 30080), LINKS, sets)
    assert off_node.strong == ()
    assert off_node.weak == (
        "port 30080 is in ipset KUBE-NODE-PORT-TCP, but 192.168.99.1 is not a node address",
    )
    o = owners({"ipvs": (svc("192.168.99.1", 30080),), "links": LINKS, "ipsets": sets})
    assert o["TCP 192.168.99.1:30080"] is Owner.UNKNOWN_KUBE


def test_probe_service_is_a_leftover_and_keepalived_is_foreign() -> None:
    o = owners(
        {
            "ipvs": (
                svc("198.51.100.0", 20000),
                svc("192.168.50.100", 80),
                svc(None, None, "FWM", fwmark=16384),
            ),
            "links": LINKS,
        }
    )
    assert o == {
        "TCP 198.51.100.0:20000": Owner.IPVS_LEFTOVER,
        "TCP 192.168.50.100:80": Owner.FOREIGN,
        "FWM 16384 IPv4": Owner.FOREIGN,
        "kube-ipvs0": Owner.IPVS_LEFTOVER,
    }


def test_ipsets_by_name_type_and_family() -> None:
    o = owners(
        {
            "ipsets": (
                Ipset("KUBE-CLUSTER-IP", "hash:ip,port", 4, 3, 1),
                Ipset("KUBE-6-LOAD-BALANCER-SOURCE-CID", "hash:ip,port,net", 6, 0, 0),
                Ipset("KUBE-NODE-PORT-TCP", "bitmap:port", None, 0, 0),
                Ipset("KUBE-NODE-PORT-SCTP", "bitmap:port", None, 0, 0),  # older release
                Ipset("KUBE-CLUSTER-IP-X", "hash:ip", 4, 0, 0),
                Ipset("KUBE-IPVS-IPS", "hash:net", 4, 0, 0),  # wrong type
                Ipset("KUBE-6-CLUSTER-IP", "hash:ip,port", 4, 0, 0),  # wrong family
                Ipset("office-allow", "hash:net", 4, 3, 0),
            )
        }
    )
    assert o == {
        "KUBE-CLUSTER-IP": Owner.IPVS_LEFTOVER,
        "KUBE-6-LOAD-BALANCER-SOURCE-CID": Owner.IPVS_LEFTOVER,
        "KUBE-NODE-PORT-TCP": Owner.IPVS_LEFTOVER,
        "KUBE-NODE-PORT-SCTP": Owner.IPVS_LEFTOVER,
        "KUBE-CLUSTER-IP-X": Owner.UNKNOWN_KUBE,
        "KUBE-IPVS-IPS": Owner.UNKNOWN_KUBE,
        "KUBE-6-CLUSTER-IP": Owner.UNKNOWN_KUBE,
        "office-allow": Owner.FOREIGN,
    }


TWO_FIREWALLS = """*nat
:POSTROUTING ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-MARK-DROP - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:DOCKER - [0:0]
:KUBE-SVC-ABCDEF - [0:0]
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -j DOCKER
COMMIT
*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
*mangle
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
"""


def test_kube_firewall_in_two_tables_has_two_owners_in_both_backends() -> None:
    for key in ("legacy", "nft"):
        o = owners({key: TWO_FIREWALLS})
        p = f"{key}/ipv4"
        assert o[f"{p}/nat KUBE-FIREWALL"] is Owner.IPVS_LEFTOVER
        assert o[f"{p}/filter KUBE-FIREWALL"] is Owner.KUBELET
        assert o[f"{p}/filter INPUT -> KUBE-FIREWALL"] is Owner.KUBELET
        assert o[f"{p}/filter OUTPUT -> KUBE-FIREWALL"] is Owner.KUBELET
        assert o[f"{p}/nat KUBE-MARK-DROP"] is Owner.UNKNOWN_KUBE
        assert o[f"{p}/nat KUBE-KUBELET-CANARY"] is Owner.KUBELET
        assert o[f"{p}/mangle KUBE-KUBELET-CANARY"] is Owner.KUBELET
        assert o[f"{p}/mangle KUBE-IPTABLES-HINT"] is Owner.KUBELET
        assert o[f"{p}/nat KUBE-SVC-ABCDEF"] is Owner.IPTABLES_LEFTOVER
        assert o[f"{p}/nat DOCKER"] is Owner.FOREIGN
        assert o[f"{p}/nat POSTROUTING -> KUBE-POSTROUTING"] is Owner.IPVS_LEFTOVER
        assert o[f"{p}/filter INPUT -> KUBE-IPVS-FILTER"] is Owner.IPVS_LEFTOVER
        assert f"{p}/nat POSTROUTING -> DOCKER" not in o  # foreign jumps are not findings


def test_filter_kube_node_port_and_nat_kube_node_port_are_both_ipvs() -> None:
    dump = "*nat\n:KUBE-NODE-PORT - [0:0]\nCOMMIT\n*filter\n:KUBE-NODE-PORT - [0:0]\nCOMMIT\n"
    o = owners({"nft": "", "nft_v6": dump})
    assert o == {
        "nft/ipv6/nat KUBE-NODE-PORT": Owner.IPVS_LEFTOVER,
        "nft/ipv6/filter KUBE-NODE-PORT": Owner.IPVS_LEFTOVER,
    }


def test_foreign_reference_is_reported_as_evidence() -> None:
    dump = """*nat
:KUBE-MARK-MASQ - [0:0]
:CNI-HOSTPORT-SETMARK - [0:0]
-A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ
COMMIT
"""
    c = classify(snapshot(legacy=dump), NOW)
    (f,) = [f for f in c.findings if f.name.endswith("KUBE-MARK-MASQ")]
    assert f.owner is Owner.IPVS_LEFTOVER
    assert "referenced by CNI-HOSTPORT-SETMARK: -j KUBE-MARK-MASQ" in f.evidence


def test_nftables_tables() -> None:
    o = owners(
        {
            "nftables": (
                NftTable("ip", "kube-proxy", 10),
                NftTable("ip6", "kube-proxy", 10),
                NftTable("inet", "kube-proxy", 1),
                NftTable("ip", "nat", 4),  # iptables-nft's: its chains are classified instead
                NftTable("inet", "filter-user", 1),
            )
        }
    )
    assert o == {
        "ip kube-proxy": Owner.NFTABLES_MODE,
        "ip6 kube-proxy": Owner.NFTABLES_MODE,
        "inet kube-proxy": Owner.FOREIGN,
        "inet filter-user": Owner.FOREIGN,
    }


def test_kube_ipvs0_only_dummy_is_a_leftover() -> None:
    assert owners({"links": LINKS}) == {"kube-ipvs0": Owner.IPVS_LEFTOVER}
    bridge = Links(Link("kube-ipvs0", 3, "bridge", True, ()))
    assert owners({"links": bridge}) == {"kube-ipvs0": Owner.UNKNOWN_KUBE}


# --- mode confirmation (docs/contract.md#the-cleanup-gate) ----------------------------------------

KP_TABLE = (NftTable("ip", "kube-proxy", 10, kube_proxy_chains=NFTABLES_MODE_CHAINS),)
LEFTOVER_SET = (Ipset("KUBE-CLUSTER-IP", "hash:ip,port", 4, 0, 0),)


def test_confirmed_nftables_with_leftovers_is_stale() -> None:
    c = classify(snapshot(ipsets=LEFTOVER_SET, nftables=KP_TABLE), NOW)
    assert c.mode.detected == "nftables" and c.mode.nftables_confirmed and c.stale


def test_not_confirmed_when_any_condition_fails() -> None:
    cases = {
        "ipvs": kube_proxy("ipvs"),
        "iptables": kube_proxy("iptables"),
        "unreachable": kube_proxy(None),
        "stuck (/livez 503)": kube_proxy(healthy=False),
        "unhealthy, no /livez": kube_proxy(healthy=False, livez=False),
        "ineligible node, no /livez": kube_proxy(eligible=False, livez=False),
        "no ip6 table": kube_proxy(families=("ipv4", "ipv6")),
    }
    for why, kp in cases.items():
        c = classify(snapshot(ipsets=LEFTOVER_SET, nftables=KP_TABLE, kp=kp), NOW)
        assert not c.mode.nftables_confirmed, why
        assert not c.stale, why
    assert not classify(snapshot(kp=kube_proxy()), NOW).mode.nftables_confirmed  # no table


def test_confirmed_by_kube_proxys_own_health_definition() -> None:
    """An idle kube-proxy re-syncs hourly; a node being deleted fails /healthz
    but /livez says the proxier is fine; a 1.30 nftables proxier exposes no nftables series
    until its counters first move."""
    cases = {
        "idle an hour": kube_proxy(sync_age=3600),
        "node being deleted": kube_proxy(eligible=False),
        "no nftables series yet": kube_proxy(series=False),
        "no /livez, healthy": kube_proxy(livez=False),
    }
    for why, kp in cases.items():
        c = classify(snapshot(ipsets=LEFTOVER_SET, nftables=KP_TABLE, kp=kp), NOW)
        assert c.mode.nftables_confirmed, (why, c.mode.failed)
        assert c.stale, why
    ineligible = classify(snapshot(nftables=KP_TABLE, kp=kube_proxy(eligible=False)), NOW)
    assert ineligible.mode.evidence[-2] == (
        "/healthz reports nodeEligible false (node being deleted or tainted "
        "ToBeDeletedByClusterAutoscaler): not a proxier failure"
    )
    stuck = classify(snapshot(nftables=KP_TABLE, kp=kube_proxy(healthy=False)), NOW)
    assert stuck.mode.failed == (
        "/livez answers HTTP 503: an update has been queued longer than kube-proxy's healthz "
        "timeout (kube-proxy is stuck)",
    )


def test_an_explicit_max_sync_age_still_bounds_the_last_sync() -> None:
    snap = snapshot(nftables=KP_TABLE, kp=kube_proxy(sync_age=600))
    assert classify(snap, NOW).mode.nftables_confirmed  # off by default
    c = classify(snap, NOW, max_sync_age=300)
    assert c.mode.failed == ("metric last sync IPv4 older than --max-sync-age 300s",)


def test_detected_mode_and_clean_node_is_not_stale() -> None:
    assert classify(snapshot(kp=kube_proxy("ipvs")), NOW).mode.detected == "ipvs"
    assert classify(snapshot(kp=kube_proxy(None)), NOW).mode.detected == "unknown"
    c = classify(snapshot(nftables=KP_TABLE), NOW)
    assert c.mode.nftables_confirmed and not c.stale


def test_only_kube_proxys_exact_jumps_are_leftovers() -> None:
    dump = """*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-NODE-PORT - [0:0]
-A INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -p tcp --dport 30000 -j KUBE-NODE-PORT
COMMIT
"""
    o = owners({"legacy": dump})
    assert o["legacy/ipv4/filter INPUT -> KUBE-PROXY-FIREWALL"] is Owner.IPVS_LEFTOVER
    assert o["legacy/ipv4/filter OUTPUT -> KUBE-PROXY-FIREWALL"] is Owner.IPVS_LEFTOVER
    assert o["legacy/ipv4/filter INPUT -> KUBE-NODE-PORT"] is Owner.UNKNOWN_KUBE


def test_only_the_sets_that_can_attribute_a_service_are_decoded() -> None:
    from agent import names
    from agent.classify import evidence_sets_needed

    bound = svc("10.96.0.1", 443)  # on kube-ipvs0: still needs its address and port in a set
    nodeport = svc("192.168.50.10", 30080)
    tcp_node_ports = frozenset(
        {
            "KUBE-NODE-PORT-TCP",
            "KUBE-NODE-PORT-LOCAL-TCP",
            "KUBE-6-NODE-PORT-TCP",
            "KUBE-6-NODE-PORT-LOCAL-TCP",
        }
    )
    # any address: a NodePort of an address the node no longer has needs its protocol's
    # NodePort bitmaps too (small); never another protocol's
    assert evidence_sets_needed([bound], LINKS) == names.VIP_PORT_SETS | tcp_node_ports
    assert evidence_sets_needed([bound, nodeport], LINKS) == names.VIP_PORT_SETS | tcp_node_ports
    assert evidence_sets_needed([svc("198.51.100.0", 20000)], LINKS) == frozenset()  # the probe
    assert evidence_sets_needed([svc(None, None, "FWM", fwmark=1)], LINKS) == frozenset()


def test_sets_of_the_first_ipset_releases_name_address_and_port() -> None:
    """1.9-1.10's KUBE-SERVICE-ACCESS held `IP,proto:port` of every ClusterIP (older-releases
    doc): a virtual server it names is kube-proxy's."""
    sets = (Ipset("KUBE-SERVICE-ACCESS", "hash:ip,port", 4, 1, 0, ("10.96.0.1,tcp:443",)),)
    o = owners({"ipvs": (svc("10.96.0.1", 443),), "links": LINKS, "ipsets": sets})
    assert o["TCP 10.96.0.1:443"] is Owner.IPVS_LEFTOVER
