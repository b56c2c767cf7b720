"""Inputs refused at the door: numbers that make no sense are usage
errors, and the environment maps exactly to the documented options, never to hidden ones.

Each case parses the real command line (the group and the command, as `ipvs-leftovers` does)
without running the command: nothing here reads or changes a node."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import click
import pytest

from agent.cli import main

# a lock file path that exists nowhere (nothing is created: parsing never opens it)
NO_LOCK = Path(tempfile.gettempdir()) / f"ipvs-leftovers-unit-{os.getpid()}" / "cleanup.lock"


def parse(
    args: list[str], env: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The group's and the command's parameters as click resolves them for `args`."""
    mp = pytest.MonkeyPatch()
    try:
        for key in [k for k in os.environ if k.startswith("IPVS_LEFTOVERS_")]:
            mp.delenv(key)
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        at = next(i for i, a in enumerate(args) if a in main.list_commands(click.Context(main)))
        with main.make_context("ipvs-leftovers", [*args[:at], args[at]]) as ctx:
            cmd = main.get_command(ctx, args[at])
            assert cmd is not None
            _no_host_lock_file(mp, args[at], cmd, args, env or {})
            sub = cmd.make_context(args[at], list(args[at + 1 :]), parent=ctx)
            return dict(ctx.params), dict(sub.params)
    finally:
        mp.undo()


def _no_host_lock_file(
    mp: pytest.MonkeyPatch, name: str, cmd: click.Command, args: list[str], env: dict[str, str]
) -> None:
    """The default --lock-file is the machine's /run/ipvs-leftovers/cleanup.lock: one left
    there by a root run makes click refuse it as unreadable to a user, which says nothing of
    the options parsed here. Unless the test names one, the lock is a path of its own."""
    var = f"IPVS_LEFTOVERS_{name.upper().replace('-', '_')}_LOCK_FILE"
    named = "--lock-file" in args or var in env
    if any(p.name == "lock_file" for p in cmd.params) and not named:
        mp.setenv(var, str(NO_LOCK))


def usage_error(args: list[str], env: dict[str, str] | None = None) -> str:
    with pytest.raises(click.UsageError) as info:
        parse(args, env)
    assert info.value.exit_code == 2
    return info.value.format_message()


@pytest.mark.parametrize(
    "args",
    [
        ["--timeout", "nan", "audit"],
        ["--timeout", "inf", "audit"],
        ["audit", "--max-sync-age", "nan"],
        ["audit", "--max-sync-age", "inf"],
        ["cleanup", "--max-sync-age", "NaN"],
        ["cleanup", "--tool-timeout", "nan"],
        ["serve", "--min-interval", "nan"],
        ["serve", "--min-interval", "inf"],
        ["serve", "--source-timeout", "nan"],
        ["serve", "--source-timeout", "inf"],
        ["serve", "--auto-cleanup-interval", "0"],
        ["serve", "--auto-cleanup-interval", "0.01s"],
        ["serve", "--auto-cleanup-interval", "nan"],
        ["serve", "--auto-cleanup-hold-down", "inf"],
        ["serve", "--auto-cleanup-hold-down", "nanh"],
        ["serve", "--auto-cleanup-hold-down", "-1m"],
        ["verify", "--probe-timeout", "nan"],
        ["serve", "--tool-timeout", "nan"],
        ["restore", "/", "--tool-timeout", "nan"],
    ],
)
def test_non_finite_or_non_positive_numbers_are_usage_errors(args: list[str]) -> None:
    """`--max-sync-age nan` turned the age check off, `--auto-cleanup-interval 0` made
    a busy loop, `--auto-cleanup-hold-down inf` never cleaned: all were accepted."""
    usage_error(args)


