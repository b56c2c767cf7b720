"""Lost evidence (docs/contract.md#ownership, "What the running nftables mode serves"): a
virtual server whose ipset member was lost, or a NodePort of an address the node no longer has,
is attributed by the running nftables mode's own service maps and /configz's
nodePortAddresses; each false positive those could make is built here and kept."""

from __future__ import annotations

import dataclasses

from agent.classify import Owner, classify
from agent.cleanup.plan import make_plan
from agent.evidence import node_port_nets, service_maps_needed
from agent.names import NFTABLES_MODE_CHAINS
from agent.readers.configz import ConfigzError, parse_configz
from agent.snapshot import (
    Ipset,
    IpvsDest,
    IpvsService,
    KubeProxyConfigz,
    Link,
    Links,
    NftTable,
    Reading,
)
from tests.unit.builders import NOW, kube_proxy, snapshot

KUBE_IPVS0 = Link("kube-ipvs0", 3, "dummy", False, ("10.96.0.1/32", "10.96.1.1/32"))
LINKS = Links(KUBE_IPVS0, node_addresses=("192.168.60.10",))
# ipvs mode's sets as a lost member left them: 10.96.1.1,tcp:80 never got in
CLUSTER_IP = Ipset("KUBE-CLUSTER-IP", "hash:ip,port", 4, 1, 0, ("10.96.0.1,tcp:443",))
NODE_PORT = Ipset("KUBE-NODE-PORT-TCP", "bitmap:port", None, 1, 0, ("30080",))
TABLE = NftTable(
    "ip",
    "kube-proxy",
    kube_proxy_chains=NFTABLES_MODE_CHAINS,
    services=frozenset({("10.96.0.1", "tcp", 443), ("10.96.1.1", "tcp", 80)}),
    node_ports=frozenset({("tcp", 30080)}),
)
CONFIGZ = KubeProxyConfigz(mode="nftables", node_port_addresses=("192.168.60.0/27",))


def svc(addr: str, port: int, proto: str = "TCP") -> IpvsService:
    dests = (IpvsDest("10.244.0.3", port, "masq", 1),)
    return IpvsService(4, proto, addr, port, None, "rr", 2, 0, dests)  # type: ignore[arg-type]


def classified(
    services: tuple[IpvsService, ...],
    table: NftTable | None = TABLE,
    configz: KubeProxyConfigz | None = CONFIGZ,
) -> tuple[dict[str, Owner], dict[str, tuple[str, ...]], object]:
    kp = dataclasses.replace(kube_proxy(), configz=Reading("ok", configz))
    snap = snapshot(
        ipvs=services,
        ipsets=(CLUSTER_IP, NODE_PORT),
        nftables=(table,) if table else (),
        links=LINKS,
        kp=kp,
    )
    c = classify(snap, NOW)
    return (
        {f.name: f.owner for f in c.findings},
        {f.name: f.evidence for f in c.findings},
        make_plan(snap, c),
    )


def test_a_lost_member_is_attributed_by_the_nftables_service_map_and_the_link_goes() -> None:
    owners, evidence, plan = classified((svc("10.96.0.1", 443), svc("10.96.1.1", 80)))
    assert owners["TCP 10.96.1.1:80"] is Owner.IPVS_LEFTOVER
    assert evidence["TCP 10.96.1.1:80"] == (
        "10.96.1.1:80/tcp is bound to kube-ipvs0 and is a Service IP and port the running "
        "nftables mode serves (its service-ips/no-endpoint-services map)",
    )
    assert [s.target for s in plan.steps if s.action == "delete-link"] == ["kube-ipvs0"]  # type: ignore[attr-defined]


def test_today_without_the_table_a_lost_member_keeps_the_link() -> None:
    owners, _, plan = classified((svc("10.96.0.1", 443), svc("10.96.1.1", 80)), table=None)
    assert owners["TCP 10.96.1.1:80"] is Owner.UNKNOWN_KUBE
    assert [k.name for k in plan.kept if k.kind == "link"] == ["kube-ipvs0"]  # type: ignore[attr-defined]


def test_keepalived_on_a_service_address_at_a_port_no_table_names_is_kept() -> None:
    """The false positive the service map guards against: a virtual server an operator put on
    a kube-ipvs0 address (a Service's own IP) at a port no Service has."""
    owners, evidence, plan = classified((svc("10.96.1.1", 80), svc("10.96.1.1", 8443)))
    assert owners["TCP 10.96.1.1:8443"] is Owner.UNKNOWN_KUBE
    assert "nor does the running nftables mode serve it" in evidence["TCP 10.96.1.1:8443"][-1]
    assert owners["TCP 10.96.1.1:80"] is Owner.IPVS_LEFTOVER
    kept = [k for k in plan.kept if k.kind == "link"]  # type: ignore[attr-defined]
    assert [k.name for k in kept] == ["kube-ipvs0"]


