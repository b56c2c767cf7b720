"""The Prometheus side of the fleet commands: one consistent reading of every node, made of
a fixed number of instant queries at one evaluation time (independent of the fleet's size),
each aggregated by (cluster, node) so that an agent pod's restart (a new `pod`/`instance`
label) is one node, not two.

The gap check: `count_over_time((max by (cluster, node) (count_over_time(M[G])) > 0)[H:S])`
counts the steps S of the hold-down H whose window G holds a sample; divided by the number of
steps, 1 means no gap. With S = G/2 a gap longer than 1.5 G is always seen, one shorter than G
never.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from agent.fleet.eligibility import NodeData
from agent.fleet.prom import Labels, PromError, Prometheus

JOB = "ipvs-leftovers"
M = "ipvs_leftovers_"
# Alerts the cleanup itself resolves: they do not pause a step.
RESOLVED_BY_CLEANUP = frozenset(
    {"IPVSLeftoversStale", "IPVSLeftoversIptablesModeChains", "IPVSLeftoversKubeIPVS0Stale"}
)


class Refusal(Exception):
    """One line; `code` the exit code (docs/exit-codes.md)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _duration(seconds: float) -> str:
    return f"{max(int(seconds), 1)}s"


@dataclass
class Reading:
    at: float
    cluster: str | None  # the cluster scoped to ("" when targets have no cluster label)
    nodes: dict[str, NodeData]
    queries: int = 0
    firing: list[Labels] = field(default_factory=list)


def read_fleet(
    prom: Prometheus,
    at: float,
    cluster: str | None,
    hold_down: float,
    max_gap: float,
) -> Reading:
    """Every node of the scoped cluster; Refusal (exit 4) on any Prometheus failure, an empty
    answer, or several clusters without a scope."""
    selector = f'job="{JOB}"'
    if cluster is not None:
        selector += f',cluster="{_quote(cluster)}"'
    by = "by (cluster, node)"
    H, G = _duration(hold_down), _duration(max_gap)
    S = _duration(max(max_gap / 2, 1))
    confirmed = f"{M}nftables_mode_confirmed{{{selector}}}"
    queries: dict[str, str] = {
        "up": f"max {by} (up{{{selector}}})",
        "last_sample": f"max {by} (timestamp({confirmed}))",
        "sources_min": f"min {by} ({M}source_up{{{selector}}})",
        "healthy": f"min {by} ({M}kube_proxy_healthy{{{selector}}})",
        "confirmed_now": f"min {by} ({confirmed})",
        "confirmed_min": f"min {by} (min_over_time({confirmed}[{H}]))",
        "coverage": (
            f"count_over_time((max {by} (count_over_time({confirmed}[{G}])) > 0)[{H}:{S}])"
            f" / scalar(count_over_time(vector(1)[{H}:{S}]))"
        ),
        "foreign_max": f"max {by} (max_over_time({M}foreign_references{{{selector}}}[{H}]))",
        "stale": f"max {by} ({M}stale{{{selector}}})",
        "iptables_mode_chains": f"sum {by} ({M}iptables_mode_chains{{{selector}}})",
        "kube_ipvs0": f"max {by} ({M}kube_ipvs0_present{{{selector}}})",
    }
    values: dict[tuple[str, str], dict[str, float]] = {}
    try:
        for name, expr in queries.items():
            for labels, value in prom.query(expr, at):
                node = labels.get("node", "")
                if not node:
                    continue  # a target without the node label cannot be acted on
                values.setdefault((labels.get("cluster", ""), node), {})[name] = value
    except PromError as exc:
        raise Refusal(str(exc), 4) from None
    if not any("up" in v for v in values.values()):
        where = f" of cluster {cluster!r}" if cluster is not None else ""
        raise Refusal(f"Prometheus has no {JOB} target{where} (an empty answer)", 4)
    clusters = sorted({c for c, _ in values})
    if cluster is None and len(clusters) > 1:
        raise Refusal(
            f"Prometheus holds {len(clusters)} clusters ({', '.join(repr(c) for c in clusters)}):"
            " give --cluster",
            4,
        )
    scope = cluster if cluster is not None else clusters[0]
    nodes = {node: _node(c, node, v) for (c, node), v in sorted(values.items())}
    return Reading(at, scope, nodes, queries=len(queries))


def _node(cluster: str, node: str, values: dict[str, float]) -> NodeData:
    data: dict[str, Any] = dict(values)
    return replace(NodeData(cluster, node), **data)


def firing_alerts(prom: Prometheus, cluster: str | None, ignore: str | None) -> list[Labels]:
    """Alerts that pause a step: every firing alert but those the cleanup resolves, those
    matching `ignore` (a regular expression on the whole alert name), and those labelled with
    another cluster. Refusal (exit 4) when Prometheus does not answer."""
    try:
        firing = prom.firing_alerts()
    except PromError as exc:
        raise Refusal(str(exc), 4) from None
    pattern = re.compile(ignore) if ignore else None
    out = []
    for a in firing:
        name = a.get("alertname", "")
        if name in RESOLVED_BY_CLEANUP or (pattern and pattern.fullmatch(name)):
            continue
        if cluster is not None and a.get("cluster", cluster) != cluster:
            continue
        out.append(a)
    return out


def describe_alert(a: dict[str, Any]) -> str:
    where = a.get("node") or a.get("instance") or ""
    return f"{a.get('alertname', '?')}{' on ' + where if where else ''}"
