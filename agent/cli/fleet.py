"""`fleet status` and `fleet step`: migrate a whole fleet from what Prometheus sees.

Run off the node (a workstation, or a CronJob: docs/operations.md). One-shot, stateless and
idempotent: each run reads Prometheus and the API server again. The Kubernetes client is the
[fleet] extra, imported only by `fleet step` and `job-manifest`'s lookup.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import click

from agent.cli import common
from agent.cli.options import Duration


def _regexp(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A regular expression Python can compile, or a usage error (exit 2)."""
    if value is None:
        return None
    try:
        re.compile(value)
    except re.error as exc:
        raise click.BadParameter(f"{value!r} is not a regular expression ({exc})") from None
    return value


def alert_filter(kw: dict[str, Any]) -> str | None:
    """--alert-filter-regexp, or its old name --ignore-alerts; both, differing: usage error."""
    new: str | None = kw.pop("alert_filter")
    old: str | None = kw.pop("ignore_alerts")
    if new is not None and old is not None and new != old:
        raise click.UsageError(
            "--ignore-alerts is the old name of --alert-filter-regexp: give one of them"
        )
    return new if new is not None else old


def prometheus_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options every fleet command shares, in the order --help lists them."""
    for option in reversed(_prometheus_connection_options() + _reading_options()):
        f = option(f)
    return f


def _prometheus_connection_options() -> list[Callable[..., Any]]:
    """Where Prometheus is, how to reach it, and which cluster of its data to read."""
    # built on each call: each command gets its own Option objects
    return [
        click.option(
            "--prometheus-url",
            required=True,
            help="The Prometheus HTTP API, e.g. http://prometheus-operated.monitoring:9090.",
        ),
        click.option(
            "--bearer-token-file",
            type=click.Path(dir_okay=False),
            help="Sent as 'Authorization: Bearer', read on every request (tokens rotate).",
        ),
        click.option(
            "--ca-file",
            type=click.Path(exists=True, dir_okay=False),
            help="CA bundle for an https Prometheus (default: the system's).",
        ),
        click.option(
            "--prometheus-timeout",
            type=Duration(least=1),
            default="30s",
            show_default=True,
            help="Each query's deadline; past it the command refuses (exit 4).",
        ),
        click.option(
            "--cluster",
            default=None,
            help="The `cluster` label value to act on; required when Prometheus holds several.",
        ),
    ]


def _reading_options() -> list[Callable[..., Any]]:
    """How the samples are judged (hold-down, gaps, freshness, alerts) and how it is shown."""
    return [
        click.option(
            "--hold-down",
            type=Duration(least=60),
            default="24h",
            show_default=True,
            help="How long nftables mode must have been confirmed, without a gap.",
        ),
        click.option(
            "--max-gap",
            type=Duration(least=10),
            default="2m",
            show_default=True,
            help="Longest time without a sample that is not a gap (a gap over 1.5x this "
            "always counts).",
        ),
        click.option(
            "--freshness",
            type=Duration(least=10),
            default="2m",
            show_default=True,
            help="How recent a node's latest sample must be.",
        ),
        click.option(
            "--alert-filter-regexp",
            "alert_filter",
            default=None,
            callback=_regexp,
            help="Alert names that do not pause (kured's option): a regular expression the "
            "whole name must match, e.g. 'Watchdog|InfoInhibitor'.",
        ),
        # the option's first name, kept working: the same value, hidden from --help
        click.option(
            "--ignore-alerts",
            "ignore_alerts",
            default=None,
            callback=_regexp,
            hidden=True,
            expose_value=True,
        ),  # fmt: skip
        click.option("--json", "as_json", is_flag=True, help="One JSON document."),
    ]


def _window_value(parse: Callable[[str], Any]) -> Callable[..., Any]:
    """A click callback: the value parsed, or a usage error (exit 2) with parse's one line."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        from agent.fleet.window import WindowError

        if value is None:
            return None
        try:
            return parse(value)
        except WindowError as exc:
            raise click.BadParameter(str(exc)) from None

    return callback


