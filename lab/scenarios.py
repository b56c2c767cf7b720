"""Ready-made nodes: a varied realistic cluster view and a large one for benchmarks."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lab.model import Family, Node, Port, Service

NODE_V4 = "192.168.50.10/24"
NODE_V6 = "fd00:50::10/64"
CONTROL_PLANE = "192.168.50.2"


def _v4_pod(i: int, local: bool) -> str:
    # 10.244.0.0/24 is this node's pod range; 10.244.1-2.x live on other nodes.
    return f"10.244.0.{i + 2}" if local else f"10.244.{1 + i % 2}.{i + 2}"


def _v6_pod(i: int, local: bool) -> str:
    return f"fd00:10:244::{i + 2:x}" if local else f"fd00:10:244::{1 + i % 2}:{i + 2:x}"


def _pods(first: int, count: int, dual: bool, n_local: int = 1) -> tuple[str, ...]:
    eps = [_v4_pod(first + k, k < n_local) for k in range(count)]
    if dual:
        eps += [_v6_pod(first + k, k < n_local) for k in range(count)]
    return tuple(eps)


def _cips(v4_host: int, dual: bool) -> tuple[str, ...]:
    v4 = f"10.96.{v4_host // 256}.{v4_host % 256}"
    return (v4, f"fd00:10:96::{v4_host:x}") if dual else (v4,)


def realistic_node(n_services: int = 12, dual_stack: bool = False, **kw: Any) -> Node:
    """A node's view of a small but varied cluster; extra keywords go to Node."""
    d = dual_stack
    fixed = [
        # Single-stack even on dual-stack clusters: the apiserver advertises one address.
        Service(
            "default",
            "kubernetes",
            "ClusterIP",
            ("10.96.0.1",),
            (Port("https", "TCP", 443, target_port=6443),),
            endpoints=(CONTROL_PLANE,),
        ),
        Service(
            "kube-system",
            "kube-dns",
            "ClusterIP",
            _cips(10, d),
            (Port("dns", "UDP", 53), Port("dns-tcp", "TCP", 53), Port("metrics", "TCP", 9153)),
            endpoints=_pods(0, 2, d),
        ),
        Service(
            "default",
            "web",
            "NodePort",
            _cips(1024 + 20, d),
            (Port("http", "TCP", 80, node_port=30080),),
            endpoints=_pods(10, 3, d, 2),
        ),
        Service(
            "ingress-nginx",
            "ingress-nginx-controller",
            "LoadBalancer",
            _cips(1024 + 30, d),
            (Port("http", "TCP", 80, node_port=31080), Port("https", "TCP", 443, node_port=31443)),
            lb_ips=("203.0.113.10",) + (("2001:db8:203::10",) if d else ()),
            source_ranges=("198.51.100.0/24",) + (("2001:db8:198::/48",) if d else ()),
            endpoints=_pods(20, 2, d),
        ),
        Service(
            "default",
            "legacy-app",
            "ClusterIP",
            _cips(1024 + 40, False),
            (Port("http", "TCP", 8080),),
            external_ips=("192.168.50.200",),
            endpoints=_pods(30, 2, False),
        ),
        Service(
            "edge",
            "edge-gateway",
            "LoadBalancer",
            _cips(1024 + 50, d),
            (Port("https", "TCP", 443, node_port=30443),),
            lb_ips=("203.0.113.11",),
            endpoints=_pods(40, 2, d),
            local=True,
            health_check_node_port=32100,
        ),
        Service(
            "logging",
            "syslog",
            "NodePort",
            _cips(1024 + 60, False),
            (Port("syslog", "UDP", 514, node_port=30514),),
            endpoints=_pods(50, 2, False),
        ),
        Service(
            "monitoring",
            "prometheus",
            "ClusterIP",
            _cips(1024 + 70, d),
            (Port("web", "TCP", 9090),),
            endpoints=_pods(60, 1, d),
        ),
        # A Service whose pods are not ready: no real servers, still a VIP.
        Service(
            "default", "batch-results", "ClusterIP", _cips(1024 + 80, False), (Port("", "TCP", 80),)
        ),
    ]
    services = fixed[:n_services]
    for i in range(len(services), n_services):
        services.append(
            Service(
                f"team-{i % 4}",
                f"app-{i}",
                "ClusterIP",
                _cips(2048 + i, d),
                (Port("http", "TCP", 8080),),
                endpoints=_pods(100 + 3 * i, 2, d),
            )
        )
    node_ips = (NODE_V4, NODE_V6) if d else (NODE_V4,)
    families: tuple[Family, ...] = ("ipv4", "ipv6") if d else ("ipv4",)
    base = Node(services=tuple(services), node_ips=node_ips, families=families)
    return replace(base, **kw)


def scaled_node(n: int, **kw: Any) -> Node:
    """n IPv4 ClusterIP services with 3 endpoints each; every 10th is a NodePort."""
    services = []
    for i in range(n):
        eps = []
        for k in range(3):
            idx = 3 * i + k
            eps.append(f"10.244.{(idx // 254) % 256}.{idx % 254 + 1}")
        np = 30000 + (i // 10) % 2768 if i % 10 == 0 else None
        services.append(
            Service(
                f"bench-{i % 16}",
                f"svc-{i}",
                "NodePort" if np else "ClusterIP",
                (f"10.96.{(i + 256) // 256 % 256}.{(i + 256) % 256}",),
                (Port("http", "TCP", 80, node_port=np),),
                endpoints=tuple(eps),
            )
        )
    return replace(Node(services=tuple(services)), **kw)
