"""The agent's CLI with the tests' hooks (agent.cleanup.hooks), which no shipped command has:

    python tests/agent_hooks.py [--pause-before-execute S] [--step-delay S] [--kill-after-step K]
        ARGS...   (ARGS as for ipvs-leftovers; a hook may stand anywhere among them)

--pause-before-execute: a window between the cleanup's backup and its re-check (a line on stderr
opens it); --step-delay: a window between steps (cleanup and restore), each step then run alone;
--kill-after-step K: SIGKILL right after the K-th step's outcome.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

HOOKS = {"--pause-before-execute": float, "--step-delay": float, "--kill-after-step": int}
# The command line the tests run instead of the ipvs-leftovers script.
COMMAND = [sys.executable, str(Path(__file__).resolve())]


def split(argv: list[str]) -> tuple[dict[str, float | int], list[str]]:
    """The hooks' values (by field name) and the arguments left for the agent."""
    hooks: dict[str, float | int] = {}
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if name not in HOOKS:
            rest.append(arg)
            continue
        number = HOOKS[name](value if eq else next(args))
        if not math.isfinite(number) or number < 0:
            raise SystemExit(f"agent_hooks: {name} {number}: a finite number >= 0")
        hooks[name[2:].replace("-", "_")] = number
    return hooks, rest


def main() -> None:
    from agent.cleanup import hooks
    from agent.cli import main as cli

    values, rest = split(sys.argv[1:])
    hooks.ACTIVE = hooks.Hooks(**values)  # type: ignore[arg-type]
    cli(rest, prog_name="ipvs-leftovers")


if __name__ == "__main__":
    main()
