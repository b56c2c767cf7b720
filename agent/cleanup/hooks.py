"""The tests' hooks into a cleanup or a restore: windows in which a test stops or changes the
node, and a kill at an exact step boundary.

No command of the product sets them and no option or variable reaches them: only the tests'
entry point (tests/agent_hooks.py) replaces ACTIVE before it runs the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Hooks:
    pause_before_execute: float = 0.0  # a window between the backup and the re-check
    step_delay: float = 0.0  # a window between steps (cleanup and restore)
    # SIGKILL the process right after the k-th step's outcome (with a step delay, so each step
    # runs alone): a kill exactly at a step boundary, however loaded the test's machine is
    kill_after_step: int = 0


NONE = Hooks()
ACTIVE = NONE
