"""The Service mix and the third-party state of every real-kube-proxy node."""

from __future__ import annotations

from tests.fake_apiserver import Cluster, Endpoint, Node, Port, Service
from tests.realkp.node import LISTEN_PORT, NodeNet

LOCAL_V4 = "10.244.0.10"  # a pod on this node: an address on lo, the listener answers
LOCAL_V6 = "fd00:244::10"
REMOTE_V4 = "10.244.1.5"  # a pod on another node, behind the veth peer
REMOTE_V6 = "fd00:244:0:1::5"

# The traffic checks: ClusterIP and NodePort of `web`, whose endpoint is the local listener.
WEB_CLUSTER_IP = "10.96.1.1"
WEB_CLUSTER_IP_V6 = "fd00:96::101"  # on an IPv6-only node
WEB_NODE_PORT = 30080


def web_cluster_ip(net: NodeNet) -> str:
    return WEB_CLUSTER_IP if net.ipv4 else WEB_CLUSTER_IP_V6


def services_v6_only(net: NodeNet) -> list[Service]:
    """A single-stack IPv6 cluster's mix: the same kinds of Service, IPv6 addresses only."""
    node = net.name
    local = (Endpoint(LOCAL_V6, node),)
    both = (Endpoint(LOCAL_V6, node), Endpoint(REMOTE_V6, "node-other"))
    web = Port(80, "TCP", target_port=LISTEN_PORT, node_port=WEB_NODE_PORT, name="http")
    return [
        Service(
            "kubernetes",
            ("fd00:96::1",),
            (Port(443, target_port=6443, name="https"),),
            endpoints=(Endpoint(net.v6_peer),),
        ),
        Service(
            "kube-dns",
            ("fd00:96::a",),
            (Port(53, "UDP", name="dns"), Port(53, "TCP", name="dns-tcp")),
            endpoints=both,
        ),
        Service("web", (WEB_CLUSTER_IP_V6,), (web,), type="NodePort", endpoints=local),
        Service(
            "syslog",
            ("fd00:96::102",),
            (Port(514, "UDP", node_port=30514, name="syslog"),),
            type="NodePort",
            endpoints=both,
        ),
        Service(
            "ext-on-node",
            ("fd00:96::104",),
            (Port(8443, target_port=LISTEN_PORT),),
            external_ips=(net.v6,),
            endpoints=local,
        ),
        Service(
            "lb-local",
            ("fd00:96::106",),
            (Port(80, target_port=LISTEN_PORT, node_port=30081),),
            type="LoadBalancer",
            lb_ingress=("2001:db8::11",),
            external_traffic_policy="Local",
            health_check_node_port=32000,
            endpoints=both,
        ),
        Service(
            "sticky",
            ("fd00:96::107",),
            (Port(80, target_port=LISTEN_PORT),),
            session_affinity="ClientIP",
            endpoints=both,
        ),
    ]


def services(net: NodeNet, sctp: bool) -> list[Service]:
    if not net.ipv4:
        return services_v6_only(net)
    node = net.name
    local = (Endpoint(LOCAL_V4, node),)
    both = (Endpoint(LOCAL_V4, node), Endpoint(REMOTE_V4, "node-other"))
    web = Port(80, "TCP", target_port=LISTEN_PORT, node_port=WEB_NODE_PORT, name="http")
    mix = [
        # the API server: a remote endpoint (the fake API server itself, behind the peer)
        Service(
            "kubernetes",
            ("10.96.0.1",),
            (Port(443, target_port=6443, name="https"),),
            endpoints=(Endpoint(net.v4_peer),),
        ),
        Service(
            "kube-dns",
            ("10.96.0.10",),
            (Port(53, "UDP", name="dns"), Port(53, "TCP", name="dns-tcp")),
            endpoints=both,
        ),
        Service("web", (WEB_CLUSTER_IP,), (web,), type="NodePort", endpoints=local),
        Service(
            "syslog",
            ("10.96.1.2",),
            (Port(514, "UDP", node_port=30514, name="syslog"),),
            type="NodePort",
            endpoints=both,
        ),
        Service(
            "ext-off-node",
            ("10.96.1.3",),
            (Port(80, target_port=LISTEN_PORT),),
            external_ips=("198.51.100.10",),
            endpoints=both,
        ),
        Service(
            "ext-on-node",
            ("10.96.1.4",),
            (Port(8443, target_port=LISTEN_PORT),),
            external_ips=(net.v4,),
            endpoints=local,
        ),
        Service(
            "lb",
            ("10.96.1.5",),
            (Port(443, target_port=LISTEN_PORT, node_port=30443),),
            type="LoadBalancer",
            lb_ingress=("203.0.113.10",),
            lb_source_ranges=("10.0.0.0/8", "192.168.0.0/16"),
            endpoints=both,
        ),
        Service(
            "lb-local",
            ("10.96.1.6",),
            (Port(80, target_port=LISTEN_PORT, node_port=30081),),
            type="LoadBalancer",
            lb_ingress=("203.0.113.11",),
            external_traffic_policy="Local",
            health_check_node_port=32000,
            endpoints=both,
        ),
        Service(
            "lb-on-node",
            ("10.96.1.9",),
            (Port(9443, target_port=LISTEN_PORT, node_port=30444),),
            type="LoadBalancer",
            lb_ingress=(net.v4,),
            endpoints=local,
        ),
        Service(
            "sticky",
            ("10.96.1.7",),
            (Port(80, target_port=LISTEN_PORT),),
            session_affinity="ClientIP",
            endpoints=both,
        ),
    ]
    if net.dual_stack:
        mix.append(
            Service(
                "dual",
                ("10.96.1.8", "fd00:96::8"),
                (Port(80, target_port=LISTEN_PORT),),
                endpoints=(*both, Endpoint(LOCAL_V6, node), Endpoint(REMOTE_V6, "node-other")),
            )
        )
        mix.append(
            Service(
                "v6-only",
                ("fd00:96::c",),
                (Port(8080, target_port=LISTEN_PORT, node_port=30082),),
                type="NodePort",
                endpoints=(Endpoint(LOCAL_V6, node),),
            )
        )
    if sctp:
        mix.append(
            Service("sctp", ("10.96.1.10",), (Port(9000, "SCTP", name="sctp"),), endpoints=both)
        )
    return mix


