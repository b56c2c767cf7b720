"""The `ipvs-leftovers` command line (click). Options mirror IPVS_LEFTOVERS_* variables."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from urllib.parse import urlparse

import click

from agent import __version__, exitcodes
from agent.cli.options import BACKUP_DIR, LOCK_FILE, MAX_SYNC_AGE, TOOL_TIMEOUT
from agent.collect import Options
from agent.collection import Collection


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
    from agent.cli.permissions import missing_capabilities

    missing = missing_capabilities()
    if missing:
        names = " and ".join(missing)
        fail(
            f"reading IPVS, ipsets and iptables needs {names}; run as root or grant {names} "
            "(the DaemonSet adds them under securityContext.capabilities)",
            exitcodes.ERROR,
        )


def dump_json(doc: object) -> str:
    """Indented for a terminal; compact through a pipe, where json's C encoder runs (with
    indent it falls back to pure Python: 5 s of a cold audit at 10,000 Services in the VM)."""
    return json.dumps(doc, indent=2 if sys.stdout.isatty() else None, sort_keys=True)


def _collection(opts: Options, max_sync_age: float, config: bool = False) -> Collection:
    from agent.classify import classify
    from agent.collect import collect
    from agent.readers import kube_proxy_config

    start = time.perf_counter()
    snap = collect(opts)
    result = classify(snap, time.time(), max_sync_age)
    if not config:
        return Collection(snap, result, time.perf_counter() - start)
    cfg = kube_proxy_config.read(None)
    return Collection(snap, result, time.perf_counter() - start, cfg)


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
    from agent.views.report import document, exit_code, render

    col = _collection(ctx.obj["options"], max_sync_age)
    snap, result = col.snapshot, col.classification
    if as_json:
        click.echo(dump_json(document(snap, result)))
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

    from agent.views.metrics import AgentCollector, SharedCollection

    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(SharedCollection(lambda: col, float("inf"))))
    try:
        write_to_textfile(path, registry)  # a temporary file renamed over PATH
    except OSError as exc:
        fail(f"cannot write --textfile {path}: {exc.strerror or exc}", exitcodes.ERROR)


class Duration(click.ParamType):  # type: ignore[type-arg]
    """Seconds, or a number with s, m, h or d: `90`, `30m`, `24h`."""

    name = "duration"
    _UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float):
            return float(value)
        text = str(value).strip()
        unit = self._UNITS.get(text[-1:], None)
        try:
            seconds = float(text[:-1]) * unit if unit else float(text)
        except ValueError:
            self.fail(f"{value!r} is not a duration like 90, 30m, 24h", param, ctx)
        if seconds < 0:
            self.fail(f"{value!r} is negative", param, ctx)
        return seconds


def _listen(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    from agent.views.server import parse_listen

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
    help="[ADDR]:PORT to serve on; without ADDR, every address of both families (IPv4 only "
    "when the kernel has no IPv6).",
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
@click.option(
    "--auto-cleanup/--no-auto-cleanup",
    default=False,
    show_default=True,
    help="Run cleanup --apply by itself once nftables mode has held for the hold-down.",
)
@click.option(
    "--auto-cleanup-hold-down",
    type=Duration(),
    default="24h",
    show_default=True,
    help="How long nftables mode must be confirmed without a break first.",
)
@click.option(
    "--auto-cleanup-interval",
    type=Duration(),
    default="60s",
    show_default=True,
    help="How often auto-cleanup observes the node (through the shared collection).",
)
@BACKUP_DIR
@LOCK_FILE
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
    auto_cleanup: bool,
    auto_cleanup_hold_down: float,
    auto_cleanup_interval: float,
    backup_dir: str,
    lock_file: str,
) -> None:
    """Prometheus exporter: reads at scrape time, counts only, no mutation over HTTP."""
    import logging
    import ssl

    from prometheus_client import CollectorRegistry, ProcessCollector

    from agent import logs
    from agent.views.metrics import AgentCollector, SharedCollection, current_deadline
    from agent.views.server import make_server, serve_until_signalled

    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    _require_permission()
    logs.setup(ctx.obj["log_format"])
    log = logging.getLogger("ipvs_leftovers.serve")
    opts = dataclasses.replace(ctx.obj["options"], budget=source_timeout, nftables_detail=False)

    def scrape() -> Collection:  # a scrape's collection ends by its deadline (if it sent one)
        scoped = dataclasses.replace(opts, deadline=current_deadline())
        return _collection(scoped, max_sync_age, config=True)

    shared = SharedCollection(scrape, min_interval)
    auto = None
    if auto_cleanup:
        from pathlib import Path

        from agent.cleanup import procedure
        from agent.cleanup.autoclean import AutoCleanup, Streak

        fresh_opts = dataclasses.replace(opts, budget=None)
        auto = AutoCleanup(
            observe=shared.get,
            fresh=lambda: _collection(fresh_opts, max_sync_age),
            settings=procedure.Settings(Path(backup_dir), Path(lock_file)),
            streak=Streak(auto_cleanup_hold_down, max_gap=3 * auto_cleanup_interval),
            interval=auto_cleanup_interval,
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(shared, (lambda: list(auto.metrics())) if auto else None))
    ProcessCollector(registry=registry)  # process_* (memory, CPU, fds), like every exporter
    host, port = listen
    tls = (tls_cert, tls_key) if tls_cert and tls_key else None
    try:
        server = make_server(host, port, registry, tls)
    except ssl.SSLError as exc:
        fail(f"cannot use --tls-cert/--tls-key: {exc.reason or exc}", exitcodes.ERROR)
    except OSError as exc:
        fail(f"cannot listen on {host or '*'}:{port}: {exc.strerror or exc}", exitcodes.ERROR)
    bound = server.server_address[0]
    where = "[::]" if bound == "::" else host or "*"
    both = " (IPv4 and IPv6)" if not host and bound == "::" else ""
    log.info("serving on %s:%d%s%s", where, port, both, " (TLS)" if tls else "")
    if auto is not None:
        log.info("auto-cleanup on: hold-down %.0fs", auto_cleanup_hold_down)
        auto.start()
    serve_until_signalled(server)
    if auto is not None:
        auto.stop()
    log.info("stopped")


@main.command()
@click.option("--apply", "apply_", is_flag=True, help="Back up, then remove. Without it: the plan.")
@BACKUP_DIR
@LOCK_FILE
@click.option(
    "--reset-arp-sysctls",
    is_flag=True,
    help="Also reset strictARP's arp_ignore=1/arp_announce=2 to 0 (never ip_forward).",
)
@MAX_SYNC_AGE
@TOOL_TIMEOUT
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
    tool_timeout: float,
    pause_before_execute: float,
    step_delay: float,
) -> None:
    """Remove exactly what ipvs mode left, only once nftables mode is confirmed (SPEC §5).

    Exit 0 clean afterwards, 1 something remains, 3 refused, 4 error.
    """
    from pathlib import Path

    from agent.cleanup import procedure
    from agent.logs import BatchedLines
    from agent.views.plan import describe

    _require_permission()
    # The plan and the gate need only which nftables tables exist; counting the nftables-mode
    # table's chains and elements was a fifth of cleanup's time at 10,000 Services (issue 6).
    opts = dataclasses.replace(ctx.obj["options"], nftables_detail=False)
    settings = procedure.Settings(
        Path(backup_dir),
        Path(lock_file),
        reset_arp_sysctls,
        pause_before_execute,
        step_delay,
        tool_timeout,
    )

    def collect() -> Collection:
        return _collection(opts, max_sync_age)

    say = BatchedLines(sys.stdout)

    def note(message: str) -> None:
        say.flush()  # keeps stdout and stderr in order on one terminal
        click.echo(message, err=True)

    try:
        if not apply_:
            col = collect()
            plan = procedure.plan_for(col, settings)
            say(f"plan: {len(plan.steps)} steps, {len(plan.kept)} kept")
            for line in describe(plan):
                say(line)
            refusal = procedure.gate_refusal(col)
            say(
                f"--apply would be {refusal}"
                if refusal
                else "nftables mode confirmed: --apply would run this plan"
            )
            sys.exit(exitcodes.REMAINS if col.classification.removable else exitcodes.OK)
        result = procedure.apply(collect, settings, say, note)
    except (procedure.Refused, procedure.CleanupError) as exc:
        say.flush()  # before fail() writes to stderr
        fail(str(exc), exc.code)
    finally:
        say.flush()
    sys.exit(result.code)


@main.command("job-manifest")
@click.option("--node", required=True, help="The node the Job runs on (spec.nodeName).")
@click.option(
    "--image",
    default=f"ghcr.io/example/ipvs-leftovers:{__version__}",
    show_default=True,
    help="The agent's image as you publish it.",
)
@click.option("--namespace", default="ipvs-leftovers", show_default=True)
@click.option("--apply", "apply_", is_flag=True, help="A Job that cleans; without: plan only.")
def job_manifest(node: str, image: str, namespace: str, apply_: bool) -> None:
    """Print a one-shot cleanup Job pinned to NODE (kubectl apply -f -)."""
    from agent.cleanup.job import InvalidName, render

    try:
        click.echo(render(node, image, namespace, apply_), nl=False)
    except InvalidName as exc:
        raise click.BadParameter(str(exc), param_hint=exc.option) from exc


@main.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@TOOL_TIMEOUT
def restore(bundle: str, tool_timeout: float) -> None:
    """Replay a backup bundle written by cleanup --apply. Exit 0 restored, 4 error."""
    from pathlib import Path

    from agent.cleanup.restore import BundleError
    from agent.cleanup.restore import restore as replay
    from agent.readers.tools import ToolError

    _require_permission()
    try:
        replay(Path(bundle), click.echo, tool_timeout)
    except (BundleError, ToolError, OSError) as exc:
        fail(f"restore of {bundle} failed: {exc}", exitcodes.ERROR)
    click.echo(f"restored {bundle}")


def _register() -> None:
    from agent.cli.checks import precheck, verify

    main.add_command(precheck)
    main.add_command(verify)


_register()

if __name__ == "__main__":  # pragma: no cover
    main()
