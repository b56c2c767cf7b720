"""The `ipvs-leftovers` command line (click). Options mirror IPVS_LEFTOVERS_* variables."""

from __future__ import annotations

import json
import sys
import time
from urllib.parse import urlparse

import click

from agent import __version__, exitcodes
from agent.collect import Options
from agent.metrics import Collection


def _url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        parsed = urlparse(value)
        parsed.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise click.BadParameter(f"{value!r}: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise click.BadParameter(f"{value!r} is not an http(s)://HOST[:PORT] URL")
    return value


def fail(message: str, code: int) -> None:
    """One line on stderr and the documented exit code; never a traceback."""
    click.echo(f"ipvs-leftovers: {message}", err=True)
    sys.exit(code)


@click.group(context_settings={"auto_envvar_prefix": "IPVS_LEFTOVERS"})
@click.version_option(__version__, prog_name="ipvs-leftovers")
@click.option(
    "--kube-proxy-metrics-url",
    default="http://127.0.0.1:10249",
    show_default=True,
    callback=_url,
    help="kube-proxy's metrics server (serves /proxyMode and /metrics).",
)
@click.option(
    "--kube-proxy-healthz-url",
    default="http://127.0.0.1:10256/healthz",
    show_default=True,
    callback=_url,
    help="kube-proxy's healthz endpoint.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1, max=300),
    default=5.0,
    show_default=True,
    help="Seconds to wait for each kube-proxy endpoint and each iptables-save.",
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.pass_context
def main(
    ctx: click.Context,
    kube_proxy_metrics_url: str,
    kube_proxy_healthz_url: str,
    timeout: float,
    log_format: str,
) -> None:
    """Audit and safely clean up what kube-proxy's ipvs mode left on this node."""
    ctx.obj = {
        "options": Options(kube_proxy_metrics_url, kube_proxy_healthz_url, timeout),
        "log_format": log_format,
    }


def _require_permission() -> None:
    from agent.permissions import missing_capabilities

    missing = missing_capabilities()
    if missing:
        names = " and ".join(missing)
        fail(
            f"reading IPVS, ipsets and iptables needs {names}; run as root or grant {names} "
            "(the DaemonSet adds them under securityContext.capabilities)",
            exitcodes.ERROR,
        )


MAX_SYNC_AGE = click.option(
    "--max-sync-age",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds within which kube-proxy must have synced for nftables mode to be confirmed.",
)


def _collection(opts: Options, max_sync_age: float) -> Collection:
    from agent.classify import classify
    from agent.collect import collect

    start = time.perf_counter()
    snap = collect(opts)
    return Collection(snap, classify(snap, time.time(), max_sync_age), time.perf_counter() - start)


@main.command()
@click.option(
    "--json", "as_json", is_flag=True, help="Print the JSON document (docs/audit-json.md)."
)
@click.option("--verbose", is_flag=True, help="List every object with its evidence.")
@MAX_SYNC_AGE
@click.option(
    "--textfile",
    type=click.Path(dir_okay=False, writable=True),
    help="Also write the metrics to this file, atomically (node_exporter's textfile collector).",
)
@click.pass_context
def audit(
    ctx: click.Context, as_json: bool, verbose: bool, max_sync_age: float, textfile: str | None
) -> None:
    """Read everything, classify it, report. Exit 0 clean, 1 leftovers, 4 a source failed."""
    _require_permission()
    from agent.report import document, exit_code, render

    col = _collection(ctx.obj["options"], max_sync_age)
    snap, result = col.snapshot, col.classification
    if as_json:
        click.echo(json.dumps(document(snap, result), indent=2, sort_keys=True))
    else:
        click.echo(render(snap, result, verbose))
    if textfile is not None:
        _write_textfile(textfile, col)
    for name, reading in snap.sources().items():
        if reading.status == "error":
            click.echo(f"ipvs-leftovers: could not read {name}: {reading.error}", err=True)
    kp = snap.kube_proxy.proxy_mode
    if kp.status == "absent":
        click.echo(
            f"ipvs-leftovers: kube-proxy not reachable ({kp.error}); mode unknown, nothing is "
            "confirmed (check --kube-proxy-metrics-url)",
            err=True,
        )
    sys.exit(exit_code(snap, result))


def _write_textfile(path: str, col: Collection) -> None:
    from prometheus_client import CollectorRegistry, write_to_textfile

    from agent.metrics import AgentCollector, SharedCollection

    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(SharedCollection(lambda: col, float("inf"))))
    try:
        write_to_textfile(path, registry)  # a temporary file renamed over PATH
    except OSError as exc:
        fail(f"cannot write --textfile {path}: {exc.strerror or exc}", exitcodes.ERROR)


def _listen(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    from agent.server import parse_listen

    try:
        return parse_listen(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@main.command()
@click.option(
    "--listen",
    default=":9437",
    show_default=True,
    callback=_listen,
    help="[ADDR]:PORT to serve on; ADDR defaults to all addresses.",
)
@click.option(
    "--min-interval",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Seconds between two reads of the kernel; scrapes within it share one collection.",
)
@click.option(
    "--source-timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Time budget of each kernel source; past it the source reports source_up 0.",
)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="PEM certificate.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="PEM private key.")
@MAX_SYNC_AGE
@click.pass_context
def serve(
    ctx: click.Context,
    listen: tuple[str, int],
    min_interval: float,
    source_timeout: float,
    tls_cert: str | None,
    tls_key: str | None,
    max_sync_age: float,
) -> None:
    """Prometheus exporter: reads at scrape time, counts only, no mutation."""
    import dataclasses
    import logging
    import ssl

    from prometheus_client import CollectorRegistry

    from agent import logs
    from agent.metrics import AgentCollector, SharedCollection
    from agent.server import make_server, serve_until_signalled

    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    _require_permission()
    logs.setup(ctx.obj["log_format"])
    log = logging.getLogger("ipvs_leftovers.serve")
    opts = dataclasses.replace(ctx.obj["options"], budget=source_timeout)
    shared = SharedCollection(lambda: _collection(opts, max_sync_age), min_interval)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(shared))
    host, port = listen
    tls = (tls_cert, tls_key) if tls_cert and tls_key else None
    try:
        server = make_server(host, port, registry, tls)
    except ssl.SSLError as exc:
        fail(f"cannot use --tls-cert/--tls-key: {exc.reason or exc}", exitcodes.ERROR)
    except OSError as exc:
        fail(f"cannot listen on {host or '*'}:{port}: {exc.strerror or exc}", exitcodes.ERROR)
    log.info("serving on %s:%d%s", host or "*", port, " (TLS)" if tls else "")
    serve_until_signalled(server)
    log.info("stopped")


def _gate_refusal(col: Collection) -> str | None:
    mode = col.classification.mode
    if mode.nftables_confirmed:
        return None
    reason = mode.failed[0] if mode.failed else "no evidence"
    return f"refused: nftables mode is not confirmed ({reason}); nothing was changed"


@main.command()
@click.option("--apply", "apply_", is_flag=True, help="Back up, then remove. Without it: the plan.")
@click.option(
    "--backup-dir",
    type=click.Path(file_okay=False),
    default="/var/lib/ipvs-leftovers",
    show_default=True,
    help="A folder per run is written here before the first change.",
)
@click.option(
    "--lock-file",
    type=click.Path(dir_okay=False),
    default="/run/ipvs-leftovers.lock",
    show_default=True,
    help="One cleanup at a time on a node.",
)
@click.option(
    "--reset-arp-sysctls",
    is_flag=True,
    help="Also reset strictARP's arp_ignore=1/arp_announce=2 to 0 (never ip_forward).",
)
@MAX_SYNC_AGE
@click.option("--pause-before-execute", type=float, default=0.0, hidden=True)
@click.option("--step-delay", type=float, default=0.0, hidden=True)
@click.pass_context
def cleanup(
    ctx: click.Context,
    apply_: bool,
    backup_dir: str,
    lock_file: str,
    reset_arp_sysctls: bool,
    max_sync_age: float,
    pause_before_execute: float,
    step_delay: float,
) -> None:
    """Remove exactly what ipvs mode left, only once nftables mode is confirmed (SPEC §5).

    Exit 0 clean afterwards, 1 something remains, 3 refused, 4 error.
    """
    from pathlib import Path

    from agent import lock
    from agent.backup import write_bundle
    from agent.executor import execute
    from agent.plan import describe, make_plan

    _require_permission()
    opts = ctx.obj["options"]
    col = _collection(opts, max_sync_age)
    errors = [
        n
        for n, r in col.snapshot.sources().items()
        if r.status == "error" and not n.startswith("kube_proxy")
    ]
    if errors:
        fail(f"cannot plan: could not read {', '.join(errors)} (see audit)", exitcodes.ERROR)
    plan = make_plan(col.snapshot, col.classification, reset_arp_sysctls)
    click.echo(f"plan: {len(plan.steps)} steps, {len(plan.kept)} kept")
    for line in describe(plan):
        click.echo(line)
    if not apply_:
        refusal = _gate_refusal(col)
        click.echo(
            f"--apply would be {refusal}"
            if refusal
            else "nftables mode confirmed: --apply would run this plan"
        )
        sys.exit(exitcodes.REMAINS if col.classification.leftovers else exitcodes.OK)
    with lock.exclusive(Path(lock_file)) as held:
        if not held:
            fail(
                f"refused: another cleanup holds {lock_file}; nothing was changed",
                exitcodes.REFUSED,
            )
        if plan.empty:
            click.echo("nothing to remove")
            sys.exit(exitcodes.REMAINS if col.classification.leftovers else exitcodes.OK)
        refusal = _gate_refusal(col)
        if refusal:
            fail(refusal, exitcodes.REFUSED)
        try:
            bundle = write_bundle(Path(backup_dir), plan)
        except Exception as exc:  # noqa: BLE001 - no change has been made yet
            fail(
                f"cannot write the backup under {backup_dir}: {exc}; nothing was changed",
                exitcodes.ERROR,
            )
        click.echo(f"backup: {bundle}")
        if pause_before_execute:
            click.echo("re-checking the gate", err=True)
            time.sleep(pause_before_execute)
        again = _collection(opts, max_sync_age)
        refusal = _gate_refusal(again)
        if refusal:
            fail(refusal, exitcodes.REFUSED)
        again_plan = make_plan(again.snapshot, again.classification, reset_arp_sysctls)
        if again_plan.fingerprint() != plan.fingerprint():
            fail(
                "refused: the node changed while the plan was made; run cleanup again "
                "(nothing was changed)",
                exitcodes.REFUSED,
            )

        def report(o: object) -> None:
            from agent.executor import Outcome

            assert isinstance(o, Outcome)
            detail = f": {o.detail}" if o.detail else ""
            click.echo(f"{o.result:6} {o.step.action} {o.step.target}{detail}")

        outcomes = execute(plan.steps, report, step_delay)
        after = _collection(opts, max_sync_age)
        remaining = after.classification.leftovers
        click.echo(f"after: {len(remaining)} ipvs-mode objects remain")
        for k in plan.kept:
            click.echo(f"  kept {k.kind} {k.name}: {k.reason}")
        for o in outcomes:
            if o.result in ("kept", "failed"):
                click.echo(f"  {o.result} {o.step.action} {o.step.target}: {o.detail}")
        if any(o.result == "failed" for o in outcomes):
            sys.exit(exitcodes.ERROR)
        sys.exit(exitcodes.REMAINS if remaining else exitcodes.OK)


@main.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
def restore(bundle: str) -> None:
    """Replay a backup bundle written by cleanup --apply. Exit 0 restored, 4 error."""
    from pathlib import Path

    from agent.restore import BundleError
    from agent.restore import restore as replay
    from agent.tools import ToolError

    _require_permission()
    try:
        replay(Path(bundle), click.echo)
    except (BundleError, ToolError, OSError) as exc:
        fail(f"restore of {bundle} failed: {exc}", exitcodes.ERROR)
    click.echo(f"restored {bundle}")


if __name__ == "__main__":  # pragma: no cover
    main()
