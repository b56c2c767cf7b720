"""The group's options reach each command as one frozen, typed object (agent.cli.common)."""

import dataclasses

import click
import pytest

from agent.cli import common, main


def _group_context(*args: str) -> click.Context:
    ctx = main.make_context("ipvs-leftovers", [*args, "audit"])
    ctx.invoke(main.callback, **ctx.params)  # type: ignore[arg-type]  # the group's callback alone: the command is not run
    return ctx


def test_the_group_stores_its_options_typed_and_frozen() -> None:
    ctx = _group_context(
        "--kube-proxy-metrics-url=http://10.0.0.1:1",
        "--kube-proxy-healthz-url=http://10.0.0.1:2/healthz",
        "--timeout=3",
        "--log-format=json",
    )
    group = common.group_options(ctx)
    assert group == common.GroupOptions(
        metrics_url="http://10.0.0.1:1",
        healthz_url="http://10.0.0.1:2/healthz",
        timeout=3.0,
        log_format="json",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        group.timeout = 9.0  # type: ignore[misc]
    opts = common.options(ctx)
    assert (opts.metrics_url, opts.healthz_url, opts.timeout) == (
        "http://10.0.0.1:1",
        "http://10.0.0.1:2/healthz",
        3.0,
    )


def test_a_context_without_the_group_options_is_refused_by_name() -> None:
    ctx = click.Context(main, obj={"timeout": 3.0})
    with pytest.raises(TypeError, match="the group's options are missing"):
        common.group_options(ctx)
