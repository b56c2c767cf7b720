"""Running the netfilter command-line tools the agent relies on (found on PATH or /usr/sbin)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

PACKAGES = {
    "iptables": "iptables",
    "ip6tables": "iptables",
    "ipset": "ipset",
    "ipvsadm": "ipvsadm",
}


DEFAULT_TIMEOUT = 60.0  # seconds a tool may run; `cleanup --tool-timeout` overrides it
# What a tool that loads text (iptables-restore, ipset restore) may take per line on top of
# that: ipset restore took >60 s for a 10,000-Service bundle in the benchmark's emulated VM
# (~3.5 ms a line), so a fixed deadline abandoned a restore half-way (docs/bundle.md).
SECONDS_PER_LINE = 0.02
PROGRESS_EVERY = 5.0
# The tools run with the C locale and nothing else from the agent's environment but this:
# XTABLES_LOCKFILE points iptables' lock at the host's /run/xtables.lock from a pod that sees
# the host under another path (`kubectl debug node/...`, docs/operations.md).
PASSED_ENV = ("XTABLES_LOCKFILE",)


def environment() -> dict[str, str]:
    return {"LC_ALL": "C", **{k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)}}


class ToolError(RuntimeError):
    """A tool is missing or failed; the text says which and why."""


def which(tool: str) -> str:
    """The first executable file `tool` in PATH, then /usr/sbin and /sbin.

    Not shutil.which: importing shutil imports zlib, bz2 and lzma, a tenth of a cold audit's
    start-up on the benchmark's emulator. Empty PATH entries (the current directory) are
    skipped: a privileged agent runs no tool from wherever it was started."""
    for folder in (*os.environ.get("PATH", "").split(os.pathsep), "/usr/sbin", "/sbin"):
        if not folder:
            continue
        path = os.path.join(folder, tool)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    package = PACKAGES.get(tool.split("-", 1)[0], tool)
    raise ToolError(f"{tool} not found (install the {package} package)")


def deadline_for(text: str, base: float = DEFAULT_TIMEOUT) -> float:
    """A loading tool's deadline: `base` plus an allowance per line it is given."""
    return base + SECONDS_PER_LINE * text.count("\n")


def run(
    args: list[str],
    stdin: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[float], None] | None = None,
) -> str:
    """Run a tool with the C locale; its stdout, or ToolError with its stderr. `progress` is
    called with the seconds elapsed every PROGRESS_EVERY seconds while the tool runs."""
    cmd = [which(args[0]), *args[1:]]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(),
    )
    started = time.monotonic()
    given: str | None = stdin
    while True:
        left = timeout - (time.monotonic() - started)
        try:
            out, err = proc.communicate(
                given, timeout=max(0.0, min(left, PROGRESS_EVERY if progress else left))
            )
            break
        except subprocess.TimeoutExpired:
            given = None  # communicate() keeps sending what it was given first
            if time.monotonic() - started >= timeout:
                proc.kill()
                # wait(), not communicate(): a child the tool left behind (a shell's) keeps
                # the pipes open, and reading them to the end waited for it past the deadline.
                proc.wait()
                for pipe in (proc.stdin, proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
                raise ToolError(f"{args[0]} did not finish within {timeout:g}s") from None
            if progress:
                progress(time.monotonic() - started)
    if proc.returncode != 0:
        raise ToolError(f"{args[0]} exited {proc.returncode}: {err.strip()[:300]}")
    return out
