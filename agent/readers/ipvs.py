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
import itertools
import socket
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal

from agent.readers._timing import Absent, timed
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
    NLA_HEADER,
    NLA_KIND,
    GenericNetlink,
    NetlinkError,
    attrs,
    consistent,
    nul_text,
)
from agent.snapshot import (
    CountedDests,
    IpVersion,
    IpvsDest,
    IpvsProtocol,
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


PROC_IPVS = "/proc/net/ip_vs"
ProcKey = tuple[IpvsProtocol | int, str, int] | tuple[Literal["FWM"], int]
# ip_vs_proto_name(): how /proc/net/ip_vs names a virtual server's protocol; any other is
# printed IP_<number>
_PROC_PROTOCOLS: dict[str, IpvsProtocol | int] = {
    **{name: name for name in PROTOCOLS.values()},
    **{"IP": 0, "ICMP": 1, "IPIP": 4, "GRE": 47, "ICMPv6": 58},
}


def _proc_protocol(word: str) -> IpvsProtocol | int | None:
    """The model's protocol for /proc's name; None for a word the kernel does not print."""
    if word.startswith("IP_") and word[3:].isdigit():
        return int(word[3:])
    return _PROC_PROTOCOLS.get(word)


def _proc_blocks(lines: Iterable[str]) -> Iterator[tuple[list[str], list[str]]]:
    """Each virtual server /proc/net/ip_vs lists (ip_vs_info_seq_show): the words of its line,
    and its real servers' lines as they are. Read as the lines come, one service at a time."""
    service: list[str] | None = None
    dests: list[str] = []
    for line in itertools.islice(lines, 3, None):  # version, and two header lines
        if line.startswith("  ->"):
            if service is not None:
                dests.append(line)
            continue
        if service is not None:
            yield service, dests
        service, dests = line.split(), []
    if service is not None:
        yield service, dests


# A virtual server's real servers as /proc/net/ip_vs counts them: how many, and the
# connections through them (ActiveConn, InActConn summed)
Tally = tuple[int, int, int]


def _conns(dests: list[str]) -> tuple[int, int]:
    """ActiveConn and InActConn summed over real-server lines (a short line counts none)."""
    rows = [words for line in dests if len(words := line.split()) >= 6]
    return sum(int(w[4]) for w in rows), sum(int(w[5]) for w in rows)


def proc_tally(lines: Iterable[str]) -> dict[ProcKey, Tally]:
    """Real servers and their connections per virtual server in /proc/net/ip_vs: keyed by
    (protocol, address, port), or ("FWM", mark). A key seen twice (an IPv4 and an IPv6
    fwmark service with one mark) is left out: the caller asks netlink for those."""
    tally: dict[ProcKey, Tally] = {}
    twice: set[ProcKey] = set()
    for words, dests in _proc_blocks(lines):
        key = _proc_service_key(words)
        if key is None:
            continue
        if key in tally:
            twice.add(key)
        tally[key] = (len(dests), *_conns(dests))
    for key in twice:
        del tally[key]
    return tally


def proc_dest_counts(lines: Iterable[str]) -> dict[ProcKey, int]:
    """Real servers per virtual server in /proc/net/ip_vs (proc_tally's first number)."""
    return {key: t[0] for key, t in proc_tally(lines).items()}


# ip_vs_fwd_name(): what /proc/net/ip_vs calls each forwarding method (bypass reads "Masq")
_PROC_FORWARD = {"Masq": "masq", "Local": "local", "Route": "route"}


def proc_dests(lines: Iterable[str]) -> dict[ProcKey, tuple[IpvsDest, ...]]:
    """Each virtual server's real servers as /proc/net/ip_vs lists them: address, port,
    forwarding method, weight and connection counts. What it cannot say exactly is left out,
    for the caller to dump over netlink: a server with a tunnel (its type, port and flags are
    not listed) and a key seen twice (an IPv4 and an IPv6 fwmark service with one mark)."""
    found: dict[ProcKey, list[IpvsDest]] = {}
    dropped: set[ProcKey] = set()
    for service, lines_of_dests in _proc_blocks(lines):
        current = _proc_service_key(service)
        if current is None:
            continue
        if current in found:
            dropped.add(current)
        found[current] = []
        for line in lines_of_dests:
            words = line.split()
            if len(words) < 6:
                continue
            forward = _PROC_FORWARD.get(words[2])
            if forward is None:
                dropped.add(current)
                continue
            address, port = _proc_endpoint(words[1])
            found[current].append(
                IpvsDest(
                    address=address,
                    port=port,
                    forward=forward,
                    weight=int(words[3]),
                    active_conns=int(words[4]),
                    inactive_conns=int(words[5]),
                )
            )
    return {k: tuple(v) for k, v in found.items() if k not in dropped}


def _proc_address(host: str) -> str:
    if host.startswith("["):
        return socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, host[1:-1]))
    return socket.inet_ntop(socket.AF_INET, bytes.fromhex(host))


