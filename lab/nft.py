"""nft script for kube-proxy's live nftables-mode tables (docs/kube-proxy-names.md#nftables-mode) and a user table."""

from __future__ import annotations

import base64
import hashlib

from lab.model import Family, Node, Port, Service, family_of
from lab.state import is_local_endpoint, node_addresses

TABLE = "kube-proxy"

# (name, type, hook, numeric priority): knftables writes dstnat-10 etc.; nft 1.0.6 only
# accepts the numeric form for every hook, and lists them the same way.
BASE_CHAINS = (
    ("filter-prerouting", "filter", "prerouting", -110),
    ("filter-input", "filter", "input", -110),
    ("filter-forward", "filter", "forward", -110),
    ("filter-output", "filter", "output", -110),
    ("filter-output-post-dnat", "filter", "output", -90),
    ("nat-prerouting", "nat", "prerouting", -100),
    ("nat-output", "nat", "output", -100),
    ("nat-postrouting", "nat", "postrouting", 100),
)

# nftablesJumpChains: (target, from, match)
JUMPS = (
    ("nodeport-endpoints-check", "filter-input", "ct state new "),
    ("service-endpoints-check", "filter-input", "ct state new "),
    ("service-endpoints-check", "filter-forward", "ct state new "),
    ("service-endpoints-check", "filter-output", "ct state new "),
    ("firewall-check", "filter-prerouting", "ct state new "),
    ("firewall-check", "filter-output", "ct state new "),
    ("services", "nat-output", ""),
    ("services", "nat-prerouting", ""),
    ("masquerading", "nat-postrouting", ""),
    ("cluster-ips-check", "filter-forward", "ct state new "),
    ("cluster-ips-check", "filter-output-post-dnat", "ct state new "),
)


def hash_and_truncate(name: str) -> str:
    """kube-proxy's chain-name base: 8 chars of base32(sha256(name)), a dash, the name."""
    encoded = base64.b32encode(hashlib.sha256(name.encode()).digest()).decode()
    name = f"{encoded[:8]}-{name}"
    return name[:237] + "..." if len(name) > 240 else name


def service_base(svc: Service, port: Port) -> str:
    return hash_and_truncate(f"{svc.namespace}/{svc.name}/{port.protocol.lower()}/{port.name}")


def endpoint_base(svc: Service, port: Port, ip: str) -> str:
    proto = port.protocol.lower()
    ip_part = ip.replace(":", ".")
    return hash_and_truncate(
        f"{svc.namespace}/{svc.name}/{proto}/{port.name}__{ip_part}/{port.backend_port}"
    )


def nft_script(node: Node) -> str:
    """Input for `nft -f -`."""
    out: list[str] = []
    if node.nftables_table:
        for family in node.families:
            out += _kube_proxy_table(node, family)
    if node.third_party:
        out += [
            "add table inet filter-user",
            "add chain inet filter-user input "
            "{ type filter hook input priority 0 ; policy accept ; }",
            "add rule inet filter-user input ip saddr 198.51.100.0/26 tcp dport 22 accept",
        ]
    return "".join(f"{line}\n" for line in out)


def _kube_proxy_table(node: Node, family: Family) -> list[str]:
    fam, addr, atype = (
        ("ip6", "ip6", "ipv6_addr") if family == "ipv6" else ("ip", "ip", "ipv4_addr")
    )
    p = f"{fam} {TABLE}"
    mark = f"{1 << node.masquerade_bit:#x}"
    svc_cidrs = ", ".join(c for c in node.service_cidrs if family_of(c) == family)
    out = [f'add table {p} {{ comment "rules for kube-proxy" ; }}']
    out += [
        f'add set {p} cluster-ips {{ type {atype} ; comment "Active ClusterIPs" ; }}',
        f'add set {p} nodeport-ips {{ type {atype} ; comment "IPs that accept NodePort traffic" ; }}',
        f"add map {p} firewall-ips {{ type {atype} . inet_proto . inet_service : verdict ; "
        'comment "destinations that are subject to LoadBalancerSourceRanges" ; }',
        f"add map {p} no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; "
        'comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }',
        f"add map {p} no-endpoint-services {{ type {atype} . inet_proto . inet_service : verdict ; "
        'comment "vmap to drop or reject packets to services with no endpoints" ; }',
        f"add map {p} service-ips {{ type {atype} . inet_proto . inet_service : verdict ; "
        'comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }',
        f"add map {p} service-nodeports {{ type inet_proto . inet_service : verdict ; "
        'comment "NodePort traffic" ; }',
    ]
    for name, ctype, hook, prio in BASE_CHAINS:
        out.append(f"add chain {p} {name} {{ type {ctype} hook {hook} priority {prio} ; }}")
    for name in (
        "cluster-ips-check",
        "firewall-check",
        "mark-for-masquerade",
        "masquerading",
        "nodeport-endpoints-check",
        "services",
        "service-endpoints-check",
    ):
        out.append(f"add chain {p} {name}")
    out.append(
        f"add chain {p} reject-chain "
        '{ comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }'
    )
    out += [
        f"add rule {p} cluster-ips-check {addr} daddr @cluster-ips reject "
        'comment "Reject traffic to invalid ports of ClusterIPs"',
        f"add rule {p} cluster-ips-check {addr} daddr {{ {svc_cidrs} }} drop "
        'comment "Drop traffic to unallocated ClusterIPs"',
        f"add rule {p} firewall-check {addr} daddr . meta l4proto . th dport vmap @firewall-ips",
        f"add rule {p} mark-for-masquerade mark set mark or {mark}",
        f"add rule {p} masquerading mark and {mark} == 0 return",
        f"add rule {p} masquerading mark set mark xor {mark}",
        f"add rule {p} masquerading masquerade fully-random",
        f"add rule {p} nodeport-endpoints-check {addr} daddr @nodeport-ips "
        "meta l4proto . th dport vmap @no-endpoint-nodeports",
        f"add rule {p} reject-chain reject",
        f"add rule {p} services {addr} daddr . meta l4proto . th dport vmap @service-ips",
        f"add rule {p} services {addr} daddr @nodeport-ips "
        "meta l4proto . th dport vmap @service-nodeports",
        f"add rule {p} service-endpoints-check {addr} daddr . meta l4proto . th dport "
        "vmap @no-endpoint-services",
    ]
    out += [f"add rule {p} {src} {m}jump {dst}" for dst, src, m in JUMPS]
    for ip in node_addresses(node, family):
        out.append(f"add element {p} nodeport-ips {{ {ip} }}")
    for svc in node.services:
        if any(family_of(c) == family for c in svc.cluster_ips):
            for port in svc.ports:
                out += _service_port(node, family, p, addr, svc, port)
    return out


