"""Running the netfilter command-line tools the agent relies on (found on PATH or /usr/sbin)."""

from __future__ import annotations

import os
import subprocess

PACKAGES = {
    "iptables": "iptables",
    "ip6tables": "iptables",
    "ipset": "ipset",
    "ipvsadm": "ipvsadm",
}


DEFAULT_TIMEOUT = 60.0  # seconds a tool may run; `cleanup --tool-timeout` overrides it
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


def run(args: list[str], stdin: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> str:
    """Run a tool with the C locale; its stdout, or ToolError with its stderr."""
    cmd = [which(args[0]), *args[1:]]
    try:
        proc = subprocess.run(
            cmd,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=environment(),
        )
    except subprocess.TimeoutExpired as exc:
        raise ToolError(f"{args[0]} did not finish within {timeout:g}s") from exc
    if proc.returncode != 0:
        raise ToolError(f"{args[0]} exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    return proc.stdout
