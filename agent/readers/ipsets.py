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
from agent.readers.netlink import (
    NLA_HEADER,
    NLA_KIND,
    IpsetNetlink,
    NetlinkError,
    attrs,
    consistent,
    nul_text,
)
from agent.snapshot import Ipset, IpVersion, Reading

SETNAME, TYPENAME, FAMILY, DATA, ADT = 2, 3, 5, 7, 8
IP, IP_TO, CIDR, PORT, PORT_TO, PROTO = 1, 2, 3, 4, 5, 7
IP2, CIDR2 = 20, 21
ELEMENTS, REFERENCES = 24, 25
IPADDR_IPV4, IPADDR_IPV6 = 1, 2
_PROTOS = {6: "tcp", 17: "udp", 132: "sctp", 1: "icmp", 58: "icmpv6"}
_FAMILIES: dict[int, IpVersion] = {2: 4, 10: 6}
_BE16 = struct.Struct("!H")


def _be(view: memoryview | None, fmt: str = "!I") -> int | None:
    return None if view is None else int(struct.unpack_from(fmt, view)[0])


def _addr(view: memoryview) -> str | None:
    """A nested IPSET_ATTR_IP / IP2: its IPADDR_IPV4 or IPADDR_IPV6, as ipset prints it
    (inet_ntop; ipaddress spells ::ffff:a.b.c.d differently)."""
    offset, found = 0, None
    while offset + 4 <= len(view):
        length, kind = NLA_HEADER.unpack_from(view, offset)
        if length < 4:
            break
        kind &= NLA_KIND
        if kind == IPADDR_IPV4:
            found = socket.inet_ntop(socket.AF_INET, view[offset + 4 : offset + length])
        elif kind == IPADDR_IPV6:
            found = socket.inet_ntop(socket.AF_INET6, view[offset + 4 : offset + length])
        offset += (length + 3) & ~3
    return found


def _with_prefix(ip: str, cidr: int | None) -> str:
    """`ip/len`, or just `ip` for a host prefix (/32, /128 for IPv6), as ipset prints it."""
    if cidr is None or cidr == (128 if ":" in ip else 32):
        return ip
    return f"{ip}/{cidr}"


def format_entry(data: memoryview) -> str:
    """One member in `ipset save` notation, whatever the set type.

    One pass over the member's attributes: a dict of slices per member (attrs()) was a third
    of reading a 10,000-member KUBE-CLUSTER-IP."""
    ip = ip2 = None
    cidr = cidr2 = port = port_to = proto = None
    offset, end = 0, len(data)
    while offset + 4 <= end:
        length, kind = NLA_HEADER.unpack_from(data, offset)
        if length < 4:
            break
        kind &= NLA_KIND
        at = offset + 4
        if kind == IP:
            ip = _addr(data[at : offset + length])
        elif kind == PORT:
            port = _BE16.unpack_from(data, at)[0]
        elif kind == PROTO:
            proto = data[at]
        elif kind == CIDR:
            cidr = data[at]
        elif kind == PORT_TO:
            port_to = _BE16.unpack_from(data, at)[0]
        elif kind == IP2:
            ip2 = _addr(data[at : offset + length])
        elif kind == CIDR2:
            cidr2 = data[at]
        offset += (length + 3) & ~3
    parts: list[str] = []
    if ip is not None:
        parts.append(_with_prefix(ip, cidr))
    if port is not None:
        text = f"{port}-{port_to}" if port_to not in (None, port) else str(port)
        parts.append(f"{_PROTOS.get(proto, str(proto))}:{text}" if proto is not None else text)
    if ip2 is not None:
        parts.append(_with_prefix(ip2, cidr2))
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
