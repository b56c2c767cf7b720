"""IPVS virtual servers and their real servers, over generic netlink.

Read with agent.readers.netlink: one dump of the services, and their real servers counted in
/proc/net/ip_vs (one read of the whole table, as node_exporter does) and dumped per service
only when something needs them (RealServers). A service /proc does not show is dumped
right away, as ipvsadm does. With pyroute2 the per-request cost alone made a 10,000-Service
node take seconds. The attribute numbers are the kernel's (include/uapi/linux/ip_vs.h).
"""

from __future__ import annotations

import errno
import functools
import socket
import struct
from collections.abc import Collection, Iterable, Sequence

from agent.readers._timing import Absent, timed
from agent.readers.ipvs_proc import (
    PROC_IPVS as PROC_IPVS,
)
from agent.readers.ipvs_proc import (
    ProcKey as ProcKey,
)
from agent.readers.ipvs_proc import (
    Tally as Tally,
)
from agent.readers.ipvs_proc import ipv4_service_count
from agent.readers.ipvs_proc import (
    proc_dest_counts as proc_dest_counts,
)
from agent.readers.ipvs_proc import (
    proc_dests as proc_dests,
)
from agent.readers.ipvs_proc import (
    proc_key as proc_key,
)
from agent.readers.ipvs_proc import (
    proc_services as proc_services,
)
from agent.readers.ipvs_proc import (
    proc_tally as proc_tally,
)
from agent.readers.ipvs_proc import (
    read_connections as read_connections,
)
from agent.readers.ipvs_proc import (
    read_proc_dest_counts as read_proc_dest_counts,
)
from agent.readers.ipvs_proc import (
    read_proc_dests as read_proc_dests,
)
from agent.readers.ipvs_proc import (
    read_proc_tally as read_proc_tally,
)
from agent.readers.ipvs_wire import (
    ATTR_DEST,
    ATTR_SERVICE,
    CMD_GET_DEST,
    CMD_GET_SERVICE,
    DEST_ACTIVE,
    DEST_ADDR,
    DEST_FAMILY,
    DEST_FWD,
    DEST_INACT,
    DEST_PERSIST,
    DEST_PORT,
    DEST_TUN_FLAGS,
    DEST_TUN_PORT,
    DEST_TUN_TYPE,
    DEST_WEIGHT,
    GENL_VERSION,
    PROTOCOLS,
    SVC_ADDR,
    SVC_AF,
    SVC_FLAGS,
    SVC_FWMARK,
    SVC_NETMASK,
    SVC_PE_NAME,
    SVC_PORT,
    SVC_PROTOCOL,
    SVC_SCHED,
    SVC_TIMEOUT,
    key_of,
    service_key,
)
from agent.readers.kernel import Presence, presence
from agent.readers.netlink import (
    DUMP_ATTEMPTS,
    NLA_HEADER,
    NLA_KIND,
    DumpInterrupted,
    GenericNetlink,
    NetlinkError,
    attrs,
    consistent,
    nul_text,
)
from agent.snapshot import (
    CountedDests,
    IpvsDest,
    IpvsService,
    LazyDests,
    Reading,
)

FORWARD = {0: "masq", 1: "local", 2: "tunnel", 3: "route", 4: "bypass"}
_FWD_MASK = 0x7
# What the kernel means when it sends no netmask: one client address per persistence entry.
_ALL = 0xFFFFFFFF
_DEFAULT_MASK: dict[int, int] = {socket.AF_INET: _ALL, socket.AF_INET6: 128}
_U16, _U32, _BE16 = struct.Struct("=H"), struct.Struct("=I"), struct.Struct("!H")


def _u(view: memoryview | None, fmt: str = "=I") -> int:
    return int(struct.unpack_from(fmt, view)[0]) if view is not None else 0


def _ip(view: memoryview | None, family: int) -> str | None:
    if view is None:
        return None
    # The kernel sends a 16-byte union nf_inet_addr for either family.
    if family == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, view[:16])
    return socket.inet_ntop(socket.AF_INET, view[:4])


