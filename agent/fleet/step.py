"""`fleet step`: one step of the fleet's migration, decided from the cluster and Prometheus
alone (stateless; a CronJob running it every few minutes is the controller).

    take the Lease -> the agent's DaemonSet (image, namespace; refuse if it auto-cleans)
    -> Prometheus (refuse if unusable; pause on firing alerts)
    -> the nodes (skip one deleted from the API server; refuse on a live agent's node the API
       server does not know: another cluster's series)
    -> the fleet's Jobs: a failed one not acknowledged halts; a running one waits
    -> bake: every node whose Job completed is clean in samples newer than the completion
    -> the next wave: eligible nodes, not opted out, not being deleted, without a Job; its size
       1, 2, 4 ... (the Lease remembers it; back to 1 after a pause or halt), at most
       --max-concurrent, at most --max-per-zone per zone
    -> every Job of the wave created with dryRun=All first; any refusal creates nothing
    -> then for real; the Lease is released.

Every refusal and halt is one line (Refusal) with the exit code of docs/exit-codes.md.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.fleet import kube
from agent.fleet.eligibility import NO_SAMPLE_YET, NodeData, Params, clean_after, evaluate
from agent.fleet.prom import Prometheus
from agent.fleet.status import (
    AgentPods,
    Refusal,
    deleted_nodes,
    describe_alert,
    firing_alerts,
    read_fleet,
)
from agent.fleet.window import Window
from agent.job import NODE_LABEL, manifest

FLEET_LABEL = "ipvs-leftovers.io/fleet"  # on the Jobs fleet step creates: the Lease's name
WAVE_ANNOTATION = "ipvs-leftovers.io/wave"
ACK_ANNOTATION = "ipvs-leftovers.io/acknowledged"
SIZE_ANNOTATION = "ipvs-leftovers.io/next-wave-size"
OPT_OUT_LABEL = "ipvs-leftovers.io/skip"  # a node labelled so (any value) is never chosen
ZONE_LABEL = "topology.kubernetes.io/zone"
PAUSED, REFUSED = 3, 4
DELETED = "deleted (skipped): no Node in the API server"


@dataclass
class Options:
    params: Params
    cluster: str | None
    alert_filter: str | None  # --alert-filter-regexp: alert names that do not pause
    namespace: str | None
    lease: str = "ipvs-leftovers-fleet"
    lease_seconds: int = 600
    max_concurrent: int = 10
    max_per_zone: int = 0  # 0: no limit
    ack: tuple[str, ...] = ()
    apply: bool = False
    window: Window | None = None  # None: always (kured's default window)
    holder: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")


@dataclass
class Outcome:
    wave: int
    created: list[str]
    lines: list[str]
    api_calls: int
    queries: int
    in_window: bool = True  # False: the window closed before the Jobs were made


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.timestamp()
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


class Kube:
    """The API calls of a step, through the official client; each counted."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self.api = api
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.calls = 0

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        self.calls += 1
        try:
            return kube.call(what, fn, *args, **kw)
        except kube.KubeError as exc:
            raise Refusal(str(exc), REFUSED) from None

    def serialize(self, obj: Any) -> Any:
        return self.api.sanitize_for_serialization(obj)


def outside(o: Options, now: float) -> str | None:
    """The one line when `now` is outside the maintenance window; None inside it."""
    if o.window is None or o.window.contains(dt.datetime.fromtimestamp(now, dt.UTC)):
        return None
    return f"outside the maintenance window ({o.window}): nothing read, nothing created"


