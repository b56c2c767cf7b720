"""Read every source once and assemble the snapshot. The only place readers are called."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agent import names
from agent.evidence import evidence_sets_needed, service_maps_needed
from agent.readers import ipsets, iptables, ipvs, kube_proxy, links, nftables, sysctls
from agent.readers._timing import bounded
from agent.snapshot import IpvsService, KubeProxy, Links, Reading, Snapshot

T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    """What to read and how long each source may take."""

    metrics_url: str = names.KUBE_PROXY_METRICS_URL
    healthz_url: str = names.KUBE_PROXY_HEALTHZ_URL
    timeout: float = 5.0
    # Per-source time budget; None reads without one (the one-shot commands).
    budget: float | None = None
    # Count the nftables-mode table's chains and set elements (the report shows them; the
    # metrics do not, and at 10,000 Services they are most of a scrape's cost).
    nftables_detail: bool = True
    # Read the virtual servers over netlink with every attribute (backups, plans); without it
    # from /proc/net/ip_vs, as much as the metrics, the report and the classifier use
    # (serve's scrapes, audit). A fwmark service or a table that changed during the read
    # sends that read to netlink all the same.
    ipvs_detail: bool = True
    # When the answer is due (time.monotonic()): serve's scrape deadline. Each source gets at
    # most what is left of it, so a slow source costs its own source_up, not the whole scrape.
    deadline: float | None = None
    # Where each source's reading is put as soon as it is done (serve: for a scrape that
    # cannot wait for the rest).
    progress: Progress | None = None


NOT_YET = "not read by this scrape's deadline (X-Prometheus-Scrape-Timeout-Seconds)"


class Progress:
    """The readings of one collection under way, each as soon as its source is done.

    serve's collection is shared and never cut short by one scrape's deadline; a scrape
    whose deadline comes first is answered from what is here, the rest as errors, for
    itself alone (agent/views/metrics.py SharedCollection)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[str, Reading[Any]] = {}
        self._kube_proxy: KubeProxy | None = None

    def add(self, name: str, reading: Reading[T]) -> Reading[T]:
        with self._lock:
            self._done[name] = reading
        return reading

    def add_kube_proxy(self, kp: KubeProxy) -> KubeProxy:
        with self._lock:
            self._kube_proxy = kp
        return kp

    def so_far(self) -> Snapshot:
        """A snapshot of the sources done; every other one an error saying why."""
        with self._lock:
            done, kp = dict(self._done), self._kube_proxy
        if kp is None:
            gone: Reading[Any] = Reading("error", None, NOT_YET)
            kp = KubeProxy(gone, gone, gone, time.time(), livez=gone)

        def got(name: str, empty: T) -> Reading[T]:
            reading: Reading[T] = done.get(name) or Reading("error", empty, NOT_YET)
            return reading

        return Snapshot(
            ipvs=got("ipvs", ()),
            ipsets=got("ipsets", ()),
            iptables_legacy=got("iptables_legacy", ()),
            iptables_nft=got("iptables_nft", ()),
            nftables=got("nftables", ()),
            links=got("links", Links(kube_ipvs0=None)),
            kernel=got("kernel", sysctls.empty()),
            kube_proxy=kp,
        )


def for_scrapes(opts: Options) -> Options:
    """What serve reads on each scrape: what the metrics use, no more (no nftables table
    detail; the virtual servers from /proc/net/ip_vs)."""
    return dataclasses.replace(opts, nftables_detail=False, ipvs_detail=False)


def _left(opts: Options) -> float | None:
    if opts.deadline is None:
        return opts.budget
    left = opts.deadline - time.monotonic()
    return left if opts.budget is None else min(opts.budget, left)


def collect(opts: Options) -> Snapshot:
    def run(name: str, read: Callable[[], Reading[T]], empty: T) -> Reading[T]:
        reading = _run(opts, name, read, empty)
        return opts.progress.add(name, reading) if opts.progress else reading

    no_services: tuple[IpvsService, ...] = ()
    ipvs_reading = run("ipvs", lambda: ipvs.read(opts.ipvs_detail), no_services)
    links_reading = run("links", links.read, Links(kube_ipvs0=None))
    # Only the sets that can name a virtual server's address and port are decoded
    # (docs/contract.md#ownership).
    wanted = evidence_sets_needed(ipvs_reading.data, links_reading.data)
    # nftables mode's service maps, only when they can attribute a virtual server
    maps = service_maps_needed(ipvs_reading.data, links_reading.data)
    return Snapshot(
        ipvs=ipvs_reading,
        ipsets=run("ipsets", lambda: ipsets.read(wanted), ()),
        iptables_legacy=run("iptables_legacy", lambda: iptables.read_legacy(opts.timeout), ()),
        iptables_nft=run("iptables_nft", lambda: iptables.read_nft(opts.timeout), ()),
        nftables=run(
            "nftables",
            lambda: nftables.read(opts.nftables_detail, services=maps),
            (),
        ),
        links=links_reading,
        kernel=run("kernel", sysctls.read, sysctls.empty()),
        kube_proxy=_kube_proxy(opts),
    )


def _run(opts: Options, name: str, read: Callable[[], Reading[T]], empty: T) -> Reading[T]:
    budget = _left(opts)
    if budget is None:
        return read()
    if budget <= 0:
        return Reading("error", empty, "not read: the scrape deadline had passed")
    return bounded(name, read, empty, budget)


def _kube_proxy(opts: Options) -> KubeProxy:
    # Its four endpoints are read at once, every answer whole by one deadline: --timeout from
    # now, or the scrape's deadline if that is sooner.
    kp = kube_proxy.read(opts.metrics_url, opts.healthz_url, opts.timeout, opts.deadline)
    return opts.progress.add_kube_proxy(kp) if opts.progress else kp
