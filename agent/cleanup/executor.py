"""Applies a plan step by step. Decides nothing: every object and its order come from the plan.

Each kind of step has its own class (agent.cleanup.plan) and is dispatched by type."""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from agent.cleanup import backup, recheck
from agent.cleanup.backup import SAVE_TOOL
from agent.cleanup.plan import (
    ChangeTable,
    DeleteLink,
    DeleteService,
    DestroySet,
    ResetSysctl,
    Step,
)
from agent.readers import tools
from agent.readers.ipvs_wire import CMD_DEL_SERVICE, GENL_VERSION, service_key
from agent.readers.netlink import GenericNetlink, IpsetNetlink, NetlinkError, RtNetlink, consistent

XTABLES_WAIT = "30"  # seconds to wait for /run/xtables.lock, shared with kube-proxy and kubelet
IPSET_IN_USE = 4100


Result = Literal["done", "gone", "kept", "failed"]


@dataclass(frozen=True)
class Outcome:
    step: Step
    result: Result
    detail: str = ""


def _refused(step: Step, code: int) -> Outcome:
    """A request the kernel answered with an errno no rule maps: the step failed."""
    return Outcome(step, "failed", f"NetlinkError: {NetlinkError(code, os.strerror(code))}")


def _ipvs_outcome(step: Step, code: int) -> Outcome:
    if code == 0:
        return Outcome(step, "done")
    if code == errno.ESRCH:
        return Outcome(step, "gone")
    return _refused(step, code)


def _ipvs(steps: list[DeleteService]) -> list[Outcome]:
    """Deletes virtual servers, one request per owned service (never IPVS_CMD_FLUSH, which
    would take foreign ones too), all over one socket and many to a send: one request and
    its ACK at a time cost 10,000 round trips at 10,000 Services."""
    keys = [service_key(step.service) for step in steps]
    with GenericNetlink("IPVS") as genl:
        codes = genl.family_commands(CMD_DEL_SERVICE, GENL_VERSION, keys)
    return [_ipvs_outcome(s, c) for s, c in zip(steps, codes, strict=True)]


# What iptables-restore says when a line of the transaction is refused: a `-D` whose rule is
# gone (legacy: only the line number), or a `-X` of a chain that still holds a rule or is
# still jumped to
_REFUSED_LINE = re.compile(
    r"line \d+ failed|matching rule exist|resource busy|not empty|Too many links"
)


def _iptables(step: ChangeTable, timeout: float) -> Outcome:
    ch = step.table
    tool = f"{SAVE_TOOL[(ch.backend, ch.family)]}-restore"
    # One transaction per table: all or nothing, under the xtables lock.
    # Given up only when it stops taking its input (tools.load): a slow tool must not leave a
    # cleanup half-applied.
    try:
        tools.load([tool, "-w", XTABLES_WAIT, "--noflush"], ch.restore_text(), timeout)
    except tools.ToolError as exc:
        if not _REFUSED_LINE.search(str(exc)):
            raise
        return Outcome(
            step,
            "failed",
            f"the table changed since its backup (a rule added to or gone from a chain to be "
            f"removed, or a new jump into one), so the kernel refused its removal: {exc}",
        )
    return Outcome(step, "done")


_IN_USE_DETAIL = (
    "in use by a kernel component not seen by the readers (a rule in another table or "
    "backend, or a list:set)"
)


def _ipset_outcome(step: Step, code: int) -> Outcome:
    if code == 0:
        return Outcome(step, "done")
    if code == errno.ENOENT:
        return Outcome(step, "gone")
    if code == IPSET_IN_USE:
        return Outcome(step, "kept", _IN_USE_DETAIL)
    return _refused(step, code)


def _changed_sets(names: list[str], saved: str, timeout: float) -> dict[str, str]:
    """Each of these sets whose header or members now differ from the backup's `ipset save`
    lines, with the difference: the kernel destroys a set whatever it holds, so this listing,
    right before the destroy, is what keeps a member added since the re-check."""
    now = backup.ipset_rules(names, timeout)
    before = backup.filter_ipset_save(saved, names)
    changed: dict[str, str] = {}
    for name in names:
        current = backup.filter_ipset_save(now, [name])
        if not current:  # gone since: its destroy says so, nothing of it is lost
            continue
        found = recheck.set_change(backup.filter_ipset_save(before, [name]), current)
        if found:
            changed[name] = found
    return changed