def _only_attr(payload: memoryview, kind: int) -> memoryview:
    """The attribute `kind` of an answer whose only attribute it is (after the genl header),
    as the kernel sends IPVS answers; any other layout goes through attrs()."""
    length, found = NLA_HEADER.unpack_from(payload, 4)
    if found & NLA_KIND == kind and 4 + ((length + 3) & ~3) >= len(payload) >= 4 + length >= 8:
        return payload[8 : 4 + length]
    return attrs(payload, 4)[kind]


def service_of(payload: memoryview) -> IpvsService:
    """A service from one IPVS_CMD_NEW_SERVICE answer (its key is made when a dump needs it).

    One pass over the nested attributes instead of attrs(): a dict of memoryview slices per
    service was a quarter of a warm scrape's Python time at 10,000 Services."""
    svc = _only_attr(payload, ATTR_SERVICE)
    af = proto = fwmark = flags = timeout = port = 0
    netmask: int | None = None
    addr: memoryview | None = None
    sched = pe_name = ""
    offset, end = 0, len(svc)
    while offset + 4 <= end:
        length, kind = NLA_HEADER.unpack_from(svc, offset)
        if length < 4:
            break
        kind &= NLA_KIND
        at = offset + 4
        if kind == SVC_AF:
            af = _U16.unpack_from(svc, at)[0]
        elif kind == SVC_PROTOCOL:
            proto = _U16.unpack_from(svc, at)[0]
        elif kind == SVC_ADDR:
            addr = svc[at : offset + length]
        elif kind == SVC_PORT:
            port = _BE16.unpack_from(svc, at)[0]
        elif kind == SVC_FWMARK:
            fwmark = _U32.unpack_from(svc, at)[0]
        elif kind == SVC_SCHED:
            sched = nul_text(svc[at : offset + length])
        elif kind == SVC_FLAGS:  # struct ip_vs_flags: the flags, then their mask
            flags = _U32.unpack_from(svc, at)[0]
        elif kind == SVC_TIMEOUT:
            timeout = _U32.unpack_from(svc, at)[0]
        elif kind == SVC_NETMASK:
            netmask = _U32.unpack_from(svc, at)[0]
        elif kind == SVC_PE_NAME:
            pe_name = nul_text(svc[at : offset + length])
        offset += (length + 3) & ~3
    return IpvsService(
        family=6 if af == socket.AF_INET6 else 4,
        protocol="FWM" if fwmark else PROTOCOLS.get(proto, proto),
        address=None if fwmark else _ip(addr, af),
        port=None if fwmark else port,
        fwmark=fwmark or None,
        scheduler=sched,
        flags=flags,
        timeout=timeout,
        netmask=_DEFAULT_MASK.get(af, _ALL) if netmask is None else netmask,
        pe_name=pe_name,
    )


def parse_dest(payload: memoryview, service_family: int) -> IpvsDest:
    d = attrs(attrs(payload, 4)[ATTR_DEST])
    family = _u(d.get(DEST_FAMILY), "=H") or service_family
    fwd = _u(d.get(DEST_FWD)) & _FWD_MASK
    return IpvsDest(
        address=_ip(d.get(DEST_ADDR), family) or "",
        port=_u(d.get(DEST_PORT), "!H"),
        forward=FORWARD.get(fwd, str(fwd)),
        weight=_u(d.get(DEST_WEIGHT)),
        active_conns=_u(d.get(DEST_ACTIVE)),
        inactive_conns=_u(d.get(DEST_INACT)),
        persist_conns=_u(d.get(DEST_PERSIST)),
        tun_type=_u(d.get(DEST_TUN_TYPE), "=B"),
        tun_port=_u(d.get(DEST_TUN_PORT), "!H"),
        tun_flags=_u(d.get(DEST_TUN_FLAGS), "=H"),
    )


