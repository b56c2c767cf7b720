"""`restore BUNDLE`: puts back what one cleanup removed, all of it or nothing.

Order: verify the bundle (agent.cleanup.bundle) -> check every line (agent.cleanup.restore_check)
-> take the cleanup lock -> read what is already on the node -> re-create only what is missing,
in the reverse of the cleanup order (sets, kube-ipvs0, iptables, IPVS, sysctls). Every change is
recorded with its inverse; if a step fails, the recorded changes are undone in reverse, so the
node ends as it was before restore started. A stop (SIGTERM, SIGINT: agent.cleanup.stop) ends
the step under way whole and is then undone the same way; no signal interrupts the undo. What
is already there is left alone, so a second restore changes nothing.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

from agent import exitcodes, names
from agent.cleanup import bundle, ipvsadm_rules, lock, restore_check
from agent.cleanup.backup import SAVE_TOOL
from agent.cleanup.bundle import BundleError
from agent.cleanup.executor import XTABLES_WAIT
from agent.cleanup.restore_check import (
    IpvsRestore,
    LinkRestore,
    RestorePlan,
    SetRestore,
    TableRestore,
)
from agent.cleanup.stop import Stop
from agent.readers import iptables_save, tools
from agent.readers.ipvs_wire import CMD_DEL_SERVICE, GENL_VERSION
from agent.readers.netlink import (
    NLA_F_NESTED,
    NLM_F_EXCL,
    GenericNetlink,
    IpsetNetlink,
    NetlinkError,
    RtNetlink,
    attr,
    attrs,
    consistent,
    nul_text,
)

__all__ = ["BundleError", "Busy", "RestoreFailed", "restore"]

RTM_NEWLINK, RTM_NEWADDR, RTM_DELADDR = 16, 20, 21
NLM_F_CREATE = 0x400
IFLA_IFNAME, IFLA_TXQLEN, IFLA_LINKINFO, IFLA_INFO_KIND = 3, 13, 18, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
IFF_UP = 0x1
SETNAME = 2

Say = Callable[[str], None]


class Busy(Exception):
    """Another cleanup or restore holds the lock; nothing was changed (exit 3)."""

    code = exitcodes.REFUSED


class RestoreFailed(Exception):
    """A step failed; the message says whether what was applied could be undone (exit 4)."""

    code = exitcodes.ERROR


class _Undo:
    """The inverse of each change made so far, run newest first."""

    def __init__(self, delay: float = 0.0) -> None:
        self.steps: list[tuple[str, Callable[[], None]]] = []
        self.delay = delay  # a test hook: a window before each inverse, to signal the undo in

    def add(self, what: str, inverse: Callable[[], None]) -> None:
        self.steps.append((what, inverse))

    def run(self) -> list[str]:
        """Undo everything; the changes that could not be undone, with why."""
        left = []
        for what, inverse in reversed(self.steps):
            time.sleep(self.delay)
            try:
                inverse()
            except Exception as exc:  # noqa: BLE001 - undo the rest all the same
                left.append(f"{what} ({exc})")
        return left


# --- what is already on the node ---------------------------------------------------------------


def _existing_sets() -> set[str]:
    with IpsetNetlink() as nl:
        return {nul_text(attrs(p, 4).get(SETNAME)) for p in nl.list(header_only=True)}


def _existing_tables(
    wanted: tuple[TableRestore, ...], timeout: float
) -> dict[tuple[str, str, str], dict[str, list[str]]]:
    """Each wanted table's chains and their rules as the node has them now."""
    out: dict[tuple[str, str, str], dict[str, list[str]]] = {}
    for backend, family in sorted({(t.backend, t.family) for t in wanted}):
        text = tools.run([f"{SAVE_TOOL[(backend, family)]}-save"], timeout=timeout)
        for t in iptables_save.parse(text, backend, family):
            out[(backend, family, t.name)] = {c.name: [r.text for r in c.rules] for c in t.chains}
    return out


def _existing_services() -> set[str]:
    from agent.cleanup.backup import ipvsadm_key
    from agent.readers import ipvs

    reading = ipvs.read(detail=False)
    if reading.status != "ok" or reading.data is None:
        raise RestoreFailed(
            f"cannot read the IPVS virtual servers ({reading.error or reading.status}); "
            "nothing was changed"
        )
    return {" ".join(ipvsadm_key(s)) for s in reading.data}


# --- sets ----------------------------------------------------------------------------------------


