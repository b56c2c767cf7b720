"""Names kube-proxy and the kubelet use, from shared/reference/kube-proxy-state.md.

Each name is written once, here; the classifier and every view use these constants.
"""

from __future__ import annotations

IPSET_NAME_MAX = 31

# §1.1: kube-proxy's ipsetInfo, name -> set type.
IPVS_SETS_V4: dict[str, str] = {
    "KUBE-LOOP-BACK": "hash:ip,port,ip",
    "KUBE-CLUSTER-IP": "hash:ip,port",
    "KUBE-EXTERNAL-IP": "hash:ip,port",
    "KUBE-EXTERNAL-IP-LOCAL": "hash:ip,port",
    "KUBE-LOAD-BALANCER": "hash:ip,port",
    "KUBE-LOAD-BALANCER-FW": "hash:ip,port",
    "KUBE-LOAD-BALANCER-LOCAL": "hash:ip,port",
    "KUBE-LOAD-BALANCER-SOURCE-IP": "hash:ip,port,ip",
    "KUBE-LOAD-BALANCER-SOURCE-CIDR": "hash:ip,port,net",
    "KUBE-NODE-PORT-TCP": "bitmap:port",
    "KUBE-NODE-PORT-LOCAL-TCP": "bitmap:port",
    "KUBE-NODE-PORT-UDP": "bitmap:port",
    "KUBE-NODE-PORT-LOCAL-UDP": "bitmap:port",
    "KUBE-NODE-PORT-SCTP-HASH": "hash:ip,port",
    "KUBE-NODE-PORT-LOCAL-SCTP-HASH": "hash:ip,port",
    "KUBE-HEALTH-CHECK-NODE-PORT": "bitmap:port",
    "KUBE-IPVS-IPS": "hash:ip",
}
# §1.3: names of older releases, which current kube-proxy never destroys. The SCTP node-port
# sets were bitmap:port before the -HASH variants replaced them.
OLD_IPVS_SETS_V4: dict[str, tuple[str, ...]] = {
    "KUBE-NODE-PORT-SCTP": ("bitmap:port", "hash:ip,port"),
    "KUBE-NODE-PORT-LOCAL-SCTP": ("bitmap:port", "hash:ip,port"),
}


def ipv6_set_name(name: str) -> str:
    """kube-proxy's NewIPSet(): KUBE- becomes KUBE-6-, cut to 31 characters."""
    return name.replace("KUBE-", "KUBE-6-", 1)[:IPSET_NAME_MAX]


# name -> (accepted set types, family 4/6, from an older release)
IPVS_SETS: dict[str, tuple[tuple[str, ...], int, bool]] = {}
for _name, _type in IPVS_SETS_V4.items():
    IPVS_SETS[_name] = ((_type,), 4, False)
    IPVS_SETS[ipv6_set_name(_name)] = ((_type,), 6, False)
for _name, _types in OLD_IPVS_SETS_V4.items():
    IPVS_SETS[_name] = (_types, 4, True)
    IPVS_SETS[ipv6_set_name(_name)] = (_types, 6, True)

