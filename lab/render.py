"""Pure functions: a Node -> the exact texts fed to ipset, iptables-restore, ipvsadm, ip, nft."""

from __future__ import annotations

from lab import iptables_mode
from lab import names as n
from lab.model import Family, Node, family_of
from lab.nft import nft_script
from lab.state import FamilyState, family_state, vs_address

__all__ = ["ip_batch", "ipset_restore", "iptables_restore", "ipvsadm_restore", "nft_script"]


def _families(node: Node) -> tuple[Family, ...]:
    return node.families


def _create(name: str, set_type: str, family: Family) -> str:
    # createSet: bitmap:port takes a range and no family; hash types get kube-proxy's defaults.
    if set_type == "bitmap:port":
        return f"create {name} bitmap:port range 0-65535"
    inet = "inet6" if family == "ipv6" else "inet"
    return f"create {name} {set_type} family {inet} hashsize 1024 maxelem 65536"


def ipset_restore(node: Node) -> str:
    """Input for `ipset restore -exist`: all 17 sets per family, filled like kube-proxy fills them."""
    lines: list[str] = []
    for family in _families(node):
        if node.ipvs_leftovers:
            st = family_state(node, family)
            for info in n.SETS:
                name = n.set_name(info.name, family)
                lines.append(_create(name, info.type, family))
                lines.extend(f"add {name} {e}" for e in st.entries[info.name])
        if node.old_release_orphans:
            for info in n.OLD_SETS:
                lines.append(_create(n.set_name(info.name, family), info.type, family))
        if node.older_release_names and family == "ipv4":  # 1.9-1.10: no KUBE-6- names yet
            lines += [_create(i.name, i.type, family) for i in n.PRE_KUBE6_SETS]
    if node.third_party:
        lines.append("create office-allow hash:net family inet hashsize 1024 maxelem 65536")
        lines.extend(
            f"add office-allow {c}"
            for c in ("198.51.100.0/26", "203.0.113.64/27", "192.0.2.128/25")
        )
    return "".join(f"{line}\n" for line in lines)


class _Table:
    """One table's restore text: chain declarations first, then rules in write order."""

    def __init__(self) -> None:
        self.chains: list[str] = []
        self.rules: list[str] = []

    def chain(self, *names: str) -> None:
        for name in names:
            if name not in self.chains:
                self.chains.append(name)

    def text(self, table: str) -> str:
        body = [f"*{table}"] + [f":{c} - [0:0]" for c in self.chains] + self.rules + ["COMMIT"]
        return "\n".join(body) + "\n"


def iptables_restore(node: Node, family: Family) -> dict[str, str]:
    """Per table, text for `iptables-restore --noflush` (or ip6tables-) in the order a node
    accumulates it: third-party daemons at boot, then kubelet, then kube-proxy."""
    tables: dict[str, _Table] = {"mangle": _Table(), "nat": _Table(), "filter": _Table()}
    if node.third_party and family == "ipv4":
        _third_party(tables)
    if node.kubelet:
        _kubelet(tables, family)
    if node.old_release_orphans:
        _old_orphans(tables, node, family)
    if node.ipvs_leftovers:
        _kube_proxy(tables, node, family)
        if node.older_release_names:  # the 1.10 jump stays beside the newer one
            table, builtin, target, comment = n.OLD_FORWARD_JUMP
            tables[table].rules.append(f'-I {builtin} -m comment --comment "{comment}" -j {target}')
    if node.iptables_mode:
        iptables_mode.write(tables, node, family)  # type: ignore[arg-type]
    return {name: t.text(name) for name, t in tables.items() if t.chains or t.rules}


def _third_party(t: dict[str, _Table]) -> None:
    nat, flt = t["nat"], t["filter"]
    nat.chain("DOCKER", "CNI-HOSTPORT-DNAT")
    nat.rules += [
        "-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER",
        "-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER",
        "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE",
        "-A DOCKER -i docker0 -j RETURN",
        "-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
    ]
    flt.chain("DOCKER", "DOCKER-ISOLATION-STAGE-1", "DOCKER-ISOLATION-STAGE-2", "DOCKER-USER")
    flt.rules += [
        "-A FORWARD -j DOCKER-USER",
        "-A FORWARD -j DOCKER-ISOLATION-STAGE-1",
        "-A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        "-A FORWARD -o docker0 -j DOCKER",
        "-A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2",
        "-A DOCKER-ISOLATION-STAGE-1 -j RETURN",
        "-A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP",
        "-A DOCKER-ISOLATION-STAGE-2 -j RETURN",
        "-A DOCKER-USER -j RETURN",
    ]


