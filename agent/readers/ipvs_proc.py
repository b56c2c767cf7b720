"""/proc/net/ip_vs: the virtual servers of this namespace as the kernel lists them, with their
real servers' counts and connections. Read beside the netlink dump (agent/readers/ipvs.py):
cheaper for what it holds.

Neither listing is whole for certain. On the kernels nodes run (Debian 12's 6.1), every
namespace's virtual servers share one table, and both the netlink dump and this file resume
each part (a 4 KiB page of this file) by position in that table: a service added or removed
in another namespace between two parts makes this namespace's listing skip or repeat one.
Measured in the VM (tests/vm/test_ipvs_dump_churn.py), a static namespace of 120 services,
five others adding and deleting twenty each: this file listed 62-119 of the 120 in 80 reads
of 80, the netlink dump 149-151 of 150 in 5 reads of 60. agent/readers/ipvs.py takes a
listing as whole only when a second one made with other resume points agrees, and the
kernel's count of IPv4 services (ipv4_service_count) with both."""

from __future__ import annotations

import itertools
import socket
import struct
from collections.abc import Iterable, Iterator
from typing import Literal

from agent.readers.ipvs_wire import PROTOCOLS
from agent.snapshot import IpVersion, IpvsDest, IpvsProtocol, IpvsService

PROC_IPVS = "/proc/net/ip_vs"
# IP_VS_SO_GET_INFO = IP_VS_BASE_CTL + 1 (include/uapi/linux/ip_vs.h); its answer is struct
# ip_vs_getinfo {version, size, num_services}. Any AF_INET socket reaches it (ip_getsockopt
# hands unknown options to nf_getsockopt): no raw socket, no CAP_NET_RAW; CAP_NET_ADMIN, as
# the dump.
_IP_VS_SO_GET_INFO = 64 + 1024 + 64 + 1
_GETINFO = struct.Struct("=III")


def ipv4_service_count() -> int | None:
    """How many IPv4 virtual servers this namespace has, as the kernel counts them (exact,
    one getsockopt); None when it cannot say (ip_vs not loaded, no permission). IPv4 only:
    ip_vs_add_service counts "only IPv4 services for old get/setsockopt interface"
    (ipvs->num_services, 6.1), so it cannot vouch for IPv6 ones."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            raw = sock.getsockopt(socket.IPPROTO_IP, _IP_VS_SO_GET_INFO, _GETINFO.size)
    except OSError:
        return None
    if len(raw) != _GETINFO.size:
        return None
    return int(_GETINFO.unpack(raw)[2])


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
