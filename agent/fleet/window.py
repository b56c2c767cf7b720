"""The maintenance window of `fleet step`: kured's (`--start-time`, `--end-time`,
`--reboot-days`, `--time-zone`), with kured's semantics (pure: plain data in, a verdict out).

kured's pkg/timewindow (github.com/kubereboot/kured), `TimeWindow.Contains(t)`, followed line by
line in `Window.contains`:

- `t` in the window's zone; its weekday must be one of the days, else outside;
- start = that date at the start time (its seconds, 0 ns), end = that date at the end time
  (its seconds, 999,999,999 ns), both as Go's `time.Date` makes a wall time in a zone
  (`_go_date`, which also decides a wall time that a DST change skips or repeats);
- start after end (a window that wraps past midnight): when `t` is before end, start moves 24 h
  back, else end moves 24 h on (Go's `Add`, an absolute 24 h: 23 or 25 wall-clock hours across
  a DST change);
- inside when start <= t <= end (both ends included).

So the day is the day `t` falls on: a window 23:00-01:00 with days `fri` holds Friday 23:30 and
Friday 00:30 (the end of Thursday's night), not Saturday 00:30. kured's defaults are this
module's: start 00:00, end 23:59:59, every day, UTC (a window that always holds).

Differences from kured, on input only: times are 24-hour `H:MM`, `HH:MM` or `HH:MM:SS` (kured
also takes `3pm`, `03:04pm`, `15`); a zone is an IANA name (`Local` is not one).
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from dataclasses import dataclass

# kured's pkg/timewindow/days.go: two-letter, three-letter and full names, any case, and the
# numbers 0 (Sunday) to 6 (Saturday), Go's time.Weekday. Stored as Python's weekday()
# (Monday 0 .. Sunday 6).
_NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
DAY_NAMES: dict[str, int] = {}
for _i, _name in enumerate(_NAMES):
    DAY_NAMES.update({_name[:2]: _i, _name[:3]: _i, _name: _i})
    DAY_NAMES[str((_i + 1) % 7)] = _i  # Go's Sunday is 0, Monday 1
EVERY_DAY = tuple(range(7))
_TIME = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")
_NS = 1_000_000_000
_DAY_NS = 24 * 3600 * _NS


class WindowError(ValueError):
    """A value that is not a time, a day or a zone; the message names what is accepted."""


@dataclass(frozen=True)
class Window:
    start: dt.time
    end: dt.time
    days: tuple[int, ...]  # Python weekday numbers, Monday 0
    zone: str

    def __str__(self) -> str:
        days = (
            "every day"
            if set(self.days) == set(EVERY_DAY)
            else ",".join(_NAMES[d][:3] for d in sorted(self.days))
        )
        return f"{days} {self.start:%H:%M}-{self.end:%H:%M} {self.zone}"

    def contains(self, t: dt.datetime) -> bool:
        """kured's TimeWindow.Contains: see the module's docstring. `t` must be aware."""
        if t.tzinfo is None:
            raise ValueError("Window.contains needs an aware datetime")
        tz = zoneinfo.ZoneInfo(self.zone)
        local = t.astimezone(tz)
        if local.weekday() not in self.days:
            return False
        at = _ns(t)
        start = _go_date(local.date(), self.start, tz)
        end = _go_date(local.date(), self.end, tz) + _NS - 1
        if self.start > self.end:  # Go: startTime.After(endTime)
            if at < end:
                start -= _DAY_NS
            else:
                end += _DAY_NS
        return start <= at <= end


def _ns(t: dt.datetime) -> int:
    """Nanoseconds since the epoch, exactly (a datetime holds microseconds)."""
    delta = t - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86400 + delta.seconds) * _NS + delta.microseconds * 1000


def _offset(epoch_s: int, tz: zoneinfo.ZoneInfo) -> int:
    """The zone's UTC offset in seconds at an instant."""
    off = dt.datetime.fromtimestamp(epoch_s, tz).utcoffset()
    return int(off.total_seconds()) if off is not None else 0


def _go_date(day: dt.date, clock: dt.time, tz: zoneinfo.ZoneInfo) -> int:
    """Go's time.Date(y, m, d, h, min, s, 0, loc) in nanoseconds since the epoch: the wall time
    read as UTC, less the offset in force at that instant; when the instant so found is outside
    the zone period that offset came from (a DST change in between), less the offset in force
    at that instant instead. This picks, like Go, one of the two readings of a repeated wall
    time and one side of a skipped one."""
    wall = dt.datetime.combine(day, clock.replace(microsecond=0), tzinfo=dt.UTC)
    unix = int(wall.timestamp())
    offset = _offset(unix, tz)
    if offset != 0:
        utc = unix - offset
        later = _offset(utc, tz)
        if later != offset:
            offset = later
        unix -= offset
    return unix * _NS


def parse_time(text: str) -> dt.time:
    """`H:MM`, `HH:MM` or `HH:MM:SS`, 24-hour (Go's "15:04" and "15:04:05")."""
    m = _TIME.fullmatch(text.strip())
    if not m:
        raise WindowError(f"{text!r} is not a time of day: HH:MM or HH:MM:SS, 24-hour")
    hour, minute, second = int(m[1]), int(m[2]), int(m[3] or 0)
    if hour > 23 or minute > 59 or second > 59:
        raise WindowError(f"{text!r} is not a time of day: hours 00-23, minutes 00-59")
    return dt.time(hour, minute, second)


def parse_days(text: str) -> tuple[int, ...]:
    """A comma-separated list of days: mon..sun (kured also takes mo, monday, and 0-6 with
    0 Sunday); each day once, in week order."""
    days = set()
    for word in text.split(","):
        key = word.strip().lower()
        if key not in DAY_NAMES:
            days_ = "mon, tue, wed, thu, fri, sat, sun"
            raise WindowError(f"{word.strip()!r} is not a day: {days_} (comma-separated)")
        days.add(DAY_NAMES[key])
    return tuple(sorted(days))


def parse_zone(name: str) -> str:
    """An IANA time zone name (Europe/Berlin, UTC), as the zone database knows it."""
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise WindowError(
            f"{name!r} is not a time zone: an IANA name such as UTC or Europe/Berlin"
        ) from None
    return name


def window(start: str, end: str, days: str | None, zone: str) -> Window:
    """The window from the options' texts; WindowError naming the first bad value."""
    return Window(
        parse_time(start),
        parse_time(end),
        EVERY_DAY if days is None else parse_days(days),
        parse_zone(zone),
    )