def window_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """kured's maintenance window: its option names, defaults and semantics
    (agent/fleet/window.py)."""
    from agent.fleet import window as w

    options = [
        click.option(
            "--start-time",
            default="00:00",
            show_default=True,
            callback=_window_value(w.parse_time),
            help="The window opens (HH:MM, in --time-zone). Before --end-time, or after it "
            "for a window across midnight (22:00 to 04:00).",
        ),
        click.option(
            "--end-time",
            default="23:59:59",
            show_default=True,
            callback=_window_value(w.parse_time),
            help="The window closes (HH:MM[:SS], that minute or second included).",
        ),
        click.option(
            "--days",
            default=None,
            metavar="DAYS",
            callback=_window_value(w.parse_days),
            help="The days the window opens on, comma-separated: mon,tue,wed,thu,fri,sat,sun "
            "(kured's --reboot-days). Default: every day.",
        ),
        click.option(
            "--time-zone",
            default="UTC",
            show_default=True,
            callback=_window_value(w.parse_zone),
            help="The IANA time zone of the window (Europe/Berlin).",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def window_of(kw: dict[str, Any]) -> Any:
    """The maintenance window of the parsed options (each already checked)."""
    from agent.fleet.window import EVERY_DAY, Window

    days = kw.pop("days")
    return Window(
        kw.pop("start_time"), kw.pop("end_time"), EVERY_DAY if days is None else days,
        kw.pop("time_zone"),
    )  # fmt: skip


@click.group()
def fleet() -> None:
    """Migrate a fleet from what Prometheus sees: status, then step by step.

    Exit codes (docs/exit-codes.md): 0 done (also: outside the maintenance window), 3 paused
    or halted (firing alerts, a failed Job not acknowledged, a node not clean after its Job,
    the Lease held elsewhere: nothing created), 4 refused (Prometheus or the API unusable, an
    ambiguous scope, a node the API server does not know whose agent is live, two actors,
    admission: nothing created)."""


def _prometheus(kw: dict[str, Any]) -> Any:
    from agent.fleet.prom import PromError, Prometheus

    try:
        return Prometheus(
            kw["prometheus_url"],
            kw["bearer_token_file"],
            kw["ca_file"],
            kw["prometheus_timeout"],
        )
    except PromError as exc:
        raise click.BadParameter(str(exc), param_hint="--prometheus-url") from None


@fleet.command()
@prometheus_options
@click.option(
    "--namespace",
    default="ipvs-leftovers",
    show_default=True,
    help="The agent's namespace: only its pods' series are read (`fleet step` asks the API).",
)
@click.option(
    "--daemonset",
    default="ipvs-leftovers",
    show_default=True,
    help="The agent's DaemonSet: only its pods' series (`pod` NAME-xxxxx) are read.",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also list the Nodes (needs the fleet extra): a node Prometheus has history of and "
    "the API server no Node is shown deleted, as `fleet step` skips it.",
)
@click.option("--context", default=None, help="The kubeconfig context (with --kubeconfig).")
def status(**kw: Any) -> None:
    """Each node of the cluster, eligible or the first check it fails."""
    from agent import exitcodes
    from agent.fleet.eligibility import Params, Verdict, evaluate
    from agent.fleet.status import AgentPods, Refusal, describe_alert, firing_alerts, read_fleet

    ignored = alert_filter(kw)
    prom = _prometheus(kw)
    at = time.time()
    params = Params(kw["hold_down"], kw["max_gap"], kw["freshness"])
    agent = AgentPods(kw["namespace"], kw["daemonset"])
    try:
        reading = read_fleet(prom, at, kw["cluster"], params.hold_down, params.max_gap, agent)
        deleted = _deleted(kw, reading.nodes, params, at)
        alerts = firing_alerts(prom, reading.cluster, ignored)
    except Refusal as exc:
        common.fail(f"fleet status refused: {exc}", exc.code)
    verdicts = [
        Verdict(d.cluster, d.node, False, "deleted", "no Node in the API server")
        if d.node in deleted
        else evaluate(d, params, at)
        for d in reading.nodes.values()
    ]
    if kw["as_json"]:
        doc = {
            "cluster": reading.cluster,
            "time": at,
            "nodes": [
                {"node": v.node, "eligible": v.eligible, "check": v.check, "why": v.why}
                for v in verdicts
            ],
            "firing_alerts": [describe_alert(a) for a in alerts],
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        _print_status(verdicts, reading.cluster)
    if alerts:
        names = ", ".join(sorted({describe_alert(a) for a in alerts}))
        common.fail(f"paused: {len(alerts)} alert(s) firing: {names}", exitcodes.REFUSED)


def _deleted(kw: dict[str, Any], seen: dict[str, Any], params: Any, at: float) -> list[str]:
    """With --kubeconfig or --context: the nodes deleted from the API server (Refusal, exit 4,
    when the API cannot be read or a live agent's node is unknown to it)."""
    if kw["kubeconfig"] is None and kw["context"] is None:
        return []
    from agent.fleet import kube
    from agent.fleet.status import Refusal, deleted_nodes

    try:
        known = kube.node_names(kube.api_client(kw["kubeconfig"], kw["context"]))
    except kube.KubeError as exc:
        raise Refusal(str(exc), 4) from None
    return deleted_nodes(seen, known, params, at)


def _print_status(verdicts: list[Any], cluster: str | None) -> None:
    width = max((len(v.node) for v in verdicts), default=4)
    counts = {"eligible": 0, "clean": 0, "waiting": 0, "deleted": 0}
    for v in verdicts:
        state = "eligible" if v.eligible else ("clean" if v.clean else "waiting")
        counts["deleted" if v.check == "deleted" else state] += 1
        detail = "" if v.eligible else f"  {v.check}: {v.why}"
        if v.check == "deleted":  # as fleet step prints it
            state, detail = "deleted", f"(skipped): {v.why}"
        click.echo(f"{v.node:<{width}}  {state:<8}{detail}")
    scope = f"cluster {cluster!r}" if cluster else "the fleet"
    click.echo(
        f"{scope}: {len(verdicts)} nodes, {counts['eligible']} eligible, {counts['clean']} clean, "
        f"{counts['waiting']} waiting"
        + (f", {counts['deleted']} deleted" if counts["deleted"] else "")
    )


@fleet.command()
@prometheus_options
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="Default: $KUBECONFIG, ~/.kube/config, or in-cluster.",
)
@click.option("--context", default=None, help="The kubeconfig context.")
@click.option(
    "--namespace", default=None, help="The agent's namespace (default: wherever its DaemonSet is)."
)
@click.option(
    "--lease",
    default="ipvs-leftovers-fleet",
    show_default=True,
    help="The Lease that keeps two steps apart; also labels the Jobs.",
)
@click.option(
    "--max-concurrent",
    type=click.IntRange(min=1, max=1000),
    default=10,
    show_default=True,
    help="The largest wave (waves grow 1, 2, 4 ... up to it).",
)
@click.option(
    "--max-per-zone",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="At most this many nodes of one topology.kubernetes.io/zone in a wave (0: no limit).",
)
@click.option(
    "--ack",
    multiple=True,
    metavar="NODE",
    help="Acknowledge the failed Job of NODE (repeatable): the halt ends, the node "
    "is not retried by fleet step.",
)
@window_options
@click.option(
    "--apply",
    "apply_",
    is_flag=True,
    help="Create the wave's Jobs. Without: print what the step would do.",
)
def step(**kw: Any) -> None:
    """One step: bake the last wave, then create the next one (docs/operations.md).

    Outside the maintenance window (--start-time, --end-time, --days, --time-zone: kured's)
    it reads nothing, creates nothing, prints one line and exits 0."""
    from agent.fleet import kube
    from agent.fleet.eligibility import Params
    from agent.fleet.status import Refusal
    from agent.fleet.step import Options, outside
    from agent.fleet.step import step as run_step

    options = Options(
        params=Params(kw["hold_down"], kw["max_gap"], kw["freshness"]),
        cluster=kw["cluster"],
        alert_filter=alert_filter(kw),
        namespace=kw["namespace"],
        lease=kw["lease"],
        max_concurrent=kw["max_concurrent"],
        max_per_zone=kw["max_per_zone"],
        ack=tuple(kw["ack"]),
        apply=kw["apply_"],
        window=window_of(kw),
    )
    prom = _prometheus(kw)
    now = time.time()
    closed = outside(options, now)
    if closed:
        _print_step(kw["as_json"], None, [closed], 0, 0)
        return
    try:
        api = kube.api_client(kw["kubeconfig"], kw["context"])
        outcome = run_step(prom, api, options, now)
    except kube.KubeError as exc:
        common.fail(f"fleet step refused: {exc}", 4)
    except Refusal as exc:
        what = "refused" if exc.code == 4 else "stopped"
        common.fail(f"fleet step {what}: {exc}", exc.code)
    wave = outcome.wave if outcome.in_window else None
    _print_step(kw["as_json"], outcome, outcome.lines, outcome.api_calls, prom.calls, wave)


def _print_step(
    as_json: bool,
    outcome: Any,
    lines: list[str],
    api_calls: int,
    queries: int,
    wave: int | None = None,
) -> None:
    if not as_json:
        for line in lines:
            click.echo(line)
        return
    doc = {
        "wave": wave,
        "created": outcome.created if outcome is not None else [],
        "in_window": outcome is not None and outcome.in_window,
        "lines": lines,
        "api_calls": api_calls,
        "prometheus_queries": queries,
    }
    click.echo(json.dumps(doc, indent=2))
