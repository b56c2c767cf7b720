"""Which nodes may be cleaned, from what Prometheus holds about them (pure: plain data in,
verdicts out; agent/fleet/status.py asks Prometheus for the data).

A node is eligible when, scoped to one `cluster`, in this order (the first check it fails is
what `fleet status` prints):

1. `fresh`       its agent's latest sample is at most `freshness` old, and its target is up;
2. `sources`     every source the agent reads was read (`ipvs_leftovers_source_up`);
3. `kube-proxy`  kube-proxy reports itself healthy (`ipvs_leftovers_kube_proxy_healthy`);
4. `confirmed`   nftables mode was confirmed on every sample of the hold-down (the minimum of
                 `ipvs_leftovers_nftables_mode_confirmed` over it is 1) and is now;
5. `no-gap`      samples cover the whole hold-down: every window of `max_gap` in it holds one
                 (Prometheus counts them, see status.py);
6. `foreign`     no foreign references at any sample of the hold-down
                 (`ipvs_leftovers_foreign_references`, whose absence fails the check);
7. `leftovers`   there is something to clean now (`stale`, or iptables-mode chains).

A value Prometheus does not have fails its check: nothing is assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_SAMPLE_YET = "no sample since its Job completed"
CHECKS = ("fresh", "sources", "kube-proxy", "confirmed", "no-gap", "foreign", "leftovers")


@dataclass(frozen=True)
class Params:
    hold_down: float  # seconds
    max_gap: float
    freshness: float


@dataclass(frozen=True)
class NodeData:
    """What Prometheus holds about one (cluster, node); None where it has nothing."""

    cluster: str
    node: str
    up: float | None = None
    last_sample: float | None = None  # timestamp of the latest nftables_mode_confirmed sample
    sources_min: float | None = None
    healthy: float | None = None
    confirmed_now: float | None = None
    confirmed_min: float | None = None  # over the hold-down
    coverage: float | None = None  # share of the hold-down's windows holding a sample
    foreign_max: float | None = None  # over the hold-down
    stale: float | None = None
    iptables_mode_chains: float | None = None
    kube_ipvs0: float | None = None


@dataclass(frozen=True)
class Verdict:
    cluster: str
    node: str
    eligible: bool
    check: str  # the first check failed; "" when eligible
    why: str

    @property
    def clean(self) -> bool:
        """Passed everything but has nothing to clean."""
        return self.check == "leftovers"


def _age(now: float, t: float | None) -> str:
    return "never" if t is None else f"{now - t:.0f}s ago"


def evaluate(d: NodeData, p: Params, now: float) -> Verdict:
    def no(check: str, why: str) -> Verdict:
        return Verdict(d.cluster, d.node, False, check, why)

    if d.up != 1:
        return no("fresh", "its agent's target is down" if d.up == 0 else "no agent target")
    if d.last_sample is None or now - d.last_sample > p.freshness:
        return no("fresh", f"latest sample {_age(now, d.last_sample)} (>{p.freshness:.0f}s)")
    if d.sources_min != 1:
        return no("sources", "a source could not be read" if d.sources_min == 0 else "unknown")
    if d.healthy != 1:
        return no(
            "kube-proxy",
            "kube-proxy reports itself unhealthy" if d.healthy == 0 else "kube-proxy unreachable",
        )
    if d.confirmed_now != 1 or d.confirmed_min != 1:
        return no("confirmed", "nftables mode not confirmed on every sample of the hold-down")
    if d.coverage is None or d.coverage < 1:
        share = "no" if d.coverage is None else f"{d.coverage:.1%} of the"
        return no("no-gap", f"samples in {share} hold-down's {p.max_gap:.0f}s windows")
    if d.foreign_max is None:
        return no("foreign", "foreign references unknown (agent too old, or not read)")
    if d.foreign_max > 0:
        return no("foreign", f"{d.foreign_max:.0f} foreign references during the hold-down")
    if d.stale != 1 and not (d.iptables_mode_chains or 0) > 0:
        return no("leftovers", "nothing to clean")
    return Verdict(d.cluster, d.node, True, "", "eligible")


def clean_after(d: NodeData, since: float) -> str:
    """Why a node cleaned at `since` is not (yet) shown clean by samples newer than that;
    "" when it is: no leftovers, no kube-ipvs0, kube-proxy healthy (the bake)."""
    if d.last_sample is None or d.last_sample <= since:
        return NO_SAMPLE_YET
    if d.healthy != 1:
        return "kube-proxy not healthy"
    if d.stale != 0:
        return "leftovers still reported" if d.stale == 1 else "stale unknown"
    if (d.iptables_mode_chains or 0) > 0:
        return "iptables-mode chains still reported"
    if d.kube_ipvs0 != 0:
        return "kube-ipvs0 still present" if d.kube_ipvs0 == 1 else "kube-ipvs0 unknown"
    if d.confirmed_now != 1:
        return "nftables mode no longer confirmed"
    return ""
