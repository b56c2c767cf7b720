"""The gate (docs/contract.md#the-cleanup-gate): is kube-proxy confirmed in nftables mode, and
is it healthy by its own definition?

Nothing is changed on a node unless this says yes, checked before the backup and again right
before the first change. The classifier carries its answer (`Classification.mode`); verify,
the metrics and the cleanup read it, or ask the same functions. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent import names
from agent.snapshot import Family, KubeProxy, NftFamily, Snapshot

# What /proxyMode may answer that the agent knows, and `unknown` for anything else.
ProxyMode = Literal["ipvs", "iptables", "nftables", "unknown"]
KNOWN_MODES: tuple[ProxyMode, ...] = ("ipvs", "iptables", "nftables")


@dataclass(frozen=True)
class Mode:
    """Which proxy mode kube-proxy runs, and whether the gate confirms nftables mode."""

    detected: ProxyMode
    nftables_confirmed: bool
    evidence: tuple[str, ...]  # what was seen
    failed: tuple[str, ...] = ()  # the gate's conditions that did not hold
    families: tuple[Family, ...] = ()  # the active families it checked


def proxy_mode(kp: KubeProxy) -> str | None:
    """What kube-proxy's /proxyMode answered; None when it did not answer."""
    return kp.proxy_mode.data if kp.proxy_mode.status == "ok" else None


def healthy(kp: KubeProxy) -> bool | None:
    """kube-proxy healthy by its own definition; None while neither /livez nor /healthz
    answered (then nothing can be said)."""
    if kp.livez.status == "ok" or kp.healthz.status == "ok":
        return not health(kp)[1]
    return None


def refusal(mode: Mode) -> str | None:
    """Why the cleanup refuses; None when the gate holds."""
    if mode.nftables_confirmed:
        return None
    reason = mode.failed[0] if mode.failed else "no evidence"
    return f"refused: nftables mode is not confirmed ({reason}); nothing was changed"


def active_families(snap: Snapshot, v6_leftovers: bool) -> list[Family]:
    """The families kube-proxy reports: /healthz, else its sync metric's labels, else IPv4
    (plus IPv6 when IPv6 leftovers exist)."""
    answer = snap.kube_proxy.healthz.data
    if answer is not None and answer.families:
        return sorted(answer.families)
    metrics = snap.kube_proxy.metrics.data
    if metrics is not None and any(metrics.last_sync):
        return sorted(f for f in metrics.last_sync if f)
    return ["ipv4", "ipv6"] if v6_leftovers else ["ipv4"]


def kube_proxy_name(family: Family) -> str:
    """kube-proxy's spelling (IPv4, IPv6), which the gate's messages keep."""
    return next(k for k, v in names.KUBE_PROXY_IP_FAMILIES.items() if v == family)


def nftables_tables(snap: Snapshot, families: list[Family]) -> tuple[list[str], list[str]]:
    """(evidence, failures): kube-proxy's nftables table for each active family, holding
    kube-proxy's own chains (names.NFTABLES_MODE_CHAINS), not merely existing."""
    evidence: list[str] = []
    failed: list[str] = []
    if snap.nftables.status == "error":
        return [], [f"could not read nftables: {snap.nftables.error}"]
    tables = {(t.family, t.name): t for t in snap.nftables.data}
    wanted = names.NFTABLES_MODE_CHAINS
    for family in families:
        nft_family: NftFamily = "ip6" if family == "ipv6" else "ip"
        fam = kube_proxy_name(family)
        table = tables.get((nft_family, names.NFTABLES_TABLE))
        if table is None:
            failed.append(f"no nftables table {nft_family} kube-proxy for active family {fam}")
            continue
        missing = [c for c in wanted if c not in table.kube_proxy_chains]
        if missing:  # an empty table, or someone else's: not kube-proxy's rules
            failed.append(
                f"nftables table {nft_family} kube-proxy lacks kube-proxy's chains "
                f"{', '.join(missing)} ({fam})"
            )
        else:  # the same words as before the chains were required: verify's evidence
            evidence.append(f"nftables table {nft_family} kube-proxy exists ({fam})")
    return evidence, failed