# Sets whose members are `IP,proto:port` of a virtual server (evidence for IPVS ownership).
VIP_PORT_SETS = frozenset(
    n
    for base in (
        "KUBE-CLUSTER-IP",
        "KUBE-EXTERNAL-IP",
        "KUBE-EXTERNAL-IP-LOCAL",
        "KUBE-LOAD-BALANCER",
        "KUBE-LOAD-BALANCER-LOCAL",
        "KUBE-LOAD-BALANCER-FW",
        "KUBE-NODE-PORT-SCTP-HASH",
        "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    )
    for n in (base, ipv6_set_name(base))
)
# bitmap:port sets of NodePorts, by protocol (older SCTP bitmap sets included).
NODE_PORT_SETS: dict[str, frozenset[str]] = {
    proto: frozenset(n for base in bases for n in (base, ipv6_set_name(base)))
    for proto, bases in {
        "TCP": ("KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP"),
        "UDP": ("KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP"),
        "SCTP": ("KUBE-NODE-PORT-SCTP", "KUBE-NODE-PORT-LOCAL-SCTP"),
    }.items()
}

# §2.1: the 11 chains of the current ipvs proxier, by table.
IPVS_CHAINS: dict[str, frozenset[str]] = {
    "nat": frozenset(
        {
            "KUBE-SERVICES",
            "KUBE-POSTROUTING",
            "KUBE-NODE-PORT",
            "KUBE-LOAD-BALANCER",
            "KUBE-MARK-MASQ",
        }
    ),
    "filter": frozenset(
        {
            "KUBE-FORWARD",
            "KUBE-NODE-PORT",
            "KUBE-PROXY-FIREWALL",
            "KUBE-SOURCE-RANGES-FIREWALL",
            "KUBE-IPVS-FILTER",
            "KUBE-IPVS-OUT-FILTER",
        }
    ),
}
# §2.4: chains of older ipvs releases that current kube-proxy no longer cleans.
OLD_IPVS_CHAINS: dict[str, frozenset[str]] = {
    "nat": frozenset({"KUBE-FIREWALL", "KUBE-FIRE-WALL", "KUBE-SVC-IPSETS"}),
}
# §3: nat KUBE-MARK-DROP was created by pre-1.28 kubelets *and* old ipvs kube-proxy; with two
# possible owners it is reported and never touched.
AMBIGUOUS_CHAINS: dict[str, frozenset[str]] = {"nat": frozenset({"KUBE-MARK-DROP"})}

# §2.2: kube-proxy's jumps from built-in chains: (table, chain, target) -> comment.
IPVS_JUMPS: dict[tuple[str, str, str], str] = {
    ("nat", "OUTPUT", "KUBE-SERVICES"): "kubernetes service portals",
    ("nat", "PREROUTING", "KUBE-SERVICES"): "kubernetes service portals",
    ("nat", "POSTROUTING", "KUBE-POSTROUTING"): "kubernetes postrouting rules",
    ("filter", "FORWARD", "KUBE-FORWARD"): "kubernetes forwarding rules",
    ("filter", "INPUT", "KUBE-NODE-PORT"): "kubernetes health check rules",
    ("filter", "INPUT", "KUBE-PROXY-FIREWALL"): "kube-proxy firewall rules",
    ("filter", "FORWARD", "KUBE-PROXY-FIREWALL"): "kube-proxy firewall rules",
    ("filter", "INPUT", "KUBE-IPVS-FILTER"): "kubernetes ipvs access filter",
    ("filter", "OUTPUT", "KUBE-IPVS-OUT-FILTER"): "kubernetes ipvs access filter",
}

# §2.2: iptables mode jumps to the same KUBE-PROXY-FIREWALL chain from INPUT, OUTPUT and
# FORWARD with another comment; a node that ran iptables mode before ipvs may carry them.
IPTABLES_MODE_JUMPS: dict[tuple[str, str, str], str] = {
    ("filter", chain, "KUBE-PROXY-FIREWALL"): "kubernetes load balancer firewall"
    for chain in ("INPUT", "OUTPUT", "FORWARD")
}

# §3: the kubelet's chains, (table, chain); never touched, in any backend or family.
KUBELET_CHAINS = frozenset(
    {
        ("mangle", "KUBE-IPTABLES-HINT"),
        ("mangle", "KUBE-KUBELET-CANARY"),
        ("nat", "KUBE-KUBELET-CANARY"),
        ("filter", "KUBE-KUBELET-CANARY"),
        ("filter", "KUBE-FIREWALL"),
    }
)

# §4.1 / §4.2
KUBE_IPVS0 = "kube-ipvs0"
PROBE_SERVICE = ("TCP", "198.51.100.0", 20000)  # CanUseIPVSProxier's probe virtual server

# §5.1: kube-proxy's nftables-mode tables.
NFTABLES_MODE_TABLES = frozenset({("ip", "kube-proxy"), ("ip6", "kube-proxy")})
# Tables iptables-nft creates; their chains are read (and classified) as iptables chains.
IPTABLES_NFT_TABLES = frozenset(
    (fam, t) for fam in ("ip", "ip6") for t in ("nat", "filter", "mangle", "raw", "security")
)
