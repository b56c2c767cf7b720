"""`cleanup`, `restore`, `job-manifest`: the commands that change a node, or print its Job."""

from __future__ import annotations

import sys
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
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent.cleanup.procedure import Settings
    from agent.collection import Collection


def _show_plan(col: Collection, settings: Settings, say: Callable[[str], None]) -> int:
    """`cleanup` without --apply: the plan, and what --apply would do; the exit code."""
    from agent.cleanup import drain, procedure
    from agent.cleanup.plan import describe

    plan = procedure.plan_for(col, settings)
    say(f"plan: {len(plan.steps)} steps, {len(plan.kept)} kept")
    for line in describe(plan):
        say(line)
    live = drain.of_plan(plan)
    if live.active:
        then = "cut them" if settings.cut_connections else "refuse (exit 5) while any is open"
        say(
            f"connections: {live.describe()}; --apply would wait up to "
            f"{settings.drain_timeout:g}s for them to close (--drain-timeout), then {then}"
        )
    refusal = procedure.gate_refusal(col)
    say(
        f"--apply would be {refusal}"
        if refusal
        else "nftables mode confirmed: --apply would run this plan"
    )
    return exitcodes.REMAINS if col.classification.removable else exitcodes.OK


@click.command()
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
@DRAIN_TIMEOUT
@CUT_CONNECTIONS
@click.pass_context
def cleanup(
    ctx: click.Context,
    apply_: bool,
    backup_dir: str,
    lock_file: str,
    reset_arp_sysctls: bool,
    max_sync_age: float,
    tool_timeout: float,
    drain_timeout: float,
    cut_connections: bool,
) -> None:
    """Remove exactly what ipvs mode left, only once nftables mode is confirmed
    (docs/contract.md#cleanup).

    Exit 0 clean afterwards, 1 something remains, 3 refused, 4 error, or stopped by SIGTERM or
    SIGINT (the step under way ends, then every change is undone), 5 refused: connections
    still open through virtual servers it would delete after --drain-timeout.
    """
    from agent.cleanup import procedure
    from agent.cleanup.stop import Stop
    from agent.logs import BatchedLines

    common.require_permission()
    # The plan and the gate need only which nftables tables exist; counting the nftables-mode
    # table's chains and elements was a fifth of cleanup's time at 10,000 Services.
    import dataclasses

    opts = dataclasses.replace(common.options(ctx), nftables_detail=False)
    settings = common.cleanup_settings(ctx)

    def collect() -> Collection:
        return common.collection(opts, max_sync_age)

    say = BatchedLines(sys.stdout)

    def note(message: str) -> None:
        say.flush()  # keeps stdout and stderr in order on one terminal
        click.echo(message, err=True)

    try:
        if not apply_:
            sys.exit(_show_plan(collect(), settings, say))
        # SIGTERM too, explicitly: as PID 1 (the image) a signal without a handler is dropped
        result = procedure.apply(collect, settings, say, note, Stop().handle())
    except (procedure.Refused, procedure.CleanupError) as exc:
        say.flush()  # before common.fail() writes to stderr
        common.fail(str(exc), exc.code)
    finally:
        say.flush()
    sys.exit(result.code)


@click.command("job-manifest")
@click.option("--node", required=True, help="The node the Job runs on (spec.nodeName).")
@click.option(
    "--image",
    default=None,
    help="The agent's image. Default: the running DaemonSet's, read from the API server "
    "(kubeconfig or in-cluster; needs the [fleet] extra).",
)
@click.option(
    "--namespace",
    default=None,
    help="Where the Job goes. Default: the running DaemonSet's namespace; with --image and no "
    "API: ipvs-leftovers.",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="For reading the DaemonSet (default: $KUBECONFIG, ~/.kube/config, or in-cluster).",
)
@click.option(
    "--active-deadline",
    type=click.IntRange(min=60, max=86400),
    default=1800,
    show_default=True,
    help="Seconds after which Kubernetes stops the Job (a hung cleanup must not hold the "
    "node's lock for ever).",
)
@click.option("--apply", "apply_", is_flag=True, help="A Job that cleans; without: plan only.")
@click.option(
    "--drain-timeout",
    type=Duration(),
    default=None,
    help="The Job's cleanup --drain-timeout (shorter than --active-deadline). Default: "
    "cleanup's own (the kubelet's default grace period).",
)
@click.option(
    "--cut-connections",
    is_flag=True,
    help="The Job's cleanup cuts the connections still open after its drain timeout instead "
    "of failing (exit 5).",
)
def job_manifest(
    node: str,
    image: str | None,
    namespace: str | None,
    kubeconfig: str | None,
    active_deadline: int,
    apply_: bool,
    drain_timeout: float | None,
    cut_connections: bool,
) -> None:
    """Print a one-shot cleanup Job pinned to NODE (kubectl apply -f -).

    The image and namespace are the running DaemonSet's unless --image is given: a Job never
    runs a placeholder image. Exit 4 when the DaemonSet cannot be read (one line: why)."""
    from agent.job import Drain, InvalidName, render, validate

    if (drain_timeout is not None or cut_connections) and not apply_:
        raise click.UsageError("--drain-timeout and --cut-connections go with --apply")

    try:
        validate(node, namespace or "ipvs-leftovers")
        if image is None:
            from agent.fleet.kube import KubeError, agent_daemonset, api_client

            try:
                ds = agent_daemonset(api_client(kubeconfig), namespace)
            except KubeError as exc:
                common.fail(
                    f"cannot take the image from the agent's DaemonSet: {exc}; give --image "
                    "(and --namespace) to render the Job without the API",
                    exitcodes.ERROR,
                )
            image, namespace = ds.image, ds.namespace
        drain = Drain(drain_timeout, cut_connections)
        job = render(node, image, namespace or "ipvs-leftovers", apply_, active_deadline, drain)
    except InvalidName as exc:
        raise click.BadParameter(str(exc), param_hint=exc.option) from exc
    click.echo(job, nl=False)


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@LOCK_FILE
@click.option(
    "--from-other-node",
    is_flag=True,
    help="Restore a bundle whose manifest names another node (it was copied here).",
)
@TOOL_TIMEOUT
def restore(bundle: str, lock_file: str, from_other_node: bool, tool_timeout: float) -> None:
    """Put back what one cleanup --apply removed, all of it or nothing (docs/bundle.md).

    Exit 0 restored (or nothing was missing), 3 another cleanup holds the lock, 4 refused or
    failed: the bundle is incomplete, altered, unsafe or from another node, or a step failed
    and what was applied has been undone.
    """
    from pathlib import Path

    from agent.cleanup import hooks
    from agent.cleanup import restore as replay

    common.require_permission()
    try:
        n = replay.restore(
            Path(bundle),
            click.echo,
            Path(lock_file),
            from_other_node,
            tool_timeout,
            hooks.ACTIVE.step_delay,
        )
    except replay.BundleError as exc:
        common.fail(f"restore of {bundle} refused: {exc}; nothing was changed", exitcodes.ERROR)
    except (replay.Busy, replay.RestoreFailed) as exc:
        common.fail(f"restore of {bundle}: {exc}", exc.code)
    click.echo(
        f"restored {bundle}: {n} objects re-created" if n else f"{bundle}: nothing was missing"
    )
