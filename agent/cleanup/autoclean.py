"""serve's auto-cleanup (off by default): the canary discipline of the migration in code.

It acts only after nftables mode has been confirmed on every observation for a whole hold-down
period (default a day), then runs the same procedure as `cleanup --apply`. After a run, whatever
its outcome, the hold-down starts again, so a failing node is not retried in a loop.

The streak is kept in a small file on the node (`--auto-cleanup-state`, by default beside the
lock, on the host's /run), so that a restarted agent pod carries on where the last one stopped
instead of waiting a whole hold-down again. The file is trusted only when every check passes
(`load_streak`); anything else -- missing, truncated, garbage, another boot, a time in the
future, a symlink, a file others may write -- starts the streak over: a bad file can make the
agent wait longer, never act earlier.

A stop of serve (SIGTERM: a rolling update, a drain) during a run ends the step under way, puts
back what the run removed (agent.cleanup.stop) and only then lets serve exit; the streak is
then saved as it was before the run, so the next pod does not wait a whole hold-down again.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agent import METRIC_PREFIX as PREFIX
from agent.cleanup import procedure
from agent.cleanup.stop import Stop
from agent.collection import Collection

log = logging.getLogger("ipvs_leftovers.autoclean")


@dataclass
class Streak:
    """How long nftables mode has been confirmed without a break."""

    hold_down: float
    max_gap: float  # an observation gap longer than this breaks the streak
    since: float | None = None
    last_seen: float | None = None

    def observe(self, confirmed: bool, now: float) -> None:
        gap_ok = self.last_seen is not None and now - self.last_seen <= self.max_gap
        if not confirmed:
            self.since = None
        elif self.since is None or not gap_ok:
            self.since = now
        self.last_seen = now

    def seconds(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since

    def ripe(self, now: float) -> bool:
        return self.since is not None and self.seconds(now) >= self.hold_down

    def restart(self) -> None:
        self.since = None


STATE_VERSION = 1
STATE_MAX_BYTES = 4096
CLOCK_SKEW = 5.0  # seconds a saved time may be ahead of this clock (two writers, one clock)
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class BadState(ValueError):
    """The saved streak failed a check; the message says which."""


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _read_state(path: Path) -> bytes:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadState("is a symlink") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadState("is not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise BadState("is owned by another user or writable by others")
        data = os.read(fd, STATE_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > STATE_MAX_BYTES:
        raise BadState(f"is larger than {STATE_MAX_BYTES} bytes")
    return data


def parse_state(data: bytes, now: float, boot: str) -> tuple[float, float] | None:
    """(since, last_seen) from the file's bytes; None for a saved "no streak"; BadState when
    any check fails."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadState(f"is not JSON ({exc})") from None
    if not isinstance(doc, dict) or set(doc) != {"version", "boot_id", "since", "last_seen"}:
        raise BadState("does not have exactly version, boot_id, since, last_seen")
    if doc["version"] != STATE_VERSION:
        raise BadState(f"has version {doc['version']!r}, not {STATE_VERSION}")
    if not boot or doc["boot_id"] != boot:
        raise BadState("was written before the node last booted")
    since, last = doc["since"], doc["last_seen"]
    for name, value in (("since", since), ("last_seen", last)):
        ok_null = value is None and name == "since"
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok_null and not (number and math.isfinite(value) and value > 0):
            raise BadState(f"has {name} {value!r}, not a time")
    if last > now + CLOCK_SKEW:
        raise BadState("has last_seen in the future")
    if since is None:
        return None
    if since > last:
        raise BadState("has since after last_seen")
    return float(since), float(last)


def load_streak(path: Path, hold_down: float, max_gap: float, now: float | None = None) -> Streak:
    """The streak saved at `path`, or a new one (with one log line saying why) when the file is
    missing or fails any check."""
    streak = Streak(hold_down, max_gap)
    now = time.time() if now is None else now
    try:
        parsed = parse_state(_read_state(path), now, boot_id())
    except FileNotFoundError:
        return streak
    except (OSError, BadState) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        log.warning("auto-cleanup state %s %s: the hold-down starts over", path, why)
        return streak
    if parsed is not None:
        streak.since, streak.last_seen = parsed
        log.info(
            "auto-cleanup state %s: nftables mode confirmed since %.0f, last seen %.0fs ago",
            path,
            parsed[0],
            now - parsed[1],
        )
    return streak


