"""What every command shares: the one-line failure, the permission check, one read of the node
and its classification, the options the group collected."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import click

from agent import exitcodes

if TYPE_CHECKING:  # imported by the commands that read the node, not at start-up
    from agent.cleanup.procedure import Settings
    from agent.collect import Options, Progress
    from agent.collection import Collection


def fail(message: str, code: int) -> NoReturn:
    """One line on stderr and the documented exit code; never a traceback."""
    click.echo(f"ipvs-leftovers: {message}", err=True)
    sys.exit(code)


def require_permission() -> None:
    from agent.cli.permissions import missing_capabilities

    missing = missing_capabilities()
    if missing:
        names = " and ".join(missing)
        fail(
            f"reading IPVS, ipsets and iptables needs {names}; run as root or grant {names} "
            "(the DaemonSet adds them under securityContext.capabilities)",
            exitcodes.ERROR,
        )


@dataclass(frozen=True, kw_only=True)
class GroupOptions:
    """The options given before the command (`ipvs-leftovers --timeout 3 audit`): the group
    stores them as its context's obj, and each command reads them with group_options()."""

    metrics_url: str
    healthz_url: str
    timeout: float
    log_format: str


def group_options(ctx: click.Context) -> GroupOptions:
    obj = ctx.find_root().obj
    if not isinstance(obj, GroupOptions):  # a command invoked without the group
        raise TypeError(f"the group's options are missing (ctx.obj is {type(obj).__name__})")
    return obj


def options(ctx: click.Context) -> Options:
    """The group's --kube-proxy-*-url and --timeout, as the readers take them."""
    from agent.collect import Options

    group = group_options(ctx)
    return Options(group.metrics_url, group.healthz_url, group.timeout)


def cleanup_settings(ctx: click.Context) -> Settings:
    """The cleanup's settings from the command's own options, built here alone: `cleanup`'s,
    and `serve`'s for its auto-cleanup (serve has no --reset-arp-sysctls: it never resets
    them). The tests' hooks come from agent.cleanup.hooks, never from an option."""
    from pathlib import Path

    from agent.cleanup import hooks
    from agent.cleanup.procedure import Settings

    params = ctx.params
    return Settings(
        backup_dir=Path(params["backup_dir"]),
        lock_file=Path(params["lock_file"]),
        reset_arp_sysctls=bool(params.get("reset_arp_sysctls", False)),
        tool_timeout=float(params["tool_timeout"]),
        drain_timeout=float(params["drain_timeout"]),
        cut_connections=bool(params["cut_connections"]),
        hooks=hooks.ACTIVE,
    )


def dump_json(doc: object) -> str:
    """Indented for a terminal; compact through a pipe, where json's C encoder runs (with
    indent it falls back to pure Python: 5 s of a cold audit at 10,000 Services in the VM)."""
    import json

    return json.dumps(doc, indent=2 if sys.stdout.isatty() else None, sort_keys=True)


def collection(opts: Options, max_sync_age: float = 0.0, config: bool = False) -> Collection:
    """One read of the node and its classification; with `config`, kube-proxy's own
    configuration too (serve's readiness gauges: its module imports yaml)."""
    from agent.classify import classify
    from agent.collect import collect
    from agent.collection import Collection

    start = time.perf_counter()
    snap = collect(opts)
    result = classify(snap, time.time(), max_sync_age)
    if not config:
        return Collection(snap, result, time.perf_counter() - start)
    from agent.readers import kube_proxy_config

    cfg = kube_proxy_config.read(None)
    return Collection(snap, result, time.perf_counter() - start, cfg)


def collection_so_far(progress: Progress, max_sync_age: float = 0.0) -> Collection:
    """What a collection under way has read, classified, every source not yet done an
    error: the answer of a scrape whose own deadline came first (never shared, never kept)."""
    from agent.classify import classify
    from agent.collection import Collection

    start = time.perf_counter()
    snap = progress.so_far()
    return Collection(snap, classify(snap, time.time(), max_sync_age), time.perf_counter() - start)
