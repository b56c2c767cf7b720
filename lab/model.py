"""Plain data describing a node's Services and which kinds of leftover state to build."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Literal

Protocol = Literal["TCP", "UDP", "SCTP"]
ServiceType = Literal["ClusterIP", "NodePort", "LoadBalancer"]
Backend = Literal["legacy", "nft"]
Family = Literal["ipv4", "ipv6"]


@dataclass(frozen=True)
class Port:
    name: str
    protocol: Protocol
    port: int
    node_port: int | None = None
    # The endpoint port; kube-proxy DNATs to it. None means "same as port".
    target_port: int | None = None

    @property
    def backend_port(self) -> int:
        return self.target_port if self.target_port is not None else self.port


@dataclass(frozen=True)
class Service:
    namespace: str
    name: str
    type: ServiceType
    cluster_ips: tuple[str, ...]
    ports: tuple[Port, ...]
    external_ips: tuple[str, ...] = ()
    lb_ips: tuple[str, ...] = ()
    source_ranges: tuple[str, ...] = ()
    endpoints: tuple[str, ...] = ()
    local: bool = False  # externalTrafficPolicy: Local
    health_check_node_port: int | None = None
    # sessionAffinity: ClientIP with this timeout (kube-proxy's default 10800 s); None: no affinity
    session_affinity_seconds: int | None = None

    @property
    def has_node_ports(self) -> bool:
        return self.type in ("NodePort", "LoadBalancer")


@dataclass(frozen=True)
class Node:
    services: tuple[Service, ...]
    node_ips: tuple[str, ...] = ("192.168.50.10/24",)
    families: tuple[Family, ...] = ("ipv4",)
    backend: Backend = "nft"
    ipvs_leftovers: bool = True
    # IPVS virtual servers; also implies kube-ipvs0 unless with_kube_ipvs0 says otherwise.
    with_ipvs: bool = False
    kube_ipvs0_kind: str = "dummy"
    # None follows with_ipvs; True lets a host without the dummy driver build a non-dummy
    # kube-ipvs0 (kube_ipvs0_kind="bridge"), the "not a dummy, do not delete" case.
    with_kube_ipvs0: bool | None = None
    nftables_table: bool = False
    kubelet: bool = True
    third_party: bool = False
    old_release_orphans: bool = False
    # Names of the 1.9-1.10 releases: their sets and FORWARD jump comment.
    older_release_names: bool = False
    # The node also ran kube-proxy's iptables mode: after ipvs mode (ipvs_leftovers=True),
    # or instead of it (iptables -> nftables).
    iptables_mode: bool = False
    strict_arp: bool = False
    masquerade_bit: int = 14
    # kube-proxy's clusterCIDR (local-traffic detector); empty selects the src,dst variant.
    pod_cidrs: tuple[str, ...] = ("10.244.0.0/16", "fd00:10:244::/64")
    # This node's pod ranges: endpoints inside are local (KUBE-LOOP-BACK, Local policy).
    local_pod_cidrs: tuple[str, ...] = ("10.244.0.0/24", "fd00:10:244::/112")
    service_cidrs: tuple[str, ...] = ("10.96.0.0/16", "fd00:10:96::/112")
    # Cluster-external address ranges used by third-party IPVS real servers.
    extra_routes: tuple[str, ...] = field(default=("192.168.60.0/24",))

    @property
    def builds_kube_ipvs0(self) -> bool:
        return self.with_ipvs if self.with_kube_ipvs0 is None else self.with_kube_ipvs0

    @property
    def masquerade_mark(self) -> str:
        # kube-proxy: fmt.Sprintf("%#08x", 1<<bit) -> "0x004000"
        return f"{1 << self.masquerade_bit:#08x}"


def family_of(address: str) -> Family:
    """Family of an address or CIDR ("10.0.0.1", "fd00::1/64")."""
    return "ipv6" if ipaddress.ip_interface(address).version == 6 else "ipv4"


def bare_ip(address: str) -> str:
    return str(ipaddress.ip_interface(address).ip)


def in_cidrs(address: str, cidrs: tuple[str, ...]) -> bool:
    ip = ipaddress.ip_address(address)
    return any(
        ip.version == net.version and ip in net
        for net in (ipaddress.ip_network(c, strict=False) for c in cidrs)
    )
