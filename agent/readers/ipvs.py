"""IPVS virtual servers and their real servers, over generic netlink.

Read with agent.netlink (one dump of services, then one destination dump per service, as
ipvsadm does): with pyroute2 the per-request cost alone made a 10,000-Service node take
seconds. The attribute numbers are the kernel's (include/uapi/linux/ip_vs.h).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct

from agent.kernel import Presence, presence
from agent.netlink import NLA_F_NESTED, GenericNetlink, NetlinkError, attr, attrs
from agent.readers._timing import Absent, timed
from agent.snapshot import IpvsDest, IpvsService, Reading

PROTOCOLS = {6: "TCP", 17: "UDP", 132: "SCTP"}
FORWARD = {0: "masq", 1: "local", 2: "tunnel", 3: "route", 4: "bypass"}
_FWD_MASK = 0x7
GENL_VERSION = 1
CMD_GET_SERVICE, CMD_GET_DEST = 4, 8
ATTR_SERVICE, ATTR_DEST = 1, 2
SVC_AF, SVC_PROTOCOL, SVC_ADDR, SVC_PORT, SVC_FWMARK = 1, 2, 3, 4, 5
SVC_SCHED, SVC_FLAGS, SVC_TIMEOUT = 6, 7, 8
DEST_ADDR, DEST_PORT, DEST_FWD, DEST_WEIGHT = 1, 2, 3, 4
DEST_ACTIVE, DEST_INACT, DEST_PERSIST, DEST_FAMILY = 7, 8, 9, 11


def _u(view: memoryview | None, fmt: str = "=I") -> int:
    return int(struct.unpack_from(fmt, view)[0]) if view is not None else 0


def _ip(view: memoryview | None, family: int) -> str | None:
    if view is None:
        return None
    raw = bytes(view)
    return str(ipaddress.ip_address(raw[:16] if family == socket.AF_INET6 else raw[:4]))


def parse_service(payload: memoryview) -> tuple[IpvsService, bytes]:
    """A service from one IPVS_CMD_NEW_SERVICE answer, and the key to ask for its dests."""
    svc = attrs(attrs(payload, 4)[ATTR_SERVICE])
    af = _u(svc.get(SVC_AF), "=H")
    fwmark = _u(svc.get(SVC_FWMARK))
    proto = _u(svc.get(SVC_PROTOCOL), "=H")
    flags = svc.get(SVC_FLAGS)
    sched = bytes(svc.get(SVC_SCHED) or b"").split(b"\0", 1)[0].decode()
    key_attrs = [attr(SVC_AF, struct.pack("=H", af))]
    if fwmark:
        key_attrs.append(attr(SVC_FWMARK, struct.pack("=I", fwmark)))
    else:
        key_attrs += [
            attr(SVC_PROTOCOL, struct.pack("=H", proto)),
            attr(SVC_ADDR, bytes(svc[SVC_ADDR])),
            attr(SVC_PORT, bytes(svc[SVC_PORT])),
        ]
    service = IpvsService(
        family=6 if af == socket.AF_INET6 else 4,
        protocol="FWM" if fwmark else PROTOCOLS.get(proto, str(proto)),
        address=None if fwmark else _ip(svc.get(SVC_ADDR), af),
        port=None if fwmark else _u(svc.get(SVC_PORT), "!H"),
        fwmark=fwmark or None,
        scheduler=sched,
        flags=_u(flags),
        timeout=_u(svc.get(SVC_TIMEOUT)),
    )
    return service, attr(ATTR_SERVICE | NLA_F_NESTED, b"".join(key_attrs))


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
        out = []
        for svc, key in found:
            af = socket.AF_INET6 if svc.family == 6 else socket.AF_INET
            dests = tuple(
                parse_dest(p, af)
                for p in genl.request(genl.family_id, CMD_GET_DEST, GENL_VERSION, key)
            )
            out.append(IpvsService(**{**svc.__dict__, "dests": dests}))
    return tuple(out)


def read() -> Reading[tuple[IpvsService, ...]]:
    return timed(_read, ())
