"""Names kube-proxy and the kubelet use, from their upstream source:
https://github.com/kubernetes/kubernetes/tree/v1.30.3/pkg/proxy (`ipvs/`, `iptables/`,
`nftables/`); older releases: docs/older-releases.md.

Each name is written once, here; the classifier and every view use these constants.
"""

from __future__ import annotations

IPSET_NAME_MAX = 31
# Every kube-proxy iptables chain and ipset name starts with KUBE-; IPv6 sets with KUBE-6-.
KUBE_PREFIX = "KUBE-"
KUBE6_PREFIX = "KUBE-6-"

# kube-proxy's two servers on the node (docs/kube-proxy-names.md#kube-proxys-endpoints-and-metrics)
KUBE_PROXY_METRICS_URL = "http://127.0.0.1:10249"
KUBE_PROXY_HEALTHZ_URL = "http://127.0.0.1:10256/healthz"
# kube-proxy's spelling of an IP family (core/v1 IPFamily): its /healthz "status" keys and its
# sync metric's ip_family label. The readers convert it to the model's family (snapshot.Family).
KUBE_PROXY_IP_FAMILIES = {"IPv4": "ipv4", "IPv6": "ipv6"}
# The kubelet's default grace period (k8s.io/api core/v1 types.go,
# DefaultTerminationGracePeriodSeconds): the seconds a removed Pod is given to finish its
# connections. `cleanup --apply` gives the live connections of the Services ipvs mode left the
# same before it refuses (--drain-timeout, docs/contract.md#live-connections).
DEFAULT_TERMINATION_GRACE_SECONDS = 30
# kube-proxy's program name, and hyperkube's subcommands that run it
KUBE_PROXY_PROGRAM = "kube-proxy"
HYPERKUBE = ("hyperkube", ("kube-proxy", "proxy"))

# docs/kube-proxy-names.md#ipsets: kube-proxy's ipsetInfo, name -> set type.
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
# docs/older-releases.md: names of older releases, which current kube-proxy never destroys.
# The SCTP node-port sets were bitmap:port before the -HASH variants replaced them.
OLD_IPVS_SETS_V4: dict[str, tuple[str, ...]] = {
    "KUBE-NODE-PORT-SCTP": ("bitmap:port", "hash:ip,port"),
    "KUBE-NODE-PORT-LOCAL-SCTP": ("bitmap:port", "hash:ip,port"),
}
# Sets of the first ipset-based ipvs releases (1.9-1.10; evidence in docs/older-releases.md).
# They predate the KUBE-6- prefix, so they never had an IPv6 name of their own: an IPv6-only
# node of that era made them with `family inet6` under the same name.
PRE_KUBE6_SETS: dict[str, tuple[str, ...]] = {
    "KUBE-SERVICE-ACCESS": ("hash:ip,port",),
    "KUBE-MASQ-ALL": ("hash:ip,port",),
    # "the destination ip set": its type is not in any source found; both plausible ones
    "KUBE-CLUSTER-CIDR": ("hash:ip,port", "hash:net"),
    "KUBE-LOAD-BALANCER-MASQ": ("hash:ip,port",),
    "KUBE-LB-INGRESS-LOCAL": ("hash:ip,port",),
}


def ipv6_set_name(name: str) -> str:
    """kube-proxy's NewIPSet(): KUBE- becomes KUBE-6-, cut to 31 characters."""
    return name.replace(KUBE_PREFIX, KUBE6_PREFIX, 1)[:IPSET_NAME_MAX]


# name -> (accepted set types, family 4/6, from an older release)
IPVS_SETS: dict[str, tuple[tuple[str, ...], int, bool]] = {}
for _name, _type in IPVS_SETS_V4.items():
    IPVS_SETS[_name] = ((_type,), 4, False)
    IPVS_SETS[ipv6_set_name(_name)] = ((_type,), 6, False)
for _name, _types in OLD_IPVS_SETS_V4.items():
    IPVS_SETS[_name] = (_types, 4, True)
    IPVS_SETS[ipv6_set_name(_name)] = (_types, 6, True)
