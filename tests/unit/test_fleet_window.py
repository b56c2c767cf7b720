"""`fleet step`'s maintenance window (agent/fleet/window.py) against kured's own table of cases
(pkg/timewindow/timewindow_test.go, every case, the windows across midnight included), the
DST edges Go's time.Date decides, the values refused; and the command line: kured's option
names, one-line usage errors (exit 2), outside the window one line and exit 0 having read
nothing."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.fleet.window import EVERY_DAY, Window, WindowError, parse_days, window

LA = "America/Los_Angeles"


def at(text: str, zone: str) -> dt.datetime:
    """kured's test times: "2019/04/04 00:49" in a zone (its PDT, or UTC)."""
    return dt.datetime.strptime(text, "%Y/%m/%d %H:%M").replace(tzinfo=zoneinfo.ZoneInfo(zone))


# (days, start, end, zone, [(time, zone of the time, inside)]): kured's table, its 12-hour
# times written as 24-hour ones (this project takes HH:MM only).
KURED = [
    ("mon,tue,wed,thu,fri", "09:00", "17:00", LA, [
        ("2019/03/31 10:00", LA, False),
        ("2019/04/04 00:49", LA, False),
        ("2019/04/04 12:00", LA, True),
        ("2019/04/04 11:59", "UTC", False),
        ("2019/04/05 08:59", LA, False),
        ("2019/04/05 9:01", LA, True),
    ]),
    ("mon,we,fri", "10:01", "11:30", LA, [
        ("2019/04/05 10:30", LA, True),
        ("2019/04/06 10:30", LA, False),
        ("2019/04/07 10:30", LA, False),
        ("2019/04/08 10:30", LA, True),
        ("2019/04/09 10:30", LA, False),
        ("2019/04/10 10:30", LA, True),
        ("2019/04/11 10:30", LA, False),
    ]),
    ("mo,tu,we,th,fr", "00:00", "23:59:59", "UTC", [
        ("2019/04/18 00:00", "UTC", True),
        ("2019/04/18 23:59", "UTC", True),
    ]),
    ("mon,tue,wed,thu,fri", "21:00", "05:00", LA, [
        ("2019/03/30 04:00", LA, False),
        ("2019/03/31 10:00", LA, False),
        ("2019/03/31 22:00", LA, False),
        ("2019/04/04 00:49", LA, True),
        ("2019/04/04 12:00", LA, False),
        ("2019/04/04 22:49", LA, True),
        ("2019/04/05 00:49", LA, True),
        ("2019/04/05 08:59", LA, False),
        ("2019/04/05 9:01", LA, False),
    ]),
    ("mon,tue,wed,thu,fri", "23:59", "00:01", LA, [
        ("2019/04/04 23:58", LA, False),
        ("2019/04/04 23:59", LA, True),
        ("2019/04/05 00:00", LA, True),
        ("2019/04/05 00:01", LA, True),
        ("2019/04/05 00:02", LA, False),
    ]),
    ("mon,tue,wed,fri", "23:59", "00:01", LA, [
        ("2019/04/04 23:58", LA, False),
        ("2019/04/04 23:59", LA, False),  # Thursday is not a day of the window
        ("2019/04/05 00:00", LA, True),
        ("2019/04/05 00:02", LA, False),
    ]),
    ("mon,tue,wed,thu", "23:59", "00:01", LA, [
        ("2019/04/04 23:58", LA, False),
        ("2019/04/04 23:59", LA, True),
        ("2019/04/05 00:00", LA, False),  # Friday is not: the day is the day `t` falls on
        ("2019/04/05 00:02", LA, False),
    ]),
    ("mon,tue,wed,thu,fri", "23:59", "00:01", "UTC", [
        ("2019/04/04 23:58", "UTC", False),
        ("2019/04/04 23:59", "UTC", True),
        ("2019/04/05 00:00", "UTC", True),
        ("2019/04/05 00:01", "UTC", True),
        ("2019/04/05 00:02", "UTC", False),
    ]),
]  # fmt: skip
CASES = [
    pytest.param(w, t, tz, inside, id=f"{w[0]} {w[1]}-{w[2]} {w[3]}: {t} {tz}")
    for *w, cases in KURED
    for t, tz, inside in cases
]


@pytest.mark.parametrize(("spec", "when", "zone", "inside"), CASES)
def test_kureds_own_cases(spec: list[str], when: str, zone: str, inside: bool) -> None:
    days, start, end, tz = spec
    assert window(start, end, days, tz).contains(at(when, zone)) is inside


