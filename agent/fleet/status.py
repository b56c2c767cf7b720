"""The Prometheus side of the fleet commands: one consistent reading of every node, made of
a fixed number of instant queries at one evaluation time (independent of the fleet's size),
each aggregated by (cluster, node) so that an agent pod's restart (a new `pod`/`instance`
label) is one node, not two.

The gap check: `count_over_time((max by (cluster, node) (count_over_time(M[G])) > 0)[C:S])`
counts the steps S of a stretch C of the hold-down whose window G holds a sample; summed over
the stretches that make up the hold-down H and divided by the number of steps, 1 means no
gap. With S = G/2 a gap longer than 1.5 G is always seen, one shorter than G never. Its cost
grows with nodes x H (a subquery evaluates every step): one query over a day at 5,000 nodes
outlasts Prometheus' default 2-minute query timeout, so it is asked a stretch of at most
GAP_STRETCH at a time, each query bounded like any other.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from agent.fleet.eligibility import NodeData, Params, evaluate
from agent.fleet.prom import Labels, PromError, Prometheus

JOB = "ipvs-leftovers"
GAP_STRETCH = 3600.0  # seconds of the hold-down one gap query covers
M = "ipvs_leftovers_"
# Alerts the cleanup itself resolves: they do not pause a step.
RESOLVED_BY_CLEANUP = frozenset(
    {"IPVSLeftoversStale", "IPVSLeftoversIptablesModeChains", "IPVSLeftoversKubeIPVS0Stale"}
)


Key = tuple[str, str]  # (cluster, node)


class Refusal(Exception):
    """One line; `code` the exit code (docs/exit-codes.md)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _duration(seconds: float) -> str:
    return f"{max(int(seconds), 1)}s"


@dataclass(frozen=True)
class AgentPods:
    """Whose series the fleet reads: the pods of the agent's DaemonSet, by the target labels
    the PodMonitor and daemonset/plain give every target (`namespace`, `pod`). A target
    elsewhere relabelled to job="ipvs-leftovers" and some node's name (a PodMonitor in another
    namespace, a copied scrape config) is not read: taken with the others' `max`, it would make
    a node whose agent is down look fresh (docs/threat-model.md)."""

    namespace: str = "ipvs-leftovers"
    daemonset: str = "ipvs-leftovers"

    def selector(self) -> str:
        # a DaemonSet's pods are named NAME-xxxxx (generateName and five characters): not
        # NAME-cleanup-NODE-xxxxx, the cleanup Jobs' pods in the same namespace
        pods = _quote(re.escape(self.daemonset)) + "-[a-z0-9]{5}"
        return f'namespace="{_quote(self.namespace)}",pod=~"{pods}"'

    def __str__(self) -> str:
        return f"DaemonSet {self.namespace}/{self.daemonset}"


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
    agent: AgentPods,
) -> Reading:
    """Every node of the scoped cluster, from the series of `agent`'s pods only; Refusal
    (exit 4) on any Prometheus failure, an empty answer, or several clusters without a scope."""
    selector = f'job="{JOB}",{agent.selector()}'
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
        "foreign_max": f"max {by} (max_over_time({M}foreign_references{{{selector}}}[{H}]))",
        "stale": f"max {by} ({M}stale{{{selector}}})",
        "iptables_mode_chains": f"sum {by} ({M}iptables_mode_chains{{{selector}}})",
        "kube_ipvs0": f"max {by} ({M}kube_ipvs0_present{{{selector}}})",
    }
    values: dict[Key, dict[str, float]] = {}
    try:
        for name, expr in queries.items():
            for key, value in _by_node(prom.query(expr, at)):
                values.setdefault(key, {})[name] = value
        present = f"max {by} (count_over_time({confirmed}[{G}])) > 0"
        coverage, asked = _coverage(prom, at, hold_down, present, S)
    except PromError as exc:
        raise Refusal(str(exc), 4) from None
    for key, share in coverage.items():
        if key in values:
            values[key]["coverage"] = share
    if not any("up" in v for v in values.values()):
        where = f" of cluster {cluster!r}" if cluster is not None else ""
        raise Refusal(
            f"Prometheus has no {JOB} target{where} from the pods of {agent} (an empty answer)",
            4,
        )
    clusters = sorted({c for c, _ in values})
    if cluster is None and len(clusters) > 1:
        raise Refusal(
            f"Prometheus holds {len(clusters)} clusters ({', '.join(repr(c) for c in clusters)}):"
            " give --cluster",
            4,
        )
    scope = cluster if cluster is not None else clusters[0]
    nodes = {node: _node(c, node, v) for (c, node), v in sorted(values.items())}
    return Reading(at, scope, nodes, queries=len(queries) + asked)


def deleted_nodes(
    seen: dict[str, NodeData], known: set[str], params: Params, now: float
) -> list[str]:
    """The nodes Prometheus has history of and the API server no Node: deleted during the
    hold-down (the autoscaler, an upgrade: their series answer its range queries for hours),
    to be skipped. Refusal (exit 4) when such a node's agent is live (not failing `fresh`):
    those are the series of a node of another cluster, not of a deleted one."""
    unknown = sorted(set(seen) - known)
    live = [n for n in unknown if evaluate(seen[n], params, now).check != "fresh"]
    if live:
        more = f" and {len(live) - 3} more" if len(live) > 3 else ""
        raise Refusal(
            f"Prometheus knows node(s) the API server does not: {', '.join(live[:3])}{more} "
            "(another cluster's? give --cluster)",
            4,
        )
    return unknown


def _by_node(samples: list[tuple[Labels, float]]) -> Iterator[tuple[Key, float]]:
    for labels, value in samples:
        node = labels.get("node", "")
        if node:  # a target without the node label cannot be acted on
            yield (labels.get("cluster", ""), node), value


def stretches(at: float, hold_down: float) -> list[tuple[float, float]]:
    """(end, length) of the stretches of at most GAP_STRETCH that make up the hold-down,
    ending on a whole second (a subquery's steps are whole seconds: none is lost)."""
    out: list[tuple[float, float]] = []
    at = float(int(at))
    while hold_down > 0:
        length = min(hold_down, GAP_STRETCH)
        out.append((at, length))
        at, hold_down = at - length, hold_down - length
    return out


def _coverage(
    prom: Prometheus, at: float, hold_down: float, present: str, step: str
) -> tuple[dict[Key, float], int]:
    """Each node's share of the hold-down's steps at which `present` held, and the number of
    queries asked. Each stretch is (end - length, end]: a millisecond short of its length, as
    Prometheus 2 includes both ends of a range and 3 only the last, so that no step falls in
    two stretches in either."""
    steps, covered = 0.0, dict[Key, float]()
    parts = stretches(at, hold_down)
    for end, length in parts:
        span = f"[{int(length * 1000) - 1}ms:{step}]"
        steps += sum(v for _, v in prom.query(f"count_over_time(vector(1){span})", end))
        for key, value in _by_node(prom.query(f"count_over_time(({present}){span})", end)):
            covered[key] = covered.get(key, 0.0) + value
    return ({k: v / steps for k, v in covered.items()} if steps else {}), 2 * len(parts)


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
