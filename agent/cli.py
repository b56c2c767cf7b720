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


if __name__ == "__main__":  # pragma: no cover
    main()