def _take_lease(k: Kube, ns: str, o: Options) -> tuple[dict[str, Any], int]:
    """The Lease, now ours; and the next wave's size it remembers. PAUSED when held."""
    from kubernetes.client.exceptions import ApiException

    now = _now()
    k.calls += 1
    try:
        lease = k.serialize(
            k.coord.read_namespaced_lease(o.lease, ns, _request_timeout=kube.REQUEST_TIMEOUT)
        )
    except ApiException as exc:
        if exc.status != 404:
            raise Refusal(
                str(kube.describe(exc, f"reading Lease {ns}/{o.lease}")), REFUSED
            ) from None
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": o.lease, "namespace": ns, "annotations": {SIZE_ANNOTATION: "1"}},
            "spec": {
                "holderIdentity": o.holder,
                "leaseDurationSeconds": o.lease_seconds,
                "acquireTime": now.isoformat(),
                "renewTime": now.isoformat(),
            },
        }
        lease = k.serialize(
            k.call(f"creating Lease {ns}/{o.lease}", k.coord.create_namespaced_lease, ns, body)
        )
        return lease, 1
    except Exception as exc:  # noqa: BLE001 - urllib3 errors
        raise Refusal(str(kube.describe(exc, f"reading Lease {ns}/{o.lease}")), REFUSED) from None
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    renewed = _ts(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds") or 0
    if holder and holder != o.holder and renewed and renewed + duration > now.timestamp():
        raise Refusal(
            f"Lease {ns}/{o.lease} is held by {holder} until "
            f"{dt.datetime.fromtimestamp(renewed + duration, dt.UTC):%H:%M:%SZ}",
            PAUSED,
        )
    spec.update(
        holderIdentity=o.holder,
        leaseDurationSeconds=o.lease_seconds,
        acquireTime=now.isoformat(),
        renewTime=now.isoformat(),
    )
    lease["spec"] = spec
    # resourceVersion: a step that took it meanwhile makes this a 409, and we stop
    lease = k.serialize(
        k.call(f"taking Lease {ns}/{o.lease}", k.coord.replace_namespaced_lease, o.lease, ns, lease)
    )
    try:
        size = int((lease["metadata"].get("annotations") or {}).get(SIZE_ANNOTATION, "1"))
    except ValueError:
        size = 1
    return lease, max(size, 1)


def _renew(k: Kube, ns: str, o: Options, lease: dict[str, Any]) -> None:
    """The Lease renewed right before the Jobs are made, from the version this step took.

    Reading the fleet can outlast the Lease (a query per hour of the hold-down, each up to
    --prometheus-timeout): another step may have taken the expired Lease meanwhile, and two
    steps would create one wave twice. The API server answers 409 to a replace from a stale
    resourceVersion, so this refuses instead, having created nothing."""
    lease["spec"]["renewTime"] = _now().isoformat()
    try:
        renewed = k.serialize(
            kube.call(
                f"renewing Lease {ns}/{o.lease}",
                k.coord.replace_namespaced_lease,
                o.lease,
                ns,
                lease,
            )
        )
    except kube.KubeError as exc:
        if exc.status == 409:
            raise Refusal(
                f"Lease {ns}/{o.lease} changed while this step read the fleet (another step "
                "took it after it expired); no Job created",
                PAUSED,
            ) from None
        raise Refusal(str(exc), REFUSED) from None
    finally:
        k.calls += 1
    lease.clear()
    lease.update(renewed)


def _release(k: Kube, ns: str, o: Options, lease: dict[str, Any], size: int) -> None:
    lease["metadata"].setdefault("annotations", {})[SIZE_ANNOTATION] = str(size)
    lease["spec"]["holderIdentity"] = None
    k.call(f"releasing Lease {ns}/{o.lease}", k.coord.replace_namespaced_lease, o.lease, ns, lease)


def _job_state(job: dict[str, Any]) -> tuple[str, float | None]:
    """running | complete | failed, and when it finished."""
    status = job.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") == "Complete":
            return "complete", _ts(status.get("completionTime") or c.get("lastTransitionTime"))
        if c.get("type") == "Failed":
            return "failed", _ts(c.get("lastTransitionTime"))
    return "running", None


def _node_of(job: dict[str, Any]) -> str:
    meta = job.get("metadata") or {}
    return str(
        (meta.get("annotations") or {}).get(NODE_LABEL)
        or (meta.get("labels") or {}).get(NODE_LABEL, "")
    )


def step(prom: Prometheus, api: Any, o: Options, now: float) -> Outcome:
    """Raises Refusal (PAUSED or REFUSED) having created no Job."""
    k = Kube(api)
    lines: list[str] = []
    k.calls += 1
    try:
        ds = kube.agent_daemonset(api, o.namespace)
    except kube.KubeError as exc:
        raise Refusal(f"the agent's DaemonSet: {exc}", REFUSED) from None
    if ds.auto_cleanup:
        raise Refusal(
            f"DaemonSet {ds.namespace}/{ds.name} runs --auto-cleanup: two actors would clean "
            "one fleet (turn one off)",
            REFUSED,
        )
    ns = ds.namespace
    lease: dict[str, Any] | None = None
    size = 1
    if o.apply:
        lease, size = _take_lease(k, ns, o)
    try:
        return _step(prom, k, o, now, AgentPods(ns, ds.name), ds, lines, size, lease)
    except Refusal as exc:
        if lease is not None and not str(exc).startswith(f"Lease {ns}/"):
            # any pause or halt: the next wave is 1 again
            _release(k, ns, o, lease, 1 if exc.code == PAUSED else size)
        raise


def _step(
    prom: Prometheus,
    k: Kube,
    o: Options,
    now: float,
    agent: AgentPods,
    ds: kube.AgentDaemonSet,
    lines: list[str],
    size: int,
    lease: dict[str, Any] | None,
) -> Outcome:
    ns = agent.namespace
    reading = read_fleet(prom, now, o.cluster, o.params.hold_down, o.params.max_gap, agent)
    _pause_on_alerts(prom, reading.cluster, o)
    nodes = _known_nodes(k, reading.nodes, o, now, lines)
    by_node, wave = _fleet_jobs(k, ns, o)
    # acknowledgements first: they are the operator's answer to an earlier halt
    _acknowledge(k, ns, o, by_node, lines)
    running, baking = _unfinished(
        _on_nodes(by_node, nodes, reading.nodes, lines), reading.nodes, now
    )
    if running or baking:
        if running:
            lines.append(f"wave {wave}: {len(running)} Job(s) still running ({', '.join(running)})")
        if baking:
            lines.append(f"wave {wave}: no sample yet since the Job on {', '.join(baking)}")
        if lease is not None:
            _release(k, ns, o, lease, size)
        return Outcome(wave, [], lines, k.calls, reading.queries)
    chosen = _choose(reading.nodes, nodes, by_node, o, now, min(size, o.max_concurrent), lines)
    if not chosen:
        lines.append("nothing to do: no eligible node without a Job")
        if lease is not None:
            _release(k, ns, o, lease, size)
        return Outcome(wave, [], lines, k.calls, reading.queries)
    wave += 1
    bodies = _wave_jobs(chosen, ds, o, wave)
    if outside(o, _now().timestamp()):
        # reading the fleet can take minutes: a window that closed meanwhile creates nothing
        lines.append(f"the maintenance window ({o.window}) closed while this step read the "
                     f"fleet: wave {wave} not created")  # fmt: skip
        if lease is not None:
            _release(k, ns, o, lease, size)
        return Outcome(wave - 1, [], lines, k.calls, reading.queries, in_window=False)
    if not o.apply:
        lines += [f"would create wave {wave}: {', '.join(chosen)}"]
        return Outcome(wave, [], lines, k.calls, reading.queries)
    if lease is None:
        # step() takes the Lease whenever o.apply; creating a wave without holding it would let
        # two steps create the same wave, so stop before any Job exists
        raise RuntimeError(f"fleet step: about to create wave {wave} without Lease {ns}/{o.lease}")
    _renew(k, ns, o, lease)
    created = _create(k, ns, bodies)
    lines.append(f"wave {wave}: created {len(created)} Job(s): {', '.join(created)}")
    _release(k, ns, o, lease, min(size * 2, o.max_concurrent))
    return Outcome(wave, created, lines, k.calls, reading.queries)


def _pause_on_alerts(prom: Prometheus, cluster: str | None, o: Options) -> None:
    """PAUSED while an alert not ignored fires for the cluster."""
    alerts = firing_alerts(prom, cluster, o.alert_filter)
    if alerts:
        names = ", ".join(sorted({describe_alert(a) for a in alerts}))
        raise Refusal(f"paused: {len(alerts)} alert(s) firing: {names}", PAUSED)


def _known_nodes(
    k: Kube, seen: dict[str, NodeData], o: Options, now: float, lines: list[str]
) -> dict[str, dict[str, Any]]:
    """The API server's Nodes by name; a deleted node Prometheus still has history of is
    reported and skipped, a live agent's node the API server does not know refuses."""
    nodes = {
        n["metadata"]["name"]: n
        for n in k.serialize(k.call("listing Nodes", k.core.list_node)).get("items", [])
    }
    lines += [f"{n}: {DELETED}" for n in deleted_nodes(seen, set(nodes), o.params, now)]
    return nodes


def _fleet_jobs(k: Kube, ns: str, o: Options) -> tuple[dict[str, dict[str, Any]], int]:
    """The fleet's Jobs by node, and the last wave they record (0 before the first)."""
    jobs = k.serialize(
        k.call(
            f"listing the fleet's Jobs in {ns}",
            k.batch.list_namespaced_job,
            ns,
            label_selector=f"{FLEET_LABEL}={o.lease}",
        )
    ).get("items", [])
    by_node: dict[str, dict[str, Any]] = {}
    waves = [0]
    for job in jobs:
        by_node[_node_of(job)] = job
        with contextlib.suppress(ValueError):
            waves.append(int((job["metadata"].get("annotations") or {}).get(WAVE_ANNOTATION, 0)))
    return by_node, max(waves)


def _acknowledge(
    k: Kube, ns: str, o: Options, by_node: dict[str, dict[str, Any]], lines: list[str]
) -> None:
    """Mark each --ack node's failed Job acknowledged (annotated only with --apply)."""
    for node in o.ack:
        job = by_node.get(node)
        if job is None or _job_state(job)[0] != "failed":
            raise Refusal(f"--ack {node}: no failed fleet Job for that node", REFUSED)
        if o.apply:
            patch = {"metadata": {"annotations": {ACK_ANNOTATION: "true"}}}
            name = job["metadata"]["name"]
            k.call(f"acknowledging Job {ns}/{name}", k.batch.patch_namespaced_job, name, ns, patch)
        # without --apply too: the plan shown is the one --apply would follow
        job["metadata"].setdefault("annotations", {})[ACK_ANNOTATION] = "true"
        lines.append(f"{node}: failed Job acknowledged; fleet step will not retry it")


def _on_nodes(
    by_node: dict[str, dict[str, Any]],
    nodes: dict[str, Any],
    seen: dict[str, NodeData],
    lines: list[str],
) -> dict[str, dict[str, Any]]:
    """The Jobs of nodes that still exist: a deleted node's Job never finishes (its Pod has no
    node to run on) and its node is never sampled again, so it must not hold the waves."""
    gone = sorted(set(by_node) - set(nodes))
    lines += [f"{n}: {DELETED}" for n in gone if n not in seen]  # else reported already
    return {n: job for n, job in by_node.items() if n in nodes}


def _unfinished(
    by_node: dict[str, dict[str, Any]], seen: dict[str, NodeData], now: float
) -> tuple[list[str], list[str]]:
    """Nodes whose Job still runs, and nodes whose Job completed but have no sample since.
    PAUSED (halted) on a failed Job not acknowledged, or a completed one that left the node
    not clean."""
    running, failed, baking = [], [], []
    for node, job in sorted(by_node.items()):
        state, finished = _job_state(job)
        acked = (job["metadata"].get("annotations") or {}).get(ACK_ANNOTATION) == "true"
        if state == "running":
            running.append(node)
        elif state == "failed" and not acked:
            failed.append(node)
        elif state == "complete":
            data = seen.get(node)
            why = "not in Prometheus" if data is None else clean_after(data, finished or now)
            if why == NO_SAMPLE_YET:
                baking.append(node)  # not a verdict yet: wait for the next scrape
            elif why:
                raise Refusal(f"halted: {node}, cleaned in wave {_wave(job)}: {why}", PAUSED)
    if failed:
        raise Refusal(
            f"halted: the cleanup Job failed on {', '.join(failed)} (read its log, then "
            "--ack NODE)",
            PAUSED,
        )
    return running, baking


def _wave_jobs(
    chosen: list[str], ds: kube.AgentDaemonSet, o: Options, wave: int
) -> list[tuple[str, dict[str, Any]]]:
    """Each chosen node's cleanup Job (the agent's image and ServiceAccount), labelled as the
    fleet's and annotated with its wave."""
    bodies = []
    for node in chosen:
        job = manifest(node, ds.image, ds.namespace, apply=True, service_account=ds.service_account)
        job["metadata"]["labels"][FLEET_LABEL] = o.lease
        job["metadata"].setdefault("annotations", {})[WAVE_ANNOTATION] = str(wave)
        bodies.append((node, job))
    return bodies


def _create(k: Kube, ns: str, bodies: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Every Job through admission first (dryRun=All), so a refusal creates nothing; then for
    real. The nodes whose Job was created."""
    for node, job in bodies:
        k.call(
            f"admission of the Job for {node} (dryRun=All)",
            k.batch.create_namespaced_job,
            ns,
            job,
            dry_run="All",
        )
    created = []
    for node, job in bodies:
        k.call(f"creating the Job for {node}", k.batch.create_namespaced_job, ns, job)
        created.append(node)
    return created


def _wave(job: dict[str, Any]) -> str:
    return str((job["metadata"].get("annotations") or {}).get(WAVE_ANNOTATION, "?"))


def _choose(
    data: dict[str, NodeData],
    nodes: dict[str, Any],
    jobs: dict[str, Any],
    o: Options,
    now: float,
    size: int,
    lines: list[str],
) -> list[str]:
    per_zone: dict[str, int] = {}
    chosen: list[str] = []
    for name in sorted(data):
        if len(chosen) >= size:
            break
        if name in jobs or name not in nodes or not evaluate(data[name], o.params, now).eligible:
            continue
        meta = nodes[name].get("metadata") or {}
        labels = meta.get("labels") or {}
        if OPT_OUT_LABEL in labels:
            lines.append(f"{name}: opted out ({OPT_OUT_LABEL})")
            continue
        if meta.get("deletionTimestamp"):
            lines.append(f"{name}: being deleted")
            continue
        zone = labels.get(ZONE_LABEL, "")
        if o.max_per_zone and per_zone.get(zone, 0) >= o.max_per_zone:
            continue
        per_zone[zone] = per_zone.get(zone, 0) + 1
        chosen.append(name)
    return chosen
