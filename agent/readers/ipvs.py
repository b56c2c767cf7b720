"""IPVS virtual servers and their real servers, over generic netlink.

Read with agent.netlink (one dump of services, then one destination dump per service, as
ipvsadm does): with pyroute2 the per-request cost alone made a 10,000-Service node take
seconds. The attribute numbers are the kernel's (include/uapi/linux/ip_vs.h).
"""

from __future__ import annotations

import errno
import functools
import socket
import struct

from agent.ipvs_wire import (
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
    service_key,
)
from agent.kernel import Presence, presence
from agent.netlink import GenericNetlink, NetlinkError, attrs, nul_text
from agent.readers._timing import Absent, timed
from agent.snapshot import IpvsDest, IpvsService, LazyDests, Reading

FORWARD = {0: "masq", 1: "local", 2: "tunnel", 3: "route", 4: "bypass"}
_FWD_MASK = 0x7
# What the kernel means when it sends no netmask: one client address per persistence entry.
_ALL = 0xFFFFFFFF
_DEFAULT_MASK: dict[int, int] = {socket.AF_INET: _ALL, socket.AF_INET6: 128}


def _u(view: memoryview | None, fmt: str = "=I") -> int:
    return int(struct.unpack_from(fmt, view)[0]) if view is not None else 0


def _ip(view: memoryview | None, family: int) -> str | None:
    if view is None:
        return None
    # The kernel sends a 16-byte union nf_inet_addr for either family.
    if family == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, view[:16])
    return socket.inet_ntop(socket.AF_INET, view[:4])


def parse_service(payload: memoryview) -> tuple[IpvsService, bytes]:
    """A service from one IPVS_CMD_NEW_SERVICE answer, and the key to ask for its dests."""
    svc = attrs(attrs(payload, 4)[ATTR_SERVICE])
    af = _u(svc.get(SVC_AF), "=H")
    fwmark = _u(svc.get(SVC_FWMARK))
    proto = _u(svc.get(SVC_PROTOCOL), "=H")
    flags = svc.get(SVC_FLAGS)
    sched = nul_text(svc.get(SVC_SCHED))
    service = IpvsService(
        family=6 if af == socket.AF_INET6 else 4,
        protocol="FWM" if fwmark else PROTOCOLS.get(proto, str(proto)),
        address=None if fwmark else _ip(svc.get(SVC_ADDR), af),
        port=None if fwmark else _u(svc.get(SVC_PORT), "!H"),
        fwmark=fwmark or None,
        scheduler=sched,
        flags=_u(flags),
        timeout=_u(svc.get(SVC_TIMEOUT)),
        netmask=_u(svc[SVC_NETMASK]) if SVC_NETMASK in svc else _DEFAULT_MASK.get(af, _ALL),
        pe_name=nul_text(svc.get(SVC_PE_NAME)),
    )
    return service, service_key(service)


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
            parse_service(p)
            for p in genl.request(genl.family_id, CMD_GET_SERVICE, GENL_VERSION, b"")
        ]
        decode = {
            4: functools.partial(parse_dest, service_family=socket.AF_INET),
            6: functools.partial(parse_dest, service_family=socket.AF_INET6),
        }
        for svc, key in found:
            raw = tuple(genl.request(genl.family_id, CMD_GET_DEST, GENL_VERSION, key))
            # filled in place: dataclasses.replace per service was 4 s of 3 reads at 10,000
            object.__setattr__(svc, "dests", LazyDests(raw, decode[svc.family]))
    return tuple(svc for svc, _ in found)


def read() -> Reading[tuple[IpvsService, ...]]:
    return timed(_read, ())