def _sets(todo: tuple[SetRestore, ...], undo: _Undo, timeout: float, say: Say) -> None:
    text = "".join(line + "\n" for s in todo for line in s.lines)
    names = [s.name for s in todo]

    def destroy() -> None:
        with IpsetNetlink() as nl:
            failed = [
                (n, c)
                for n, c in zip(names, nl.destroy_many(names), strict=True)
                if c not in (0, errno.ENOENT)
            ]
        if failed:
            raise NetlinkError(
                failed[0][1], f"ipset destroy {failed[0][0]}: {os.strerror(failed[0][1])}"
            )

    # Registered first: a killed or failed `ipset restore` may have made some of them.
    undo.add(f"{len(names)} ipsets", destroy)
    lines = text.count("\n")
    tools.load(
        ["ipset", "restore"],
        text,
        timeout,
        lambda s, fed: say(f"  ipset restore: {fed:.0%} of {lines} lines taken, {s:.0f}s"),
    )


# --- kube-ipvs0 ----------------------------------------------------------------------------------


def _ifinfo(index: int, flags: int = 0, change: int = 0) -> bytes:
    return struct.pack("=BxHiII", 0, 0, index, flags, change)


def _new_dummy(rt: RtNetlink, name: str, index: int, txqlen: int | None) -> None:
    body = _ifinfo(index) + attr(IFLA_IFNAME, name.encode() + b"\0")
    if txqlen is not None:
        body += attr(IFLA_TXQLEN, struct.pack("=I", txqlen))
    body += attr(IFLA_LINKINFO | NLA_F_NESTED, attr(IFLA_INFO_KIND, b"dummy"))
    rt.command(RTM_NEWLINK, body, NLM_F_CREATE | NLM_F_EXCL)


def _addr_request(cmd: int, index: int, cidr: str) -> tuple[int, bytes, int]:
    address, prefix = cidr.split("/")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    raw = socket.inet_pton(family, address)
    body = struct.pack("=BBBBI", family, int(prefix), 0, 0, index)
    body += attr(IFA_LOCAL, raw) + attr(IFA_ADDRESS, raw)
    return (cmd, body, NLM_F_CREATE | NLM_F_EXCL if cmd == RTM_NEWADDR else 0)


def _present(rt: RtNetlink, index: int) -> set[str]:
    found = set()
    for p in rt.addresses():
        family, prefix, _, _, at = struct.unpack_from("=BBBBI", p)
        if at != index:
            continue
        a = attrs(p, 8)
        raw = (
            a.get(IFA_LOCAL) if family == socket.AF_INET and IFA_LOCAL in a else a.get(IFA_ADDRESS)
        )
        if raw is not None:
            found.add(f"{socket.inet_ntop(family, raw)}/{prefix}")
    return found


def _link(link: LinkRestore, undo: _Undo, say: Say) -> int:
    """kube-ipvs0 back with its old index, its missing addresses in their old order, and up if
    it was; the addresses many to a send. Returns how many addresses were added."""
    with RtNetlink() as rt:
        row = consistent(lambda: next((r for r in rt.link_rows() if r.name == link.name), None))
        if row is not None and row.kind != "dummy":
            raise RestoreFailed(f"{link.name} exists and is of kind {row.kind}, not dummy")
        if row is None:
            try:  # the old interface index, so that the node is as it was
                _new_dummy(rt, link.name, link.index, link.txqlen)
            except NetlinkError as exc:
                say(f"  kube-ipvs0 gets a new interface index ({exc})")
                _new_dummy(rt, link.name, 0, link.txqlen)
            row = consistent(lambda: next(r for r in rt.link_rows() if r.name == link.name))
            created = row.index

            def delete() -> None:
                with RtNetlink() as rt2:
                    rt2.delete_link(created)

            undo.add(names.KUBE_IPVS0, delete)
        index = row.index
        present = consistent(lambda: _present(rt, index))
        # The kernel lists IPv6 addresses newest first and IPv4 oldest first: adding them in
        # that order gives the same listing back.
        listed = link.addresses
        ordered = [c for c in listed if ":" not in c] + [c for c in reversed(listed) if ":" in c]
        wanted = [c for c in ordered if c not in present]
        if wanted:

            def remove() -> None:
                with RtNetlink() as rt2:
                    rt2.commands([_addr_request(RTM_DELADDR, index, c) for c in wanted])

            undo.add(f"{len(wanted)} kube-ipvs0 addresses", remove)
            codes = rt.commands([_addr_request(RTM_NEWADDR, index, c) for c in wanted])
            failed = [(c, code) for c, code in zip(wanted, codes, strict=True) if code]
            if failed:
                cidr, code = failed[0]
                raise NetlinkError(code, f"adding {cidr} to {link.name}: {os.strerror(code)}")
        if link.up and not row.up:
            rt.command(RTM_NEWLINK, _ifinfo(index, IFF_UP, IFF_UP))

            def down() -> None:
                with RtNetlink() as rt2:
                    rt2.command(RTM_NEWLINK, _ifinfo(index, 0, IFF_UP))

            undo.add("kube-ipvs0 up", down)
        return len(wanted)


