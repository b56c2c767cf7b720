"""The `ipvs-leftovers` command line (click). Options mirror IPVS_LEFTOVERS_* variables."""

from __future__ import annotations

import json
import sys
import time
from urllib.parse import urlparse

import click

from agent import __version__, exitcodes
from agent.collect import Options


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
    from agent.permissions import missing_capability

    missing = missing_capability()
    if missing is not None:
        fail(
            f"reading IPVS, ipsets and iptables needs {missing}; run as root or grant "
            f"{missing} (the DaemonSet adds it under securityContext.capabilities)",
            exitcodes.ERROR,
        )


@main.command()
@click.option(
    "--json", "as_json", is_flag=True, help="Print the JSON document (docs/audit-json.md)."
)
@click.option("--verbose", is_flag=True, help="List every object with its evidence.")
@click.option(
    "--max-sync-age",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds within which kube-proxy must have synced for nftables mode to be confirmed.",
)
@click.pass_context
def audit(ctx: click.Context, as_json: bool, verbose: bool, max_sync_age: float) -> None:
    """Read everything, classify it, report. Exit 0 clean, 1 leftovers, 4 a source failed."""
    _require_permission()
    from agent.classify import classify
    from agent.collect import collect
    from agent.report import document, exit_code, render

    snap = collect(ctx.obj["options"])
    result = classify(snap, time.time(), max_sync_age)
    if as_json:
        click.echo(json.dumps(document(snap, result), indent=2, sort_keys=True))
    else:
        click.echo(render(snap, result, verbose))
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


if __name__ == "__main__":  # pragma: no cover
    main()
