"""`ipvsadm -S -n` text written from a reading, byte for byte as ipvsadm 1.31 prints it.

The backup bundle used to run `ipvsadm -S -n` and keep the removed services' lines: at 10,000
Services that process re-read the whole IPVS table the agent had just read. Here the same text
comes from the reading (ipvsadm.c print_service_entry with FMT_RULE|FMT_NUMERIC).

Order: ipvsadm sorts with glibc qsort and comparators that subtract unsigned 32-bit numbers
into an int (libipvs ipvs_cmp_services/ipvs_cmp_dests), so two addresses 2^31 or more apart
compare the "wrong" way and the order is not a total order. When each compared field's
values lie on an arc of the 2^32 circle shorter than 2^31 (one value or one cluster, or the
ClusterIP range and the node's addresses) the comparator is a total order and any stable
sort gives ipvsadm's; otherwise the merge sort glibc (<= 2.36, Debian 12) runs is replayed
with that comparator.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from agent.readers.ipvs_wire import PROTOCOL_NUMBERS

if TYPE_CHECKING:  # restore's loader shares the word tables below without the dataclasses
    from agent.snapshot import IpvsDest, IpvsProtocol, IpvsService

    DestsOf = Callable[[IpvsService], Sequence[IpvsDest]]

PROTOCOL_OPTIONS: dict[IpvsProtocol | int, str] = {
    "TCP": "-t",
    "UDP": "-u",
    "SCTP": "--sctp-service",
}
_FWD_SWITCH = {"masq": "-m", "tunnel": "-i", "local": "-g", "route": "-g"}
_TUN_NAMES = ("ipip", "gue", "gre")
_TUN_FLAG_OPTS = ("--tun-nocsum", "--tun-csum", "--tun-remcsum")
SCHED_FLAGS = {
    "sh": ((0x8, "sh-fallback"), (0x10, "sh-port")),
    "mh": ((0x8, "mh-fallback"), (0x10, "mh-port")),
}
OTHER_SCHED_FLAGS = ((0x8, "flag-1"), (0x10, "flag-2"), (0x20, "flag-3"))
F_PERSISTENT, F_ONEPACKET, F_SCHED_ANY = 0x1, 0x4, 0x38
_AF = {4: socket.AF_INET, 6: socket.AF_INET6}
_CIRCLE, _HALF = 1 << 32, 1 << 31

T = TypeVar("T")


def _words(address: str | None) -> tuple[int, ...]:
    """An address as libipvs compares it: one u32 (IPv4) or four (IPv6), host order."""
    if not address:
        return (0,)
    if ":" in address:
        return struct.unpack("!4I", socket.inet_pton(socket.AF_INET6, address))
    return struct.unpack("!I", socket.inet_aton(address))


def _int32(x: int) -> int:
    """C's conversion of an unsigned 32-bit difference to int."""
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


