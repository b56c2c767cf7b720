"""nftables tables over nfnetlink; chains and set/map sizes of kube-proxy's tables.

Read with agent.readers.netlink: a 10,000-Service nftables-mode table holds tens of thousands of
chains, and only their table names are needed here (counted, never decoded further).
Attribute numbers are the kernel's (include/uapi/linux/netfilter/nf_tables.h).
"""

from __future__ import annotations

import dataclasses
import errno
import socket
import struct
import sys
from collections import Counter

from agent import names
from agent.names import NFTABLES_MODE_CHAINS
from agent.readers._timing import Absent, timed
from agent.readers.kernel import Presence, presence
from agent.readers.netlink import (
    NLA_HEADER,
    NLA_KIND,
    NetlinkError,
    NfTables,
    attr,
    attrs,
    consistent,
    count_attrs,
    nul_text,
)
from agent.snapshot import NftFamily, NftSet, NftTable, Reading

FAMILIES: dict[int, NftFamily] = {1: "inet", 2: "ip", 3: "arp", 5: "netdev", 7: "bridge", 10: "ip6"}
_FAMILY_NUMBERS = {v: k for k, v in FAMILIES.items()}
Key = tuple[NftFamily | int, str]  # a table: its family and name
GETTABLE, GETCHAIN, GETRULE, GETSET, GETSETELEM = 1, 4, 7, 10, 13
RULE_TABLE, RULE_CHAIN, RULE_EXPRESSIONS = 1, 2, 4
LIST_ELEM, EXPR_NAME, EXPR_DATA = 1, 1, 2
# kube-proxy's `masquerading` chain: `mark and M == 0 return; mark set mark xor M; masquerade`.
BITWISE_MASK, BITWISE_XOR, DATA_VALUE = 4, 5, 1
TABLE_NAME = CHAIN_TABLE = SET_TABLE = ELEM_LIST_TABLE = 1
SET_NAME = ELEM_LIST_SET = 2
CHAIN_NAME = 3
SET_FLAGS = 3
ELEM_LIST_ELEMENTS = 3
SET_ANONYMOUS, SET_MAP = 0x1, 0x8
ELEM_KEY = 1  # NFTA_SET_ELEM_KEY, holding an NFTA_DATA_VALUE


def _chain_counts(nft: NfTables) -> dict[Key, int]:
    """Chains per (family, table). Each chain's message is reduced to its family byte and
    its table attribute's bytes, counted as they are and decoded once per table: at 1,000
    Services kube-proxy's table has 4,000 chains, and a decoded string per chain was most of
    this reader's time. The kernel puts NFTA_CHAIN_TABLE first (nf_tables_fill_chain_info);
    a message where it is not is decoded in full."""
    raw = Counter(
        (p[0], bytes(p[8 : 4 + h[0]]))
        if (h := NLA_HEADER.unpack_from(p, 4))[1] & NLA_KIND == CHAIN_TABLE
        else (p[0], bytes(attrs(p, 4).get(CHAIN_TABLE) or b""))
        for p in nft.dump(GETCHAIN)
    )
    out: Counter[Key] = Counter()
    for (family, table), n in raw.items():
        out[(_family_name(family), nul_text(memoryview(table)))] += n
    return out


def _set_header(payload: memoryview) -> tuple[memoryview | None, memoryview | None, int]:
    """A set's table, name and flags, walking its attributes only until all three are seen.
    kube-proxy's table holds an anonymous map per Service (the endpoints' numgen vmap): at
    1,000 Services a dict of every attribute of each was most of the set dump's time. The
    kernel sends no flags attribute for flags 0; the walk then reads to the end."""
    table = name = None
    flags = -1
    offset, end = 4, len(payload)
    while offset + 4 <= end and (table is None or name is None or flags < 0):
        length, kind = NLA_HEADER.unpack_from(payload, offset)
        if length < 4:
            break
        kind &= NLA_KIND
        if kind == SET_TABLE:
            table = payload[offset + 4 : offset + length]
        elif kind == SET_NAME:
            name = payload[offset + 4 : offset + length]
        elif kind == SET_FLAGS:
            flags = struct.unpack_from("!I", payload, offset + 4)[0]
        offset += (length + 3) & ~3
    return table, name, max(flags, 0)


def _family(payload: memoryview) -> NftFamily | int:
    """The family of an nfgenmsg-headed answer."""
    return _family_name(payload[0])


def _family_name(number: int) -> NftFamily | int:
    return FAMILIES.get(number, number)