def test_both_ends_are_inside_to_the_nanosecond_second_and_the_next_second_is_not() -> None:
    w = window("22:00", "04:00", None, "UTC")
    night = dt.datetime(2026, 12, 7, 22, 0, tzinfo=dt.UTC)
    assert w.contains(night)
    assert not w.contains(night - dt.timedelta(microseconds=1))
    end = dt.datetime(2026, 12, 8, 4, 0, 0, 999999, tzinfo=dt.UTC)
    assert w.contains(end) and not w.contains(end + dt.timedelta(microseconds=1))


def test_the_defaults_are_kureds_and_hold_at_every_instant_of_a_week() -> None:
    w = window("00:00", "23:59:59", None, "UTC")
    assert w.days == EVERY_DAY
    t = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)
    while t < dt.datetime(2026, 12, 14, tzinfo=dt.UTC):
        assert w.contains(t), t
        t += dt.timedelta(seconds=599, microseconds=999999)
    assert str(w) == "every day 00:00-23:59 UTC"


def test_a_window_across_midnight_on_the_night_summer_time_begins_is_24_hours_not_a_day() -> None:
    """Europe/Berlin, 29 March 2026: 02:00 CET is 03:00 CEST. A window 22:00-01:00 asked at
    00:30 Sunday starts Saturday 22:00 + 24 h back: Go's Add is 24 real hours, and so here."""
    berlin = "Europe/Berlin"
    w = window("22:00", "01:00", "sun", berlin)
    sunday_0030 = dt.datetime(2026, 3, 29, 0, 30, tzinfo=zoneinfo.ZoneInfo(berlin))
    assert w.contains(sunday_0030)
    # Sunday 23:30: after the end, so end + 24 h (Monday 01:00 CEST): inside, Sunday's window
    assert w.contains(dt.datetime(2026, 3, 29, 23, 30, tzinfo=zoneinfo.ZoneInfo(berlin)))


@pytest.mark.parametrize(
    ("zone", "wall", "utc"),
    [
        # a wall time the spring change skips: Go reads 02:30 Berlin as 01:30 UTC (CET)...
        ("Europe/Berlin", dt.datetime(2026, 3, 29, 2, 30), dt.datetime(2026, 3, 29, 1, 30)),
        # ... and 02:30 Los Angeles as 09:30 UTC (PDT)
        (LA, dt.datetime(2026, 3, 8, 2, 30), dt.datetime(2026, 3, 8, 9, 30)),
        # a wall time the autumn change repeats: Berlin's second (CET), LA's first (PDT)
        ("Europe/Berlin", dt.datetime(2026, 10, 25, 2, 30), dt.datetime(2026, 10, 25, 1, 30)),
        (LA, dt.datetime(2026, 11, 1, 1, 30), dt.datetime(2026, 11, 1, 8, 30)),
    ],
)
def test_a_start_time_a_dst_change_skips_or_repeats_is_read_as_gos_time_date_reads_it(
    zone: str, wall: dt.datetime, utc: dt.datetime
) -> None:
    """The window opens at the instant Go's time.Date gives for that wall time (worked out
    from Go's src/time/time.go Date: the offset at the wall time read as UTC, then the offset
    at the instant found when that is outside the first offset's period)."""
    w = window(f"{wall:%H:%M}", "23:59", None, zone)
    opens = utc.replace(tzinfo=dt.UTC)
    assert w.contains(opens)
    assert not w.contains(opens - dt.timedelta(microseconds=1))


def test_days_by_kureds_names_and_numbers() -> None:
    assert parse_days("Mon,tue,Wednesday,th") == (0, 1, 2, 3)
    assert parse_days("0,6") == (5, 6)  # Go's Sunday 0, Saturday 6
    assert parse_days("sun,su,sunday") == (6,)