def health(kp: KubeProxy) -> tuple[list[str], list[str]]:
    """(evidence, failures): is kube-proxy healthy now, by its own definition?

    Its health server fails only when a queued update has waited longer than its healthz
    timeout; an idle proxier re-syncs once an hour, so an old last sync is no failure.
    /livez says exactly that; /healthz also fails while the node is being deleted or tainted
    ToBeDeletedByClusterAutoscaler (nodeEligible false), which says nothing of the proxier.
    Releases without /livez are judged by /healthz alone.
    """
    live, health = kp.livez, kp.healthz
    notes: list[str] = []
    if health.status == "ok" and health.data is not None and health.data.node_eligible is False:
        notes.append(
            "/healthz reports nodeEligible false (node being deleted or tainted "
            "ToBeDeletedByClusterAutoscaler): not a proxier failure"
        )
    if live.status == "ok" and live.data is not None:
        if live.data.healthy:
            return [f"/livez answers HTTP {live.data.http_status}: no update stuck", *notes], []
        return notes, [
            f"/livez answers HTTP {live.data.http_status}: an update has been queued longer "
            "than kube-proxy's healthz timeout (kube-proxy is stuck)"
        ]
    if live.status == "error":
        return notes, [f"/livez error: {live.error}"]
    if health.status != "ok" or health.data is None:
        return notes, [f"/healthz {health.status}: {health.error}"]
    if health.data.healthy:
        return [f"/healthz answers HTTP {health.data.http_status}: healthy"], []
    if health.data.node_eligible is False:
        return notes, [
            f"/healthz answers HTTP {health.data.http_status} for an ineligible node, and this "
            "kube-proxy serves no /livez to tell the proxier's own health"
        ]
    return notes, [f"/healthz answers HTTP {health.data.http_status}: unhealthy"]


def sync_age(kp: KubeProxy, families: list[Family], now: float, max_sync_age: float) -> list[str]:
    """Failures of the opt-in bound on the last sync's age (off when `max_sync_age` is 0)."""
    metrics = kp.metrics.data
    if not max_sync_age or metrics is None:
        return []
    failed = []
    for family in families:
        stamp, fam = (
            metrics.last_sync.get(family, metrics.last_sync.get(None)),
            kube_proxy_name(family),
        )
        if stamp is None:
            failed.append(f"no kubeproxy_sync_proxy_rules_last_timestamp_seconds for {fam}")
        elif (kp.read_at or now) - stamp > max_sync_age:
            failed.append(f"metric last sync {fam} older than --max-sync-age {max_sync_age:g}s")
    return failed


# kube-proxy's default --sync-period (pkg/proxy/apis/config/v1alpha1/defaults.go
# SetDefaults_KubeProxyConfiguration: NFTables.SyncPeriod 30s, MinSyncPeriod 1s). nftables mode
# passes it to its sync runner as the retry interval after a failed sync, and the minimum sync
# period, at most it (validation.go), bounds how long a change waits for its first attempt.
SYNC_PERIOD = 30.0


def _family_value(values: dict[Family | None, float], family: Family) -> float | None:
    """A per-family series' value: the family's, else the unlabelled one (before 1.33)."""
    return values.get(family, values.get(None))