def _kubelet(t: dict[str, _Table], family: Family) -> None:
    t["mangle"].chain(n.KUBELET_HINT, n.KUBELET_CANARY)
    t["nat"].chain(n.KUBELET_CANARY)
    t["filter"].chain(n.KUBELET_CANARY)
    if family == "ipv4":
        flt = t["filter"]
        flt.chain(n.KUBELET_FIREWALL)
        # EnsureRule(Prepend) OUTPUT then INPUT; the martian rule is appended to the chain.
        flt.rules += [
            f"-I OUTPUT -j {n.KUBELET_FIREWALL}",
            f"-I INPUT -j {n.KUBELET_FIREWALL}",
            f"-A {n.KUBELET_FIREWALL} {n.KUBELET_MARTIAN_RULE}",
        ]


def _old_orphans(t: dict[str, _Table], node: Node, family: Family) -> None:
    # What an old ipvs kube-proxy wrote into nat KUBE-FIREWALL / KUBE-MARK-DROP; newer
    # releases stopped managing (and flushing) these chains, so the contents stay.
    nat = t["nat"]
    nat.chain(n.OLD_NAT_FIREWALL, n.OLD_MARK_DROP)
    src_cidr = n.SET_BY_NAME[n.LOAD_BALANCER_SOURCE_CIDR]
    st = family_state(node, family)
    if st.entries[src_cidr.name]:
        nat.rules.append(
            f'-A {n.OLD_NAT_FIREWALL} -m comment --comment "{src_cidr.comment}" '
            f"-m set --match-set {n.set_name(src_cidr.name, family)} dst,dst,src -j RETURN"
        )
    nat.rules += [
        f"-A {n.OLD_NAT_FIREWALL} -j {n.OLD_MARK_DROP}",
        f"-A {n.OLD_MARK_DROP} -j MARK --or-mark {n.OLD_DROP_MARK}",
    ]


def _kube_proxy(t: dict[str, _Table], node: Node, family: Family) -> None:
    """writeIptablesRules() followed by the prepended jumps of iptablesJumpChain."""
    st = family_state(node, family)
    nat, flt = t["nat"], t["filter"]
    nat.chain(*n.CHAINS["nat"])
    flt.chain(*n.CHAINS["filter"])

    def sn(base: str) -> str:
        return n.set_name(base, family)

    mark = node.masquerade_mark
    loopback = "::1/128" if family == "ipv6" else "127.0.0.0/8"
    nat.rules.append(f"-A {n.SERVICES} -s {loopback} -j RETURN")

    for set_base, table, chain, target, match, proto in n.SET_RULES:
        if not st.entries[set_base]:
            continue  # kube-proxy skips the rule while its set is empty
        p = f"-p {proto} " if proto else ""
        comment = n.SET_BY_NAME[set_base].comment
        t[table].rules.append(
            f'-A {chain} {p}-m comment --comment "{comment}" '
            f"-m set --match-set {sn(set_base)} {match} -j {target}"
        )

    def set_rule(set_base: str, match: str) -> str:
        comment = n.SET_BY_NAME[set_base].comment
        return (
            f'-A {n.SERVICES} -m comment --comment "{comment}" '
            f"-m set --match-set {sn(set_base)} {match}"
        )

    if st.entries[n.CLUSTER_IP]:
        pod_cidr = next((c for c in node.pod_cidrs if family_of(c) == family), None)
        if pod_cidr:  # a local-traffic detector (clusterCIDR) is configured
            nat.rules.append(
                f"{set_rule(n.CLUSTER_IP, 'dst,dst')} ! -s {pod_cidr} -j {n.MARK_MASQ}"
            )
        else:
            nat.rules.append(f"{set_rule(n.CLUSTER_IP, 'src,dst')} -j {n.MARK_MASQ}")
    external_only = "-m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
    dst_local = "-m addrtype --dst-type LOCAL -j ACCEPT"
    if st.entries[n.EXTERNAL_IP]:
        base = set_rule(n.EXTERNAL_IP, "dst,dst")
        nat.rules += [f"{base} -j {n.MARK_MASQ}", f"{base} {external_only}", f"{base} {dst_local}"]
    if st.entries[n.EXTERNAL_IP_LOCAL]:
        base = set_rule(n.EXTERNAL_IP_LOCAL, "dst,dst")
        nat.rules += [f"{base} {external_only}", f"{base} {dst_local}"]
    nat.rules.append(f"-A {n.SERVICES} -m addrtype --dst-type LOCAL -j {n.NODE_PORT}")
    nat.rules.append(f"-A {n.LOAD_BALANCER_CHAIN} -j {n.MARK_MASQ}")
    flt.rules.append(f"-A {n.SOURCE_RANGES_FIREWALL} -j DROP")
    if node.with_ipvs:
        # The ipvs match needs xt_ipvs, i.e. an IPVS kernel; iptables rejects it elsewhere.
        for ip, proto, port in st.lb_no_node_access:
            flt.rules.append(
                f"-A {n.IPVS_OUT_FILTER} -s {ip} -m ipvs --vaddr {ip} --vproto {proto} "
                f"--vport {port} -j DROP"
            )
    for set_base in (n.CLUSTER_IP, n.LOAD_BALANCER):  # acceptIPVSTraffic
        if st.entries[set_base]:
            nat.rules.append(f"-A {n.SERVICES} -m set --match-set {sn(set_base)} dst,dst -j ACCEPT")
    flt.rules += [
        f'-A {n.FORWARD} -m comment --comment "kubernetes forwarding rules" '
        f"-m mark --mark {mark}/{mark} -j ACCEPT",
        f'-A {n.FORWARD} -m comment --comment "kubernetes forwarding conntrack rule" '
        "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        f'-A {n.NODE_PORT} -m comment --comment "Kubernetes health check node port" '
        f"-m set --match-set {sn(n.HEALTH_CHECK_NODE_PORT)} dst -j ACCEPT",
    ]
    for set_base in (n.LOAD_BALANCER, n.CLUSTER_IP, n.EXTERNAL_IP, n.EXTERNAL_IP_LOCAL):
        flt.rules.append(f"-A {n.IPVS_FILTER} -m set --match-set {sn(set_base)} dst,dst -j RETURN")
    flt.rules += [
        f"-A {n.IPVS_FILTER} -m set --match-set {sn(n.HEALTH_CHECK_NODE_PORT)} dst -j RETURN",
        f"-A {n.IPVS_FILTER} -m conntrack --ctstate NEW "
        f"-m set --match-set {sn(n.IPVS_IPS)} dst -j REJECT",
    ]
    nat.rules += iptables_mode.masquerade_rules(mark)
    for table, builtin, target, comment in n.JUMPS:
        t[table].rules.append(f'-I {builtin} -m comment --comment "{comment}" -j {target}')


