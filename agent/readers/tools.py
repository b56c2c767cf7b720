"""Running the netfilter command-line tools the agent relies on (found on PATH or /usr/sbin)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

# subprocess (with selectors, signal and locale) and fcntl are imported by the functions that
# start a tool: the CLI's options and every reader import this module, and an audit of a node
# with no iptables table runs no tool at all.
if TYPE_CHECKING:
    import selectors
    import subprocess

PACKAGES = {
    "iptables": "iptables",
    "ip6tables": "iptables",
    "ipset": "ipset",
    "ipvsadm": "ipvsadm",
}


DEFAULT_TIMEOUT = 60.0  # seconds a tool may run; `cleanup --tool-timeout` overrides it
# A tool that loads text (iptables-restore, ipset restore) is given up only when it stops
# making progress (`load`): a fixed deadline abandoned a 10,000-Service restore half-way, and
# 20 ms a line was not enough either (ipset restore took over 485 s for 21,271 lines in the
# benchmark's emulated VM on a loaded host; docs/bundle.md). Once all its input is taken, it
# may take `timeout` plus this much per line to apply it and exit.
SECONDS_PER_LINE = 0.02
PROGRESS_EVERY = 5.0
_OUTPUT_CAP = 1 << 20
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, named in the module only from Python 3.10 on Linux
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


@dataclass
class _Input:
    """What is left of a tool's standard input, and when it last took some."""

    data: bytes
    pipe: IO[bytes]
    sel: selectors.BaseSelector
    pos: int = 0
    last: float = 0.0

    @property
    def fed(self) -> bool:
        return self.pos >= len(self.data)

    def close(self) -> None:
        self.sel.unregister(self.pipe)
        self.pipe.close()
        self.last = time.monotonic()

    def write(self, fd: int) -> None:
        """As much as the pipe takes now; closed once all is taken or the tool has gone."""
        try:
            n = os.write(fd, self.data[self.pos : self.pos + 65536])
        except BlockingIOError:
            return
        except BrokenPipeError:  # it exited early: its exit code says why
            self.close()
            return
        self.pos += n
        self.last = time.monotonic()
        if self.fed:
            self.close()


def _start(args: list[str]) -> tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes], IO[bytes]]:
    import fcntl  # imported here: audit's cold start does not need it, measured in bench/README.md
    import subprocess  # imported here: as fcntl

    proc = subprocess.Popen(
        [which(args[0]), *args[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment(),
        process_group=0,  # see run()
    )
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr
    if stdin is None or stdout is None or stderr is None:  # PIPE makes all three
        proc.kill()
        raise ToolError(f"{args[0]}: no pipes to it")
    with contextlib.suppress(OSError):  # a one-page pipe: what the tool takes shows at once
        fcntl.fcntl(stdin.fileno(), F_SETPIPE_SZ, 4096)
    os.set_blocking(stdin.fileno(), False)
    return proc, stdin, stdout, stderr


def _selector(
    stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes], out: bytearray, err: bytearray
) -> selectors.BaseSelector:
    """Writable stdin; stdout and stderr readable, each with the buffer it is read into."""
    import selectors  # imported here: audit's cold start does not need it, bench/README.md

    sel = selectors.DefaultSelector()
    sel.register(stdin, selectors.EVENT_WRITE)
    sel.register(stdout, selectors.EVENT_READ, out)
    sel.register(stderr, selectors.EVENT_READ, err)
    return sel


def load(
    args: list[str],
    text: str,
    stall: float = DEFAULT_TIMEOUT,
    progress: Callable[[float, float], None] | None = None,
) -> str:
    """Run a tool that loads `text` from its standard input; its stdout, or ToolError.

    The deadline follows the work: the tool is given up when it has taken none of its input for
    `stall` seconds, or when it has not exited `stall` seconds plus SECONDS_PER_LINE a line
    after taking the last of it (it is then applying what it read). `progress` is called with
    the seconds elapsed and the share of the input taken, every PROGRESS_EVERY seconds."""
    import subprocess  # imported here: audit's cold start does not need it, bench/README.md

    after_input = stall + SECONDS_PER_LINE * text.count("\n")
    proc, stdin, stdout, stderr = _start(args)
    out, err = bytearray(), bytearray()
    sel = _selector(stdin, stdout, stderr, out, err)
    started = time.monotonic()
    feed = _Input(text.encode(), stdin, sel, last=started)
    report = started + PROGRESS_EVERY
    try:
        while sel.get_map():
            now = time.monotonic()
            allowed = feed.last + (after_input if feed.fed else stall)
            if now >= allowed:
                taken = f"took {feed.pos} of {len(feed.data)} bytes of input"
                why = f"applied nothing more for {after_input:g}s" if feed.fed else "stalled"
                gap = now - feed.last
                raise ToolError(f"{args[0]} {why}: it {taken}, then nothing for {gap:.0f}s")
            for key, _ in sel.select(timeout=min(1.0, allowed - now)):
                if key.fileobj is stdin:
                    feed.write(key.fd)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                elif len(key.data) < _OUTPUT_CAP:
                    key.data.extend(chunk)
            if progress and time.monotonic() >= report:
                report += PROGRESS_EVERY
                progress(time.monotonic() - started, feed.pos / max(1, len(feed.data)))
        code = proc.wait(timeout=max(0.1, feed.last + after_input - time.monotonic()))
    except BaseException as exc:
        proc.kill()
        proc.wait()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise ToolError(f"{args[0]} did not exit after its output ended") from None
        raise
    finally:
        sel.close()
        for pipe in (stdin, stdout, stderr):
            pipe.close()
    if code != 0:
        message = err.decode(errors="replace").strip()[:300]
        raise ToolError(f"{args[0]} exited {code}: {message}")
    return out.decode(errors="replace")


def run(args: list[str], stdin: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> str:
    """Run a tool with the C locale; its stdout, or ToolError with its stderr."""
    import subprocess  # imported here: audit's cold start does not need it, bench/README.md

    cmd = [which(args[0]), *args[1:]]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(),
        # Its own process group: a terminal's ^C (SIGINT to the foreground group) reaches the
        # agent only, which ends the step -- this tool's run -- before it stops; the tool is
        # never cut off mid-write, nor left running after the agent exits.
        process_group=0,
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        # wait(), not communicate(): a child the tool left behind (a shell's) keeps the pipes
        # open, and reading them to the end waited for it past the deadline.
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        raise ToolError(f"{args[0]} did not finish within {timeout:g}s") from None
    if proc.returncode != 0:
        raise ToolError(f"{args[0]} exited {proc.returncode}: {err.strip()[:300]}")
    return out
