"""The cleanup plan's order and what it keeps (SPEC §5), on plain data."""

from __future__ import annotations

from agent.classify import classify
from agent.plan import make_plan
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