def _proc_endpoint(word: str) -> tuple[str, int]:
    """`0A600001:01BB` or `[fd00:0096:...:0001]:01BB`: the address as inet_ntop spells it, and
    the port."""
    host, _, port = word.rpartition(":")
    return _proc_address(host), int(port, 16)


def _proc_service_key(words: list[str]) -> ProcKey | None:
    if len(words) < 2:
        return None
    if words[0] == "FWM":
        return ("FWM", int(words[1], 16))
    protocol = _proc_protocol(words[0])
    return None if protocol is None else (protocol, *_proc_endpoint(words[1]))


# IP_VS_SVC_F_* (include/uapi/linux/ip_vs.h): what a /proc/net/ip_vs service line shows
_F_PERSISTENT, _F_HASHED, _F_ONEPACKET = 0x1, 0x2, 0x4


def proc_services(lines: Iterable[str]) -> tuple[list[IpvsService], list[int]] | None:
    """Every virtual server /proc/net/ip_vs lists (ip_vs_info_seq_show), and how many real
    servers each has: all a scrape needs, without the netlink dump of the services.

    None when /proc cannot name each one exactly (the caller dumps over netlink then): a
    fwmark service (its line carries no family) or a key listed twice (the table changed
    under the read). The services carry no persistence timeout (/proc prints it in
    jiffies), netmask or persistence engine: serve's metrics use none of them, and the
    commands that back up or delete read the services over netlink."""
    services: list[IpvsService] = []
    counts: list[int] = []
    seen: set[ProcKey] = set()
    for words, dests in _proc_blocks(lines):
        if len(words) < 3:  # not a service line: its real servers count to the one before
            if counts:
                counts[-1] += len(dests)
            continue
        if words[0] == "FWM":
            return None
        address, port = _proc_endpoint(words[1])
        protocol = _proc_protocol(words[0])
        if protocol is None:  # a name this reader does not know: the caller asks netlink
            return None
        key: ProcKey = (protocol, address, port)
        if key in seen:
            return None
        seen.add(key)
        # a listed service is in the kernel's table: hashed, as netlink reports it too
        flags = _F_HASHED | (_F_PERSISTENT if "persistent" in words else 0)
        flags |= _F_ONEPACKET if "ops" in words else 0
        family: IpVersion = 6 if ":" in address else 4
        svc = IpvsService(family, protocol, address, port, None, words[2], flags, 0)
        active, inactive = _conns(dests)
        object.__setattr__(svc, "active_conns", active)
        object.__setattr__(svc, "inactive_conns", inactive)
        services.append(svc)
        counts.append(len(dests))
    return services, counts


def read_proc_dests() -> dict[ProcKey, tuple[IpvsDest, ...]]:
    """proc_dests of the node now; {} when the file cannot be read or parsed."""
    try:
        with open(PROC_IPVS) as lines:
            return proc_dests(lines)
    except (OSError, ValueError):
        return {}