def _dnat_target(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _numgen(endpoint_chains: list[str]) -> str:
    arms = ", ".join(f"{i} : goto {c}" for i, c in enumerate(endpoint_chains))
    return f"numgen random mod {len(endpoint_chains)} vmap {{ {arms} }}"


def _service_port(
    node: Node, family: Family, p: str, addr: str, svc: Service, port: Port
) -> list[str]:
    out: list[str] = []
    proto = port.protocol.lower()
    base = service_base(svc, port)
    svc_chain, ext_chain = f"service-{base}", f"external-{base}"
    pod_cidr = next((c for c in node.pod_cidrs if family_of(c) == family), None)
    cips = [c for c in svc.cluster_ips if family_of(c) == family]
    eps = [e for e in svc.endpoints if family_of(e) == family]
    local_eps = [e for e in eps if is_local_endpoint(node, e)]

    ep_chains = []
    for ep in eps:
        ec = f"endpoint-{endpoint_base(svc, port, ep)}"
        ep_chains.append(ec)
        out += [
            f"add chain {p} {ec}",
            f"add rule {p} {ec} {addr} saddr {ep} jump mark-for-masquerade",
            f"add rule {p} {ec} meta l4proto {proto} dnat to {_dnat_target(ep, port.backend_port)}",
        ]
    out.append(f"add chain {p} {svc_chain}")
    for cip in cips:
        if pod_cidr:
            out.append(
                f"add rule {p} {svc_chain} {addr} daddr {cip} {addr} saddr != {pod_cidr} "
                "jump mark-for-masquerade"
            )
    if ep_chains:
        out.append(f"add rule {p} {svc_chain} {_numgen(ep_chains)}")
    for cip in cips:
        out.append(f"add element {p} cluster-ips {{ {cip} }}")
        if ep_chains:
            out.append(
                f"add element {p} service-ips {{ {cip} . {proto} . {port.port} : goto {svc_chain} }}"
            )
        else:
            out.append(
                f"add element {p} no-endpoint-services "
                f"{{ {cip} . {proto} . {port.port} : goto reject-chain }}"
            )

    externals = [e for e in svc.external_ips if family_of(e) == family]
    lbs = [e for e in svc.lb_ips if family_of(e) == family] if svc.type == "LoadBalancer" else []
    node_port = port.node_port if svc.has_node_ports else None
    if not (externals or lbs or node_port) or not ep_chains:
        return out
    out.append(f"add chain {p} {ext_chain}")
    if svc.local:
        local_chain = f"local-{base}"
        local_chains = [c for e, c in zip(eps, ep_chains, strict=True) if e in local_eps]
        out.append(f"add chain {p} {local_chain}")
        if local_chains:
            out.append(f"add rule {p} {local_chain} {_numgen(local_chains)}")
        else:
            out.append(f'add rule {p} {local_chain} drop comment "no local endpoints"')
        if pod_cidr:
            out.append(
                f"add rule {p} {ext_chain} {addr} saddr {pod_cidr} goto {svc_chain} "
                'comment "short-circuit pod traffic"'
            )
        out += [
            f"add rule {p} {ext_chain} fib saddr type local jump mark-for-masquerade "
            'comment "masquerade local traffic"',
            f"add rule {p} {ext_chain} fib saddr type local goto {svc_chain} "
            'comment "short-circuit local traffic"',
            f"add rule {p} {ext_chain} goto {local_chain}",
        ]
    else:
        out += [
            f"add rule {p} {ext_chain} jump mark-for-masquerade",
            f"add rule {p} {ext_chain} goto {svc_chain}",
        ]
    for ip in externals + lbs:
        out.append(
            f"add element {p} service-ips {{ {ip} . {proto} . {port.port} : goto {ext_chain} }}"
        )
    ranges = [r for r in svc.source_ranges if family_of(r) == family]
    if lbs and ranges:
        fw_chain = f"firewall-{base}"
        out += [
            f"add chain {p} {fw_chain}",
            f"add rule {p} {fw_chain} {addr} saddr != {{ {', '.join(ranges)} }} drop",
        ]
        for lb in lbs:
            out.append(
                f"add element {p} firewall-ips {{ {lb} . {proto} . {port.port} : goto {fw_chain} }}"
            )
    if node_port:
        out.append(
            f"add element {p} service-nodeports {{ {proto} . {node_port} : goto {ext_chain} }}"
        )
    return out
