"""agent.cleanup.stop: a signal is recorded, raised at the next boundary, and only reported
while an undo runs (the end-to-end cases, with real signals on lab nodes: tests/netns/test_stop.py)."""

from __future__ import annotations

import os
import signal

import pytest

from agent.cleanup.stop import Stop, Stopped


def test_a_stop_is_raised_at_the_next_check_only() -> None:
    said: list[str] = []
    stop = Stop(said.append)
    stop.check()  # nothing asked
    stop.ask("SIGTERM")
    with pytest.raises(Stopped, match="^stopped by SIGTERM$"):
        stop.check()
    stop.ask("SIGINT")  # the first one's name stays
    with pytest.raises(Stopped, match="^stopped by SIGTERM$"):
        stop.check()
    assert said == ["SIGINT received: already stopping after the current step, then undoing"]


def test_signals_during_an_undo_are_reported_and_ignored() -> None:
    said: list[str] = []
    stop = Stop(said.append)
    stop.ask("SIGTERM")
    with stop.shielded():
        stop.check()  # no raise inside the undo
        stop.ask("SIGINT")
        stop.ask("SIGTERM")
        with stop.shielded():  # the cleanup's undo runs restore's, nested
            pass
        stop.check()
    assert said == [
        "SIGINT received while undoing: ignored until the undo ends",
        "SIGTERM received while undoing: ignored until the undo ends",
    ]
    with pytest.raises(Stopped):  # after the undo the stop stands
        stop.check()


def test_handle_takes_sigterm_and_sigint() -> None:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop = Stop(lambda line: None).handle()
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next bytecode
        assert stop.asked == "SIGTERM"
        assert signal.getsignal(signal.SIGINT) == stop._on_signal
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
