"""`cleanup` and serve's auto-cleanup build their Settings in one place, from their own options
(agent.cli.common.cleanup_settings): serve's used to leave out --tool-timeout."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pytest

from agent.cleanup import hooks
from agent.cleanup.procedure import Settings
from agent.cli import common, main


def _command_context(name: str, args: list[str]) -> click.Context:
    group = main.make_context("ipvs-leftovers", [name])
    cmd = main.get_command(group, name)
    assert cmd is not None
    return cmd.make_context(name, args, parent=group)


def test_serve_auto_cleanup_settings_carry_every_option(tmp_path: Path) -> None:
    ctx = _command_context(
        "serve",
        ["--auto-cleanup", "--backup-dir", str(tmp_path / "b"), "--lock-file", str(tmp_path / "l")]
        + ["--tool-timeout", "77", "--drain-timeout", "2m", "--cut-connections"],
    )
    assert common.cleanup_settings(ctx) == Settings(
        backup_dir=tmp_path / "b",
        lock_file=tmp_path / "l",
        reset_arp_sysctls=False,  # serve never resets strictARP's sysctls
        tool_timeout=77.0,
        drain_timeout=120.0,
        cut_connections=True,
        hooks=hooks.NONE,
    )


def test_cleanup_settings_carry_every_option(tmp_path: Path) -> None:
    ctx = _command_context(
        "cleanup",
        ["--apply", "--backup-dir", str(tmp_path / "b"), "--lock-file", str(tmp_path / "l")]
        + ["--tool-timeout", "90", "--reset-arp-sysctls", "--drain-timeout", "0"],
    )
    assert common.cleanup_settings(ctx) == Settings(
        backup_dir=tmp_path / "b",
        lock_file=tmp_path / "l",
        reset_arp_sysctls=True,
        tool_timeout=90.0,
        drain_timeout=0.0,
        cut_connections=False,
        hooks=hooks.NONE,
    )


def test_every_settings_field_but_the_hooks_is_an_option_of_both_commands() -> None:
    """A new field must come from an option, or this fails before serve silently drops it."""
    fields = {f.name for f in dataclasses.fields(Settings)} - {"hooks", "reset_arp_sysctls"}
    for name in ("cleanup", "serve"):
        cmd = main.get_command(click.Context(main), name)
        assert cmd is not None
        assert fields <= {p.name for p in cmd.params}, name


def test_settings_are_keyword_only(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        Settings(tmp_path / "b", tmp_path / "l")  # type: ignore[misc]
