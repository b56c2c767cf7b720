"""ipsets over nfnetlink (pyroute2): a header-only listing, entries only for named sets."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from agent.kernel import Presence, presence
from agent.readers._timing import Absent, timed
from agent.snapshot import Ipset, Reading

IPSET_FLAG_LIST_HEADER = 4  # `ipset list -t`: counts and references, no members
_PROTOS = {6: "tcp", 17: "udp", 132: "sctp", 1: "icmp", 58: "icmpv6"}
_FAMILIES = {2: 4, 10: 6}


def _addr(attr: Any) -> str | None:
    if attr is None:
        return None
    value = attr.get_attr("IPSET_ATTR_IPADDR_IPV4") or attr.get_attr("IPSET_ATTR_IPADDR_IPV6")
    return None if value is None else str(value)


def format_entry(entry: Any) -> str:
    """One member in `ipset save` notation, whatever the set type."""
    parts: list[str] = []
    ip = _addr(entry.get_attr("IPSET_ATTR_IP_FROM") or entry.get_attr("IPSET_ATTR_IP"))
    cidr = entry.get_attr("IPSET_ATTR_CIDR")
    if ip is not None:
        parts.append(f"{ip}/{cidr}" if cidr is not None and ip and cidr not in (32, 128) else ip)
    port = entry.get_attr("IPSET_ATTR_PORT_FROM")
    if port is None:
        port = entry.get_attr("IPSET_ATTR_PORT")
    if port is not None:
        port_to = entry.get_attr("IPSET_ATTR_PORT_TO")
        text = f"{port}-{port_to}" if port_to not in (None, port) else str(port)
        proto = entry.get_attr("IPSET_ATTR_PROTO")
        parts.append(f"{_PROTOS.get(proto, str(proto))}:{text}" if proto is not None else text)
    ip2 = _addr(entry.get_attr("IPSET_ATTR_IP2"))
    if ip2 is not None:
        cidr2 = entry.get_attr("IPSET_ATTR_CIDR2")
        parts.append(f"{ip2}/{cidr2}" if cidr2 is not None else ip2)
    return ",".join(parts)


def _open() -> Any:
    if presence("ip_set") is Presence.ABSENT:
        raise Absent("ip_set module not loaded")
    from pyroute2 import IPSet
    from pyroute2.ipset import IPSetError

    try:
        return IPSet()
    except IPSetError as exc:
        # nfnetlink answers EINVAL for a subsystem that is not registered.
        if getattr(exc, "code", None) == 22:
            raise Absent("kernel has no ip_set") from exc
        raise


def _read(entries_for: Collection[str]) -> tuple[Ipset, ...]:
    ips = _open()
    try:
        sets = []
        # list() is drained completely: leaving a dump half-read makes the next request EBUSY.
        for msg in list(ips.list(flags=IPSET_FLAG_LIST_HEADER)):
            data = msg.get_attr("IPSET_ATTR_DATA")
            name = msg.get_attr("IPSET_ATTR_SETNAME")
            entries = _entries(ips, name) if name in entries_for else None
            sets.append(
                Ipset(
                    name=name,
                    type=msg.get_attr("IPSET_ATTR_TYPENAME"),
                    family=_FAMILIES.get(msg.get_attr("IPSET_ATTR_FAMILY") or 0),
                    elements=int(data.get_attr("IPSET_ATTR_ELEMENTS") or 0) if data else 0,
                    references=int(data.get_attr("IPSET_ATTR_REFERENCES") or 0) if data else 0,
                    entries=entries,
                )
            )
        return tuple(sets)
    finally:
        ips.close()


def _entries(ips: Any, name: str) -> tuple[str, ...]:
    out: list[str] = []
    for msg in list(ips.list(name)):  # large sets span several messages
        adt = msg.get_attr("IPSET_ATTR_ADT")
        if adt is None:
            continue
        out.extend(format_entry(e) for e in adt.get_attrs("IPSET_ATTR_DATA"))
    return tuple(out)


def read(entries_for: Collection[str] = ()) -> Reading[tuple[Ipset, ...]]:
    """All sets with counts; members only for the sets named in `entries_for`."""
    return timed(lambda: _read(entries_for), ())