def _ipsets(steps: list[DestroySet], saved: str | None, timeout: float) -> list[Outcome]:
    """Destroys sets by name (never all: an empty name is refused), many to a send, and none
    of them when one no longer holds exactly the backed-up members (`saved`, the bundle's
    ipset.save)."""
    names = [step.ipset.name for step in steps]
    changed = _changed_sets(names, saved, timeout) if saved is not None else {}
    if changed:
        first = next(iter(changed))
        return [
            Outcome(s, "failed", f"changed since its backup ({changed[n]}): not destroyed")
            if (n := s.ipset.name) in changed
            else Outcome(s, "kept", f"not destroyed: {first} changed since its backup")
            for s in steps
        ]
    with IpsetNetlink() as nl:
        codes = nl.destroy_many(names)
    return [_ipset_outcome(s, c) for s, c in zip(steps, codes, strict=True)]


def _link(step: DeleteLink) -> Outcome:
    link = step.link
    with RtNetlink() as rt:
        rows = consistent(lambda: list(rt.link_rows()))  # a partial dump could miss it
        current = next((r for r in rows if r.name == link.name), None)
        if current is None:
            return Outcome(step, "gone")
        if current.kind != "dummy":  # the plan saw a dummy; something replaced it since
            return Outcome(step, "kept", f"{link.name} is now of kind {current.kind}, not dummy")
        try:
            rt.delete_link(current.index)
        except NetlinkError as exc:
            if exc.errno == errno.ENODEV:
                return Outcome(step, "gone")
            raise
    return Outcome(step, "done")


def _sysctl(step: ResetSysctl) -> Outcome:
    name, _, value = step.sysctl
    Path("/proc/sys", *name.split(".")).write_text(value + "\n")
    return Outcome(step, "done")


# Steps applied to a run of consecutive steps of their kind at once (the plan's order is
# kept: a run never crosses a step of another kind); the others go one at a time.
_BATCHED = (DeleteService, DestroySet)


def _runs(steps: tuple[Step, ...], batch: bool) -> list[list[Step]]:
    runs: list[list[Step]] = []
    for step in steps:
        if batch and runs and isinstance(step, _BATCHED) and type(runs[-1][0]) is type(step):
            runs[-1].append(step)
        else:
            runs.append([step])
    return runs


def _apply(run: list[Step], tool_timeout: float, saved_sets: str | None) -> list[Outcome]:
    """One run of steps of one kind, by the kind."""
    first = run[0]
    if isinstance(first, DeleteService):
        return _ipvs([s for s in run if isinstance(s, DeleteService)])
    if isinstance(first, DestroySet):
        return _ipsets([s for s in run if isinstance(s, DestroySet)], saved_sets, tool_timeout)
    if isinstance(first, ChangeTable):
        return [_iptables(first, tool_timeout)]
    if isinstance(first, DeleteLink):
        return [_link(first)]
    return [_sysctl(first)]


def execute(
    steps: tuple[Step, ...],
    report: Callable[[Outcome], None],
    step_delay: float = 0.0,
    tool_timeout: float = tools.DEFAULT_TIMEOUT,
    stopping: Callable[[], bool] = lambda: False,
    saved_sets: str | None = None,
) -> list[Outcome]:
    """Run the steps in order until one fails: the failed one is the first failed reported
    (the caller undoes what ran before it). `stopping` is asked between two runs of steps (a
    stop ends a step whole, never inside it); the caller undoes what ran before. With a step
    delay (a test hook) every step goes alone, so the window between steps is real.
    `saved_sets`: the backup's `ipset save` lines of the sets to destroy, compared with each set
    right before it is destroyed."""
    outcomes: list[Outcome] = []
    for i, run in enumerate(_runs(steps, batch=not step_delay)):
        if i and step_delay:
            time.sleep(step_delay)
        if stopping():
            break
        try:
            done = _apply(run, tool_timeout, saved_sets)
        except Exception as exc:  # noqa: BLE001 - reported as the step's outcome
            done = [Outcome(s, "failed", f"{type(exc).__name__}: {exc}") for s in run]
        # a tool's message may span lines; the outcome is said in one
        done = [replace(o, detail=" ".join(o.detail.split())) for o in done]
        for outcome in done:
            report(outcome)
            outcomes.append(outcome)
        if any(o.result == "failed" for o in done):
            break
    return outcomes
