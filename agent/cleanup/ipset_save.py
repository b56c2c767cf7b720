"""`ipset save` text for named sets, read over nfnetlink and printed as ipset 7.x prints it.

The backup bundle used to run `ipset save` (every set on the node, members included) and keep
the destroyed sets' lines. Here only those sets are listed, on one socket, and printed from
the kernel's answer. What this module does not know how to print exactly (a set type, a create
option or a member extension it has no rule for) is reported back, and the backup asks
`ipset save NAME` for just that set.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from agent.readers.ipsets import format_entry, members_of
from agent.readers.netlink import IpsetNetlink, attrs, nul_text

TYPENAME, REVISION, FAMILY, DATA, ADT, SETNAME, PROTOCOL, INDEX = 3, 4, 5, 7, 8, 2, 1, 11
# IPSET_ATTR_* inside the header's DATA (create options and kernel-only counts)
PORT, PORT_TO, TIMEOUT, CADT_FLAGS = 4, 5, 6, 8
INITVAL, HASHSIZE, MAXELEM, BUCKETSIZE = 17, 18, 19, 21
ELEMENTS, REFERENCES, MEMSIZE, RESIZE = 24, 25, 26, 22
# ... and inside a member's DATA
IP, CIDR, PROTO, IP2, CIDR2, BYTES, PACKETS, COMMENT = 1, 3, 7, 20, 21, 24, 25, 26
WITH_COUNTERS, WITH_COMMENT = 1 << 3, 1 << 4

_HASH_TYPES = {"hash:ip", "hash:ip,port", "hash:ip,port,ip", "hash:ip,port,net", "hash:net"}
_FAMILY = {2: "inet", 10: "inet6"}
_HEADER_ATTRS = {TIMEOUT, CADT_FLAGS, INITVAL, HASHSIZE, MAXELEM, BUCKETSIZE, RESIZE}
_HEADER_ATTRS |= {ELEMENTS, REFERENCES, MEMSIZE}
_MEMBER_ATTRS = {IP, CIDR, PORT, PROTO, IP2, CIDR2, TIMEOUT, BYTES, PACKETS, COMMENT}


class Unsupported(Exception):
    """This set has something the printer has no rule for."""


def _be32(v: memoryview) -> int:
    return int(struct.unpack_from("!I", v)[0])


def _header(name: str, top: dict[int, memoryview]) -> tuple[str, int]:
    kind = nul_text(top.get(TYPENAME))
    data = attrs(top[DATA]) if DATA in top else {}
    flags = _be32(data[CADT_FLAGS]) if CADT_FLAGS in data else 0
    words = [f"create {name} {kind}"]
    if kind == "bitmap:port":
        if set(data) - (_HEADER_ATTRS | {PORT, PORT_TO}) or PORT not in data:
            raise Unsupported(name)
        lo, hi = struct.unpack_from("!H", data[PORT])[0], struct.unpack_from("!H", data[PORT_TO])[0]
        words.append(f"range {lo}-{hi}")
    elif kind in _HASH_TYPES:
        family = top.get(FAMILY)
        if set(data) - _HEADER_ATTRS or family is None or family[0] not in _FAMILY:
            raise Unsupported(name)
        words.append(f"family {_FAMILY[family[0]]}")
        words.append(f"hashsize {_be32(data[HASHSIZE])} maxelem {_be32(data[MAXELEM])}")
    else:
        raise Unsupported(name)
    if flags & ~(WITH_COUNTERS | WITH_COMMENT):
        raise Unsupported(name)  # skbinfo, forceadd, ...
    if TIMEOUT in data:
        words.append(f"timeout {_be32(data[TIMEOUT])}")
    if flags & WITH_COUNTERS:
        words.append("counters")
    if flags & WITH_COMMENT:
        words.append("comment")
    if BUCKETSIZE in data:
        words.append(f"bucketsize {data[BUCKETSIZE][0]}")
    if INITVAL in data:
        words.append(f"initval 0x{_be32(data[INITVAL]):08x}")
    return " ".join(words), flags


def _member(name: str, data: memoryview) -> str:
    a = attrs(data)
    if set(a) - _MEMBER_ATTRS:
        raise Unsupported(name)  # nomatch flags, skbinfo, marks, interfaces, ...
    words = [f"add {name} {format_entry(data)}"]
    if TIMEOUT in a:
        words.append(f"timeout {_be32(a[TIMEOUT])}")
    if PACKETS in a:
        words.append(f"packets {struct.unpack_from('!Q', a[PACKETS])[0]}")
    if BYTES in a:
        words.append(f"bytes {struct.unpack_from('!Q', a[BYTES])[0]}")
    if COMMENT in a:
        words.append(f'comment "{nul_text(a[COMMENT])}"')
    return " ".join(words)


@dataclass(frozen=True)
class Saved:
    text: str  # `ipset save` lines of the sets printed here, in the kernel's order
    unsupported: tuple[str, ...]  # sets to ask `ipset save NAME` for


def _one(nl: IpsetNetlink, name: str) -> list[str]:
    lines: list[str] = []
    for p in nl.list(name):  # the header, then members over as many messages as they need
        top = attrs(p, 4)
        if not lines:
            lines.append(_header(name, top)[0])
        adt = top.get(ADT)
        if adt is not None:
            lines += (_member(name, data) for data in members_of(adt))
    return lines


def save(names: Iterable[str]) -> Saved:
    """The named sets (in the kernel's listing order), each listed once over one socket."""
    wanted = set(names)
    lines: list[str] = []
    unsupported: list[str] = []
    with IpsetNetlink() as nl:
        order = [nul_text(attrs(p, 4).get(SETNAME)) for p in nl.list(header_only=True)]
        for name in order:
            if name not in wanted:
                continue
            try:
                lines += _one(nl, name)
            except Unsupported:
                unsupported.append(name)
    return Saved("".join(f"{line}\n" for line in lines), tuple(unsupported))
