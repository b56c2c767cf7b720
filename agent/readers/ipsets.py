"""ipsets over nfnetlink (agent.readers.netlink): header-only listing, members only for named sets.

Attribute numbers are the kernel's (include/uapi/linux/netfilter/ipset/ip_set.h); numbers are
in network byte order.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Collection, Iterator

from agent.readers._timing import Absent, timed
from agent.readers.kernel import Presence, presence
from agent.readers.netlink import IpsetNetlink, NetlinkError, attrs, consistent, nul_text
from agent.snapshot import Ipset, Reading

SETNAME, TYPENAME, FAMILY, DATA, ADT = 2, 3, 5, 7, 8
IP, IP_TO, CIDR, PORT, PORT_TO, PROTO = 1, 2, 3, 4, 5, 7
IP2, CIDR2 = 20, 21
ELEMENTS, REFERENCES = 24, 25
IPADDR_IPV4, IPADDR_IPV6 = 1, 2
_PROTOS = {6: "tcp", 17: "udp", 132: "sctp", 1: "icmp", 58: "icmpv6"}
_FAMILIES = {2: 4, 10: 6}


def _be(view: memoryview | None, fmt: str = "!I") -> int | None:
    return None if view is None else int(struct.unpack_from(fmt, view)[0])


def _addr(view: memoryview | None) -> str | None:
    if view is None:
        return None
    a = attrs(view)
    raw = a.get(IPADDR_IPV4)
    if raw is not None:
        return socket.inet_ntop(socket.AF_INET, raw)
    raw = a.get(IPADDR_IPV6)
    # inet_ntop, as ipset prints them (ipaddress spells ::ffff:a.b.c.d differently)
    return None if raw is None else socket.inet_ntop(socket.AF_INET6, raw)


def _with_prefix(ip: str, cidr: memoryview | None) -> str:
    """`ip/len`, or just `ip` for a host prefix (/32, /128 for IPv6), as ipset prints it."""
    if cidr is None or cidr[0] == (128 if ":" in ip else 32):
        return ip
    return f"{ip}/{cidr[0]}"


def format_entry(data: memoryview) -> str:
    """One member in `ipset save` notation, whatever the set type."""
    a = attrs(data)
    parts: list[str] = []
    ip = _addr(a.get(IP))
    cidr = a.get(CIDR)
    if ip is not None:
        parts.append(_with_prefix(ip, cidr))
    port = _be(a.get(PORT), "!H")
    if port is not None:
        port_to = _be(a.get(PORT_TO), "!H")
        text = f"{port}-{port_to}" if port_to not in (None, port) else str(port)
        proto = a.get(PROTO)
        parts.append(
            f"{_PROTOS.get(proto[0], str(proto[0]))}:{text}" if proto is not None else text
        )
    ip2 = _addr(a.get(IP2))
    if ip2 is not None:
        parts.append(_with_prefix(ip2, a.get(CIDR2)))
    return ",".join(parts)


def members_of(adt: memoryview) -> Iterator[memoryview]:
    """Each member's DATA in an IPSET_ATTR_ADT (a list of DATA attributes, one per member)."""
    offset = 0
    while offset + 4 <= len(adt):
        length = struct.unpack_from("=H", adt, offset)[0]
        if length < 4:
            break
        yield adt[offset + 4 : offset + length]
        offset += (length + 3) & ~3


def _members(nl: IpsetNetlink, name: str) -> tuple[str, ...]:
    out: list[str] = []
    for p in nl.list(name):  # large sets span several messages
        adt = attrs(p, 4).get(ADT)
        if adt is not None:
            out += map(format_entry, members_of(adt))
    return tuple(out)


def _read(entries_for: Collection[str]) -> tuple[Ipset, ...]:
    if presence("ip_set") is Presence.ABSENT:
        raise Absent("ip_set module not loaded")
    with IpsetNetlink() as nl:
        try:
            headers = list(nl.list(header_only=True))
        except NetlinkError as exc:
            if exc.errno in (errno.EINVAL, errno.EPROTONOSUPPORT):  # no ip_set subsystem
                raise Absent("kernel has no ip_set") from exc
            raise
        sets = []
        for p in headers:
            a = attrs(p, 4)
            name = nul_text(a.get(SETNAME))
            data = attrs(a[DATA]) if DATA in a else {}
            family = a.get(FAMILY)
            sets.append(
                Ipset(
                    name=name,
                    type=nul_text(a.get(TYPENAME)),
                    family=_FAMILIES.get(family[0]) if family is not None else None,
                    elements=_be(data.get(ELEMENTS)) or 0,
                    references=_be(data.get(REFERENCES)) or 0,
                    entries=_members(nl, name) if name in entries_for else None,
                )
            )
    return tuple(sets)


def read(entries_for: Collection[str] = ()) -> Reading[tuple[Ipset, ...]]:
    """All sets with counts; members only for the sets named in `entries_for`."""
    return timed(lambda: consistent(lambda: _read(entries_for)), ())