def _number(family: NftFamily | int) -> int:
    return family if isinstance(family, int) else _FAMILY_NUMBERS[family]


def _read(detail: bool, services: bool) -> tuple[NftTable, ...]:
    if presence("nf_tables") is Presence.ABSENT:
        raise Absent("nf_tables module not loaded")
    with NfTables() as nft:
        try:
            tables = [
                (_family(p), nul_text(attrs(p, 4).get(TABLE_NAME))) for p in nft.dump(GETTABLE)
            ]
        except NetlinkError as exc:
            if exc.errno == errno.EINVAL:  # nfnetlink: subsystem not registered
                raise Absent("kernel has no nf_tables") from exc
            raise
        # One small chain per kube-proxy table: cleanup needs it to keep KUBE-MARK-MASQ's
        # masquerade only where nftables mode does not masquerade the same mark
        # (docs/contract.md#cleanup).
        marks: dict[Key, int | None] = {
            key: _masquerade_mark(nft, *key) for key in tables if key in names.NFTABLES_MODE_TABLES
        }
        # The gate needs kube-proxy's own chains in its table, not the table alone: one
        # request per chain, never a dump of the tens of thousands a large node has.
        own: dict[Key, tuple[str, ...]] = {
            key: _own_chains(nft, *key) for key in tables if key in names.NFTABLES_MODE_TABLES
        }
        # What it serves, only when that can attribute a virtual server (docs/contract.md
        # #ownership): the keys of its service maps, never their verdicts.
        served: dict[Key, Served] = {
            key: _served(nft, *key)
            for key in tables
            if services and key in names.NFTABLES_MODE_TABLES
        }
        if not detail:  # the metrics need only which tables exist
            bare = (
                NftTable(f, n, 0, (), marks.get((f, n)), own.get((f, n), ())) for f, n in tables
            )
            return tuple(_with(t, served) for t in bare)
        chains = _chain_counts(nft)
        sets: dict[Key, list[tuple[str, bool]]] = {}
        for p in nft.dump(GETSET):
            set_table, set_name, flags = _set_header(p)
            if flags & SET_ANONYMOUS:
                continue
            key = (_family(p), nul_text(set_table))
            sets.setdefault(key, []).append((nul_text(set_name), bool(flags & SET_MAP)))
        out = []
        for family, name in tables:
            detailed = (family, name) in names.NFTABLES_MODE_TABLES
            table_sets = tuple(
                NftSet(s, is_map, _elements(nft, family, name, s) if detailed else None)
                for s, is_map in sets.get((family, name), [])
            )
            mark = marks.get((family, name))
            table = NftTable(
                family, name, chains[(family, name)], table_sets, mark, own.get((family, name), ())
            )
            out.append(_with(table, served))
    return tuple(out)


def _own_chains(nft: NfTables, family: NftFamily | int, table: str) -> tuple[str, ...]:
    """Which of kube-proxy's chains (names.NFTABLES_MODE_CHAINS) the table holds: a GETCHAIN
    of each by name (not a dump), answered with the chain or ENOENT."""
    header = struct.pack("=BBH", _number(family), 0, 0)
    found = []
    for chain in NFTABLES_MODE_CHAINS:
        body = attr(CHAIN_TABLE, table.encode() + b"\0") + attr(CHAIN_NAME, chain.encode() + b"\0")
        try:
            for _ in nft.raw_request((nft.SUBSYS << 8) | GETCHAIN, header + body, dump=False):
                pass
        except NetlinkError as exc:
            if exc.errno == errno.ENOENT:
                continue
            raise
        found.append(chain)
    return tuple(found)


def _masquerade_mark(nft: NfTables, family: NftFamily | int, table: str) -> int | None:
    """The mark bit the table's `masquerading` chain masquerades; None without such a chain.

    The chain tests the bit with a bitwise expression (mask M, xor 0) and ends in a `masq`
    expression; both must be there for the mark to count as honoured.
    """
    body = attr(RULE_TABLE, table.encode() + b"\0") + attr(
        RULE_CHAIN, names.MASQUERADING_CHAIN.encode() + b"\0"
    )
    tested: int | None = None
    masquerades = False
    try:
        rules = list(nft.dump(GETRULE, _number(family), body))
    except NetlinkError as exc:
        if exc.errno == errno.ENOENT:  # no such chain
            return None
        raise
    for p in rules:
        a = attrs(p, 4)
        if nul_text(a.get(RULE_CHAIN)) != names.MASQUERADING_CHAIN or RULE_EXPRESSIONS not in a:
            continue
        for elem in _nested(a[RULE_EXPRESSIONS], LIST_ELEM):
            e = attrs(elem)
            name = nul_text(e.get(EXPR_NAME))
            if name == "masq":
                masquerades = True
            elif name == "bitwise" and EXPR_DATA in e and tested is None:
                b = attrs(e[EXPR_DATA])
                mask, xor = _data(b.get(BITWISE_MASK)), _data(b.get(BITWISE_XOR))
                if mask and xor == 0:
                    tested = mask
    return tested if masquerades else None


