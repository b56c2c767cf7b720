"""The lab's ipvs-mode node for the real tier's Service mix, for comparison with what real
kube-proxy wrote (tests/data/kube-proxy-<version>/states/)."""

from __future__ import annotations

import dataclasses
from typing import Any

from lab import model, render
from tests import fake_apiserver as api
from tests.realkp import mix
from tests.realkp.node import NodeNet

NFACCT_MATCH = " -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts"


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
        # kube-proxy runs both families wherever the node has IPv6, IPv4-only node or not
        families=("ipv4", "ipv6") if net.ipv6 else ("ipv4",),
        backend=net.backend,  # type: ignore[arg-type]
        with_ipvs=True,
        kubelet=False,
        # --cluster-cidr as the tier passes it
        pod_cidrs=("10.244.0.0/16", "fd00:244::/56") if net.dual_stack else ("10.244.0.0/16",),
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


def differences(
    net: NodeNet, s0: dict[str, Any], s1: dict[str, Any], sctp: bool, iptables_mode: bool = False
) -> list[str]:
    """What the lab builds for the tier's Service mix against what real ipvs mode wrote
    (`s1`, minus the third-party state `s0`): IPVS, kube-ipvs0, ipsets, iptables chains of the
    node's backend. With `iptables_mode`, `s1` is the node after iptables mode ran over ipvs
    mode's leftovers (scenario C's S5). Builds the lab's node (without IPVS) in a throwaway
    namespace."""
    from lab import build
    from tests.realkp import state as st

    node = dataclasses.replace(lab_node(net, sctp), iptables_mode=iptables_mode)
    out: list[str] = []
    lab_vs = lab_ipvs(node)
    real_vs = {k: v for k, v in s1["ipvs"].items() if k not in s0["ipvs"]}
    if lab_vs != real_vs:
        out.append(f"IPVS real servers differ: real {real_vs} lab {lab_vs}")
    lab_lines = {
        st._ipvs_name(x.split()): x
        for x in render.ipvsadm_restore(node).splitlines()
        if x.startswith("-A")
    }
    real_lines = {k: v for k, v in s1["ipvs_lines"].items() if k not in s0["ipvs"]}
    if lab_lines != real_lines:
        out.append(f"IPVS services differ: real {real_lines} lab {lab_lines}")
    lab_addrs = sorted(
        x.split()[2] for x in render.ip_batch(node).splitlines() if x.startswith("address")
    )
    real_addrs = sorted(a.split()[1] for a in s1["addrs"].get("kube-ipvs0", []))
    if lab_addrs != real_addrs:
        out.append(f"kube-ipvs0 addresses differ: real {real_addrs} lab {lab_addrs}")
    ns = f"rkcmp-{net.index}"
    build.delete_netns(ns)
    build.create_netns(ns)
    try:
        build.build(ns, dataclasses.replace(node, with_ipvs=False, with_kube_ipvs0=False))
        lab_sets = st.read_ipsets(ns)
        lab_ipt = st.read_iptables(ns)
    finally:
        build.delete_netns(ns)
    real_sets = {
        k: [st._INITVAL.sub("", x) for x in v]
        for k, v in s1["ipsets"].items()
        if k not in s0["ipsets"]
    }
    for name in sorted(set(real_sets) | set(lab_sets)):
        if real_sets.get(name) != lab_sets.get(name):
            out.append(f"ipset {name}: real {real_sets.get(name)} lab {lab_sets.get(name)}")
    for where in sorted(set(s1["iptables"]) | set(lab_ipt)):
        if not where.startswith(f"{net.backend}/"):
            continue
        before = s0["iptables"].get(where, {})
        # kube-proxy's chains and jumps only (a CNI chain may have come after S0)
        real = {
            c: [
                r
                for r in rules
                if r not in before.get(c, []) and "-j KUBE-" in r or c not in st.BUILTIN
            ]
            for c, rules in s1["iptables"].get(where, {}).items()
            if (c not in before and c.startswith("KUBE-")) or c in st.BUILTIN
        }
        lab = {
            c: [r for r in rules if r not in before.get(c, [])]
            for c, rules in lab_ipt.get(where, {}).items()
            if c not in before or c in st.BUILTIN
        }
        if iptables_mode:
            # The tier passes --nodeport-addresses=<node IP>: kube-proxy then jumps to
            # KUBE-NODEPORTS per address instead of by addrtype LOCAL (the lab's default).
            nodeports = "this must be the last rule in this chain"
            for side in (real, lab):
                side["KUBE-SERVICES"] = [
                    r for r in side.get("KUBE-SERVICES", []) if nodeports not in r
                ]
            # ... and writes these chains in Go map order: any order is real
            for c in ("KUBE-SERVICES", "KUBE-NODEPORTS"):
                for side in (real, lab):
                    if c in side:
                        side[c] = sorted(side[c])
            # From v1.31 kube-proxy counts the INVALID drops with an nfacct counter where the
            # kernel has nfacct (the VM's has): a match the lab does not write, since the
            # kernel of the namespace tier has no nfacct. Listed in README "Decisions"; the
            # agent reads both (scenario C of the real tier runs the newest release).
            real["KUBE-FORWARD"] = [
                r.replace(NFACCT_MATCH, "") for r in real.get("KUBE-FORWARD", [])
            ]
        for chain in sorted(set(real) | set(lab)):
            if real.get(chain, []) != lab.get(chain, []):
                out.append(f"{where} {chain}: real {real.get(chain)} lab {lab.get(chain)}")
    return out


__all__ = ["api", "differences", "lab_ipvs", "lab_node"]
