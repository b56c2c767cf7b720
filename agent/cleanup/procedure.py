"""The `cleanup --apply` procedure (docs/contract.md#cleanup), shared by the command and
serve's auto-cleanup.

Order: plan -> lock -> gate -> the live connections drain (agent.cleanup.drain) -> backup ->
gate, plan and content again (agent.cleanup.recheck), the connections once more -> execute ->
re-audit. Until the executor starts nothing has changed, and every refusal says so. If a step
fails, the executor stops and what the steps before it removed is put back from the bundle
(restore's all-or-nothing replay, under the lock already held): the cleanup is applied whole
or not at all. A stop (SIGTERM, SIGINT: agent.cleanup.stop) is the same: the step under way
ends whole, then what was removed is put back, and no signal interrupts that.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent import exitcodes, gate
from agent.cleanup import drain, lock, recheck
from agent.cleanup.backup import write_bundle
from agent.cleanup.executor import Outcome, execute
from agent.cleanup.hooks import NONE, Hooks
from agent.cleanup.plan import Plan, describe, make_plan
from agent.cleanup.stop import Stop, Stopped
from agent.collection import Collection
from agent.readers import tools


class Refused(Exception):
    """The gate or the lock said no; nothing was changed (exit 3)."""

    code = exitcodes.REFUSED


class LiveConnections(Refused):
    """Connections still go through virtual servers the plan deletes, after the wait; nothing
    was changed (exit 5)."""

    code = exitcodes.LIVE_CONNECTIONS


class CleanupError(Exception):
    """Something could not be read or written before any change (exit 4)."""

    code = exitcodes.ERROR


class Interrupted(CleanupError):
    """A stop (SIGTERM, SIGINT) ended the cleanup before any change, or its changes were all
    undone; the message says which (exit 4)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    backup_dir: Path
    lock_file: Path
    reset_arp_sysctls: bool = False
    tool_timeout: float = tools.DEFAULT_TIMEOUT  # per netfilter tool run (backup, restore)
    # seconds to wait for the active connections through the plan's virtual servers to end
    # (0: no wait), and whether to cut those still there then instead of refusing
    drain_timeout: float = drain.DEFAULT_TIMEOUT
    cut_connections: bool = False
    hooks: Hooks = NONE  # only the tests set them (agent.cleanup.hooks)


@dataclass
class Result:
    code: int
    plan: Plan
    outcomes: list[Outcome] = field(default_factory=list)
    remaining: int = 0
    bundle: Path | None = None
    finished_at: float = 0.0
    window: float = 0.0  # seconds from the first change to the last
    cut: drain.Connections = drain.Connections()  # read right before the first change

    def removed_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            if o.result == "done":
                counts[o.step.action] = counts.get(o.step.action, 0) + 1
        return counts

    @property
    def failures(self) -> int:
        return sum(o.result == "failed" for o in self.outcomes)


def gate_refusal(col: Collection) -> str | None:
    return gate.refusal(col.classification.mode)


def plan_for(col: Collection, settings: Settings) -> Plan:
    errors = [
        name
        for name, r in col.snapshot.sources().items()
        if r.status == "error" and not name.startswith("kube_proxy")
    ]
    if errors:
        raise CleanupError(f"cannot plan: could not read {', '.join(errors)} (see audit)")
    return make_plan(col.snapshot, col.classification, settings.reset_arp_sysctls)