@pytest.mark.parametrize(
    ("start", "end", "days", "zone", "message"),
    [
        ("25:00", "04:00", None, "UTC", "'25:00' is not a time of day: hours 00-23, minutes 00-59"),
        ("22:00", "4pm", None, "UTC", "'4pm' is not a time of day: HH:MM or HH:MM:SS, 24-hour"),
        ("22:00", "04:60", None, "UTC", "'04:60' is not a time of day"),
        ("22:00", "04:00", "mon,funday", "UTC", "'funday' is not a day: mon, tue, wed"),
        ("22:00", "04:00", "", "UTC", "'' is not a day"),
        ("22:00", "04:00", "7", "UTC", "'7' is not a day"),
        ("22:00", "04:00", None, "Mars/Olympus", "'Mars/Olympus' is not a time zone: an IANA"),
        ("22:00", "04:00", None, "../etc/passwd", "'../etc/passwd' is not a time zone"),
        ("22:00", "04:00", None, "Local", "'Local' is not a time zone"),
    ],
)
def test_bad_values_are_refused_naming_what_is_accepted(
    start: str, end: str, days: str | None, zone: str, message: str
) -> None:
    with pytest.raises(WindowError) as e:
        window(start, end, days, zone)
    assert str(e.value).startswith(message)


def test_contains_needs_an_aware_time() -> None:
    with pytest.raises(ValueError):
        Window(dt.time(1), dt.time(2), EVERY_DAY, "UTC").contains(dt.datetime(2026, 1, 1))


# --- the command line ------------------------------------------------------------------------

UNREACHABLE = ["--prometheus-url", "http://127.0.0.1:9", "--prometheus-timeout", "2s"]


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, ["fleet", "step", *UNREACHABLE, *args])
    return r.exit_code, r.stdout, r.stderr


def _far_day() -> str:
    """A day that is neither yesterday, today nor tomorrow in UTC: outside whatever the
    time of day, and no run across midnight makes it today."""
    today = dt.datetime.now(dt.UTC).weekday()
    return ("mon", "tue", "wed", "thu", "fri", "sat", "sun")[(today + 3) % 7]


def test_outside_the_window_one_line_exit_0_and_nothing_read() -> None:
    """Prometheus unreachable and no kubeconfig: inside the window that is exit 4; outside,
    the step never asks either of them."""
    code, out, err = run("--days", _far_day(), "--kubeconfig", "/nonexistent/kubeconfig")
    assert (code, err) == (0, "")
    assert out == (
        f"outside the maintenance window ({_far_day()} 00:00-23:59 UTC): nothing read, "
        "nothing created\n"
    )
    code, out, err = run("--days", _far_day(), "--json", "--apply")
    assert code == 0 and err == ""
    assert '"in_window": false' in out and '"wave": null' in out and '"created": []' in out


def test_inside_the_window_the_step_goes_on_to_the_api_server() -> None:
    code, out, err = run(
        "--start-time", "00:00", "--end-time", "23:59:59", "--time-zone", "UTC",
        "--kubeconfig", "/nonexistent/kubeconfig",
    )  # fmt: skip
    assert code == 4 and out == ""
    assert err.startswith("ipvs-leftovers: fleet step refused: no usable kubeconfig")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--start-time", "25:00"], "Invalid value for '--start-time': '25:00' is not a time of"),
        (["--end-time", "4pm"], "Invalid value for '--end-time': '4pm' is not a time of day"),
        (["--days", "mon,xyz"], "Invalid value for '--days': 'xyz' is not a day: mon, tue"),
        (["--time-zone", "Nowhere/City"], "Invalid value for '--time-zone': 'Nowhere/City' is"),
        (["--alert-filter-regexp", "Watchdog("], "Invalid value for '--alert-filter-regexp': "),
        (["--ignore-alerts", "("], "Invalid value for '--ignore-alerts': '(' is not a regular"),
        (
            ["--alert-filter-regexp", "A", "--ignore-alerts", "B"],
            "--ignore-alerts is the old name of --alert-filter-regexp: give one of them",
        ),
    ],
)
def test_a_bad_value_is_a_one_line_usage_error(args: list[str], message: str) -> None:
    code, out, err = run(*args)
    assert code == 2 and out == ""
    assert "Traceback" not in err
    assert message in err.splitlines()[-1], err


def test_kureds_option_names_in_help_the_old_alert_option_hidden_but_working() -> None:
    from agent.cli.fleet import step

    text = CliRunner().invoke(main, ["fleet", "step", "--help"]).stdout
    for name in ("--alert-filter-regexp", "--start-time", "--end-time", "--days", "--time-zone"):
        assert name in text
    assert "--ignore-alerts" not in text
    for option in ("--alert-filter-regexp", "--ignore-alerts"):
        ctx = step.make_context("step", [*UNREACHABLE, option, "Watchdog|InfoInhibitor"])
        from agent.cli.fleet import alert_filter

        assert alert_filter(dict(ctx.params)) == "Watchdog|InfoInhibitor"
