"""Read every source once and assemble the snapshot. The only place readers are called."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from agent.classify import evidence_sets_needed
from agent.readers import ipsets, iptables, ipvs, kube_proxy, links, nftables, sysctls
from agent.readers._timing import bounded
from agent.snapshot import IpvsService, KubeProxy, Links, Reading, Snapshot

T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    metrics_url: str = "http://127.0.0.1:10249"
    healthz_url: str = "http://127.0.0.1:10256/healthz"
    timeout: float = 5.0
    # Per-source time budget; None reads without one (the one-shot commands).
    budget: float | None = None
    # Count the nftables-mode table's chains and set elements (the report shows them; the
    # metrics do not, and at 10,000 Services they are most of a scrape's cost).
    nftables_detail: bool = True


def collect(opts: Options) -> Snapshot:
    def run(name: str, read: Callable[[], Reading[T]], empty: T) -> Reading[T]:
        return read() if opts.budget is None else bounded(name, read, empty, opts.budget)

    no_services: tuple[IpvsService, ...] = ()
    ipvs_reading = run("ipvs", ipvs.read, no_services)
    links_reading = run("links", links.read, Links(kube_ipvs0=None))
    # Only the sets that can name a virtual server's address and port are decoded (SPEC §4).
    wanted = evidence_sets_needed(ipvs_reading.data, links_reading.data)
    return Snapshot(
        ipvs=ipvs_reading,
        ipsets=run("ipsets", lambda: ipsets.read(wanted), ()),
        iptables_legacy=run("iptables_legacy", lambda: iptables.read_legacy(opts.timeout), ()),
        iptables_nft=run("iptables_nft", lambda: iptables.read_nft(opts.timeout), ()),
        nftables=run("nftables", lambda: nftables.read(opts.nftables_detail), ()),
        links=links_reading,
        kernel=run("kernel", sysctls.read, sysctls.empty()),
        kube_proxy=_kube_proxy(opts),
    )


def _kube_proxy(opts: Options) -> KubeProxy:
    # Its three endpoints carry their own HTTP timeout, which is its budget.
    return kube_proxy.read(opts.metrics_url, opts.healthz_url, opts.timeout)