def test_a_served_address_and_port_not_on_kube_ipvs0_is_not_attributed() -> None:
    """The service map names a Service, not a virtual server: one no kube-proxy record puts on
    this node (not bound, no set) stays foreign even at a Service's exact IP and port."""
    off_link = Links(Link("kube-ipvs0", 3, "dummy", False, ("10.96.0.1/32",)), LINKS.node_addresses)
    kp = dataclasses.replace(kube_proxy(), configz=Reading("ok", CONFIGZ))
    snap = snapshot(
        ipvs=(svc("10.96.1.1", 80),), ipsets=(CLUSTER_IP,), nftables=(TABLE,), links=off_link, kp=kp
    )
    assert {f.name: f.owner for f in classify(snap, NOW).findings}["TCP 10.96.1.1:80"] is (
        Owner.FOREIGN
    )


def test_a_node_port_of_a_lost_node_address_inside_node_port_addresses_is_attributed() -> None:
    owners, evidence, _ = classified((svc("192.168.60.10", 30080), svc("192.168.60.20", 30080)))
    assert owners["TCP 192.168.60.20:30080"] is Owner.IPVS_LEFTOVER
    assert evidence["TCP 192.168.60.20:30080"][0].endswith(
        "192.168.60.20 is inside kube-proxy's nodePortAddresses 192.168.60.0/27 (/configz): "
        "a NodePort of an address the node no longer has"
    )


def test_keepalived_at_a_node_port_number_outside_node_port_addresses_is_kept() -> None:
    """The false positive nodePortAddresses guards against: a keepalived VIP off the node,
    outside the CIDRs kube-proxy serves NodePorts on, at a port number a NodePort also has."""
    owners, _, _ = classified((svc("192.168.60.100", 30080),))
    assert owners["TCP 192.168.60.100:30080"] is Owner.UNKNOWN_KUBE


def test_a_lost_node_address_needs_every_piece() -> None:
    lost = (svc("192.168.60.20", 30080),)
    # no /configz, or its nodePortAddresses a keyword or /0: nothing says which addresses
    for configz in (None, KubeProxyConfigz(node_port_addresses=("primary",))):
        assert classified(lost, configz=configz)[0]["TCP 192.168.60.20:30080"] is (
            Owner.UNKNOWN_KUBE
        )
    everything = KubeProxyConfigz(node_port_addresses=("0.0.0.0/0",))
    assert classified(lost, configz=everything)[0]["TCP 192.168.60.20:30080"] is (
        Owner.UNKNOWN_KUBE
    )
    # nftables mode serves no such NodePort (the Service is gone)
    no_port = dataclasses.replace(TABLE, node_ports=frozenset())
    assert classified(lost, table=no_port)[0]["TCP 192.168.60.20:30080"] is Owner.UNKNOWN_KUBE
    # UDP 30080: the protocol is part of the key
    assert classified((svc("192.168.60.20", 30080, "UDP"),))[0]["UDP 192.168.60.20:30080"] is (
        Owner.FOREIGN
    )


def test_node_port_nets_take_explicit_cidrs_only() -> None:
    c = KubeProxyConfigz(node_port_addresses=("primary", "10.0.0.0/8", "::/0", "bad", "fd00::/64"))
    assert [str(n) for n in node_port_nets(c)] == ["10.0.0.0/8", "fd00::/64"]


V134 = (
    b'{"kubeproxy.config.k8s.io":{"Mode":"nftables","IPTables":{"MasqueradeBit":13,'
    b'"LocalhostNodePorts":true},"IPVS":{"Scheduler":"","StrictARP":true},"NFTables":'
    b'{"MasqueradeBit":14},"NodePortAddresses":["192.168.50.0/24"]}}'
)
V137 = (
    b'{"kubeproxy.config.k8s.io":{"kind":"KubeProxyConfiguration","apiVersion":'
    b'"kubeproxy.config.k8s.io/v1alpha1","mode":"nftables","iptables":{"masqueradeBit":13},'
    b'"ipvs":{"strictARP":true},"nftables":{"masqueradeBit":14},'
    b'"nodePortAddresses":["192.168.50.0/24"]}}'
)


def test_configz_of_both_shapes() -> None:
    """Up to v1.35 the internal type (Go field names), from v1.36 v1alpha1 (as real
    kube-proxy v1.34.4 and v1.37.2 answered, trimmed)."""
    want = KubeProxyConfigz("nftables", ("192.168.50.0/24",), True, 13, 14)
    assert parse_configz(200, V134) == want
    assert parse_configz(200, V137) == want
    assert parse_configz(200, b'{"kubeproxy.config.k8s.io":{}}') == KubeProxyConfigz()


def test_configz_garbage_is_an_error() -> None:
    for status, body in (
        (404, b"404 page not found"),
        (200, b"not json"),
        (200, b"{}"),
        (200, b'{"kubeproxy.config.k8s.io":{"nodePortAddresses":"10.0.0.0/8"}}'),
    ):
        try:
            parse_configz(status, body)
        except ConfigzError:
            continue
        raise AssertionError(f"{status} {body!r} was accepted")


def test_the_maps_are_read_only_when_they_can_attribute_something() -> None:
    on_node = (svc("192.168.60.10", 30080),)
    assert not service_maps_needed(on_node, Links(None, ("192.168.60.10",)))
    assert service_maps_needed(on_node, LINKS)  # kube-ipvs0 exists
    assert service_maps_needed((svc("192.168.60.20", 30080),), Links(None, ("192.168.60.10",)))
    assert not service_maps_needed((), LINKS)