def test_sensible_numbers_still_parse() -> None:
    group, sub = parse(
        ["--timeout", "2.5", "serve", "--auto-cleanup-hold-down", "0", "--min-interval", "0"]
    )
    assert group["timeout"] == 2.5
    assert sub["auto_cleanup_hold_down"] == 0.0 and sub["min_interval"] == 0.0
    _, sub = parse(["serve", "--auto-cleanup-interval", "1s", "--auto-cleanup-hold-down", "24h"])
    assert sub["auto_cleanup_interval"] == 1.0 and sub["auto_cleanup_hold_down"] == 86400.0
    _, sub = parse(["audit", "--max-sync-age", "300"])
    assert sub["max_sync_age"] == 300.0


def test_the_trailing_underscore_variable_does_not_make_cleanup_apply() -> None:
    """click named the variable after the Python parameter (`apply_`), so
    IPVS_LEFTOVERS_CLEANUP_APPLY_=1 made a plain `cleanup` apply and the documented
    IPVS_LEFTOVERS_CLEANUP_APPLY did nothing."""
    _, sub = parse(["cleanup"], {"IPVS_LEFTOVERS_CLEANUP_APPLY_": "1"})
    assert sub["apply_"] is False
    _, sub = parse(["cleanup"], {"IPVS_LEFTOVERS_CLEANUP_APPLY": "1"})
    assert sub["apply_"] is True
    _, sub = parse(["job-manifest"], {"IPVS_LEFTOVERS_JOB_MANIFEST_NODE": "n1"})
    assert sub["node"] == "n1"
    _, sub = parse(
        ["audit"], {"IPVS_LEFTOVERS_AUDIT_JSON": "1", "IPVS_LEFTOVERS_AUDIT_AS_JSON": "0"}
    )
    assert sub["as_json"] is True


@pytest.mark.parametrize(
    "args",
    [
        ["cleanup", "--pause-before-execute", "300"],
        ["cleanup", "--step-delay", "5"],
        ["cleanup", "--kill-after-step", "1"],
        ["restore", "/", "--step-delay", "5"],
    ],
)
def test_the_shipped_commands_have_no_test_hooks(args: list[str]) -> None:
    """The tests' hooks are options of tests/agent_hooks.py alone: the product's commands
    refuse them, and no variable sets them either."""
    assert "No such option" in usage_error(args)
    env = {
        "IPVS_LEFTOVERS_CLEANUP_PAUSE_BEFORE_EXECUTE": "300",
        "IPVS_LEFTOVERS_CLEANUP_STEP_DELAY": "5",
        "IPVS_LEFTOVERS_CLEANUP_KILL_AFTER_STEP": "1",
    }
    _, sub = parse(["cleanup"], env)
    assert not {"pause_before_execute", "step_delay", "kill_after_step"} & set(sub)


def test_no_command_has_a_hidden_option() -> None:
    ctx = click.Context(main)
    commands = [main, *(main.get_command(ctx, n) for n in main.list_commands(ctx))]
    hidden = [
        (c.name, p.name)
        for c in commands
        if c is not None
        for p in c.params
        if isinstance(p, click.Option) and p.hidden
    ]
    assert hidden == []


def test_every_visible_option_reads_exactly_its_documented_variable() -> None:
    """IPVS_LEFTOVERS_<OPTION> for the group's, IPVS_LEFTOVERS_<COMMAND>_<OPTION> for a
    command's: the long name, upper case, dashes as underscores."""
    ctx = click.Context(main)
    commands = {"": main, **{n: main.get_command(ctx, n) for n in main.list_commands(ctx)}}
    seen = 0
    for name, command in commands.items():
        assert command is not None
        prefix = "IPVS_LEFTOVERS" + (f"_{name.upper().replace('-', '_')}" if name else "")
        for p in command.params:
            if not isinstance(p, click.Option):
                continue
            assert not p.allow_from_autoenv, p.name
            if p.hidden or not p.expose_value:
                assert p.envvar is None, p.name
                continue
            long = next(o for o in p.opts if o.startswith("--"))
            assert p.envvar == f"{prefix}_{long[2:].upper().replace('-', '_')}", p.name
            seen += 1
    assert seen > 20
