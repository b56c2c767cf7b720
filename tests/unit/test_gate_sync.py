"""The gate's sync conditions (docs/contract.md#the-cleanup-gate): kube-proxy's nftables mode
must not be confirmed while its transactions fail, which /livez does not see for twice the
sync period (and never, when no change is queued). Metrics as kube-proxy v1.37.2 serves them
(`ip_family` labels; the failures counter absent until its first failure)."""

from __future__ import annotations

from dataclasses import replace

from agent import gate
from agent.classify import classify
from agent.names import NFTABLES_MODE_CHAINS
from agent.readers.kube_proxy import parse_metrics
from agent.snapshot import Family, KubeProxy, NftTable, Snapshot
from tests.unit.builders import NOW, kube_proxy, ok, snapshot

FAMILIES: tuple[Family, ...] = ("ipv4", "ipv6")
TABLES = (
    NftTable("ip", "kube-proxy", 12, kube_proxy_chains=NFTABLES_MODE_CHAINS),
    NftTable("ip6", "kube-proxy", 12, kube_proxy_chains=NFTABLES_MODE_CHAINS),
)


def _metrics(synced: dict[str, float], queued: dict[str, float], failures: dict[str, float]) -> str:
    """/metrics text: each value an age in seconds before NOW (failures: a count)."""
    name = "kubeproxy_sync_proxy_rules_"
    lines = [
        f'{name}last_timestamp_seconds{{ip_family="{f}"}} {NOW - a!r}' for f, a in synced.items()
    ]
    lines += [
        f'{name}last_queued_timestamp_seconds{{ip_family="{f}"}} {NOW - a!r}'
        for f, a in queued.items()
    ]
    lines += [
        f'{name}nftables_sync_failures_total{{ip_family="{f}"}} {n:g}' for f, n in failures.items()
    ]
    return "\n".join(lines) + "\n"


def _kp(text: str) -> KubeProxy:
    """kube-proxy healthy by /livez and /healthz, in nftables mode, with these metrics."""
    kp = kube_proxy("nftables", FAMILIES)
    return replace(kp, metrics=ok(parse_metrics(text.encode())))


def _snap(text: str) -> Snapshot:
    return snapshot(nftables=TABLES, kp=_kp(text))


def _mode(text: str) -> gate.Mode:
    return classify(_snap(text), NOW).mode


BOTH = {"IPv4": 5.0, "IPv6": 5.0}


def test_a_change_queued_longer_than_the_sync_period_and_not_synced_refuses() -> None:
    """The Service added while transactions fail: queued 40 s ago, the last success 300 s ago,
    /livez still 200 (it waits for twice the sync period)."""
    mode = _mode(_metrics({"IPv4": 300.0, "IPv6": 5.0}, {"IPv4": 40.0, "IPv6": 20.0}, {}))
    assert not mode.nftables_confirmed
    assert mode.failed == (
        "IPv4: a change queued 40s ago is not synced (last successful sync: 300s ago; "
        "kube-proxy retries a failed sync every --sync-period, 30s by default): its nftables "
        "rules are stale",
    )
    refused = gate.refusal(mode)
    assert refused is not None and refused.startswith(
        "refused: nftables mode is not confirmed (IPv4: a change queued 40s ago is not synced"
    )


def test_only_the_stale_family_is_named() -> None:
    mode = _mode(_metrics({"IPv4": 5.0, "IPv6": 600.0}, {"IPv4": 20.0, "IPv6": 45.0}, {}))
    assert len(mode.failed) == 1 and mode.failed[0].startswith("IPv6: a change queued 45s ago")


def test_a_family_that_never_synced_refuses_once_its_start_is_a_sync_period_old() -> None:
    """SyncLoop stamps the queued time at start; a kube-proxy whose transactions fail from the
    start has no last successful sync at all, and its /livez was marked healthy at start."""
    mode = _mode(_metrics({"IPv4": 5.0}, {"IPv4": 20.0, "IPv6": 31.0}, {"IPv6": 2.0}))
    assert mode.failed == (
        "IPv6: a change queued 31s ago is not synced (last successful sync: none yet; "
        "kube-proxy retries a failed sync every --sync-period, 30s by default): its nftables "
        "rules are stale",
    )


def test_a_change_waiting_its_first_attempt_and_an_idle_kube_proxy_confirm() -> None:
    # queued 3 s ago: within --min-sync-period plus the sync's own time
    assert _mode(
        _metrics({"IPv4": 50.0, "IPv6": 5.0}, {"IPv4": 3.0, "IPv6": 6.0}, {})
    ).nftables_confirmed
    # idle for 50 minutes (it re-syncs hourly), its last change synced: no failure
    idle = _mode(_metrics({"IPv4": 3000.0, "IPv6": 3000.0}, {"IPv4": 3100.0, "IPv6": 3100.0}, {}))
    assert idle.nftables_confirmed, idle.failed
    # old failures, synced since: the counter alone says nothing
    old = _mode(_metrics(BOTH, BOTH, {"IPv4": 7.0}))
    assert old.nftables_confirmed, old.failed


def test_failures_rising_between_the_two_reads_refuse_on_the_second() -> None:
    """A failed transaction queues nothing: only the counter moves."""
    first = _kp(_metrics(BOTH, BOTH, {"IPv6": 3.0}))
    again = _snap(_metrics(BOTH, BOTH, {"IPv4": 1.0, "IPv6": 3.0}))
    mode = classify(again, NOW).mode
    assert mode.nftables_confirmed  # each read alone confirms
    assert gate.recheck_refusal(first, again, mode) == (
        "refused: nftables mode is not confirmed (IPv4: "
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total rose from 0 to 1 between the "
        "gate's two reads: nftables transactions are failing); nothing was changed"
    )
    assert gate.failures_rising(first, again.kube_proxy, ["ipv6"]) == []
    steady = _snap(_metrics(BOTH, BOTH, {"IPv6": 3.0}))
    assert gate.recheck_refusal(first, steady, classify(steady, NOW).mode) is None


def test_the_reader_keeps_both_series_by_family() -> None:
    m = parse_metrics(_metrics(BOTH, {"IPv4": 9.0}, {"IPv4": 2.0, "IPv6": 4.0}).encode())
    assert m.sync_failures == {"ipv4": 2.0, "ipv6": 4.0}
    assert m.nftables_sync_failures == 6.0
    assert m.last_queued == {"ipv4": NOW - 9.0}
    assert m.last_sync == {"ipv4": NOW - 5.0, "ipv6": NOW - 5.0}
