"""Upstream kube-proxy's own word on ipvs mode's end (docs/contract.md#upstream-signals), as
one line each for the audit and precheck. Pure: what the readers got in, text out."""

from __future__ import annotations

from agent import names
from agent.snapshot import KubeProxy

# pkg/features/kube_features.go (v1.37.2): KubeProxyIPVS GA from 1.0, Deprecated from 1.37
GATE_SOURCE = "pkg/features/kube_features.go"
# cmd/kube-proxy/app/server_linux.go (v1.37.2) lines 139-143: logged at error level and
# recorded as a Warning event KubeProxyDefaultMode when no mode was given
DEFAULT_MODE_WARNING = (
    "kube-proxy v1.37 warns (event KubeProxyDefaultMode, cmd/kube-proxy/app/server_linux.go) "
    "that an unset mode, iptables today, becomes nftables in Kubernetes 1.40"
)


def ipvs_feature_gate(kp: KubeProxy) -> str:
    """What /metrics says of the KubeProxyIPVS feature gate."""
    m = kp.metrics
    if m.status != "ok" or m.data is None:
        return f"feature gate {names.IPVS_FEATURE_GATE}: /metrics {m.status}: {m.error}"
    gate = m.data.ipvs_feature_gate
    series = f'{names.FEATURE_ENABLED_SERIES}{{name="{names.IPVS_FEATURE_GATE}"}}'
    if gate is None:
        return (
            f"{series} absent: a release before v1.37 (ipvs mode deprecated from v1.35, "
            "the IPVSDeprecation event, not yet behind a feature gate)"
        )
    value, stage = gate
    allowed = "ipvs mode allowed" if value == 1 else "ipvs mode refused (the gate is off)"
    return (
        f"{series} = {value:g}, stage {stage or 'GA'} ({GATE_SOURCE}): {allowed}; "
        "off by default in Kubernetes 1.40, removed in 1.43"
    )
