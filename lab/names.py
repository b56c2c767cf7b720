"""kube-proxy ipvs-mode names and comments, typed once (docs/kube-proxy-names.md)."""

from __future__ import annotations

from dataclasses import dataclass

from lab.model import Family


@dataclass(frozen=True)
class SetInfo:
    name: str  # IPv4 base name
    type: str
    comment: str


# Order of kube-proxy's ipsetInfo; the restore text follows it.
LOOP_BACK = "KUBE-LOOP-BACK"
CLUSTER_IP = "KUBE-CLUSTER-IP"
EXTERNAL_IP = "KUBE-EXTERNAL-IP"
EXTERNAL_IP_LOCAL = "KUBE-EXTERNAL-IP-LOCAL"
LOAD_BALANCER = "KUBE-LOAD-BALANCER"
LOAD_BALANCER_FW = "KUBE-LOAD-BALANCER-FW"
LOAD_BALANCER_LOCAL = "KUBE-LOAD-BALANCER-LOCAL"
LOAD_BALANCER_SOURCE_IP = "KUBE-LOAD-BALANCER-SOURCE-IP"
LOAD_BALANCER_SOURCE_CIDR = "KUBE-LOAD-BALANCER-SOURCE-CIDR"
NODE_PORT_TCP = "KUBE-NODE-PORT-TCP"
NODE_PORT_LOCAL_TCP = "KUBE-NODE-PORT-LOCAL-TCP"
NODE_PORT_UDP = "KUBE-NODE-PORT-UDP"
NODE_PORT_LOCAL_UDP = "KUBE-NODE-PORT-LOCAL-UDP"
NODE_PORT_SCTP = "KUBE-NODE-PORT-SCTP-HASH"
NODE_PORT_LOCAL_SCTP = "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
HEALTH_CHECK_NODE_PORT = "KUBE-HEALTH-CHECK-NODE-PORT"
IPVS_IPS = "KUBE-IPVS-IPS"

SETS: tuple[SetInfo, ...] = (
    SetInfo(
        LOOP_BACK,
        "hash:ip,port,ip",
        "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
    ),
    SetInfo(
        CLUSTER_IP, "hash:ip,port", "Kubernetes service cluster ip + port for masquerade purpose"
    ),
    SetInfo(
        EXTERNAL_IP,
        "hash:ip,port",
        "Kubernetes service external ip + port for masquerade and filter purpose",
    ),
    SetInfo(
        EXTERNAL_IP_LOCAL,
        "hash:ip,port",
        "Kubernetes service external ip + port with externalTrafficPolicy=local",
    ),
    SetInfo(LOAD_BALANCER, "hash:ip,port", "Kubernetes service lb portal"),
    SetInfo(
        LOAD_BALANCER_FW,
        "hash:ip,port",
        "Kubernetes service load balancer ip + port for load balancer with sourceRange",
    ),
    SetInfo(
        LOAD_BALANCER_LOCAL,
        "hash:ip,port",
        "Kubernetes service load balancer ip + port with externalTrafficPolicy=local",
    ),
    SetInfo(
        LOAD_BALANCER_SOURCE_IP,
        "hash:ip,port,ip",
        "Kubernetes service load balancer ip + port + source IP for packet filter purpose",
    ),
    SetInfo(
        LOAD_BALANCER_SOURCE_CIDR,
        "hash:ip,port,net",
        "Kubernetes service load balancer ip + port + source cidr for packet filter purpose",
    ),
    SetInfo(NODE_PORT_TCP, "bitmap:port", "Kubernetes nodeport TCP port for masquerade purpose"),
    SetInfo(
        NODE_PORT_LOCAL_TCP,
        "bitmap:port",
        "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
    ),
    SetInfo(NODE_PORT_UDP, "bitmap:port", "Kubernetes nodeport UDP port for masquerade purpose"),
    SetInfo(
        NODE_PORT_LOCAL_UDP,
        "bitmap:port",
        "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
    ),
    SetInfo(
        NODE_PORT_SCTP,
        "hash:ip,port",
        "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'",
    ),
    SetInfo(
        NODE_PORT_LOCAL_SCTP,
        "hash:ip,port",
        "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'",
    ),
    SetInfo(HEALTH_CHECK_NODE_PORT, "bitmap:port", "Kubernetes health check node port"),
    SetInfo(IPVS_IPS, "hash:ip", "Addresses on the ipvs interface"),
)
SET_BY_NAME = {s.name: s for s in SETS}

