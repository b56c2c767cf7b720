"""Prometheus view of a classified snapshot (docs/contract.md#metrics), and the collection
scrapes share.

The collector follows prometheus_client's custom-collector pattern: descriptions are fixed,
values are built fresh from one collection on every scrape, so a vanished object vanishes from
the output. No node label, no timestamps, no per-object labels.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from agent import METRIC_PREFIX, __version__, gate, names
from agent.classify import ChainRef, Classification, Owner, RuleRef, ipset_family
from agent.collect import Progress
from agent.collection import Collection
from agent.readers.kernel import SUBSYSTEMS
from agent.snapshot import Ipset, IpvsService, KubeProxy, Snapshot
from agent.views.checks.precheck import readiness_metrics

PREFIX = METRIC_PREFIX
CLASS_LABEL = "kube-proxy"  # the IPVS counts' `class` of kube-proxy's virtual servers
# the reader that proves a subsystem is loaded on a kernel without module support
READINESS_DOCS = {
    "kube_proxy_mode_pinned": "1 when kube-proxy's configuration pins a proxy mode (precheck)",
    "foreign_references": "Rules outside kube-proxy's chains that use KUBE-* chains or sets",
    "localhost_nodeport_packets": "kube-proxy's localhost NodePort packet counter (iptables mode)",
}
# the kinds of object the classifier can put in unknown-kube (agent/classify.py)
UNKNOWN_KINDS = ("ipvs-service", "ipset", "chain", "jump-rule", "link")
_READER_OF = {"ip_vs": "ipvs", "ip_set": "ipsets", "nf_tables": "nftables"}


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))


Family = GaugeMetricFamily | InfoMetricFamily | CounterMetricFamily


def families(col: Collection) -> Iterator[Family]:
    """Every metric of docs/contract.md#metrics for one collection."""
    snap, c = col.snapshot, col.classification
    yield from _leftover_families(snap, c)
    yield from _iptables_families(c)
    yield from _unknown_families(c)
    yield from _mode_families(snap, c)
    yield from _source_families(snap)
    readiness = readiness_metrics(snap, c, col.config)
    for name, doc in READINESS_DOCS.items():
        if PREFIX + name in readiness:  # a value that cannot be known is left out
            yield _value(name, doc, readiness[PREFIX + name])
    info = InfoMetricFamily(PREFIX + "build", "The agent's version")
    info.add_metric([], {"version": __version__})
    yield info


def _leftover_families(snap: Snapshot, c: Classification) -> Iterator[Family]:
    """stale, kube-ipvs0, the IPVS counts by class and the sets by family."""
    yield _value(
        "stale", "1 when nftables mode is confirmed and ipvs-mode leftovers exist", c.stale
    )
    link = snap.links.data.kube_ipvs0
    yield _value("kube_ipvs0_present", "1 when the link kube-ipvs0 exists", link is not None)
    g = _gauge("kube_ipvs0_addresses", "Addresses on kube-ipvs0", ("family",))
    addrs = link.addresses if link else ()
    g.add_metric(["ipv4"], sum(":" not in a for a in addrs))
    g.add_metric(["ipv6"], sum(":" in a for a in addrs))
    yield g

    vs = _gauge("ipvs_virtual_servers", "IPVS virtual servers by class of owner", ("class",))
    rs = _gauge(
        "ipvs_real_servers", "IPVS real servers by class of their service's owner", ("class",)
    )
    conns = _gauge(
        "ipvs_connections",
        "Connections IPVS tracks through the real servers, by class of their service's owner "
        "and state; deleting a virtual server cuts them",
        ("class", "state"),
    )
    for owner, label in ((Owner.IPVS_LEFTOVER, CLASS_LABEL), (Owner.FOREIGN, "foreign")):
        svcs = [f.obj for f in c.of(IpvsService, owner)]
        vs.add_metric([label], len(svcs))
        rs.add_metric([label], sum(len(s.dests) for s in svcs))
        conns.add_metric([label, "active"], sum(s.active_conns for s in svcs))
        conns.add_metric([label, "inactive"], sum(s.inactive_conns for s in svcs))
    yield vs
    yield rs
    yield conns

    sets = _gauge("ipsets", "kube-proxy ipvs-mode ipsets present", ("family",))
    entries = _gauge("ipset_entries", "Entries in kube-proxy ipvs-mode ipsets", ("family",))
    n_sets: Counter[str] = Counter({"ipv4": 0, "ipv6": 0})
    n_entries: Counter[str] = Counter({"ipv4": 0, "ipv6": 0})
    for s in c.of(Ipset, Owner.IPVS_LEFTOVER):
        n_sets[ipset_family(s.obj)] += 1
        n_entries[ipset_family(s.obj)] += s.obj.elements
    for fam in ("ipv4", "ipv6"):
        sets.add_metric([fam], n_sets[fam])
        entries.add_metric([fam], n_entries[fam])
    yield sets
    yield entries