# --- iptables ------------------------------------------------------------------------------------


def _table_texts(t: TableRestore, current: dict[str, list[str]]) -> tuple[str, str, int] | None:
    """(restore text, its inverse, changes) for what of `t` is missing; None when nothing is."""
    chains = [(c, rules) for c, rules in t.chains if c not in current]
    jumps: list[tuple[str, int, str]] = []
    added: dict[str, int] = {}
    for chain, pos, text in sorted(t.jumps):
        held = current.get(chain, [])
        if text in held:
            continue
        # past the chain's end, the jump goes last (iptables refuses a position beyond it)
        jumps.append((chain, min(pos, len(held) + added.get(chain, 0) + 1), text))
        added[chain] = added.get(chain, 0) + 1
    if not chains and not jumps:
        return None
    forward = [f"*{t.table}", *(f":{c} - [0:0]" for c, _ in chains)]
    forward += [f"-A {c} {r}" for c, rules in chains for r in rules]
    forward += [f"-I {c} {pos} {text}" for c, pos, text in jumps]
    inverse = [f"*{t.table}", *(f"-D {c} {text}" for c, _, text in jumps)]
    inverse += [f"-F {c}" for c, _ in chains] + [f"-X {c}" for c, _ in chains]
    return (
        "\n".join([*forward, "COMMIT"]) + "\n",
        "\n".join([*inverse, "COMMIT"]) + "\n",
        len(chains) + len(jumps),
    )


def _iptables(
    t: TableRestore, current: dict[str, list[str]], undo: _Undo, timeout: float, say: Say
) -> int:
    texts = _table_texts(t, current)
    if texts is None:
        return 0
    forward, inverse, changes = texts
    tool = f"{SAVE_TOOL[(t.backend, t.family)]}-restore"

    def revert() -> None:
        tools.load([tool, "-w", XTABLES_WAIT, "--noflush"], inverse, timeout)

    # One transaction per table: all or nothing, so the inverse is registered once it is in.
    tools.load(
        [tool, "-w", XTABLES_WAIT, "--noflush"],
        forward,
        timeout,
        lambda s, fed: say(f"  {tool}: {fed:.0%} of its input taken, {s:.0f}s"),
    )
    undo.add(f"iptables {t.backend} {t.family} {t.table}", revert)
    return changes


# --- IPVS ----------------------------------------------------------------------------------------


def _ipvs(todo: tuple[IpvsRestore, ...], undo: _Undo) -> None:
    text = "".join(line + "\n" for s in todo for line in s.lines)
    requests = ipvsadm_rules.parse(text)
    if requests is None:  # restore_check parsed the same lines already
        raise RestoreFailed("ipvsadm.rules could not be parsed")

    def delete() -> None:
        with GenericNetlink("IPVS") as genl:
            codes = genl.family_commands(CMD_DEL_SERVICE, GENL_VERSION, list(requests.services))
        bad = [c for c in codes if c not in (0, errno.ESRCH)]
        if bad:
            raise NetlinkError(bad[0], f"deleting a restored virtual server: {os.strerror(bad[0])}")

    # Registered first: a refusal part-way leaves the services before it in place.
    undo.add(f"{len(todo)} IPVS virtual servers", delete)
    ipvsadm_rules.load(requests)


# --- sysctls -------------------------------------------------------------------------------------


def _sysctl_path(name: str) -> str:
    return "/proc/sys/" + name.replace(".", "/")  # restore_check allowed only plain names


def _sysctls(todo: tuple[tuple[str, str], ...], undo: _Undo) -> int:
    changed = 0
    for name, value in todo:
        path = _sysctl_path(name)
        with open(path) as f:
            before = f.read().strip()
        if before == value:
            continue
        with open(path, "w") as f:
            f.write(value + "\n")

        def back(path: str = path, before: str = before) -> None:
            with open(path, "w") as f:
                f.write(before + "\n")

        undo.add(name, back)
        changed += 1
    return changed


# --- the command ---------------------------------------------------------------------------------