def save_streak(path: Path, streak: Streak) -> None:
    """Write the streak atomically (a new file renamed over the old one). Raises OSError."""
    if streak.last_seen is None:
        return
    doc = {
        "version": STATE_VERSION,
        "boot_id": boot_id(),
        "since": streak.since,
        "last_seen": streak.last_seen,
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileExistsError:  # left by a process with our pid that died mid-write
        tmp.unlink()
        fd = os.open(tmp, flags, 0o600)
    except FileNotFoundError:  # the folder is made on first use (a tmpfs /run)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass
class AutoCleanup:
    observe: Callable[[], Collection]  # the scrapes' shared collection
    fresh: Callable[[], Collection]  # a new read, for the procedure's own checks
    settings: procedure.Settings
    streak: Streak
    interval: float
    state: Path | None = None  # where the streak is kept across restarts
    runs: dict[str, int] = field(default_factory=dict)
    last: procedure.Result | None = None
    last_run_at: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _save_error: str = ""
    # the run's stop: serve's signal handler asks it (stop()), the procedure checks it
    stopping: Stop = field(default_factory=lambda: Stop(log.warning))
    _thread: threading.Thread | None = None

    def _save(self) -> None:
        if self.state is None:
            return
        try:
            save_streak(self.state, self.streak)
            self._save_error = ""
        except OSError as exc:
            why = f"{exc.strerror or exc}"
            if why != self._save_error:  # once per distinct failure, not every tick
                log.warning(
                    "cannot save the auto-cleanup state %s (%s): a restart will start the "
                    "hold-down over",
                    self.state,
                    why,
                )
            self._save_error = why

    def tick(self, now: float | None = None) -> None:
        col = self.observe()
        now = time.time() if now is None else now
        self.streak.observe(col.classification.mode.nftables_confirmed, now)
        self._save()
        c = col.classification
        # ipvs-mode leftovers (stale) or iptables mode's: both go under the same gate
        if not (self.streak.ripe(now) and c.mode.nftables_confirmed and c.removable):
            return
        if self._stop.is_set():
            return
        log.info(
            "nftables mode confirmed for %.0fs and leftovers exist: cleaning up",
            self.streak.seconds(now),
        )
        self.last_run_at = now
        # The hold-down starts over before the run, on disk too: an agent killed mid-run does
        # not run again the moment it is back.
        kept = (self.streak.since, self.streak.last_seen)
        self.streak.restart()
        self._save()
        try:
            self.last = procedure.apply(
                self.fresh, self.settings, log.info, log.info, self.stopping
            )
            outcome = {0: "clean", 1: "remains"}.get(self.last.code, "error")
        except procedure.Interrupted as exc:
            # Stopped, and the node is as before the run: the streak it had still holds. The
            # run is not counted (it had no outcome).
            log.warning("%s", exc)
            self.streak.since, self.streak.last_seen = kept
            self._save()
            return
        except procedure.Refused as exc:
            log.warning("%s", exc)
            outcome = "refused"
        except procedure.CleanupError as exc:
            log.error("%s", exc)
            outcome = "error"
        self.runs[outcome] = self.runs.get(outcome, 0) + 1

    def run_forever(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the exporter keeps serving whatever happens here
                log.exception("auto-cleanup check failed")

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="auto-cleanup", daemon=True)
        self._thread.start()

    def stop(self, signal_name: str = "") -> None:
        """No more runs; a run under way (given the signal's name) ends its step and undoes."""
        self._stop.set()
        if signal_name:
            self.stopping.ask(signal_name)

    def finish(self) -> None:
        """No more runs, and wait for one under way to end (its undo included), so that no tool
        outlives serve. In short waits: the main thread must stay free to run the signal
        handlers meanwhile."""
        self._stop.set()
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

    def metrics(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = time.time()
        yield GaugeMetricFamily(
            PREFIX + "nftables_confirmed_streak_seconds",
            "Seconds nftables mode has been confirmed without a break",
            value=self.streak.seconds(now),
        )
        yield GaugeMetricFamily(
            PREFIX + "cleanup_last_run_timestamp_seconds",
            "When auto-cleanup last ran (0: never)",
            value=self.last_run_at,
        )
        runs = CounterMetricFamily(
            PREFIX + "cleanup_runs", "Auto-cleanup runs by outcome", labels=["outcome"]
        )
        for outcome in ("clean", "remains", "refused", "error"):
            runs.add_metric([outcome], self.runs.get(outcome, 0))
        yield runs
        removed = GaugeMetricFamily(
            PREFIX + "cleanup_removed",
            "Objects the last auto-cleanup run removed, by step kind",
            labels=["kind"],
        )
        done = self.last.removed_by_kind() if self.last else {}
        for kind in (
            "delete-ipvs-service",
            "iptables-table",
            "destroy-ipset",
            "delete-link",
            "reset-sysctl",
        ):
            removed.add_metric([kind], done.get(kind, 0))
        yield removed
        yield GaugeMetricFamily(
            PREFIX + "cleanup_failures",
            "Failed steps in the last auto-cleanup run",
            value=self.last.failures if self.last else 0,
        )
        cut = GaugeMetricFamily(
            PREFIX + "cleanup_connections_cut",
            "Connections the last auto-cleanup run cut (an active one only with --cut-connections)",
            labels=["state"],
        )
        cut.add_metric(["active"], self.last.cut.active if self.last else 0)
        cut.add_metric(["inactive"], self.last.cut.inactive if self.last else 0)
        yield cut
