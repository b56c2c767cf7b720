"""`serve`: the Prometheus exporter, and its optional auto-cleanup."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import click

from agent import exitcodes
from agent.cli import common
from agent.cli.options import (
    BACKUP_DIR,
    CUT_CONNECTIONS,
    DRAIN_TIMEOUT,
    LOCK_FILE,
    MAX_SYNC_AGE,
    TOOL_TIMEOUT,
    Duration,
    Seconds,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from agent.cleanup.autoclean import AutoCleanup
    from agent.cleanup.procedure import Settings
    from agent.collect import Options, Progress
    from agent.collection import Collection
    from agent.views.metrics import SharedCollection
    from agent.views.server import Server


def _listen(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    from agent.views.server import parse_listen

    try:
        return parse_listen(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _auto_cleanup(
    shared: SharedCollection,
    fresh_opts: Options,
    max_sync_age: float,
    hold_down: float,
    interval: float,
    settings: Settings,
    state_file: str | None,
) -> AutoCleanup:
    """serve's auto-cleanup: it observes the scrapes' shared collection and, once due, reads
    the node as `cleanup --apply` does (every attribute: `fresh_opts`) and runs it with the
    settings `cleanup` would build from the same options. Its streak is kept in a state file
    (default: auto-cleanup.json beside the lock file)."""
    from pathlib import Path

    from agent.cleanup.autoclean import AutoCleanup, load_streak

    state = Path(state_file or settings.lock_file.with_name("auto-cleanup.json"))
    return AutoCleanup(
        observe=shared.get,
        fresh=lambda: common.collection(fresh_opts, max_sync_age),
        settings=settings,
        streak=load_streak(state, hold_down, 3 * interval),
        interval=interval,
        state=state,
    )


def _shared(opts: Options, min_interval: float, max_sync_age: float) -> SharedCollection:
    """The scrapes' collection: made by a thread of its own, bounded by --source-timeout and
    never by one scrape's deadline; a scrape whose deadline comes first gets, for itself
    alone, what has been read so far (docs/contract.md#metrics)."""
    from agent.views.metrics import SharedCollection, current_progress

    def scrape() -> Collection:
        tracked = dataclasses.replace(opts, progress=current_progress())
        return common.collection(tracked, max_sync_age, config=True)

    def so_far(progress: Progress) -> Collection:
        return common.collection_so_far(progress, max_sync_age)

    return SharedCollection(scrape, min_interval, so_far)


def _bind(host: str, port: int, registry: CollectorRegistry, tls: tuple[str, str] | None) -> Server:
    """The metrics server, bound and said so; a named failure (exit 4) when it cannot be."""
    import logging

    from agent.views.server import TlsFileError, make_server

    try:
        server = make_server(host, port, registry, tls)
    except TlsFileError as exc:
        common.fail(str(exc), exitcodes.ERROR)
    except OSError as exc:
        common.fail(
            f"cannot listen on {host or '*'}:{port}: {exc.strerror or exc}", exitcodes.ERROR
        )
    bound = server.server_address[0]
    where = "[::]" if bound == "::" else host or "*"
    both = " (IPv4 and IPv6)" if not host and bound == "::" else ""
    log = logging.getLogger("ipvs_leftovers.serve")
    log.info("serving on %s:%d%s%s", where, port, both, " (TLS)" if tls else "")
    return server


@click.command()
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
    type=Seconds(min=0, max=86400),
    default=10.0,
    show_default=True,
    help="Seconds between two reads of the kernel; scrapes within it share one collection.",
)
@click.option(
    "--source-timeout",
    type=Seconds(min=0.1, max=3600),
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
    type=Duration(least=0.1),
    default="60s",
    show_default=True,
    help="How often auto-cleanup observes the node (through the shared collection); at least 0.1s.",
)
@click.option(
    "--auto-cleanup-state",
    type=click.Path(dir_okay=False),
    default=None,
    help="File that keeps the hold-down across agent restarts (default: auto-cleanup.json "
    "beside --lock-file, on the host's /run). A file failing any check starts it over.",
)
@BACKUP_DIR
@LOCK_FILE
@TOOL_TIMEOUT
@DRAIN_TIMEOUT
@CUT_CONNECTIONS
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
    auto_cleanup_state: str | None,
    backup_dir: str,
    lock_file: str,
    tool_timeout: float,
    drain_timeout: float,
    cut_connections: bool,
) -> None:
    """Prometheus exporter: reads at scrape time, counts only, no mutation over HTTP."""
    import logging

    from prometheus_client import CollectorRegistry, ProcessCollector

    from agent import logs
    from agent.collect import for_scrapes
    from agent.views.metrics import AgentCollector
    from agent.views.server import StopSignals

    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    common.require_permission()
    logs.setup(common.group_options(ctx).log_format)
    log = logging.getLogger("ipvs_leftovers.serve")
    signals = StopSignals()
    opts = for_scrapes(dataclasses.replace(common.options(ctx), budget=source_timeout))

    shared = _shared(opts, min_interval, max_sync_age)
    auto = None
    if auto_cleanup:
        auto = _auto_cleanup(
            shared,
            dataclasses.replace(opts, budget=None, ipvs_detail=True),
            max_sync_age,
            auto_cleanup_hold_down,
            auto_cleanup_interval,
            common.cleanup_settings(ctx),
            auto_cleanup_state,
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(shared, (lambda: list(auto.metrics())) if auto else None))
    ProcessCollector(registry=registry)  # process_* (memory, CPU, fds), like every exporter
    server = _bind(*listen, registry, (tls_cert, tls_key) if tls_cert and tls_key else None)
    if auto is not None:
        log.info("auto-cleanup on: hold-down %.0fs", auto_cleanup_hold_down)
        signals.listeners.append(auto.stop)
        auto.start()
    signals.serve(server)
    if auto is not None:  # a run under way ends its step and undoes; no tool outlives serve
        auto.finish()
    log.info("stopped")