def _cmp_words(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    r = 0
    for x, y in zip(a, b, strict=False):
        r = _int32(x - y)
        if r:
            break
    return r


def _svc_fields(s: IpvsService) -> tuple[int, int, int, tuple[int, ...], int]:
    # a protocol without a name in the model sorts as 0, as it did when the numbers were here
    proto = 0 if isinstance(s.protocol, int) else PROTOCOL_NUMBERS.get(s.protocol, 0)
    # a fwmark service's address is libipvs' zeroed union: four words for IPv6, as an address
    words = _words(s.address) if s.address else (0,) * (4 if s.family == 6 else 1)
    return (s.fwmark or 0, _AF[s.family], proto, words, s.port or 0)


def cmp_services(a: IpvsService, b: IpvsService) -> int:
    """libipvs ipvs_cmp_services."""
    return _cmp_fields(_svc_fields(a), _svc_fields(b))


def _cmp_fields(
    fa: tuple[int, int, int, tuple[int, ...], int], fb: tuple[int, int, int, tuple[int, ...], int]
) -> int:
    r = _int32(fa[0] - fb[0])
    if r:
        return r
    r = fa[1] - fb[1]
    if r:
        return r
    r = fa[2] - fb[2]
    if r:
        return r
    r = _cmp_words(fa[3], fb[3])
    return r if r else fa[4] - fb[4]


def cmp_dests(a: IpvsDest, b: IpvsDest) -> int:
    """libipvs ipvs_cmp_dests."""
    r = _cmp_words(_words(a.address), _words(b.address))
    return r if r else a.port - b.port


def _glibc_msort(items: list[T], cmp: Callable[[T, T], int]) -> list[T]:
    """glibc's msort_with_tmp: halves n//2 and n - n//2; ties take the left run."""
    n = len(items)
    if n <= 1:
        return items
    left, right = _glibc_msort(items[: n // 2], cmp), _glibc_msort(items[n // 2 :], cmp)
    out: list[T] = []
    i = j = 0
    while i < len(left) and j < len(right):
        if cmp(left[i], right[j]) <= 0:
            out.append(left[i])
            i += 1
        else:
            out.append(right[j])
            j += 1
    return out + left[i:] + right[j:]


def _arc_start(values: Iterable[int]) -> int | None:
    """Where an arc of the 2^32 circle shorter than 2^31 that holds every value starts, or
    None if there is none. Within such an arc the wrapping subtraction orders the values like
    their distances from its start: 10.96.0.0/12 ClusterIPs and 192.168.0.0/16 node addresses
    lie 0xB6 apart one way and 0x4A the other, so ipvsadm puts every node address first."""
    points = sorted(set(values))
    if len(points) <= 1:
        return points[0] if points else 0
    gaps = [(b - a, b) for a, b in zip(points, points[1:], strict=False)]
    gaps.append((points[0] + _CIRCLE - points[-1], points[0]))
    gap, start = max(gaps)
    return start if _CIRCLE - gap < _HALF else None


def _rotations(rows: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    """_arc_start of every column, or None if a column has no such arc."""
    starts = tuple(_arc_start(col) for col in zip(*rows, strict=True))
    return None if None in starts else starts  # type: ignore[return-value]


def _rotated(words: tuple[int, ...], starts: tuple[int, ...]) -> tuple[int, ...]:
    return tuple((w - s) & 0xFFFFFFFF for w, s in zip(words, starts, strict=True))


def sort_services(services: Sequence[IpvsService]) -> list[IpvsService]:
    fields = [_svc_fields(s) for s in services]
    # fwmark and the address words are the only fields whose subtraction can wrap; the
    # addresses are compared only between services of one family
    by_af: dict[int, list[tuple[int, ...]]] = {}
    for f in fields:
        by_af.setdefault(f[1], []).append(f[3])
    marks = _arc_start(f[0] for f in fields)
    starts = {af: _rotations(rows) for af, rows in by_af.items()}
    if marks is not None and None not in starts.values():
        # a total order: every stable sort gives the order glibc's stable merge sort gives
        keys = [
            ((f[0] - marks) & 0xFFFFFFFF, f[1], f[2], _rotated(f[3], starts[f[1]]), f[4])  # type: ignore[arg-type]
            for f in fields
        ]
        order = sorted(range(len(services)), key=keys.__getitem__)
    else:  # the fields once per service, not twice per comparison
        order = _glibc_msort(
            list(range(len(services))), lambda i, j: _cmp_fields(fields[i], fields[j])
        )
    return [services[i] for i in order]


def sort_dests(dests: Sequence[IpvsDest]) -> list[IpvsDest]:
    words = [_words(d.address) for d in dests]
    starts = _rotations(words) if len({len(w) for w in words}) <= 1 else None
    if starts is not None:
        keys = [(_rotated(w, starts), d.port) for w, d in zip(words, dests, strict=True)]
        order = sorted(range(len(dests)), key=keys.__getitem__)
        return [dests[i] for i in order]
    return _glibc_msort(list(dests), cmp_dests)


def _host(address: str | None, family: int, port: int | None) -> str:
    return f"[{address}]:{port}" if family == 6 else f"{address}:{port}"


def _service_name(s: IpvsService) -> str:
    if s.fwmark:
        mark = _int32(s.fwmark)  # printed with %d
        return f"-f {mark} -6" if s.family == 6 else f"-f {mark}"
    option = PROTOCOL_OPTIONS.get(s.protocol, "--xxx-service")
    return f"{option} {_host(s.address, s.family, s.port)}"


def _service_line(s: IpvsService, name: str) -> str:
    words = [f"-A {name} -s {s.scheduler}"]
    if s.flags & F_PERSISTENT:
        words.append(f" -p {s.timeout}")
        if s.family == 4 and s.netmask != 0xFFFFFFFF:
            words.append(f" -M {socket.inet_ntoa(struct.pack('=I', s.netmask))}")
        if s.family == 6 and s.netmask != 128:
            words.append(f" -M {s.netmask}")
    if s.pe_name:
        words.append(f" --pe {s.pe_name}")
    if s.flags & F_ONEPACKET:
        words.append(" -o")
    if s.flags & F_SCHED_ANY:
        table = SCHED_FLAGS.get(s.scheduler, OTHER_SCHED_FLAGS)
        words.append(" -b " + ",".join(text for bit, text in table if s.flags & bit))
    return "".join(words)


def _dest_line(name: str, d: IpvsDest) -> str:
    family = 6 if ":" in d.address else 4
    head = f"-a {name} -r {_host(d.address, family, d.port)} "
    head += f"{_FWD_SWITCH.get(d.forward, '(null)')} -w {d.weight}"
    if d.forward != "tunnel":
        return head
    if d.tun_type == 2:  # gre
        return f"{head} --tun-type gre {_TUN_FLAG_OPTS[d.tun_flags]}"
    if d.tun_type == 1:  # gue
        return f"{head} --tun-type gue --tun-port {d.tun_port} {_TUN_FLAG_OPTS[d.tun_flags]}"
    if d.tun_type == 0:
        return f"{head} --tun-type ipip"
    return head


def _own_dests(s: IpvsService) -> Sequence[IpvsDest]:
    return s.dests


def supported(s: IpvsService, dests_of: DestsOf = _own_dests) -> bool:
    """Whether this module prints `s` as ipvsadm would (else the backup asks ipvsadm)."""
    tunnels_ok = all(
        d.forward != "tunnel" or d.tun_type == 0 or d.tun_flags < len(_TUN_FLAG_OPTS)
        for d in dests_of(s)
    )
    return s.family in _AF and tunnels_ok


def save_text(services: Sequence[IpvsService], dests_of: DestsOf = _own_dests) -> str:
    """The lines `ipvsadm -S -n` prints for exactly these services, in its order; each
    service's real servers are `dests_of(service)` (by default its own)."""
    lines: list[str] = []
    for s in sort_services(services):
        name = _service_name(s)
        lines.append(_service_line(s, name))
        lines += [_dest_line(name, d) for d in sort_dests(dests_of(s))]
    return "".join(f"{line}\n" for line in lines)


__all__ = ["save_text", "sort_services", "sort_dests", "supported"]