def _nested(data: memoryview, kind: int) -> list[memoryview]:
    """Every attribute of type `kind` in a nested list (attrs() keeps only the last)."""
    out = []
    offset = 0
    while offset + 4 <= len(data):
        length, k = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        if k & 0x3FFF == kind:
            out.append(data[offset + 4 : offset + length])
        offset += (length + 3) & ~3
    return out


def _data(view: memoryview | None) -> int | None:
    """An nft_data value: a register's bytes in host order (meta mark is a host u32)."""
    if view is None:
        return None
    value = attrs(view).get(DATA_VALUE)
    return None if value is None else int.from_bytes(bytes(value), sys.byteorder)


def _keys(nft: NfTables, family: NftFamily | int, table: str, name: str) -> list[bytes]:
    """The key of every element of a set or map; none when it does not exist."""
    body = attr(ELEM_LIST_TABLE, table.encode() + b"\0") + attr(
        ELEM_LIST_SET, name.encode() + b"\0"
    )
    out = []
    try:
        for p in nft.dump(GETSETELEM, _number(family), body):
            elements = attrs(p, 4).get(ELEM_LIST_ELEMENTS)
            for elem in _nested(elements, LIST_ELEM) if elements is not None else ():
                key = attrs(elem).get(ELEM_KEY)
                value = attrs(key).get(DATA_VALUE) if key is not None else None
                if value is not None:
                    out.append(bytes(value))
    except NetlinkError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise
    return out


def _proto_port(key: bytes) -> tuple[str, int] | None:
    """`inet_proto . inet_service`, each in a 4-byte register: the protocol's number in
    the first byte, the port in network order in the first two."""
    if len(key) != 8 or key[0] not in names.INET_PROTOCOLS:
        return None
    return names.INET_PROTOCOLS[key[0]].lower(), int.from_bytes(key[4:6], "big")


Served = tuple[frozenset[tuple[str, str, int]], frozenset[tuple[str, int]]]


def _with(table: NftTable, served: dict[Key, Served]) -> NftTable:
    got = served.get((table.family, table.name))
    if got is None:
        return table
    return dataclasses.replace(table, services=got[0], node_ports=got[1])


def _served(nft: NfTables, family: NftFamily | int, table: str) -> Served:
    """The Service IPs and ports, and the NodePorts, of kube-proxy's service maps."""
    width = 16 if family == "ip6" else 4
    af = socket.AF_INET6 if width == 16 else socket.AF_INET
    services: set[tuple[str, str, int]] = set()
    for m in names.NFTABLES_SERVICE_MAPS:
        for key in _keys(nft, family, table, m):
            rest = _proto_port(key[width:]) if len(key) == width + 8 else None
            if rest is not None:
                services.add((socket.inet_ntop(af, key[:width]), *rest))
    node_ports = {
        pp
        for m in names.NFTABLES_NODE_PORT_MAPS
        for key in _keys(nft, family, table, m)
        if (pp := _proto_port(key)) is not None
    }
    return frozenset(services), frozenset(node_ports)


def _elements(nft: NfTables, family: NftFamily | int, table: str, name: str) -> int:
    # The element dump must go out with the table's own family, not NFPROTO_UNSPEC.
    body = attr(ELEM_LIST_TABLE, table.encode() + b"\0") + attr(
        ELEM_LIST_SET, name.encode() + b"\0"
    )
    total = 0
    for p in nft.dump(GETSETELEM, _number(family), body):
        elements = attrs(p, 4).get(ELEM_LIST_ELEMENTS)
        if elements is not None:
            total += count_attrs(elements)
    return total


def read(detail: bool = True, services: bool = False) -> Reading[tuple[NftTable, ...]]:
    """Every table; with `detail`, chain counts and the sizes of kube-proxy's sets and maps;
    with `services`, the keys of its service maps."""
    return timed(lambda: consistent(lambda: _read(detail, services)), ())