def unsynced_change(
    kp: KubeProxy, families: list[Family], now: float, sync_period: float
) -> list[str]:
    """Failures: a change kube-proxy was told of more than a sync period ago that no successful
    sync has followed (pkg/proxy/nftables/proxier.go: Sync and SyncLoop stamp
    kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds, only a successful syncProxyRules
    stamps kubeproxy_sync_proxy_rules_last_timestamp_seconds). A working kube-proxy makes its
    first attempt within --min-sync-period (at most --sync-period); a failed one is retried
    after --sync-period. So its table lacks that change, while /livez stays 200 until the
    oldest pending change is twice the sync period old. The last sync's age alone says
    nothing: an idle kube-proxy re-syncs once an hour (proxyutil.FullSyncPeriod)."""
    metrics = kp.metrics.data
    if metrics is None:
        return []
    failed, at = [], kp.read_at or now
    for family in families:
        queued = _family_value(metrics.last_queued, family)
        synced = _family_value(metrics.last_sync, family)
        if queued is None or (synced is not None and synced >= queued):
            continue
        waited = at - queued
        if waited <= sync_period:
            continue
        last = "none yet" if synced is None else f"{at - synced:.0f}s ago"
        failed.append(
            f"{kube_proxy_name(family)}: a change queued {waited:.0f}s ago is not synced "
            f"(last successful sync: {last}; kube-proxy retries a failed sync every "
            f"--sync-period, {sync_period:g}s by default): its nftables rules are stale"
        )
    return failed


def failures_rising(before: KubeProxy, after: KubeProxy, families: list[Family]) -> list[str]:
    """Failures: kube-proxy counted failed nftables transactions between the gate's two reads
    (pkg/proxy/nftables/proxier.go syncProxyRules: a failed transaction increments
    kubeproxy_sync_proxy_rules_nftables_sync_failures_total and queues nothing, so /livez
    does not see it). The counter is absent until a family's first failure: absent is 0."""
    first, second = before.metrics.data, after.metrics.data
    if first is None or second is None:
        return []
    failed = []
    for family in families:
        was = _family_value(first.sync_failures, family) or 0.0
        now = _family_value(second.sync_failures, family) or 0.0
        if now > was:
            failed.append(
                f"{kube_proxy_name(family)}: "
                "kubeproxy_sync_proxy_rules_nftables_sync_failures_total "
                f"rose from {was:g} to {now:g} between the gate's two reads: "
                "nftables transactions are failing"
            )
    return failed


def recheck_refusal(before: KubeProxy, after: Snapshot, mode: Mode) -> str | None:
    """The gate on its second read: `refusal(mode)`, then the failures counted since the
    first read."""
    refused = refusal(mode)
    if refused:
        return refused
    rising = failures_rising(before, after.kube_proxy, list(mode.families))
    if rising:
        return f"refused: nftables mode is not confirmed ({rising[0]}); nothing was changed"
    return None


def confirm(snap: Snapshot, now: float, max_sync_age: float, v6_leftovers: bool) -> Mode:
    """The gate (docs/contract.md#the-cleanup-gate): /proxyMode, the tables of every active
    family, kube-proxy's health, no change left unsynced past the sync period (the failures
    counted between the gate's two reads are `recheck_refusal`'s).

    The nftables-specific metric series are extra evidence when present, never required:
    a release exposes its counters only once they first move.
    """
    kp = snap.kube_proxy
    evidence: list[str] = []
    failed: list[str] = []
    mode = proxy_mode(kp)
    if mode is not None:
        evidence.append(f"/proxyMode answers {mode}")
    else:
        failed.append(f"/proxyMode {kp.proxy_mode.status}: {kp.proxy_mode.error}")
    detected: ProxyMode = next((m for m in KNOWN_MODES if m == mode), "unknown")
    if mode != "nftables":
        failed.append("kube-proxy does not say nftables")

    families = active_families(snap, v6_leftovers)
    for part in (nftables_tables(snap, families), health(kp)):
        evidence += part[0]
        failed += part[1]
    failed += unsynced_change(kp, families, now, SYNC_PERIOD)
    failed += sync_age(kp, families, now, max_sync_age)
    metrics = kp.metrics.data
    if metrics is not None and metrics.nftables_series:
        evidence.append("kubeproxy_sync_proxy_rules_nftables_* series present")
    return Mode(detected, not failed, tuple(evidence), tuple(failed), tuple(families))
