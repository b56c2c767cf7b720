"""Options several commands share, declared once."""

from __future__ import annotations

import click

from agent.readers.tools import DEFAULT_TIMEOUT

MAX_SYNC_AGE = click.option(
    "--max-sync-age",
    type=click.FloatRange(min=0),
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
    type=click.FloatRange(min=1, max=3600),
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