def _backup(plan: Plan, settings: Settings, drained: drain.Drain) -> Path:
    """The bundle, written before any change; CleanupError (nothing changed) when it cannot be."""
    connections = {
        **drained.connections.as_json(),
        "waited_seconds": round(drained.waited, 3),
        "drain_timeout": settings.drain_timeout,
        "cut_connections": settings.cut_connections,
    }
    try:
        return write_bundle(settings.backup_dir, plan, settings.tool_timeout, connections)
    except OSError as exc:  # a read-only or missing folder: no change has been made yet
        raise CleanupError(
            f"cannot write the backup under {settings.backup_dir} ({lock.reason(exc)}); point "
            "--backup-dir at a writable folder; nothing was changed"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - a tool failed; no change has been made yet
        raise CleanupError(
            f"cannot write the backup under {settings.backup_dir}: {exc}; nothing was changed"
        ) from exc


def _recheck(
    again: Collection,
    settings: Settings,
    backed_up: dict[str, str],
    bundle: Path,
    first: Collection,
) -> Plan:
    """The gate again on a new reading (and kube-proxy's failed syncs since the `first`), and
    that reading against the backup, in content: the plan made from it against the one the
    bundle was written from, then the members and real servers it lists against the bundle's.
    Refused (nothing changed) when either differs. Returns the plan made from it."""
    refusal = gate.recheck_refusal(
        first.snapshot.kube_proxy, again.snapshot, again.classification.mode
    )
    if refusal:
        raise Refused(refusal)
    now = plan_for(again, settings)
    changed = recheck.plan_change(backed_up, now.contents())
    if not changed:
        try:
            changed = recheck.bundle_change(bundle, now, settings.tool_timeout)
        except Exception as exc:  # noqa: BLE001 - a read failed; no change has been made yet
            raise CleanupError(
                f"cannot compare the node with the backup {bundle}: {exc}; nothing was changed"
            ) from exc
    if changed:
        raise Refused(
            f"refused: the node changed since its backup was read ({changed}); run cleanup "
            "again (nothing was changed)"
        )
    return now


def _live(c: drain.Connections, why: str) -> LiveConnections:
    return LiveConnections(
        f"refused: {c.describe()} {why}; deleting a virtual server cuts the connections IPVS "
        "tracks through it (ipvs mode set net.ipv4.vs.expire_nodest_conn=1); nothing was "
        "changed; run again once they have closed, give a longer --drain-timeout, or pass "
        "--cut-connections to cut them"
    )


def _drain(plan: Plan, settings: Settings, say: Callable[[str], None], stop: Stop) -> drain.Drain:
    """Wait up to the drain timeout for the active connections through the plan's virtual
    servers to end, reading their counts again each second; LiveConnections (nothing
    changed) when some are still open and cutting them was not asked."""
    first = drain.of_plan(plan)
    services = drain.planned(plan)

    def again() -> drain.Connections:
        try:
            return drain.reread(services)
        except (OSError, ValueError) as exc:  # an unknown count is never taken for none
            raise CleanupError(
                f"cannot read the IPVS connections ({exc}); nothing was changed"
            ) from exc

    if first.active and settings.drain_timeout > 0:
        say(
            f"connections: {first.describe()}; waiting up to {settings.drain_timeout:g}s for "
            "the active ones to close (--drain-timeout)"
        )
    done = drain.wait(first, again, settings.drain_timeout, stop.check)
    if done.connections.active and not settings.cut_connections:
        raise _live(
            done.connections,
            f"still open after waiting {settings.drain_timeout:g}s (--drain-timeout)",
        )
    if first.active:
        say(f"connections after {done.waited:.1f}s: {done.connections.describe()}")
    return done


def _reporter(say: Callable[[str], None], settings: Settings) -> Callable[[Outcome], None]:
    """Says each outcome; the tests' hook kill_after_step kills the process after the k-th."""
    reported = 0

    def report(o: Outcome) -> None:
        nonlocal reported
        detail = f": {o.detail}" if o.detail else ""
        say(f"{o.result:6} {o.step.action} {o.step.target}{detail}")
        reported += 1
        if reported == settings.hooks.kill_after_step:
            import os
            import signal

            flush = getattr(say, "flush", None)
            if flush is not None:
                flush()
            os.kill(os.getpid(), signal.SIGKILL)

    return report


def _locked(
    collect: Callable[[], Collection],
    settings: Settings,
    col: Collection,
    plan: Plan,
    say: Callable[[str], None],
    note: Callable[[str], None],
    stop: Stop,
) -> tuple[Path, list[Outcome], float, drain.Connections]:
    """Gate, drain, backup, re-check and execute, under the lock; raises before any change.
    Also returns how long the node was half-cleaned (from the first change to the last) and
    the connections read right before the first change: those the deletes cut."""
    refusal = gate_refusal(col)
    if refusal:
        raise Refused(refusal)
    drained = _drain(plan, settings, say, stop)
    backed_up = plan.contents()  # the bundle's iptables rules and link come from this plan
    bundle = _backup(plan, settings, drained)
    say(f"backup: {bundle}")
    stop.check()
    if settings.hooks.pause_before_execute:
        note("re-checking the gate")
        time.sleep(settings.hooks.pause_before_execute)
    cut = drain.of_plan(_recheck(collect(), settings, backed_up, bundle, col))
    if cut.active and not settings.cut_connections:
        raise _live(cut, "opened while the backup was written")
    saved_sets = _saved_sets(bundle)
    stop.check()  # the last moment a stop changes nothing
    if drain.planned(plan):
        flag = " (--cut-connections)" if cut.active else ""
        say(f"connections: cutting {cut.active} active, {cut.inactive} inactive{flag}")
    started = time.monotonic()
    outcomes = execute(
        plan.steps,
        _reporter(say, settings),
        settings.hooks.step_delay,
        settings.tool_timeout,
        lambda: stop.asked is not None,
        saved_sets,
    )
    failed = next((o for o in outcomes if o.result == "failed"), None)
    if failed is not None:
        why = f"{failed.step.action} {failed.step.target}: {failed.detail}"
        _undo(bundle, settings, say, f"failed: {why}", why, stop)
    if stop.asked is not None and len(outcomes) < len(plan.steps):
        why = f"stopped by {stop.asked} after step {len(outcomes)} of {len(plan.steps)}"
        _undo(bundle, settings, say, f"{stop.asked} received", why, stop, Interrupted)
    if stop.asked is not None:
        say(f"{stop.asked} came during the last step: the cleanup was completed, not undone")
    return bundle, outcomes, time.monotonic() - started, cut


def _saved_sets(bundle: Path) -> str | None:
    """The bundle's ipset.save, just written and compared with the node: each set is destroyed
    only while it still holds exactly these members."""
    path = bundle / "ipset.save"
    try:
        return path.read_text() if path.exists() else None
    except OSError as exc:  # read back a moment ago by the re-check; no change made yet
        raise CleanupError(
            f"cannot read back {path} ({lock.reason(exc)}); nothing was changed"
        ) from exc


def _undo(
    bundle: Path,
    settings: Settings,
    say: Callable[[str], None],
    heading: str,
    why: str,
    stop: Stop,
    done: type[CleanupError] = CleanupError,
) -> None:
    """A step failed (a tool slow past its stall limit, the xtables lock held, a kernel
    refusal) or a stop came after steps changed the node: put back, from the bundle just
    written and checked against the node, what the cleanup removed, so that it is all or
    nothing; no signal interrupts that. Always raises: `done` when every change was undone."""
    from agent.cleanup import restore

    try:
        with stop.shielded():  # before it is said: a signal the line prompts is ignored too
            say(f"{heading}; putting back what this cleanup removed, from {bundle}")
            n = restore.undo_cleanup(bundle, say, settings.tool_timeout, stop)
    except Exception as exc:  # noqa: BLE001 - said as it is, with what to run
        raise CleanupError(
            f"{why}; putting back what was removed failed too ({exc}): the node is "
            f"part-cleaned; run: ipvs-leftovers restore {bundle}"
        ) from exc
    raise done(
        f"{why}; every change was undone ({n} objects put back from {bundle}): the node is as "
        "it was before cleanup"
    )


def apply(
    collect: Callable[[], Collection],
    settings: Settings,
    say: Callable[[str], None],
    note: Callable[[str], None],
    stop: Stop | None = None,
) -> Result:
    """Run the whole procedure; raises Refused or CleanupError before any change, Interrupted
    when `stop` was asked (before any change, or with every change undone)."""
    try:
        return _apply(collect, settings, say, note, stop or Stop())
    except Stopped as exc:  # at a check before the first change
        raise Interrupted(f"{exc} before any change; nothing was changed") from exc


def _apply(
    collect: Callable[[], Collection],
    settings: Settings,
    say: Callable[[str], None],
    note: Callable[[str], None],
    stop: Stop,
) -> Result:
    col = collect()
    plan = plan_for(col, settings)
    say(f"plan: {len(plan.steps)} steps, {len(plan.kept)} kept")
    for line in describe(plan):
        say(line)
    stop.check()
    try:
        with lock.exclusive(settings.lock_file) as held:
            if not held:
                raise Refused(
                    f"refused: another cleanup holds {settings.lock_file}; nothing was changed"
                )
            if plan.empty:
                say("nothing to remove")
                code = exitcodes.REMAINS if col.classification.removable else exitcodes.OK
                return Result(code, plan, finished_at=time.time())
            bundle, outcomes, window, cut = _locked(collect, settings, col, plan, say, note, stop)
    except lock.LockError as exc:
        raise CleanupError(f"{exc}; nothing was changed") from exc
    say(f"changes: first to last in {window:.3f}s")
    after = collect().classification
    remaining = after.removable
    say(
        f"after: {len(after.leftovers)} ipvs-mode objects remain, "
        f"{len(after.iptables_leftovers)} iptables-mode objects remain"
    )
    for k in plan.kept:
        say(f"  kept {k.kind} {k.name}: {k.reason}")
    for o in outcomes:
        if o.result in ("kept", "failed"):
            say(f"  {o.result} {o.step.action} {o.step.target}: {o.detail}")
    if any(o.result == "failed" for o in outcomes):
        code = exitcodes.ERROR
    else:
        code = exitcodes.REMAINS if remaining else exitcodes.OK
    if cut.active or cut.inactive:
        say(f"connections cut: {cut.active} active, {cut.inactive} inactive")
    return Result(code, plan, outcomes, len(remaining), bundle, time.time(), window, cut)
