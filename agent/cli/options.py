"""Options several commands share, declared once; the number types every command uses."""

from __future__ import annotations

import math
from typing import Any

import click

from agent import names
from agent.readers.tools import DEFAULT_TIMEOUT


class Seconds(click.FloatRange):
    """A finite number of seconds within a range. click.FloatRange lets `nan` through (every
    comparison with it is false) and `inf` where there is no maximum: `--max-sync-age nan`
    turned the age check off."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds


class Duration(click.ParamType):  # type: ignore[type-arg]
    """Seconds, or a number with s, m, h or d: `90`, `30m`, `24h`; finite, at least `least`."""

    name = "duration"
    _UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

    def __init__(self, least: float = 0.0) -> None:
        self.least = least

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float):
            seconds = float(value)
        else:
            text = str(value).strip()
            unit = self._UNITS.get(text[-1:], None)
            try:
                seconds = float(text[:-1]) * unit if unit else float(text)
            except ValueError:
                self.fail(f"{value!r} is not a duration like 90, 30m, 24h", param, ctx)
        if not math.isfinite(seconds):  # nan passed every comparison; inf held off forever
            self.fail(f"{value!r} is not a finite duration", param, ctx)
        if seconds < self.least:
            what = "negative" if self.least == 0 else f"under {self.least:g}s"
            self.fail(f"{value!r} is {what}", param, ctx)
        return seconds


MAX_SYNC_AGE = click.option(
    "--max-sync-age",
    type=Seconds(min=0),
    default=0.0,
    show_default=True,
    help="Also require kube-proxy's last sync (its sync-timestamp metric) within this many "
    "seconds; 0 (the default) trusts kube-proxy's own health, since an idle kube-proxy "
    "re-syncs only once an hour.",
)
BACKUP_DIR = click.option(
    "--backup-dir",
    type=click.Path(file_okay=False),
    default="/var/lib/ipvs-leftovers",
    show_default=True,
    help="A backup bundle is written here, one folder per run, before the first change.",
)
TOOL_TIMEOUT = click.option(
    "--tool-timeout",
    type=Seconds(min=1, max=3600),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds each netfilter tool may take (ipvsadm -S, ipset save, iptables-*-save and "
    "-restore). Past it the cleanup refuses before any change; raise it on very large nodes.",
)
LOCK_FILE = click.option(
    "--lock-file",
    type=click.Path(dir_okay=False),
    default="/run/ipvs-leftovers/cleanup.lock",
    show_default=True,
    help="One cleanup at a time on a node (the Job and the DaemonSet share it).",
)
DRAIN_TIMEOUT = click.option(
    "--drain-timeout",
    type=Duration(),
    default=f"{names.DEFAULT_TERMINATION_GRACE_SECONDS}s",
    show_default=True,
    help="How long --apply waits for the active connections through the virtual servers it "
    "deletes to close (their counts read again each second), then refuses (exit 5) unless "
    "--cut-connections; 0: no wait. Default: the kubelet's default grace period.",
)
CUT_CONNECTIONS = click.option(
    "--cut-connections",
    is_flag=True,
    help="Delete the virtual servers even with connections still open through them after "
    "--drain-timeout: IPVS drops those connections (ipvs mode set "
    "net.ipv4.vs.expire_nodest_conn=1); how many is said.",
)
