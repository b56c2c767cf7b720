from agent.cleanup.autoclean import Streak


def test_streak_needs_the_whole_hold_down_without_a_break() -> None:
    s = Streak(hold_down=100, max_gap=30)
    s.observe(True, 0)
    s.observe(True, 20)
    assert not s.ripe(90)
    s.observe(True, 40)
    s.observe(False, 60)  # one unconfirmed observation restarts it
    s.observe(True, 70)
    assert s.seconds(100) == 30 and not s.ripe(160)
    for t in range(90, 200, 20):
        s.observe(True, t)
    assert s.ripe(190)


def test_a_gap_in_observations_breaks_the_streak() -> None:
    s = Streak(hold_down=100, max_gap=30)
    s.observe(True, 0)
    s.observe(True, 80)  # 80 s without an observation: nothing proves continuity
    assert s.since == 80
    s.restart()
    assert s.seconds(500) == 0