def cluster(net: NodeNet, sctp: bool) -> Cluster:
    pod_cidrs = ("10.244.0.0/24", "fd00:244::/64") if net.dual_stack else ("10.244.0.0/24",)
    pod_cidrs = pod_cidrs if net.ipv4 else ("fd00:244::/64",)
    return Cluster(Node(net.name, net.node_ips, pod_cidrs), services(net, sctp))


def keepalived_vip(net: NodeNet) -> str:
    return f"192.168.{60 + net.index}.100" if net.ipv4 else f"fd00:{60 + net.index}::100"


def third_party_before(net: NodeNet) -> dict[str, str]:
    """State present before kube-proxy ever ran: command -> stdin, applied in order."""
    vip = keepalived_vip(net)
    if net.ipv4:
        ipvs = f"-A -t {vip}:80 -s wlc\n-a -t {vip}:80 -r {net.v4_peer}:80 -m -w 1\n"
    else:
        ipvs = f"-A -t [{vip}]:80 -s wlc\n-a -t [{vip}]:80 -r [{net.v6_peer}]:80 -m -w 1\n"
    ipset = "create user-allow hash:ip family inet\nadd user-allow 192.0.2.1\n"
    nft = (
        "table inet user-fw {\n"
        " chain input {\n  type filter hook input priority 10; policy accept;\n"
        "  ip saddr 192.0.2.0/24 counter accept\n }\n}\n"
    )
    # Docker- and kubelet-like chains, per family (iptables-restore --noflush).
    v4 = (
        "*filter\n:DOCKER - [0:0]\n:DOCKER-USER - [0:0]\n:KUBE-FIREWALL - [0:0]\n"
        ":KUBE-KUBELET-CANARY - [0:0]\n"
        "-A FORWARD -j DOCKER-USER\n-A DOCKER-USER -j RETURN\n"
        "-A INPUT -j KUBE-FIREWALL\n-A OUTPUT -j KUBE-FIREWALL\n"
        '-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming '
        'localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n'
        "COMMIT\n"
        "*nat\n:DOCKER - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n:CNI-HOSTPORT-DNAT - [0:0]\n"
        "-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n"
        "-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n"
        "-A DOCKER -i docker0 -j RETURN\n"
        "COMMIT\n"
        "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
    )
    v6 = (
        "*filter\n:DOCKER-USER - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n"
        "-A FORWARD -j DOCKER-USER\n-A DOCKER-USER -j RETURN\nCOMMIT\n"
        "*nat\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
        "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
    )
    b = net.backend
    out = {
        "ipvsadm -R": ipvs,
        "ipset restore -exist": ipset,
        "nft -f -": nft,
        f"iptables-{b}-restore --noflush": v4,
    }
    if net.has_v6:
        out[f"ip6tables-{b}-restore --noflush"] = v6
    return out


def cni_hostport_rule(net: NodeNet) -> dict[str, str]:
    """A CNI hostport chain that jumps to KUBE-MARK-MASQ, added once kube-proxy made it (as a
    CNI does when a hostPort pod starts on an ipvs-mode node)."""
    v4 = (
        "*nat\n:CNI-DN-1234 - [0:0]\n"
        f'-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: cbr0" '
        f"-m multiport --dports 8081 -j CNI-DN-1234\n"
        f"-A CNI-DN-1234 -s 10.244.0.0/24 -p tcp --dport 8081 -j KUBE-MARK-MASQ\n"
        f"-A CNI-DN-1234 -p tcp --dport 8081 -j DNAT --to-destination {LOCAL_V4}:{LISTEN_PORT}\n"
        "COMMIT\n"
    )
    return {f"iptables-{net.backend}-restore --noflush": v4}
