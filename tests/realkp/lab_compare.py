"""The lab's ipvs-mode node for the real tier's Service mix, for comparison with what real
kube-proxy v1.30.3 wrote (tests/data/kube-proxy-v1.30.3/states/)."""

from __future__ import annotations

from typing import Any

from lab import model, render
from tests import fake_apiserver as api
from tests.realkp import mix
from tests.realkp.node import NodeNet


def lab_node(net: NodeNet, sctp: bool) -> model.Node:
    services = []
    for s in mix.services(net, sctp):
        services.append(
            model.Service(
                s.namespace,
                s.name,
                s.type,  # type: ignore[arg-type]
                s.cluster_ips,
                tuple(
                    model.Port(p.name, p.protocol, p.port, p.node_port, p.target_port)  # type: ignore[arg-type]
                    for p in s.ports
                ),
                external_ips=s.external_ips,
                lb_ips=s.lb_ingress,
                source_ranges=s.lb_source_ranges,
                endpoints=tuple(e.address for e in s.endpoints),
                local=s.external_traffic_policy == "Local",
                health_check_node_port=s.health_check_node_port,
                session_affinity_seconds=10800 if s.session_affinity == "ClientIP" else None,
            )
        )
    ips = (f"{net.v4}/24", f"{net.v6}/64") if net.dual_stack else (f"{net.v4}/24",)
    return model.Node(
        tuple(services),
        node_ips=ips,
        families=net.families,  # type: ignore[arg-type]
        backend=net.backend,  # type: ignore[arg-type]
        with_ipvs=True,
        kubelet=False,
        pod_cidrs=("10.244.0.0/16", "fd00:244::/56"),
        local_pod_cidrs=("10.244.0.0/24", "fd00:244::/64"),
    )


def lab_ipvs(node: model.Node) -> dict[str, list[str]]:
    """The lab's IPVS services, as tests/realkp/state.read_ipvs names them."""
    from tests.realkp.state import _ipvs_name

    out: dict[str, list[str]] = {}
    for line in render.ipvsadm_restore(node).splitlines():
        words = line.split()
        name = _ipvs_name(words)
        if words[0] == "-A":
            out.setdefault(name, [])
        else:
            out.setdefault(name, []).append(line)
    return {k: sorted(v) for k, v in out.items()}


def diff(real: dict[str, Any], lab: dict[str, Any]) -> list[str]:
    """Keys whose values differ, with both sides (for a readable assertion)."""
    out = []
    for key in sorted(set(real) | set(lab)):
        if real.get(key) != lab.get(key):
            out.append(f"{key}:\n  real {real.get(key)!r}\n  lab  {lab.get(key)!r}")
    return out


__all__ = ["api", "diff", "lab_ipvs", "lab_node"]
