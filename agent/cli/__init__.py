"""The `ipvs-leftovers` command line (click). Options mirror IPVS_LEFTOVERS_* variables.

Each command lives in its own module and is imported only when it runs (click's lazy
subcommand pattern): a cold `restore` never imports the readers or the classifier, and a cold
`audit` not the checks, the plan or yaml. Under the benchmark's emulator every module imported
at start-up cost tens of milliseconds, seconds in all."""

from __future__ import annotations

import importlib

import click

from agent import __version__, names
from agent.cli import common
from agent.cli.options import Seconds

# command name -> "module:function"; shown in this order by --help (click sorts names)
COMMANDS = {
    "audit": "agent.cli.audit:audit",
    "serve": "agent.cli.serve:serve",
    "cleanup": "agent.cli.cleanup:cleanup",
    "restore": "agent.cli.cleanup:restore",
    "job-manifest": "agent.cli.cleanup:job_manifest",
    "precheck": "agent.cli.checks:precheck",
    "verify": "agent.cli.checks:verify",
    "fleet": "agent.cli.fleet:fleet",
}


ENV_PREFIX = "IPVS_LEFTOVERS"


def documented_env(command: click.Command, prefix: str) -> click.Command:
    """Each visible option of `command` read from exactly `PREFIX_<OPTION>`: its long name,
    upper case, dashes as underscores (IPVS_LEFTOVERS_TIMEOUT, IPVS_LEFTOVERS_CLEANUP_APPLY).

    click's auto_envvar_prefix builds the name from the Python parameter instead, so `--apply`
    (parameter `apply_`) was IPVS_LEFTOVERS_CLEANUP_APPLY_, with the trailing underscore, and
    a hidden option could be set from the environment too. Hidden options and eager ones
    (--version) are read from no variable."""
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        param.allow_from_autoenv = False
        longs = [o for o in param.opts if o.startswith("--")]
        if param.hidden or not param.expose_value or not longs:
            param.envvar = None
            continue
        param.envvar = f"{prefix}_{longs[0][2:].upper().replace('-', '_')}"
    return command


class LazyGroup(click.Group):
    """A group whose commands are imported by name when invoked (or listed by --help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, name = target.split(":")
        command: click.Command = getattr(importlib.import_module(module), name)
        prefix = f"{ENV_PREFIX}_{cmd_name.upper().replace('-', '_')}"
        if isinstance(command, click.Group):  # `fleet status`: IPVS_LEFTOVERS_FLEET_STATUS_*
            for sub_name, sub in command.commands.items():
                documented_env(sub, f"{prefix}_{sub_name.upper().replace('-', '_')}")
        return documented_env(command, prefix)


def _url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from agent.readers.urls import split_url

    bad = next((c for c in value if c <= " " or c >= "\x7f"), None)
    if bad is not None:  # a CR/LF would add headers to the request
        raise click.BadParameter(
            f"{value!r} holds a control character, space or non-ASCII character "
            f"({bad!r}); write the URL percent-encoded"
        )
    try:
        parsed = split_url(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r}: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise click.BadParameter(f"{value!r} is not an http(s)://HOST[:PORT] URL")
    return value


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="ipvs-leftovers")
@click.option(
    "--kube-proxy-metrics-url",
    default=names.KUBE_PROXY_METRICS_URL,
    show_default=True,
    callback=_url,
    help="kube-proxy's metrics server (serves /proxyMode and /metrics).",
)
@click.option(
    "--kube-proxy-healthz-url",
    default=names.KUBE_PROXY_HEALTHZ_URL,
    show_default=True,
    callback=_url,
    help="kube-proxy's healthz endpoint.",
)
@click.option(
    "--timeout",
    type=Seconds(min=0.1, max=300),
    default=5.0,
    show_default=True,
    help="Deadline, in seconds, of kube-proxy's four answers (read at once, each whole) and of "
    "each iptables-save.",
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
    ctx.obj = common.GroupOptions(
        metrics_url=kube_proxy_metrics_url,
        healthz_url=kube_proxy_healthz_url,
        timeout=timeout,
        log_format=log_format,
    )


documented_env(main, ENV_PREFIX)

if __name__ == "__main__":  # pragma: no cover
    main()