def read_proc_tally() -> dict[ProcKey, Tally]:
    """proc_tally of the node now; {} when the file cannot be read or parsed. The file is
    parsed line by line as it is read: at 20,000 Services, its text and its list of lines
    held at once were 20 MB of serve's peak memory, a third of it."""
    try:
        with open(PROC_IPVS) as lines:
            return proc_tally(lines)
    except (OSError, ValueError):
        return {}


def read_proc_dest_counts() -> dict[ProcKey, int]:  # read_proc_tally's first numbers
    return {key: t[0] for key, t in read_proc_tally().items()}


def read_connections() -> dict[ProcKey, tuple[int, int]]:
    """The active and inactive connections of every virtual server /proc/net/ip_vs lists,
    read again (the cleanup's wait for them to drain). OSError or ValueError when the file
    cannot be read or parsed: an unknown count is never taken for none."""
    with open(PROC_IPVS) as lines:
        return {key: (t[1], t[2]) for key, t in proc_tally(lines).items()}


def proc_key(svc: IpvsService) -> ProcKey:
    """How /proc/net/ip_vs names this virtual server."""
    if svc.fwmark:
        return ("FWM", svc.fwmark)
    return (svc.protocol, str(svc.address), svc.port or 0)


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


def _read() -> tuple[IpvsService, ...]:
    if presence("ip_vs") is Presence.ABSENT:
        raise Absent("ip_vs module not loaded")
    try:
        genl = GenericNetlink("IPVS")
    except NetlinkError as exc:
        if exc.errno == errno.ENOENT:
            raise Absent("kernel has no IPVS") from exc
        raise
    with genl:
        found = [
            service_of(p) for p in genl.request(genl.family_id, CMD_GET_SERVICE, GENL_VERSION, b"")
        ]
        decode = {
            4: functools.partial(parse_dest, service_family=socket.AF_INET),
            6: functools.partial(parse_dest, service_family=socket.AF_INET6),
        }
        # read after the service dump: a service added in between is dumped below
        tally = read_proc_tally()
        for svc in found:
            counted = tally.get(proc_key(svc))
            dests: Sequence[IpvsDest]
            if counted is not None:
                dests = CountedDests(counted[0])
                active, inactive = counted[1], counted[2]
            else:  # not in /proc/net/ip_vs (gone, new, or ambiguous there): one dump
                key = service_key(svc)
                raw = tuple(genl.request(genl.family_id, CMD_GET_DEST, GENL_VERSION, key))
                dests = LazyDests(raw, decode[svc.family])
                active = sum(d.active_conns for d in dests)
                inactive = sum(d.inactive_conns for d in dests)
            # filled in place: dataclasses.replace per service was 4 s of 3 reads at 10,000
            object.__setattr__(svc, "dests", dests)
            object.__setattr__(svc, "active_conns", active)
            object.__setattr__(svc, "inactive_conns", inactive)
    return tuple(found)


def _read_summary() -> tuple[IpvsService, ...]:
    """The services as /proc/net/ip_vs lists them (proc_services), or the netlink read when
    it cannot name each one exactly."""
    if presence("ip_vs") is Presence.ABSENT:
        raise Absent("ip_vs module not loaded")
    try:
        with open(PROC_IPVS) as lines:
            parsed = proc_services(lines)
    except (OSError, ValueError):
        parsed = None
    if parsed is None:
        return consistent(_read)
    services, counts = parsed
    for svc, count in zip(services, counts, strict=True):
        object.__setattr__(svc, "dests", CountedDests(count))
    return tuple(services)


def read(detail: bool = True) -> Reading[tuple[IpvsService, ...]]:
    """Every virtual server, over netlink. Without `detail` (serve's scrapes), from one read
    of /proc/net/ip_vs instead: the netlink dump and its decoding were half of a scrape's
    IPVS time at 10,000 Services (`python -m bench.profile_scrape`, bench/README.md)."""
    if not detail:
        return timed(_read_summary, ())
    return timed(lambda: consistent(_read), ())