class RealServers:
    """The real servers of a reading's virtual servers, for what needs the servers themselves
    (the backup bundle, the re-check): /proc/net/ip_vs read once when made, and a netlink
    dump for a service /proc cannot describe exactly (a tunnel, an ambiguous fwmark) whose
    reading only counted them. It owns the dump's socket: use it in a `with`.

    The real servers come from /proc and not a dump per virtual server: that was more than
    half of the backup at 5,000 Services in the VM."""

    def __init__(self) -> None:
        self._listed = read_proc_dests()
        self._dumped: dict[tuple[object, ...], tuple[IpvsDest, ...]] = {}
        self._genl: GenericNetlink | None = None

    def __call__(self, s: IpvsService) -> Sequence[IpvsDest]:
        found = self._listed.get(proc_key(s))
        if found is not None:
            return found
        if not isinstance(s.dests, CountedDests):
            return s.dests
        key = (s.family, s.protocol, s.address, s.port, s.fwmark)
        if key not in self._dumped:
            self._dumped[key] = self._dump(s)
        return self._dumped[key]

    def _dump(self, s: IpvsService) -> tuple[IpvsDest, ...]:
        if self._genl is None:
            self._genl = GenericNetlink("IPVS")
        af = socket.AF_INET6 if s.family == 6 else socket.AF_INET
        key = key_of(s.family, s.protocol, s.address, s.port, s.fwmark)
        dump = self._genl.request(self._genl.family_id, CMD_GET_DEST, GENL_VERSION, key)
        return tuple(parse_dest(p, service_family=af) for p in dump)

    def close(self) -> None:
        if self._genl is not None:
            self._genl.close()
            self._genl = None

    def __enter__(self) -> RealServers:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _ipvs_socket() -> GenericNetlink:
    """A socket of the IPVS generic netlink family; Absent when the kernel has none."""
    if presence("ip_vs") is Presence.ABSENT:
        raise Absent("ip_vs module not loaded")
    try:
        return GenericNetlink("IPVS")
    except NetlinkError as exc:
        if exc.errno == errno.ENOENT:
            raise Absent("kernel has no IPVS") from exc
        raise


def _read() -> tuple[IpvsService, ...]:
    with _ipvs_socket() as genl:
        found = _whole_listing(genl)
        # read after the service dumps: a service added in between is dumped below
        tally = read_proc_tally()
        _check_listed(found, tally)
        for svc in found:
            listed = tally.get(proc_key(svc))
            dests: Sequence[IpvsDest]
            if listed is not None:
                dests = CountedDests(listed[0])
                active, inactive = listed[1], listed[2]
            else:  # not in /proc/net/ip_vs (gone, new, or ambiguous there): one dump
                dests = _dests_by_key(genl, svc)
                active, inactive = _connections(dests)
            # filled in place: dataclasses.replace per service was 4 s of 3 reads at 10,000
            object.__setattr__(svc, "dests", dests)
            object.__setattr__(svc, "active_conns", active)
            object.__setattr__(svc, "inactive_conns", inactive)
    return tuple(found)


def _check_listed(found: Sequence[IpvsService], listed: Collection[ProcKey]) -> None:
    """Refuse a service dump that lacks a virtual server /proc/net/ip_vs (read after it)
    lists: the dump skipped it, or it is new; either way, read again. The dump's keys are
    gathered once (per listed key, as a first version did, it was quadratic: about 20 s at
    10,000 Services, measured in review)."""
    keys = {proc_key(svc) for svc in found}
    if any(key not in keys for key in listed):
        raise DumpInterrupted("the IPVS service dump missed a virtual server /proc/net/ip_vs lists")


def connections_of(services: Sequence[IpvsService]) -> dict[ProcKey, tuple[int, int]]:
    """The active and inactive connections through these virtual servers now (the cleanup's
    drain wait): /proc/net/ip_vs, and for a service it does not list, which it may skip while
    other namespaces change theirs (ipvs_proc), the netlink dump of that service's real
    servers, asked by its key (no position to lose); a service the kernel no longer has
    dumps none. OSError or ValueError when either cannot be read: an unknown count is never
    taken for none."""
    now = read_connections()
    # a FWM line carries no family: an IPv4 and an IPv6 service with one mark share its key,
    # and /proc may list only one of them; ask netlink for every fwmark service
    missing = [s for s in services if s.fwmark or proc_key(s) not in now]
    if not missing:
        return now
    asked: set[ProcKey] = set()
    with GenericNetlink("IPVS") as genl:
        for svc in missing:
            key = proc_key(svc)
            active, inactive = _connections(_dests_by_key(genl, svc))
            if key in asked:  # two services on one key (same mark, both families): their sum
                active, inactive = active + now[key][0], inactive + now[key][1]
            asked.add(key)
            now[key] = (active, inactive)
    return now


