import io

from agent.logs import BatchedLines


class _Counting(io.StringIO):
    flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_lines_are_written_in_order_and_flushed_in_batches() -> None:
    stream = _Counting()
    say = BatchedLines(stream, interval=3600)
    for i in range(11_000):
        say(f"done delete-ipvs-service {i}")
    assert stream.flushes == 0
    say.flush()
    assert stream.flushes == 1
    lines = stream.getvalue().splitlines()
    assert len(lines) == 11_000 and lines[0].endswith(" 0") and lines[-1].endswith(" 10999")


def test_a_line_after_the_interval_is_flushed_at_once() -> None:
    stream = _Counting()
    say = BatchedLines(stream, interval=0.0)
    say("a")
    say("b")
    assert stream.flushes == 2