# Sets from older releases that current kube-proxy neither creates nor destroys (docs/older-releases.md).
OLD_SETS: tuple[SetInfo, ...] = (
    SetInfo(
        "KUBE-NODE-PORT-SCTP", "bitmap:port", "Kubernetes nodeport SCTP port for masquerade purpose"
    ),
    SetInfo(
        "KUBE-NODE-PORT-LOCAL-SCTP",
        "bitmap:port",
        "Kubernetes nodeport SCTP port with externalTrafficPolicy=local",
    ),
)


def set_name(base: str, family: Family) -> str:
    """kube-proxy's NewIPSet: KUBE- -> KUBE-6- for IPv6, cut to the kernel's 31 characters."""
    if family == "ipv4":
        return base
    return base.replace("KUBE-", "KUBE-6-", 1)[:31]


# Chains (docs/kube-proxy-names.md#ipvs-modes-iptables-chains-and-jumps)
SERVICES = "KUBE-SERVICES"
POSTROUTING = "KUBE-POSTROUTING"
NODE_PORT = "KUBE-NODE-PORT"
LOAD_BALANCER_CHAIN = "KUBE-LOAD-BALANCER"
MARK_MASQ = "KUBE-MARK-MASQ"
FORWARD = "KUBE-FORWARD"
PROXY_FIREWALL = "KUBE-PROXY-FIREWALL"
SOURCE_RANGES_FIREWALL = "KUBE-SOURCE-RANGES-FIREWALL"
IPVS_FILTER = "KUBE-IPVS-FILTER"
IPVS_OUT_FILTER = "KUBE-IPVS-OUT-FILTER"

CHAINS: dict[str, tuple[str, ...]] = {
    "nat": (SERVICES, POSTROUTING, NODE_PORT, LOAD_BALANCER_CHAIN, MARK_MASQ),
    "filter": (
        FORWARD,
        NODE_PORT,
        PROXY_FIREWALL,
        SOURCE_RANGES_FIREWALL,
        IPVS_FILTER,
        IPVS_OUT_FILTER,
    ),
}

# iptablesJumpChain, in kube-proxy's order: (table, built-in chain, target, comment)
JUMPS: tuple[tuple[str, str, str, str], ...] = (
    ("nat", "OUTPUT", SERVICES, "kubernetes service portals"),
    ("nat", "PREROUTING", SERVICES, "kubernetes service portals"),
    ("nat", "POSTROUTING", POSTROUTING, "kubernetes postrouting rules"),
    ("filter", "FORWARD", FORWARD, "kubernetes forwarding rules"),
    ("filter", "INPUT", NODE_PORT, "kubernetes health check rules"),
    ("filter", "INPUT", PROXY_FIREWALL, "kube-proxy firewall rules"),
    ("filter", "FORWARD", PROXY_FIREWALL, "kube-proxy firewall rules"),
    ("filter", "INPUT", IPVS_FILTER, "kubernetes ipvs access filter"),
    ("filter", "OUTPUT", IPVS_OUT_FILTER, "kubernetes ipvs access filter"),
)

# ipsetWithIptablesChain: (set, table, from chain, target, match type, protocol)
SET_RULES: tuple[tuple[str, str, str, str, str, str], ...] = (
    (LOOP_BACK, "nat", POSTROUTING, "MASQUERADE", "dst,dst,src", ""),
    (LOAD_BALANCER, "nat", SERVICES, LOAD_BALANCER_CHAIN, "dst,dst", ""),
    (LOAD_BALANCER_LOCAL, "nat", LOAD_BALANCER_CHAIN, "RETURN", "dst,dst", ""),
    (NODE_PORT_LOCAL_TCP, "nat", NODE_PORT, "RETURN", "dst", "tcp"),
    (NODE_PORT_TCP, "nat", NODE_PORT, MARK_MASQ, "dst", "tcp"),
    (NODE_PORT_LOCAL_UDP, "nat", NODE_PORT, "RETURN", "dst", "udp"),
    (NODE_PORT_UDP, "nat", NODE_PORT, MARK_MASQ, "dst", "udp"),
    (NODE_PORT_LOCAL_SCTP, "nat", NODE_PORT, "RETURN", "dst,dst", "sctp"),
    (NODE_PORT_SCTP, "nat", NODE_PORT, MARK_MASQ, "dst,dst", "sctp"),
    (LOAD_BALANCER_FW, "filter", PROXY_FIREWALL, SOURCE_RANGES_FIREWALL, "dst,dst", ""),
    (LOAD_BALANCER_SOURCE_CIDR, "filter", SOURCE_RANGES_FIREWALL, "RETURN", "dst,dst,src", ""),
    (LOAD_BALANCER_SOURCE_IP, "filter", SOURCE_RANGES_FIREWALL, "RETURN", "dst,dst,src", ""),
)

