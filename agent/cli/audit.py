"""`audit`: read everything, classify it, report (and `--textfile` for node_exporter)."""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING

import click

from agent import exitcodes
from agent.cli import common
from agent.cli.options import MAX_SYNC_AGE

if TYPE_CHECKING:
    from agent.collection import Collection


@click.command()
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
    common.require_permission()
    from agent.views.report import document, exit_code, render

    # The virtual servers as /proc/net/ip_vs lists them, as serve's scrapes read them: the
    # report and the classifier use nothing the netlink read adds (timeouts, netmasks, pe).
    opts = dataclasses.replace(common.options(ctx), ipvs_detail=False)
    col = common.collection(opts, max_sync_age)
    snap, result = col.snapshot, col.classification
    if as_json:
        click.echo(common.dump_json(document(snap, result)))
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
        common.fail(f"cannot write --textfile {path}: {exc.strerror or exc}", exitcodes.ERROR)
