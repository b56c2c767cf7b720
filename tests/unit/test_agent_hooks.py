"""The tests' entry point takes its hooks from anywhere in the arguments and hands the rest to
the CLI unchanged (tests/agent_hooks.py)."""

import pytest

from tests.agent_hooks import split


def test_hooks_are_taken_out_and_the_rest_kept_in_order() -> None:
    hooks, rest = split(
        ["--timeout", "3", "cleanup", "--apply", "--step-delay", "0.5", "--kill-after-step=2"]
    )
    assert hooks == {"step_delay": 0.5, "kill_after_step": 2}
    assert rest == ["--timeout", "3", "cleanup", "--apply"]


@pytest.mark.parametrize("bad", ["nan", "inf", "-1"])
def test_a_hook_that_is_no_finite_non_negative_number_is_refused(bad: str) -> None:
    with pytest.raises(SystemExit, match="a finite number >= 0"):
        split(["cleanup", "--pause-before-execute", bad])
