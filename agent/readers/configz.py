"""kube-proxy's /configz (on its metrics port): its effective, defaulted configuration.

Every release tested serves it (cmd/kube-proxy/app/server.go: `configz.New`, `cz.Set`,
`configz.InstallHandler(proxyMux)`), as `{"kubeproxy.config.k8s.io": CONFIG}`. Up to v1.35
CONFIG is the internal type, whose JSON keys are the Go field names (`NodePortAddresses`,
`IPVS.StrictARP`, `IPTables.MasqueradeBit`); from v1.36 it is the v1alpha1 type converted
first (`nodePortAddresses`, `ipvs.strictARP`, `iptables.masqueradeBit`). Both are read.
"""

from __future__ import annotations

import json
from typing import Any

from agent.readers.timestamps import Garbage
from agent.snapshot import KubeProxyConfigz

GROUP = "kubeproxy.config.k8s.io"


class ConfigzError(Garbage):
    """/configz answered, but not with a kube-proxy configuration."""


def _get(doc: dict[str, Any], *keys: str) -> Any:
    """The first of `keys` (one per spelling) that `doc` holds."""
    for k in keys:
        if k in doc:
            return doc[k]
    return None


def _section(doc: dict[str, Any], *keys: str) -> dict[str, Any]:
    value = _get(doc, *keys)
    return value if isinstance(value, dict) else {}


def _bit(value: Any) -> int | None:
    return (
        value
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 32
        else None
    )


def parse_configz(status: int, body: bytes) -> KubeProxyConfigz:
    """The settings of one /configz answer; ConfigzError for anything else."""
    if status != 200:
        raise ConfigzError(f"/configz answered HTTP {status}")
    try:
        doc: Any = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigzError(f"/configz is not JSON: {exc}") from exc
    config = doc.get(GROUP) if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise ConfigzError(f"/configz holds no {GROUP} object")
    addresses = _get(config, "nodePortAddresses", "NodePortAddresses")
    if addresses is not None and not (
        isinstance(addresses, list) and all(isinstance(a, str) for a in addresses)
    ):
        raise ConfigzError("/configz: nodePortAddresses is not a list of strings")
    ipvs = _section(config, "ipvs", "IPVS")
    strict = _get(ipvs, "strictARP", "StrictARP")
    mode = _get(config, "mode", "Mode")
    return KubeProxyConfigz(
        mode=mode if isinstance(mode, str) and mode else None,
        node_port_addresses=tuple(addresses or ()),
        strict_arp=strict if isinstance(strict, bool) else None,
        iptables_masquerade_bit=_bit(
            _get(_section(config, "iptables", "IPTables"), "masqueradeBit", "MasqueradeBit")
        ),
        nftables_masquerade_bit=_bit(
            _get(_section(config, "nftables", "NFTables"), "masqueradeBit", "MasqueradeBit")
        ),
    )
