"""serve's auto-cleanup (off by default): the canary discipline of the migration in code.

It acts only after nftables mode has been confirmed on every observation for a whole hold-down
period (default a day), then runs the same procedure as `cleanup --apply`. After a run, whatever
its outcome, the hold-down starts again, so a failing node is not retried in a loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agent.cleanup import procedure
from agent.collection import Collection
from agent.views.metrics import PREFIX

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


@dataclass
class AutoCleanup:
    observe: Callable[[], Collection]  # the scrapes' shared collection
    fresh: Callable[[], Collection]  # a new read, for the procedure's own checks
    settings: procedure.Settings
    streak: Streak
    interval: float
    runs: dict[str, int] = field(default_factory=dict)
    last: procedure.Result | None = None
    last_run_at: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def tick(self, now: float | None = None) -> None:
        col = self.observe()
        now = time.time() if now is None else now
        self.streak.observe(col.classification.mode.nftables_confirmed, now)
        c = col.classification
        # ipvs-mode leftovers (stale) or iptables mode's: both go under the same gate
        if not (self.streak.ripe(now) and c.mode.nftables_confirmed and c.removable):
            return
        log.info(
            "nftables mode confirmed for %.0fs and leftovers exist: cleaning up",
            self.streak.seconds(now),
        )
        self.last_run_at = now
        try:
            self.last = procedure.apply(self.fresh, self.settings, log.info, log.info)
            outcome = {0: "clean", 1: "remains"}.get(self.last.code, "error")
        except procedure.Refused as exc:
            log.warning("%s", exc)
            outcome = "refused"
        except procedure.CleanupError as exc:
            log.error("%s", exc)
            outcome = "error"
        self.runs[outcome] = self.runs.get(outcome, 0) + 1
        self.streak.restart()

    def run_forever(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the exporter keeps serving whatever happens here
                log.exception("auto-cleanup check failed")

    def start(self) -> None:
        threading.Thread(target=self.run_forever, name="auto-cleanup", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

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
