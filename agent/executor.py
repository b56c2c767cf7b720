"""Applies a plan step by step. Decides nothing: every object and its order come from the plan."""

from __future__ import annotations

import errno
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent import tools
from agent.backup import SAVE_TOOL
from agent.ipvs_wire import CMD_DEL_SERVICE, GENL_VERSION, service_key
from agent.netlink import GenericNetlink, IpsetNetlink, NetlinkError, RtNetlink, consistent
from agent.plan import Step

XTABLES_WAIT = "30"  # seconds to wait for /run/xtables.lock, shared with kube-proxy and kubelet
IPSET_IN_USE = 4100


@dataclass(frozen=True)
class Outcome:
    step: Step
    result: str  # done | gone | kept | failed
    detail: str = ""


class _Ipvs:
    """Deletes virtual servers one by one over a single generic-netlink socket.

    One request per owned service (never IPVS_CMD_FLUSH, which would take foreign ones too);
    the socket is opened on the first IPVS step, because pyroute2's per-request setup cost
    (~1 ms, a family lookup each time) made 10,000 deletions take seconds.
    """

    def __init__(self) -> None:
        self._genl: GenericNetlink | None = None

    def __call__(self, step: Step) -> Outcome:
        assert step.service is not None
        if self._genl is None:
            self._genl = GenericNetlink("IPVS")
        try:
            self._genl.family_command(CMD_DEL_SERVICE, GENL_VERSION, service_key(step.service))
        except NetlinkError as exc:
            if exc.errno == errno.ESRCH:
                return Outcome(step, "gone")
            raise
        return Outcome(step, "done")

    def close(self) -> None:
        if self._genl is not None:
            self._genl.close()


def _iptables(step: Step, timeout: float) -> Outcome:
    ch = step.table
    assert ch is not None
    tool = f"{SAVE_TOOL[(ch.backend, ch.family)]}-restore"
    # One transaction per table: all or nothing, under the xtables lock.
    tools.run([tool, "-w", XTABLES_WAIT, "--noflush"], stdin=ch.restore_text(), timeout=timeout)
    return Outcome(step, "done")


def _ipset(step: Step) -> Outcome:
    assert step.ipset is not None
    with IpsetNetlink() as nl:
        try:
            nl.destroy(step.ipset.name)
        except NetlinkError as exc:
            if exc.errno == errno.ENOENT:
                return Outcome(step, "gone")
            if exc.errno == IPSET_IN_USE:
                return Outcome(
                    step,
                    "kept",
                    "in use by a kernel component not seen by the "
                    "readers (a rule in another table or backend, or a list:set)",
                )
            raise
    return Outcome(step, "done")


def _link(step: Step) -> Outcome:
    link = step.link
    assert link is not None
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


def _sysctl(step: Step) -> Outcome:
    assert step.sysctl is not None
    name, _, value = step.sysctl
    Path("/proc/sys", *name.split(".")).write_text(value + "\n")
    return Outcome(step, "done")


# Actions without per-run state; execute() adds the IPVS socket and the iptables timeout.
_ACTIONS: dict[str, Callable[[Step], Outcome]] = {
    "destroy-ipset": _ipset,
    "delete-link": _link,
    "reset-sysctl": _sysctl,
}


def execute(
    steps: tuple[Step, ...],
    report: Callable[[Outcome], None],
    step_delay: float = 0.0,
    tool_timeout: float = tools.DEFAULT_TIMEOUT,
) -> list[Outcome]:
    """Run every step; a failed step is reported and the others still run."""
    outcomes = []
    ipvs = _Ipvs()
    actions: dict[str, Callable[[Step], Outcome]] = {
        **_ACTIONS,
        "delete-ipvs-service": ipvs,
        "iptables-table": functools.partial(_iptables, timeout=tool_timeout),
    }
    try:
        for i, step in enumerate(steps):
            if i and step_delay:
                time.sleep(step_delay)
            try:
                outcome = actions[step.action](step)
            except Exception as exc:  # noqa: BLE001 - one failed step must not hide the others
                outcome = Outcome(step, "failed", f"{type(exc).__name__}: {exc}")
            report(outcome)
            outcomes.append(outcome)
    finally:
        ipvs.close()
    return outcomes
