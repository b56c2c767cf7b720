"""What kube-proxy's ipvs proxier derives from Services for one IP family (its syncProxyRules)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from lab import names as n
from lab.model import Family, Node, Service, family_of, in_cidrs


@dataclass(frozen=True)
class VirtualServer:
    protocol: str  # "tcp" | "udp" | "sctp"
    address: str
    port: int
    real_servers: tuple[tuple[str, int], ...]
    scheduler: str = "rr"
    # sessionAffinity ClientIP: every virtual server of the Service is persistent (ipvsadm -p)
    persistence: int | None = None
    forward: str = "-m"  # masq


@dataclass
class FamilyState:
    family: Family
    entries: dict[str, list[str]] = field(default_factory=lambda: {s.name: [] for s in n.SETS})
    virtual_servers: list[VirtualServer] = field(default_factory=list)
    bound: list[str] = field(default_factory=list)  # addresses on kube-ipvs0
    # LB ip:port whose source ranges exclude the node: KUBE-IPVS-OUT-FILTER drops
    lb_no_node_access: list[tuple[str, str, int]] = field(default_factory=list)

    def add(self, set_base: str, entry: str) -> None:
        if entry not in self.entries[set_base]:
            self.entries[set_base].append(entry)

    def bind(self, address: str) -> None:
        if address not in self.bound:
            self.bound.append(address)
            self.add(n.IPVS_IPS, address)


def node_addresses(node: Node, family: Family) -> list[str]:
    """Node IPs kube-proxy would use for NodePorts (no loopback, no IPv6 link-local)."""
    out = []
    for cidr in node.node_ips:
        ip = ipaddress.ip_interface(cidr).ip
        if family_of(cidr) == family and not ip.is_loopback and not ip.is_link_local:
            out.append(str(ip))
    return out


def _of(addresses: tuple[str, ...], family: Family) -> list[str]:
    return [a for a in addresses if family_of(a) == family]


def _fmt(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def is_local_endpoint(node: Node, endpoint: str) -> bool:
    return in_cidrs(endpoint, node.local_pod_cidrs)


def family_state(node: Node, family: Family) -> FamilyState:
    st = FamilyState(family)
    node_ips = node_addresses(node, family)
    for svc in node.services:
        if _of(svc.cluster_ips, family):
            _add_service(st, node, svc, family, node_ips)
    return st


def _add_service(
    st: FamilyState, node: Node, svc: Service, family: Family, node_ips: list[str]
) -> None:
    endpoints = _of(svc.endpoints, family)
    local_eps = [e for e in endpoints if is_local_endpoint(node, e)]
    # externalTrafficPolicy=Local: external VIPs and NodePorts only reach local endpoints.
    ext_eps = local_eps if svc.local else endpoints
    for port in svc.ports:
        proto = port.protocol.lower()
        rs = tuple((e, port.backend_port) for e in endpoints)
        ext_rs = tuple((e, port.backend_port) for e in ext_eps)
        for ep in local_eps:
            st.add(n.LOOP_BACK, f"{ep},{proto}:{port.backend_port},{ep}")
        for cip in _of(svc.cluster_ips, family):
            st.add(n.CLUSTER_IP, f"{cip},{proto}:{port.port}")
            st.bind(cip)
            st.virtual_servers.append(
                VirtualServer(proto, cip, port.port, rs, persistence=svc.session_affinity_seconds)
            )
        for eip in _of(svc.external_ips, family):
            st.add(
                n.EXTERNAL_IP_LOCAL if svc.local else n.EXTERNAL_IP, f"{eip},{proto}:{port.port}"
            )
            if eip not in node_ips:
                st.bind(eip)
            st.virtual_servers.append(
                VirtualServer(
                    proto, eip, port.port, ext_rs, persistence=svc.session_affinity_seconds
                )
            )
        if svc.type == "LoadBalancer":
            for lb in _of(svc.lb_ips, family):
                _add_lb(st, node, svc, lb, proto, port.port, node_ips)
                st.virtual_servers.append(
                    VirtualServer(
                        proto, lb, port.port, ext_rs, persistence=svc.session_affinity_seconds
                    )
                )
        if svc.has_node_ports and port.node_port:
            _add_node_port(st, svc, proto, port.node_port, node_ips)
            for nip in node_ips:
                st.virtual_servers.append(
                    VirtualServer(
                        proto, nip, port.node_port, ext_rs, persistence=svc.session_affinity_seconds
                    )
                )
    if svc.health_check_node_port:
        st.add(n.HEALTH_CHECK_NODE_PORT, str(svc.health_check_node_port))


def _add_lb(
    st: FamilyState,
    node: Node,
    svc: Service,
    lb: str,
    proto: str,
    port: int,
    node_ips: list[str],
) -> None:
    entry = f"{lb},{proto}:{port}"
    st.add(n.LOAD_BALANCER, entry)
    if svc.local:
        st.add(n.LOAD_BALANCER_LOCAL, entry)
    if lb not in node_ips:
        st.bind(lb)
    ranges = [r for r in svc.source_ranges if family_of(r) == st.family]
    if not ranges:
        return
    st.add(n.LOAD_BALANCER_FW, entry)
    for cidr in ranges:
        st.add(n.LOAD_BALANCER_SOURCE_CIDR, f"{lb},{proto}:{port},{cidr}")
    # kube-proxy checks only its primary node IP against the ranges.
    if node_ips and in_cidrs(node_ips[0], tuple(ranges)):
        st.add(n.LOAD_BALANCER_SOURCE_IP, f"{lb},{proto}:{port},{lb}")
    else:
        st.lb_no_node_access.append((lb, proto, port))


def _add_node_port(
    st: FamilyState, svc: Service, proto: str, node_port: int, node_ips: list[str]
) -> None:
    if proto == "sctp":
        entries = [f"{ip},sctp:{node_port}" for ip in node_ips]
        sets = (n.NODE_PORT_SCTP, n.NODE_PORT_LOCAL_SCTP)
    else:
        entries = [str(node_port)]
        sets = {
            "tcp": (n.NODE_PORT_TCP, n.NODE_PORT_LOCAL_TCP),
            "udp": (n.NODE_PORT_UDP, n.NODE_PORT_LOCAL_UDP),
        }[proto]
    for e in entries:
        st.add(sets[0], e)
        if svc.local:
            st.add(sets[1], e)


def vs_address(ip: str, port: int) -> str:
    return _fmt(ip, port)
