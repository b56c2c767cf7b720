"""verify (docs/precheck-verify.md): after the migration, a clean node and a working nftables
data plane.

Pure: the probe result and `now` are passed in. Something that could not be read is a fail
naming what, never a pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from agent import gate, names
from agent.findings import Classification
from agent.snapshot import Snapshot
from agent.views.checks.common import (
    Check,
    Status,
    _check,
    _listed,
)
from agent.views.checks.upstream import check_ip_forward


@dataclass(frozen=True)
class ProbeResult:
    """One TCP connect to a Service; target None when nothing was configured."""

    target: str | None  # HOST:PORT
    origin: str  # "--probe-address" or "KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT"
    ok: bool
    detail: str  # "connected in 0.003s" / "connection refused" / why there is no target


def check_nftables_mode(snap: Snapshot, c: Classification) -> Check:
    """The mode part of the gate (docs/contract.md#the-cleanup-gate): /proxyMode and the tables
    of every active family."""
    kp = snap.kube_proxy
    ok: list[str] = []
    bad: list[str] = []
    mode = gate.proxy_mode(kp)
    if mode is None:
        bad.append(f"/proxyMode {kp.proxy_mode.status}: {kp.proxy_mode.error}")
    elif mode == "nftables":
        ok.append("/proxyMode answers nftables")
    else:
        bad.append(f"/proxyMode answers {mode}, not nftables")
    found, missing = gate.nftables_tables(snap, list(c.mode.families))
    m = kp.metrics.data
    if m is not None and m.nftables_series:
        found.append("/metrics has the kubeproxy_sync_proxy_rules_nftables_* series")
    return _check(
        "nftables-mode", "fail" if bad or missing else "pass", *bad, *missing, *ok, *found
    )


_KERNEL_SOURCES = ("ipvs", "ipsets", "iptables_legacy", "iptables_nft", "nftables", "links")


def check_no_leftovers(
    snap: Snapshot, c: Classification, kept: Mapping[tuple[str, str], str]
) -> Check:
    """`kept`: what the cleanup's plan keeps, and why, by (kind, name) (Plan.kept_reasons)."""
    errors = [
        f"could not read {n}: {r.error}"
        for n, r in snap.sources().items()
        if n in _KERNEL_SOURCES and r.status == "error"
    ]
    # What cleanup keeps because foreign state still uses it (a CNI rule jumping to
    # KUBE-MARK-MASQ) is not left over: removing it would break that state.
    held = [f for f in c.removable if (f.kind, f.name) in kept]
    left = [f for f in c.leftovers if (f.kind, f.name) not in kept]
    # iptables mode's remnants fail it too: stale nat KUBE-SERVICES rules still DNAT traffic
    ipt = [f for f in c.iptables_leftovers if (f.kind, f.name) not in kept]
    notes = [
        f"kept, still used by foreign state: {f.kind} {f.name} ({kept[(f.kind, f.name)]})"
        for f in held
    ]
    if not left and not ipt and not errors:
        return _check("no-leftovers", "pass", "no ipvs-mode object on the node", *notes)
    counts = Counter(f.kind for f in left)
    evidence = list(errors)
    if ipt:
        evidence.append(
            f"{len(ipt)} iptables-mode object(s) remain: "
            + ", ".join(f"{n} {k}" for k, n in sorted(Counter(f.kind for f in ipt).items()))
            + " (ipvs-leftovers cleanup removes them)"
        )
    if left:
        evidence.append(
            f"{len(left)} ipvs-mode object(s) remain: "
            + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
            + " (ipvs-leftovers cleanup removes them)"
        )
        evidence += _listed([f"{f.kind} {f.name}" for f in left], 10)
    return _check("no-leftovers", "fail", *evidence, *notes)


def check_kube_ipvs0_gone(snap: Snapshot) -> Check:
    if snap.links.status == "error":
        return _check("kube-ipvs0-gone", "fail", f"could not read links: {snap.links.error}")
    link = snap.links.data.kube_ipvs0
    if link is None:
        return _check("kube-ipvs0-gone", "pass", f"no link {names.KUBE_IPVS0}")
    return _check(
        "kube-ipvs0-gone",
        "fail",
        f"{link.name} exists (kind {link.kind}, {'up' if link.up else 'down'}) with "
        f"{len(link.addresses)} addresses: the node still claims those Service IPs",
    )


def check_nftables_sync(
    snap: Snapshot, c: Classification, now: float, max_sync_age: float
) -> Check:
    """kube-proxy healthy by its own definition (the gate's), and no failed nftables sync."""
    kp = snap.kube_proxy
    ok, bad = gate.health(kp)
    bad += gate.sync_age(kp, list(c.mode.families), now, max_sync_age)
    m = kp.metrics
    if m.status != "ok" or m.data is None:
        bad.append(f"/metrics {m.status}: {m.error}")
    elif m.data.nftables_sync_failures is None:
        # The counter is exposed once it first moves: absent means no failure yet.
        ok.append("no kubeproxy_sync_proxy_rules_nftables_sync_failures_total counted yet")
    elif m.data.nftables_sync_failures > 0:
        failures = m.data.nftables_sync_failures
        bad.append(f"kubeproxy_sync_proxy_rules_nftables_sync_failures_total = {failures:g}")
    else:
        ok.append("kubeproxy_sync_proxy_rules_nftables_sync_failures_total = 0")
    return _check("nftables-sync", "fail" if bad else "pass", *bad, *ok)


def check_probe(probe: ProbeResult) -> Check:
    if probe.target is None:
        return _check("service-probe", "fail", probe.detail)
    status: Status = "pass" if probe.ok else "fail"
    return _check(
        "service-probe", status, f"TCP connect to {probe.target} ({probe.origin}): {probe.detail}"
    )


def verify(
    snap: Snapshot,
    c: Classification,
    kept: Mapping[tuple[str, str], str],
    probe: ProbeResult,
    now: float,
    max_sync_age: float,
) -> list[Check]:
    """After the migration: is this node clean and is the new data plane working
    (docs/precheck-verify.md). `kept`: what the cleanup's plan keeps (Plan.kept_reasons)."""
    return [
        check_nftables_mode(snap, c),
        check_no_leftovers(snap, c, kept),
        check_kube_ipvs0_gone(snap),
        check_nftables_sync(snap, c, now, max_sync_age),
        check_probe(probe),
        check_ip_forward(snap),
    ]
