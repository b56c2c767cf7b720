"""Checks on upstream kube-proxy's own signals (docs/precheck-verify.md): the KubeProxyIPVS
feature gate for precheck, the ip_forward ipvs mode set for verify."""

from __future__ import annotations

from agent import names
from agent.snapshot import Snapshot
from agent.views.checks.common import Check, Status, _check
from agent.views.signals import ipvs_feature_gate
from agent.views.sysctls import attribute


def check_ipvs_deprecation(snap: Snapshot) -> Check:
    """The feature gate, as evidence: pass once /metrics was read, warn when it was not."""
    m = snap.kube_proxy.metrics
    status: Status = "pass" if m.status == "ok" and m.data is not None else "warn"
    return _check("ipvs-deprecation", status, ipvs_feature_gate(snap.kube_proxy))


def check_ip_forward(snap: Snapshot) -> Check:
    """ip_forward=1 after the migration: only ipvs mode, of kube-proxy's modes, sets it, and
    nothing sets it again after a reboot. A warn, which verify's exit code does not count: the
    node may well need it, set by its own configuration."""
    name = "net.ipv4.ip_forward"
    if snap.kernel.status == "error":
        return _check("ip-forward", "fail", f"could not read sysctls: {snap.kernel.error}")
    value = snap.kernel.data.sysctls.get(name)
    if value is None:
        return _check("ip-forward", "warn", f"{name} was not read")
    if value != names.IPVS_MODE_SYSCTLS[name][0]:
        return _check("ip-forward", "pass", f"{name} = {value}: not the value ipvs mode sets")
    note = next(n.note for n in attribute(snap.kernel.data) if n.name == name)
    return _check(
        "ip-forward",
        "warn",
        f"{name} = 1, {note}",
        "kube-proxy's nftables mode never sets it: if ipvs mode was what set it, the node "
        "loses forwarding (pod traffic through it) at its next boot; persist it in "
        "/etc/sysctl.d or let the CNI set it",
    )
