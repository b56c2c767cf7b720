"""The re-check right before the first change (docs/contract.md#cleanup): the node read again must
equal, in content, what the backup bundle holds of everything the plan removes.

Two comparisons, each naming the first difference it finds:

- `plan_change`: the plan made from the new reading against the plan the bundle was written
  from (Plan.contents: the rules inside every chain to be removed and the jumps with their
  positions, per backend, family and table; each virtual server's settings and real-server
  count; each set's type, family and member count; kube-ipvs0's index, kind, state and
  addresses; what is kept). The bundle's iptables `.restore` and `kube-ipvs0.json` are
  written from that first plan, so equal contents prove they hold the node as it is now.
- `bundle_change`: the members of the sets to be destroyed and the real servers (address,
  port, forwarding method, weight) of the virtual servers to be deleted are not in a plan;
  the bundle lists them from the kernel while it is written. They are listed again now, by
  the same code (the IPVS lines printed in any order), and compared with the bundle's
  `ipset.save` and `ipvsadm.rules` — one more listing of just those sets and one read of
  /proc/net/ip_vs, less than that part of the backup costs, instead of a member listing in
  every reading.

Any difference refuses (exit 3) before the first change: a removed object is always in the
bundle.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from agent.cleanup import backup, ipvsadm_save
from agent.cleanup.plan import DeleteService, DestroySet, Plan
from agent.readers import ipvs
from agent.snapshot import IpvsService

_SHOWN = 80  # characters of a differing line quoted in a reason


def _quote(line: str) -> str:
    return repr(line if len(line) <= _SHOWN else line[:_SHOWN] + "...")


def _lines(text: str) -> list[str]:
    return text.split("\n") if text else []


def _difference(noun: str, before: list[str], now: list[str]) -> str:
    """`3 rules in the backup, 4 now (new: '-j ACCEPT')`, or what differs when the counts
    do not."""
    gone = sorted(set(before) - set(now))
    new = sorted(set(now) - set(before))
    counts = f"{len(before)} {noun} in the backup, {len(now)} now"
    if new:
        return f"{counts} (new: {_quote(new[0])})"
    if gone:
        return f"{counts} (gone: {_quote(gone[0])})"
    return f"{counts} (same {noun} in another order)"


def plan_change(before: Mapping[str, str], now: Mapping[str, str]) -> str | None:
    """The first entry of Plan.contents() that differs between the two readings, said in one
    line; None when they are equal."""
    for label, content in before.items():
        current = now.get(label)
        if current is None:
            return f"{label}: no longer in the plan"
        if current == content:
            continue
        if label.startswith(("chain ", "jump rules ")):
            return f"{label}: {_difference('rules', _lines(content), _lines(current))}"
        head, *rest = _lines(content) or [""]
        head_now, *rest_now = _lines(current) or [""]
        if label.startswith("link ") and head == head_now:
            return f"{label}: {_difference('addresses', rest, rest_now)}"
        return f"{label}: was {_quote(head)}, now {_quote(head_now)}"
    for label in now:
        if label not in before:
            return f"{label}: new in the plan"
    return None


# ipset save `add` line tails that change without anyone changing the set: a member's
# remaining timeout and its counters (kube-proxy's sets have neither)
_VOLATILE = re.compile(r" (?:timeout|packets|bytes) \d+")


def _member(line: str) -> str:
    head, quote, comment = line.partition(' comment "')
    return _VOLATILE.sub("", head) + quote + comment


def _by_set(text: str) -> dict[str, tuple[str, list[str]]]:
    """`ipset save` text: each set's create line and its members, sorted (a hash set lists
    its members in bucket order, which a resize changes)."""
    creates: dict[str, str] = {}
    members: dict[str, list[str]] = defaultdict(list)
    for line in text.splitlines():
        words = line.split(None, 2)
        if len(words) < 2:
            continue
        if words[0] == "create":
            creates[words[1]] = line
        elif words[0] == "add":
            members[words[1]].append(_member(line))
    return {name: (create, sorted(members[name])) for name, create in creates.items()}


def set_change(saved: str, now: str) -> str | None:
    """The first set whose header or members differ between the bundle's `ipset.save` and
    the same listing made now."""
    if now == saved:  # the usual case, without parsing 10,000 lines twice
        return None
    return _first_change("set", "members", _by_set(saved), _by_set(now))


def _by_service(text: str) -> dict[str, tuple[str, list[str]]]:
    """`ipvsadm -S -n` text: each virtual server's `-A` line and its real servers' lines."""
    heads: dict[str, str] = {}
    dests: dict[str, list[str]] = defaultdict(list)
    for line in text.splitlines():
        words = line.split()
        if len(words) < 3:
            continue
        name = " ".join(words[1:3]) + (" -6" if words[3:4] == ["-6"] else "")
        if words[0] == "-A":
            heads[name] = line
        elif words[0] == "-a":
            dests[name].append(line)
    return {name: (head, sorted(dests[name])) for name, head in heads.items()}


def ipvs_change(saved: str, now: str) -> str | None:
    """The first virtual server whose settings or real servers differ between the bundle's
    `ipvsadm.rules` and the same listing made now."""
    if now == saved or sorted(now.splitlines()) == sorted(saved.splitlines()):
        return None
    return _first_change("virtual server", "real servers", _by_service(saved), _by_service(now))


def _first_change(
    kind: str,
    parts: str,
    before: dict[str, tuple[str, list[str]]],
    current: dict[str, tuple[str, list[str]]],
) -> str | None:
    """The first object whose head line or sorted part lines differ between two listings."""
    for name, (head, lines) in before.items():
        if name not in current:
            return f"{kind} {name}: gone"
        head_now, lines_now = current[name]
        if head_now != head:
            return f"{kind} {name}: was {_quote(head)}, now {_quote(head_now)}"
        if lines_now != lines:
            return f"{kind} {name}: {_difference(parts, lines, lines_now)}"
    for name in current:
        if name not in before:
            return f"{kind} {name}: not in the backup"
    return None


def _ipvs_rules(services: list[IpvsService], timeout: float) -> str:
    """The lines backup.ipvsadm_rules writes for these services (their real servers from one
    read of /proc/net/ip_vs, a service /proc cannot describe dumped over netlink), in any
    order: ipvsadm's order (agent.cleanup.ipvsadm_save's sorts) was most of this listing's
    cost in the VM, and the comparison sorts the lines anyway. A shape the printer has no rule
    for is listed by the backup's own fallback, `ipvsadm -S -n`."""
    with ipvs.RealServers() as dests_of:
        if not all(ipvsadm_save.supported(s, dests_of) for s in services):
            return backup.ipvsadm_rules(services, timeout)
        lines: list[str] = []
        for s in services:
            name = ipvsadm_save._service_name(s)  # noqa: SLF001 - the backup's printer
            lines.append(ipvsadm_save._service_line(s, name))  # noqa: SLF001
            lines += (ipvsadm_save._dest_line(name, d) for d in dests_of(s))  # noqa: SLF001
    return "".join(f"{line}\n" for line in lines)


def bundle_change(bundle: Path, plan: Plan, timeout: float) -> str | None:
    """The first set member or real server of what `plan` removes that differs from what
    `bundle` holds. Raises OSError (the bundle cannot be read back) or what the listing
    raises."""
    services = [s.service for s in plan.steps if isinstance(s, DeleteService)]
    if services:
        saved = (bundle / "ipvsadm.rules").read_text()
        found = ipvs_change(saved, _ipvs_rules(services, timeout))
        if found:
            return found
    sets = [s.ipset.name for s in plan.steps if isinstance(s, DestroySet)]
    if sets:
        saved = (bundle / "ipset.save").read_text()
        found = set_change(saved, backup.ipset_rules(sets, timeout))
        if found:
            return found
    return None
