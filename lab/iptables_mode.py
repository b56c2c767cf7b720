"""What kube-proxy v1.30.3 in iptables mode writes for a Node's Services in one family
(pkg/proxy/iptables/proxier.go syncProxyRules): the restore text and the prepended jumps.

A node that ran iptables mode after ipvs mode carries both: iptables mode declares (and so
flushes and rewrites) the chain names the two modes share, and leaves ipvs mode's own chains,
sets and jumps as they were.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Protocol

from lab import names as n
from lab.model import Family, Node, Port, Service, family_of
from lab.state import is_local_endpoint


class Table(Protocol):
    rules: list[str]

    def chain(self, *names: str) -> None: ...


def _hash(*parts: str) -> str:
    # portProtoHash / servicePortEndpointChainName: sha256, base32, first 16 characters
    digest = hashlib.sha256("".join(parts).encode()).digest()
    return base64.b32encode(digest).decode()[:16]


def _host(ip: str) -> str:
    return f"{ip}/128" if ":" in ip else f"{ip}/32"


def _dest(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def rewrite(t: Table, *chains: str) -> None:
    """Declare chains as iptables-restore does: their earlier rules are gone."""
    t.chain(*chains)
    t.rules[:] = [r for r in t.rules if r.split()[:2] not in [["-A", c] for c in chains]]


def masquerade_rules(mark: str) -> list[str]:
    """KUBE-POSTROUTING and KUBE-MARK-MASQ: byte-identical in ipvs and iptables mode."""
    return [
        f"-A {n.POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN",
        f"-A {n.POSTROUTING} -j MARK --xor-mark {mark}",
        f'-A {n.POSTROUTING} -m comment --comment "kubernetes service traffic requiring SNAT" '
        "-j MASQUERADE --random-fully",
        f"-A {n.MARK_MASQ} -j MARK --or-mark {mark}",
    ]


def write(tables: dict[str, Table], node: Node, family: Family) -> None:
    nat, flt = tables["nat"], tables["filter"]
    rewrite(nat, *n.IPTABLES_MODE_CHAINS["nat"])
    rewrite(flt, *n.IPTABLES_MODE_CHAINS["filter"])
    mark = node.masquerade_mark
    nat.rules += masquerade_rules(mark)
    for svc in node.services:
        for port in svc.ports:
            _service_port(nat, flt, node, family, svc, port)
    loopback = "! -d ::1/128 " if family == "ipv6" else ""
    nat.rules.append(
        f"-A {n.SERVICES} -m comment --comment "
        '"kubernetes service nodeports; NOTE: this must be the last rule in this chain" '
        f"-m addrtype --dst-type LOCAL {loopback}-j {n.NODEPORTS}"
    )
    flt.rules += [
        f"-A {n.FORWARD} -m conntrack --ctstate INVALID -j DROP",
        f'-A {n.FORWARD} -m comment --comment "kubernetes forwarding rules" '
        f"-m mark --mark {mark}/{mark} -j ACCEPT",
        f'-A {n.FORWARD} -m comment --comment "kubernetes forwarding conntrack rule" '
        "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    ]
    for table in n.CANARY_TABLES:  # ipt.Monitor: EnsureChain in each
        tables[table].chain(n.PROXY_CANARY)
    for table, builtin, target, comment, extra in n.IPTABLES_MODE_JUMPS:
        rule = f'-I {builtin} {extra}-m comment --comment "{comment}" -j {target}'
        # EnsureRule: `-C` first, so a byte-identical ipvs-mode jump is not added twice
        same = f'-I {builtin} -m comment --comment "{comment}" -j {target}'
        if rule not in tables[table].rules and same not in tables[table].rules:
            tables[table].rules.append(rule)


def _service_port(
    nat: Table, flt: Table, node: Node, family: Family, svc: Service, port: Port
) -> None:
    cips = [c for c in svc.cluster_ips if family_of(c) == family]
    if not cips:
        return
    proto = port.protocol.lower()
    spn = f"{svc.namespace}/{svc.name}:{port.name}" if port.name else f"{svc.namespace}/{svc.name}"
    eps = [e for e in svc.endpoints if family_of(e) == family]
    local_eps = [e for e in eps if is_local_endpoint(node, e)]
    base = _hash(spn, proto)
    svc_chain, ext_chain = f"KUBE-SVC-{base}", f"KUBE-EXT-{base}"
    local_chain, fw_chain = f"KUBE-SVL-{base}", f"KUBE-FW-{base}"
    match = f"-p {proto} -m {proto}" if proto != "sctp" else "-p sctp -m sctp"
    external = bool(svc.external_ips or svc.lb_ips or (svc.has_node_ports and port.node_port))
    reject = "icmp6-port-unreachable" if family == "ipv6" else "icmp-port-unreachable"
    cip = cips[0]
    if not eps:
        flt.rules.append(
            f"-A {n.SERVICES} -d {_host(cip)} {match.split(' -m')[0]} "
            f'-m comment --comment "{spn} has no endpoints" -m {proto} --dport {port.port} '
            f"-j REJECT --reject-with {reject}"
        )
        return
    sep = {e: f"KUBE-SEP-{_hash(spn, proto, _dest(e, port.backend_port))}" for e in eps}
    nat.chain(svc_chain, *sep.values())
    nat.rules.append(
        f"-A {n.SERVICES} -d {_host(cip)} -p {proto} "
        f'-m comment --comment "{spn} cluster IP" -m {proto} --dport {port.port} -j {svc_chain}'
    )
    pod_cidr = next((c for c in node.pod_cidrs if family_of(c) == family), None)
    if pod_cidr:
        nat.rules.append(
            f"-A {svc_chain} ! -s {pod_cidr} -d {_host(cip)} -p {proto} "
            f'-m comment --comment "{spn} cluster IP" -m {proto} --dport {port.port} '
            f"-j {n.MARK_MASQ}"
        )
    _endpoint_jumps(nat, svc_chain, spn, [(e, sep[e]) for e in eps], port.backend_port)
    for e, chain in sep.items():
        nat.rules += [
            f'-A {chain} -s {_host(e)} -m comment --comment "{spn}" -j {n.MARK_MASQ}',
            f'-A {chain} -p {proto} -m comment --comment "{spn}" -m {proto} '
            f"-j DNAT --to-destination {_dest(e, port.backend_port)}",
        ]
    if not external:
        return
    nat.chain(ext_chain)
    if svc.local:
        nat.chain(local_chain)
        _endpoint_jumps(nat, local_chain, spn, [(e, sep[e]) for e in local_eps], port.backend_port)
        nat.rules += [
            f'-A {ext_chain} -s {pod_cidr} -m comment --comment "pod traffic for {spn} '
            f'external destinations" -j {svc_chain}',
            f'-A {ext_chain} -m comment --comment "masquerade LOCAL traffic for {spn} external '
            f'destinations" -m addrtype --src-type LOCAL -j {n.MARK_MASQ}',
            f'-A {ext_chain} -m comment --comment "route LOCAL traffic for {spn} external '
            f'destinations" -m addrtype --src-type LOCAL -j {svc_chain}',
            f"-A {ext_chain} -j {local_chain}",
        ]
    else:
        nat.rules += [
            f'-A {ext_chain} -m comment --comment "masquerade traffic for {spn} external '
            f'destinations" -j {n.MARK_MASQ}',
            f"-A {ext_chain} -j {svc_chain}",
        ]
    for eip in (e for e in svc.external_ips if family_of(e) == family):
        nat.rules.append(
            f"-A {n.SERVICES} -d {_host(eip)} -p {proto} "
            f'-m comment --comment "{spn} external IP" -m {proto} --dport {port.port} '
            f"-j {ext_chain}"
        )
    ranges = [r for r in svc.source_ranges if family_of(r) == family]
    for lb in (
        (x for x in svc.lb_ips if family_of(x) == family) if svc.type == "LoadBalancer" else ()
    ):
        nat.rules.append(
            f"-A {n.SERVICES} -d {_host(lb)} -p {proto} "
            f'-m comment --comment "{spn} loadbalancer IP" -m {proto} --dport {port.port} '
            f"-j {fw_chain if ranges else ext_chain}"
        )
        if ranges:
            nat.chain(fw_chain)
            nat.rules += [
                f'-A {fw_chain} -s {r} -m comment --comment "{spn} loadbalancer IP" -j {ext_chain}'
                for r in ranges
            ]
            nat.rules.append(
                f'-A {fw_chain} -m comment --comment "other traffic to {spn} will be dropped '
                'by KUBE-PROXY-FIREWALL"'
            )
            flt.rules.append(
                f"-A {n.PROXY_FIREWALL} -d {_host(lb)} -p {proto} "
                f'-m comment --comment "{spn} traffic not accepted by {fw_chain}" '
                f"-m {proto} --dport {port.port} -j DROP"
            )
    if svc.has_node_ports and port.node_port:
        nat.rules.append(
            f'-A {n.NODEPORTS} -p {proto} -m comment --comment "{spn}" '
            f"-m {proto} --dport {port.node_port} -j {ext_chain}"
        )
    if svc.health_check_node_port:
        flt.rules.append(
            f'-A {n.NODEPORTS} -p tcp -m comment --comment "{spn} health check node port" '
            f"-m tcp --dport {svc.health_check_node_port} -j ACCEPT"
        )


def _endpoint_jumps(
    nat: Table, chain: str, spn: str, eps: list[tuple[str, str]], target_port: int
) -> None:
    for i, (ip, sep) in enumerate(eps):
        left = len(eps) - i
        prob = f"-m statistic --mode random --probability {1 / left:.10f} " if left > 1 else ""
        nat.rules.append(
            f'-A {chain} -m comment --comment "{spn} -> {_dest(ip, target_port)}" {prob}-j {sep}'
        )