def _dests_by_key(genl: GenericNetlink, svc: IpvsService) -> LazyDests:
    """One virtual server's real servers, dumped by its key: no position in the table every
    namespace shares to lose (ipvs_proc), and none for a service the kernel no longer has."""
    raw = tuple(genl.request(genl.family_id, CMD_GET_DEST, GENL_VERSION, service_key(svc)))
    family = socket.AF_INET6 if svc.family == 6 else socket.AF_INET
    return LazyDests(raw, functools.partial(parse_dest, service_family=family))


def _connections(dests: Iterable[IpvsDest]) -> tuple[int, int]:
    """The active and the inactive connections through these real servers."""
    active = inactive = 0
    for d in dests:
        active += d.active_conns
        inactive += d.inactive_conns
    return active, inactive


def _dump_services(genl: GenericNetlink) -> list[IpvsService]:
    return [service_of(p) for p in genl.request(genl.family_id, CMD_GET_SERVICE, GENL_VERSION, b"")]


def _whole_listing(genl: GenericNetlink) -> list[IpvsService]:
    """The services of one dump that a second dump and the kernel's IPv4 count vouch for.

    Both on one socket, so that their parts end at other services: a dump's first part is
    made when it is asked for, in a buffer of the socket's largest receive so far (netlink_dump:
    NLMSG_GOODSIZE, about 13 services, on a fresh socket; then up to 32 KiB, as this reader
    receives into 1 MiB), so the second dump's parts are all large where the first's began
    small, and a skip that hits one at a boundary misses the other."""
    before = ipv4_service_count()
    first = _dump_services(genl)
    second = _dump_services(genl)
    _check_dump(first, second, before, ipv4_service_count())
    return first


def _check_dump(
    found: Sequence[IpvsService],
    again: Sequence[IpvsService],
    before: int | None,
    after: int | None,
) -> None:
    """Refuse a service listing that skipped or repeated a service. The kernel resumes each
    part of a dump (and each page of /proc/net/ip_vs) by position in one table of every
    namespace's services (ip_vs_genl_dump_services) and never sets NLM_F_DUMP_INTR: a service
    added or removed in any namespace between two parts shifts the position, and this
    namespace's listing misses one or lists one twice without a word. A second listing,
    whose parts end elsewhere, must agree, and the kernel's count of IPv4 services (before
    and after) must be the listing's."""
    dumped = {(svc.family, proc_key(svc)) for svc in found}
    if len(dumped) != len(found):
        raise DumpInterrupted("the IPVS service dump listed a virtual server twice")
    if dumped != {(svc.family, proc_key(svc)) for svc in again} or len(again) != len(found):
        raise DumpInterrupted("two IPVS service listings disagree")
    ipv4 = sum(1 for svc in found if svc.family == 4)
    if before is not None and not before == after == ipv4:
        raise DumpInterrupted(
            f"the IPVS service listing holds {ipv4} IPv4 virtual servers, the kernel counts "
            f"{before} then {after}"
        )


def _read_summary() -> tuple[IpvsService, ...]:
    """The services as /proc/net/ip_vs lists them (proc_services), when one netlink service
    dump and the kernel's IPv4 count agree with it (its pages and the dump's parts end at
    other services, so one skip does not hide another); else the checked netlink read: /proc
    cannot name each one exactly, or it kept skipping services while other namespaces
    changed theirs (ipvs_proc)."""
    with _ipvs_socket() as genl:
        for _ in range(DUMP_ATTEMPTS):
            before = ipv4_service_count()
            try:
                with open(PROC_IPVS) as lines:
                    parsed = proc_services(lines)
            except (OSError, ValueError):
                parsed = None
            if parsed is None:
                break
            services, counts = parsed
            try:
                _check_dump(services, _dump_services(genl), before, ipv4_service_count())
            except DumpInterrupted:
                continue
            for svc, count in zip(services, counts, strict=True):
                object.__setattr__(svc, "dests", CountedDests(count))
            return tuple(services)
    return consistent(_read)


def read(detail: bool = True) -> Reading[tuple[IpvsService, ...]]:
    """Every virtual server, over netlink. Without `detail` (serve's scrapes), from one read
    of /proc/net/ip_vs instead: the netlink dump and its decoding were half of a scrape's
    IPVS time at 10,000 Services (`python -m bench.profile_scrape`, bench/README.md)."""
    if not detail:
        return timed(_read_summary, ())
    return timed(lambda: consistent(_read), ())
