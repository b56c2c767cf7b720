"""Read every source once and assemble the snapshot. The only place readers are called."""

from __future__ import annotations

from dataclasses import dataclass

from agent import names
from agent.classify import needs_set_entries
from agent.readers import ipsets, iptables, ipvs, kube_proxy, links, nftables, sysctls
from agent.snapshot import Snapshot


@dataclass(frozen=True)
class Options:
    metrics_url: str = "http://127.0.0.1:10249"
    healthz_url: str = "http://127.0.0.1:10256/healthz"
    timeout: float = 5.0


def collect(opts: Options) -> Snapshot:
    ipvs_reading = ipvs.read()
    links_reading = links.read()
    # Set members are decoded only when a virtual server cannot be attributed without them.
    wanted = (
        names.EVIDENCE_SETS
        if needs_set_entries(ipvs_reading.data, links_reading.data)
        else frozenset()
    )
    return Snapshot(
        ipvs=ipvs_reading,
        ipsets=ipsets.read(wanted),
        iptables_legacy=iptables.read_legacy(opts.timeout),
        iptables_nft=iptables.read_nft(opts.timeout),
        nftables=nftables.read(),
        links=links_reading,
        kernel=sysctls.read(),
        kube_proxy=kube_proxy.read(opts.metrics_url, opts.healthz_url, opts.timeout),
    )