# kubelet (docs/kube-proxy-names.md#the-kubelets-chains)
KUBELET_HINT = "KUBE-IPTABLES-HINT"
KUBELET_CANARY = "KUBE-KUBELET-CANARY"
KUBELET_FIREWALL = "KUBE-FIREWALL"
KUBELET_MARTIAN_RULE = (
    '-m comment --comment "block incoming localnet connections" --dst 127.0.0.0/8 '
    "! --src 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
)

# Old ipvs releases (docs/older-releases.md); kubelet's default drop bit 15.
OLD_NAT_FIREWALL = "KUBE-FIREWALL"
OLD_MARK_DROP = "KUBE-MARK-DROP"
OLD_DROP_MARK = "0x8000"

# --- kube-proxy iptables mode (pkg/proxy/iptables/proxier.go, v1.30.3) ----------------------
NODEPORTS = "KUBE-NODEPORTS"
EXTERNAL_SERVICES = "KUBE-EXTERNAL-SERVICES"
PROXY_CANARY = "KUBE-PROXY-CANARY"
# The chains it declares (and so flushes) on every sync, by table; the canary is ensured apart.
IPTABLES_MODE_CHAINS: dict[str, tuple[str, ...]] = {
    "nat": (SERVICES, NODEPORTS, POSTROUTING, MARK_MASQ),
    "filter": (SERVICES, EXTERNAL_SERVICES, FORWARD, NODEPORTS, PROXY_FIREWALL),
}
CANARY_TABLES = ("mangle", "nat", "filter")
IPTABLES_MODE_PREFIXES = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-")
# iptablesJumpChains, in kube-proxy's order: (table, built-in, target, comment, extra match)
_NEW = "-m conntrack --ctstate NEW "
IPTABLES_MODE_JUMPS: tuple[tuple[str, str, str, str, str], ...] = (
    ("filter", "INPUT", EXTERNAL_SERVICES, "kubernetes externally-visible service portals", _NEW),
    ("filter", "FORWARD", EXTERNAL_SERVICES, "kubernetes externally-visible service portals", _NEW),
    ("filter", "INPUT", NODEPORTS, "kubernetes health check service ports", ""),
    ("filter", "FORWARD", SERVICES, "kubernetes service portals", _NEW),
    ("filter", "OUTPUT", SERVICES, "kubernetes service portals", _NEW),
    ("filter", "FORWARD", FORWARD, "kubernetes forwarding rules", ""),
    ("filter", "INPUT", PROXY_FIREWALL, "kubernetes load balancer firewall", _NEW),
    ("filter", "OUTPUT", PROXY_FIREWALL, "kubernetes load balancer firewall", _NEW),
    ("filter", "FORWARD", PROXY_FIREWALL, "kubernetes load balancer firewall", _NEW),
    ("nat", "OUTPUT", SERVICES, "kubernetes service portals", ""),
    ("nat", "PREROUTING", SERVICES, "kubernetes service portals", ""),
    ("nat", "POSTROUTING", POSTROUTING, "kubernetes postrouting rules", ""),
)

# Older releases (docs/older-releases.md): the first ipset-based ipvs releases' sets, which
# never had a KUBE-6- name, and the 1.9-1.10 FORWARD -> KUBE-FORWARD comment.
PRE_KUBE6_SETS: tuple[SetInfo, ...] = (
    SetInfo("KUBE-SERVICE-ACCESS", "hash:ip,port", ""),
    SetInfo("KUBE-MASQ-ALL", "hash:ip,port", ""),
    SetInfo("KUBE-CLUSTER-CIDR", "hash:net", ""),
    SetInfo("KUBE-LOAD-BALANCER-MASQ", "hash:ip,port", ""),
    SetInfo("KUBE-LB-INGRESS-LOCAL", "hash:ip,port", ""),
)
OLD_FORWARD_JUMP = ("filter", "FORWARD", FORWARD, "kubernetes forward rules")