def _by_table(name: str, doc: str, counts: Counter[tuple[str, str, str]]) -> GaugeMetricFamily:
    g = _gauge(name, doc, ("backend", "family", "table"))
    for key in sorted(counts):
        g.add_metric(list(key), counts[key])
    return g


def _iptables_families(c: Classification) -> Iterator[Family]:
    """kube-proxy's chains and rules per backend, family and table, of both modes."""
    chains: Counter[tuple[str, str, str]] = Counter()
    rules: Counter[tuple[str, str, str]] = Counter()
    for f in c.owned_by(Owner.IPVS_LEFTOVER):
        obj = f.obj
        if isinstance(obj, ChainRef):
            where = (obj.table.backend, obj.table.family, obj.table.name)
            chains[where] += 1
            rules[where] += len(obj.chain.rules)
        elif isinstance(obj, RuleRef):
            rules[(obj.table.backend, obj.table.family, obj.table.name)] += 1
    yield _by_table("iptables_chains", "kube-proxy ipvs-mode iptables chains present", chains)
    yield _by_table("iptables_rules", "Rules in ipvs-mode chains plus jumps into them", rules)
    modes: Counter[tuple[str, str, str]] = Counter()
    for ch in c.of(ChainRef, Owner.IPTABLES_LEFTOVER):
        modes[(ch.obj.table.backend, ch.obj.table.family, ch.obj.table.name)] += 1
    yield _by_table(
        "iptables_mode_chains", "kube-proxy iptables-mode iptables chains present", modes
    )


def _unknown_families(c: Classification) -> Iterator[Family]:
    """Objects with KUBE-* names or weak evidence that match no rule: reported, never touched
    (docs/contract.md#ownership). Every kind the classifier can give is exported, 0 when
    there is none."""
    unknown: Counter[str] = Counter({kind: 0 for kind in UNKNOWN_KINDS})
    for f in c.owned_by(Owner.UNKNOWN_KUBE):
        unknown[f.kind] += 1
    g = _gauge(
        "unknown_kube_objects",
        f"{names.KUBE_PREFIX}* objects no rule recognises, never touched",
        ("kind",),
    )
    for kind in sorted(unknown):
        g.add_metric([kind], unknown[kind])
    yield g


def _mode_families(snap: Snapshot, c: Classification) -> Iterator[Family]:
    """The mode kube-proxy runs, the gate's verdict, kube-proxy's health, the kernel."""
    # An _info series is 1 or absent (Prometheus' convention): one series, the mode seen.
    g = _gauge("kube_proxy_mode_info", "1 for the proxy mode kube-proxy reports", ("mode",))
    g.add_metric([c.mode.detected], 1)
    yield g
    yield from kube_proxy_families(snap.kube_proxy)
    yield _value(
        "nftables_mode_confirmed",
        "1 when the cleanup gate would pass",
        c.mode.nftables_confirmed,
    )
    healthy = gate.healthy(snap.kube_proxy)
    if healthy is not None:
        # The gate's own definition, so the alert on it agrees with cleanup and verify; left
        # out while kube-proxy cannot be reached (kube_proxy_mode_info says unknown then).
        yield _value(
            "kube_proxy_healthy",
            "1 when kube-proxy is healthy by its own definition (/livez, else /healthz)",
            healthy,
        )
    yield _value(
        "nftables_kernel_ready",
        "1 when the kernel is 5.13 or newer",
        (snap.kernel.data.version() or (0, 0)) >= names.NFTABLES_MIN_KERNEL,
    )


def _source_families(snap: Snapshot) -> Iterator[Family]:
    """Each source's read status and time, and the kernel's subsystems."""
    sources = snap.sources()
    up = _gauge("source_up", "1 when the source was read (an absent subsystem counts)", ("source",))
    took = _gauge("scrape_duration_seconds", "Seconds spent reading each source", ("source",))
    for name, reading in sources.items():
        up.add_metric([name], 0 if reading.status == "error" else 1)
        took.add_metric([name], reading.seconds)
    yield up
    yield took

    g = _gauge("subsystem_loaded", "1 when the kernel has the subsystem", ("subsystem",))
    for name in SUBSYSTEMS:
        known = snap.kernel.data.subsystems.get(name)
        if known is None and name in _READER_OF:
            known = sources[_READER_OF[name]].status == "ok"
        g.add_metric([name], 1 if known else 0)
    yield g


