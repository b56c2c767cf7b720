"""A stop (SIGTERM, SIGINT) of a command that changes the node: cleanup, its undo, restore.

One mechanism for all three. A signal only records that a stop was asked; the command checks
at its step boundaries (`Stop.check`), so a step -- an iptables-restore transaction, a batch of
set destroys -- always ends whole and its tool is waited for, never left running. The command
then undoes what it changed (the all-or-nothing undo a failed step already gets). While that
undo runs, further signals are reported and ignored: a second ^C or a kubelet's repeated
SIGTERM must not leave the node part-restored.

Handlers are installed explicitly (`Stop.handle`) for SIGTERM as well as SIGINT: a Python
process that is PID 1 of its PID namespace (the agent in its image) receives no SIGTERM at all
without a handler, and the kubelet's stop would wait for the SIGKILL of the grace period's end.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


class Stopped(Exception):
    """A stop was asked; raised at the next step boundary."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"stopped by {signal_name}")
        self.signal_name = signal_name


def _stderr(line: str) -> None:
    # os.write, not print: a handler may run while the main thread is inside a write to stderr
    os.write(2, f"ipvs-leftovers: {line}\n".encode())


class Stop:
    """Whether a stop was asked, and whether an undo (which no signal interrupts) is running."""

    def __init__(self, report: Callable[[str], None] = _stderr) -> None:
        self.report = report
        self.asked: str | None = None  # the first signal's name
        self.undoing = False

    def ask(self, signal_name: str) -> None:
        """Record a stop; later ones are only reported."""
        if self.undoing:
            self.report(f"{signal_name} received while undoing: ignored until the undo ends")
        elif self.asked is not None:
            self.report(
                f"{signal_name} received: already stopping after the current step, then undoing"
            )
        else:
            self.asked = signal_name

    def check(self) -> None:
        """At a step boundary: Stopped if a stop was asked."""
        if self.asked is not None and not self.undoing:
            raise Stopped(self.asked)

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """An undo: runs to its end whatever signal comes."""
        before, self.undoing = self.undoing, True
        try:
            yield
        finally:
            self.undoing = before

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.ask(signal.Signals(signum).name)

    def handle(self) -> Stop:
        """Take SIGTERM and SIGINT (main thread only); returns self."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        return self