for _name, _types in PRE_KUBE6_SETS.items():
    IPVS_SETS[_name] = (_types, 4, True)
# Before the KUBE-6- prefix (dual-stack ipvs, PR #80627, 2019) an IPv6-only node's sets carried
# the plain KUBE- names with `family inet6` (PR #68436, 2018): every hash set of every list
# above may therefore also be IPv6 under its plain name. bitmap:port sets have no family.
PLAIN_NAME_IPV6_OK = frozenset(
    n for n, (types, family, _) in IPVS_SETS.items() if family == 4 and "bitmap:port" not in types
)

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
) | frozenset(  # 1.9-1.10 sets of Service `IP,proto:port` (plain names in either family)
    {"KUBE-SERVICE-ACCESS", "KUBE-MASQ-ALL", "KUBE-LOAD-BALANCER-MASQ", "KUBE-LB-INGRESS-LOCAL"}
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

# The 11 chains of the current ipvs proxier, by table
# (docs/kube-proxy-names.md#ipvs-modes-iptables-chains-and-jumps).
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
# Chains of older ipvs releases that current kube-proxy no longer cleans.
OLD_IPVS_CHAINS: dict[str, frozenset[str]] = {
    "nat": frozenset({"KUBE-FIREWALL", "KUBE-FIRE-WALL", "KUBE-SVC-IPSETS"}),
}
# nat KUBE-MARK-DROP was created by pre-1.28 kubelets *and* old ipvs kube-proxy; with two
# possible owners it is reported and never touched.
AMBIGUOUS_CHAINS: dict[str, frozenset[str]] = {"nat": frozenset({"KUBE-MARK-DROP"})}

# Chains kube-proxy's modes and the kubelet's masquerade rely on by name.
MARK_MASQ_CHAIN = "KUBE-MARK-MASQ"
POSTROUTING_CHAIN = "KUBE-POSTROUTING"
FORWARD_CHAIN = "KUBE-FORWARD"

# kube-proxy's ipvs-mode jumps from built-in chains: (table, chain, target) -> comment.
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

# --- iptables mode (class iptables-leftover, docs/contract.md#ownership) --------------------------
# pkg/proxy/iptables/proxier.go (v1.30.3): the chains it makes, by table. KUBE-SERVICES,
# KUBE-POSTROUTING, KUBE-MARK-MASQ, KUBE-FORWARD and KUBE-PROXY-FIREWALL share their name (and
# table) with ipvs mode: which mode a shared chain belongs to is decided by its rules
# (classify.py, README "Decisions").
IPTABLES_MODE_CHAINS: dict[str, frozenset[str]] = {
    "nat": frozenset(
        {
            "KUBE-SERVICES",
            "KUBE-NODEPORTS",
            "KUBE-POSTROUTING",
            "KUBE-MARK-MASQ",
            "KUBE-PROXY-CANARY",
        }
    ),
    "filter": frozenset(
        {
            "KUBE-SERVICES",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-FORWARD",
            "KUBE-NODEPORTS",
            "KUBE-PROXY-FIREWALL",
            "KUBE-PROXY-CANARY",
        }
    ),
    # ipt.Monitor(KUBE-PROXY-CANARY, mangle, nat, filter)
    "mangle": frozenset({"KUBE-PROXY-CANARY"}),
}
# Per-service chains (isServiceChainName; KUBE-XLB- is the pre-KUBE-SVL/KUBE-EXT name of the
# externalTrafficPolicy=Local chain, which older CleanupLeftovers still hunted for). nat only.
IPTABLES_MODE_FIREWALL_PREFIX = "KUBE-FW-"
IPTABLES_MODE_PREFIXES: dict[str, tuple[str, ...]] = {
    "nat": (
        "KUBE-SVC-",
        "KUBE-SVL-",
        "KUBE-EXT-",
        IPTABLES_MODE_FIREWALL_PREFIX,
        "KUBE-SEP-",
        "KUBE-XLB-",
    ),
}
# Rules only iptables mode writes into a chain name both modes use: a drop whose comment says
# "... traffic not accepted by KUBE-FW-...", and KUBE-FORWARD's drop of conntrack INVALID.
IPTABLES_MODE_INVALID_DROP = (FORWARD_CHAIN, "--ctstate INVALID")

# iptablesJumpChains (v1.30.3): (table, built-in chain, target) -> comment. Three are
# byte-identical to ipvs mode's; the KUBE-PROXY-FIREWALL jumps differ in comment and ctstate.
_EXTERNAL = "kubernetes externally-visible service portals"
IPTABLES_MODE_JUMPS: dict[tuple[str, str, str], str] = {
    ("filter", "INPUT", "KUBE-EXTERNAL-SERVICES"): _EXTERNAL,
    ("filter", "FORWARD", "KUBE-EXTERNAL-SERVICES"): _EXTERNAL,
    ("filter", "INPUT", "KUBE-NODEPORTS"): "kubernetes health check service ports",
    ("filter", "FORWARD", "KUBE-SERVICES"): "kubernetes service portals",
    ("filter", "OUTPUT", "KUBE-SERVICES"): "kubernetes service portals",
    ("filter", "FORWARD", "KUBE-FORWARD"): "kubernetes forwarding rules",
    ("filter", "INPUT", "KUBE-PROXY-FIREWALL"): "kubernetes load balancer firewall",
    ("filter", "OUTPUT", "KUBE-PROXY-FIREWALL"): "kubernetes load balancer firewall",
    ("filter", "FORWARD", "KUBE-PROXY-FIREWALL"): "kubernetes load balancer firewall",
    ("nat", "OUTPUT", "KUBE-SERVICES"): "kubernetes service portals",
    ("nat", "PREROUTING", "KUBE-SERVICES"): "kubernetes service portals",
    ("nat", "POSTROUTING", "KUBE-POSTROUTING"): "kubernetes postrouting rules",
}
# Jumps of older releases (docs/older-releases.md): the 1.9-1.10 FORWARD -> KUBE-FORWARD jump
# (PR #52569 for iptables mode, PR #62007 for ipvs mode) said "kubernetes forward rules", and
# iptables mode once jumped to filter KUBE-SERVICES from INPUT.
OLD_JUMPS: dict[tuple[str, str, str], str] = {
    ("filter", "FORWARD", "KUBE-FORWARD"): "kubernetes forward rules",
    ("filter", "INPUT", "KUBE-SERVICES"): "kubernetes service portals",
}


def _jump_comments() -> dict[tuple[str, str, str], frozenset[str]]:
    out: dict[tuple[str, str, str], set[str]] = {}
    for table in (IPVS_JUMPS, IPTABLES_MODE_JUMPS, OLD_JUMPS):
        for key, comment in table.items():
            out.setdefault(key, set()).add(comment)
    return {key: frozenset(comments) for key, comments in out.items()}


# Every jump any kube-proxy release or mode writes from a built-in chain: key -> comments.
KUBE_PROXY_JUMPS = _jump_comments()

# The kubelet's chains, (table, chain); never touched, in any backend or family
# (docs/kube-proxy-names.md#the-kubelets-chains).
KUBELET_CHAINS = frozenset(
    {
        ("mangle", "KUBE-IPTABLES-HINT"),
        ("mangle", "KUBE-KUBELET-CANARY"),
        ("nat", "KUBE-KUBELET-CANARY"),
        ("filter", "KUBE-KUBELET-CANARY"),
        ("filter", "KUBE-FIREWALL"),
    }
)

# docs/kube-proxy-names.md#kube-ipvs0-the-probe-service-sysctls
KUBE_IPVS0 = "kube-ipvs0"
PROBE_SERVICE = ("TCP", "198.51.100.0", 20000)  # CanUseIPVSProxier's probe virtual server
# What strictARP (--ipvs-strict-arp) sets; reported, and reset only on request.
ARP_SYSCTLS = {"net.ipv4.conf.all.arp_ignore": "1", "net.ipv4.conf.all.arp_announce": "2"}
# Every sysctl ipvs mode's NewProxier sets (pkg/proxy/ipvs/proxier.go, v1.37.2 lines 258-303,
# v1.34.4 283-328; docs/contract.md#sysctls): name -> (the value it sets, the kernel's default,
# the upstream constant and condition). conn_reuse_mode only on kernels 4.1 to 5.8 (left as
# is from 5.9, IPVSConnReuseModeFixedKernelVersion); the ARP pair only with strictARP.
IPVS_MODE_SYSCTLS = {
    "net.ipv4.vs.conntrack": ("1", "0", "sysctlVSConnTrack"),
    "net.ipv4.vs.conn_reuse_mode": ("0", "1", "sysctlConnReuse, kernels before 5.9"),
    "net.ipv4.vs.expire_nodest_conn": ("1", "0", "sysctlExpireNoDestConn"),
    "net.ipv4.vs.expire_quiescent_template": ("1", "0", "sysctlExpireQuiescentTemplate"),
    "net.ipv4.ip_forward": ("1", "0", "sysctlForward"),
    "net.ipv4.conf.all.arp_ignore": ("1", "0", "sysctlArpIgnore, with strictARP"),
    "net.ipv4.conf.all.arp_announce": ("2", "0", "sysctlArpAnnounce, with strictARP"),
}

# docs/kube-proxy-names.md#nftables-mode: kube-proxy's nftables-mode tables.
NFTABLES_TABLE = "kube-proxy"
NFTABLES_MODE_TABLES = frozenset({("ip", NFTABLES_TABLE), ("ip6", NFTABLES_TABLE)})
# The oldest kernel kube-proxy's nftables mode runs on (NFTablesKubeProxyKernelVersion).
NFTABLES_MIN_KERNEL = (5, 13)
# The chains the gate requires in such a table (docs/contract.md#the-cleanup-gate): an empty
# `ip kube-proxy` table, or one someone else made, does not count. kube-proxy's setupNFTables
# creates them with the table, in one transaction, on every sync, in every release from 1.29 to 1.37
# (pkg/proxy/nftables/proxier.go: servicesChain, masqueradingChain). Not mark-for-masquerade:
# 1.36 inlined it into masquerading (real v1.37.2, tests/data/kube-proxy-v1.37.2/README.md).
# Nor the base chains: 1.34 renamed filter-prerouting/filter-output's pre-DNAT chains.
# `masquerading` tests the masquerade bit and ends in `masquerade`: how the cleanup tells that
# nftables mode masquerades the mark a kept KUBE-MARK-MASQ sets.
MASQUERADING_CHAIN = "masquerading"
NFTABLES_MODE_CHAINS = ("services", MASQUERADING_CHAIN)
# Its service dispatch maps (pkg/proxy/nftables/proxier.go, every release 1.34-1.37:
# serviceIPsMap, noEndpointServicesMap `ipvX_addr . inet_proto . inet_service : verdict`;
# serviceNodePortsMap, noEndpointNodePortsMap `inet_proto . inet_service : verdict`): each
# Service IP and port, each NodePort, that nftables mode serves (docs/contract.md#ownership).
NFTABLES_SERVICE_MAPS = ("service-ips", "no-endpoint-services")
NFTABLES_NODE_PORT_MAPS = ("service-nodeports", "no-endpoint-nodeports")
# inet_proto numbers as IPVS names the protocols
INET_PROTOCOLS = {6: "TCP", 17: "UDP", 132: "SCTP"}
# kube-proxy's /metrics: the feature gate that allows ipvs mode, from v1.37 (deprecated).
FEATURE_ENABLED_SERIES = "kubernetes_feature_enabled"
IPVS_FEATURE_GATE = "KubeProxyIPVS"
# Tables iptables-nft creates; their chains are read (and classified) as iptables chains.
IPTABLES_NFT_TABLES = frozenset(
    (fam, t) for fam in ("ip", "ip6") for t in ("nat", "filter", "mangle", "raw", "security")
)