def kube_proxy_families(kp: KubeProxy) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """What the kube-proxy alerts and panels need, re-exported from what the agent read
    (ipvs_leftovers_kube_proxy_healthy, the gate's own verdict, is made beside the gate).

    kube-proxy serves its own metrics on the node's 127.0.0.1:10249, which Prometheus usually
    cannot scrape; the agent reads them anyway, and its own target carries the `node` label.
    A value kube-proxy did not give is left out, never exported as 0.
    """
    metrics = kp.metrics.data
    g = _gauge(
        "kube_proxy_last_sync_timestamp_seconds",
        "kube-proxy's last successful rules sync by IP family; an idle kube-proxy "
        "re-syncs only hourly, so an old value alone is not a fault",
        ("family",),
    )
    for fam, stamp in sorted(
        (metrics.last_sync if metrics else {}).items(), key=lambda kv: kv[0] or ""
    ):
        g.add_metric([fam or ""], stamp)
    yield g
    if metrics is not None and metrics.nftables_sync_failures is not None:
        yield CounterMetricFamily(
            PREFIX + "kube_proxy_nftables_sync_failures",
            "kube-proxy's failed nftables syncs, all IP families (resets when kube-proxy does)",
            value=metrics.nftables_sync_failures,
        )


def _value(name: str, doc: str, value: bool | float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=float(value))


# When the scrape being answered is due (time.monotonic()), from Prometheus' scrape timeout;
# set by the HTTP handler around one answer, read by the collection it starts or waits for.
_DEADLINE: ContextVar[float | None] = ContextVar("scrape_deadline", default=None)


@contextmanager
def scrape_deadline(deadline: float | None) -> Iterator[None]:
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def current_deadline() -> float | None:
    return _DEADLINE.get()


# The collection a SharedCollection's thread is making, for the function that makes it.
_PROGRESS: ContextVar[Progress | None] = ContextVar("collection_progress", default=None)


def current_progress() -> Progress | None:
    return _PROGRESS.get()


class _Run:
    """One collection being made: what it has read so far, and how it ended."""

    def __init__(self) -> None:
        self.progress = Progress()
        self.done = False
        self.result: Collection | None = None
        self.error: Exception | None = None


class SharedCollection:
    """One collection serves every scrape within `min_interval` seconds.

    It is made by a thread of its own, bounded by the server's limits only (each source's
    --source-timeout), never by one scrape's deadline: a scrape waits for it until its own
    deadline, and one whose deadline comes first gets `so_far` of what has been read, every
    other source an error. That answer is for that scrape alone: never kept, never given to
    another scrape or to auto-cleanup. One client sending a tiny
    X-Prometheus-Scrape-Timeout-Seconds made everyone see a cut-short node (all sources down,
    nftables mode not confirmed) for a whole interval, and reset auto-cleanup's streak.

    Scrapes that arrive while a collection runs wait for it instead of starting their own, so
    a scrape storm, whatever its headers, costs the kernel one read per interval.
    """

    def __init__(
        self,
        collect: Callable[[], Collection],
        min_interval: float,
        so_far: Callable[[Progress], Collection] | None = None,
    ) -> None:
        self._collect = collect
        self._min_interval = min_interval
        self._so_far = so_far
        self._cond = threading.Condition()
        self._last: Collection | None = None
        self._at = 0.0
        self._run: _Run | None = None
        self.count = 0

    def get(self) -> Collection:
        """The shared collection; by the deadline of the scrape being answered (if any)."""
        deadline = current_deadline()
        with self._cond:
            if self._last is not None and time.monotonic() - self._at < self._min_interval:
                return self._last
            run = self._run or self._start()
            while not run.done:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
        if run.done:
            if run.result is None:
                raise run.error or RuntimeError("the collection ended without a result")
            return run.result
        if self._so_far is None:
            raise TimeoutError("the collection under way did not finish by the scrape deadline")
        return self._so_far(run.progress)

    def _start(self) -> _Run:
        run = self._run = _Run()
        # Let go of the old reading first: holding both doubled serve's peak memory on a
        # large node (the old one is stale the moment a new one is due).
        self._last = None
        threading.Thread(target=self._make, args=(run,), name="collection", daemon=True).start()
        return run

    def _make(self, run: _Run) -> None:
        _PROGRESS.set(run.progress)  # this thread's own context
        try:
            run.result = self._collect()
        except Exception as exc:  # noqa: BLE001 - handed to the scrapes waiting for it
            run.error = exc
        with self._cond:
            if run.result is not None:
                self._last, self._at = run.result, time.monotonic()
                self.count += 1
            run.done = True
            self._run = None
            self._cond.notify_all()


class AgentCollector(Collector):
    def __init__(
        self,
        shared: SharedCollection,
        extra: Callable[[], list[GaugeMetricFamily | CounterMetricFamily]] | None = None,
    ) -> None:
        self._shared = shared
        self._extra = extra

    def collect(self) -> Iterator[GaugeMetricFamily | InfoMetricFamily | CounterMetricFamily]:
        col = self._shared.get()
        yield from families(col)
        yield CounterMetricFamily(
            PREFIX + "collections",
            "Collections made since start; scrapes share them",
            value=self._shared.count,
        )
        if self._extra is not None:
            yield from self._extra()

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # no collection at registration time