def _apply(plan: RestorePlan, undo: _Undo, timeout: float, say: Say, stop: Stop) -> int:
    """Everything missing, in order; returns the number of objects re-created. Stopped at the
    first step boundary after a stop was asked."""
    done = 0
    stop.check()
    if plan.sets:
        existing = _existing_sets()
        todo = tuple(s for s in plan.sets if s.name not in existing)
        if todo:
            started = time.monotonic()
            _sets(todo, undo, timeout, say)
            say(f"restored {len(todo)} ipsets in {time.monotonic() - started:.1f}s")
            done += len(todo)
        if len(todo) < len(plan.sets):
            say(f"  {len(plan.sets) - len(todo)} ipsets already present, left alone")
    if plan.link is not None:
        stop.check()
        added = _link(plan.link, undo, say)
        say(f"restored kube-ipvs0 ({added} addresses added)")
        done += added
    if plan.tables:
        current = _existing_tables(plan.tables, timeout)
        for t in plan.tables:
            stop.check()
            n = _iptables(t, current.get((t.backend, t.family, t.table), {}), undo, timeout, say)
            say(f"restored iptables {t.backend} {t.family} {t.table}: {n} chains and jumps")
            done += n
    if plan.services:
        stop.check()
        existing = _existing_services()
        todo_svcs = tuple(s for s in plan.services if s.key not in existing)
        if todo_svcs:
            started = time.monotonic()
            _ipvs(todo_svcs, undo)
            elapsed = time.monotonic() - started
            say(f"restored {len(todo_svcs)} IPVS virtual servers in {elapsed:.1f}s")
            done += len(todo_svcs)
        if len(todo_svcs) < len(plan.services):
            say(f"  {len(plan.services) - len(todo_svcs)} virtual servers already present")
    if plan.sysctls:
        stop.check()
        n = _sysctls(plan.sysctls, undo)
        say(f"restored {n} sysctls")
        done += n
    return done


def restore(
    folder: Path,
    say: Say,
    lock_file: Path,
    from_other_node: bool = False,
    timeout: float = tools.DEFAULT_TIMEOUT,
    step_delay: float = 0.0,
) -> int:
    """Restore the bundle; the number of objects re-created. Raises BundleError (nothing
    changed), Busy (nothing changed) or RestoreFailed (what was applied has been undone, or the
    message says what could not be)."""
    plan = restore_check.check(bundle.open_verified(folder, from_other_node))
    if step_delay:  # a test hook: a window after each step, to kill the process in
        plain = say

        def say(line: str) -> None:
            plain(line)
            if line.startswith("restored "):
                time.sleep(step_delay)

    stop = Stop().handle()  # SIGTERM (a Job's deadline, `kubectl delete`) and ^C
    try:
        with lock.exclusive(lock_file) as held:
            if not held:
                raise Busy(f"another cleanup or restore holds {lock_file}; nothing was changed")
            return _all_or_nothing(plan, timeout, say, stop, step_delay)
    except lock.LockError as exc:
        raise RestoreFailed(f"{exc}; nothing was changed") from exc


def _all_or_nothing(
    plan: RestorePlan, timeout: float, say: Say, stop: Stop, undo_delay: float = 0.0
) -> int:
    undo = _Undo(undo_delay)
    try:
        return _apply(plan, undo, timeout, say, stop)
    except Exception as exc:  # a failed step, or a stop (agent.cleanup.stop.Stopped)
        if not undo.steps:
            raise RestoreFailed(f"{exc}; nothing was changed") from exc
        with stop.shielded():  # before it is said: a signal the line prompts is ignored too
            say(f"restore failed ({exc}); undoing {len(undo.steps)} applied changes")
            left = undo.run()
        if left:
            raise RestoreFailed(
                f"{exc}; could not undo: {'; '.join(left)}; the node is part-restored"
            ) from exc
        raise RestoreFailed(
            f"{exc}; every change was undone: the node is as it was before restore"
        ) from exc


def undo_cleanup(
    folder: Path, say: Say, timeout: float = tools.DEFAULT_TIMEOUT, stop: Stop | None = None
) -> int:
    """For a cleanup that failed or was stopped part-way, under the lock it already holds: put
    back from the bundle it wrote just before its first change what is missing of it (what the
    cleanup removed), all of it or nothing, whatever signal comes meanwhile (`stop` reports
    them). The number of objects re-created; BundleError or RestoreFailed if it could not."""
    stop = stop or Stop()
    with stop.shielded():
        plan = restore_check.check(bundle.open_verified(folder))
        return _all_or_nothing(plan, timeout, say, stop)
