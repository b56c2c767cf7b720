"""Plain-data snapshots for the pure tests."""

from __future__ import annotations

from typing import Any

from agent.readers import iptables_save
from agent.snapshot import (
    Family,
    Kernel,
    KubeProxy,
    KubeProxyHealth,
    KubeProxyMetrics,
    Links,
    Reading,
    Snapshot,
)

NOW = 1_800_000_000.0


def ok(data: Any) -> Reading[Any]:
    return Reading("ok", data)


def kube_proxy(
    mode: str | None = "nftables",
    families: tuple[Family, ...] = ("ipv4",),
    sync_age: float = 5.0,
    healthy: bool = True,
    eligible: bool = True,
    livez: bool = True,
    series: bool | None = None,
) -> KubeProxy:
    """kube-proxy as its endpoints show it; `livez=False` is a release without /livez,
    `series` whether /metrics has the nftables-mode series (default: in nftables mode)."""
    if mode is None:
        absent: Reading[Any] = Reading("absent", None, "unreachable")
        return KubeProxy(absent, absent, absent, NOW, livez=absent)
    metrics = KubeProxyMetrics(
        last_sync={f: NOW - sync_age for f in families},
        nftables_sync_failures=0.0 if mode == "nftables" else None,
        nftables_series=mode == "nftables" if series is None else series,
        iptables_series=mode == "iptables",
    )
    health = KubeProxyHealth(
        http_status=200 if healthy and eligible else 503,
        healthy=healthy and eligible,
        last_updated=NOW,
        current_time=NOW,
        families={f: NOW - sync_age for f in families},
        node_eligible=eligible,
    )
    live: Reading[Any] = (
        ok(KubeProxyHealth(200 if healthy else 503, healthy, NOW, NOW))
        if livez
        else Reading("absent", None, "/livez not served by this kube-proxy release")
    )
    return KubeProxy(ok(mode), ok(metrics), ok(health), NOW, livez=live)


def snapshot(
    ipvs: tuple[Any, ...] = (),
    ipsets: tuple[Any, ...] = (),
    legacy: str = "",
    nft: str = "",
    nft_v6: str = "",
    nftables: tuple[Any, ...] = (),
    links: Links | None = None,
    kp: KubeProxy | None = None,
) -> Snapshot:
    nft_tables = iptables_save.parse(nft, "nft", "ipv4") + iptables_save.parse(
        nft_v6, "nft", "ipv6"
    )
    return Snapshot(
        ipvs=ok(ipvs),
        ipsets=ok(ipsets),
        iptables_legacy=ok(iptables_save.parse(legacy, "legacy", "ipv4")),
        iptables_nft=ok(nft_tables),
        nftables=ok(nftables),
        links=ok(links or Links(kube_ipvs0=None)),
        kernel=ok(Kernel(release="6.1.0")),
        kube_proxy=kp or kube_proxy(),
    )