def ipvsadm_restore(node: Node) -> str:
    """Input for `ipvsadm -R` (the `ipvsadm -S -n` format)."""
    lines: list[str] = []
    if node.with_ipvs and node.ipvs_leftovers:
        for family in _families(node):
            lines += _kube_virtual_servers(family_state(node, family))
    if node.with_ipvs and node.third_party:
        lines += _keepalived_services()
    return "".join(f"{line}\n" for line in lines)


_PROTO_FLAG = {"tcp": "-t", "udp": "-u", "sctp": "--sctp-service"}


def _kube_virtual_servers(st: FamilyState) -> list[str]:
    lines: list[str] = []
    seen: set[tuple[str, str, int]] = set()
    for vs in st.virtual_servers:
        key = (vs.protocol, vs.address, vs.port)
        if key in seen:
            continue
        seen.add(key)
        svc = f"{_PROTO_FLAG[vs.protocol]} {vs_address(vs.address, vs.port)}"
        lines.append(f"-A {svc} -s {vs.scheduler}")
        lines += [f"-a {svc} -r {vs_address(ip, p)} {vs.forward} -w 1" for ip, p in vs.real_servers]
    return lines


def _keepalived_services() -> list[str]:
    # A keepalived/LVS-DR pair on the node's LAN, and a firewall-mark service: foreign state
    # that kube-proxy's global ipvs.Flush() would destroy.
    return [
        "-A -t 192.168.50.100:80 -s wlc",
        "-a -t 192.168.50.100:80 -r 192.168.60.11:80 -g -w 1",
        "-a -t 192.168.50.100:80 -r 192.168.60.12:80 -g -w 1",
        "-A -f 100 -s wlc",
        "-a -f 100 -r 192.168.60.21:0 -g -w 1",
        "-a -f 100 -r 192.168.60.22:0 -g -w 1",
    ]


def ip_batch(node: Node) -> str:
    """Input for `ip -batch -`: kube-ipvs0, left DOWN as kube-proxy leaves it, holding every
    bound address as a host route-sized prefix."""
    if not node.builds_kube_ipvs0:
        return ""
    lines = [f"link add kube-ipvs0 type {node.kube_ipvs0_kind}"]
    for family in _families(node):
        if not node.ipvs_leftovers:
            continue
        plen = 128 if family == "ipv6" else 32
        for addr in family_state(node, family).bound:
            lines.append(f"address add {addr}/{plen} dev kube-ipvs0")
    return "".join(f"{line}\n" for line in lines)
