"""One read of the node and its classification: what every view is built from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.findings import Classification
from agent.snapshot import Reading, Snapshot

if TYPE_CHECKING:  # its module imports yaml: a tenth of a cold audit's start in the VM
    from agent.readers.kube_proxy_config import KubeProxyConfig


@dataclass(frozen=True)
class Collection:
    """A snapshot with its classification and the seconds the read took."""

    snapshot: Snapshot
    classification: Classification
    seconds: float
    # kube-proxy's own configuration, for the readiness gauges (absent when not read)
    config: Reading[KubeProxyConfig | None] = field(
        default_factory=lambda: Reading("absent", None, "not read")
    )
