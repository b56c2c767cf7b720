"""IPVS virtual servers and their real servers, over generic netlink (pyroute2).

Values come from the raw attributes: pyroute2's IPVSService/IPVSDest.from_message() replace
flags, timeout and the forwarding method with class defaults.
"""

from __future__ import annotations

import errno
from typing import Any

from agent.kernel import Presence, presence
from agent.readers._timing import Absent, timed
from agent.snapshot import IpvsDest, IpvsService, Reading

PROTOCOLS = {6: "TCP", 17: "UDP", 132: "SCTP"}
FORWARD = {0: "masq", 1: "local", 2: "tunnel", 3: "route", 4: "bypass"}
_FWD_MASK = 0x7


def _service(msg: Any) -> IpvsService:
    svc = msg.get_attr("IPVS_CMD_ATTR_SERVICE")
    af = svc.get_attr("IPVS_SVC_ATTR_AF")
    flags = svc.get_attr("IPVS_SVC_ATTR_FLAGS") or {}
    proto = svc.get_attr("IPVS_SVC_ATTR_PROTOCOL")
    fwmark = svc.get_attr("IPVS_SVC_ATTR_FWMARK")
    return IpvsService(
        family=6 if af == 10 else 4,
        protocol="FWM" if fwmark else PROTOCOLS.get(proto or 0, str(proto)),
        address=None if fwmark else svc.get_attr("IPVS_SVC_ATTR_ADDR"),
        port=None if fwmark else svc.get_attr("IPVS_SVC_ATTR_PORT"),
        fwmark=fwmark or None,
        scheduler=svc.get_attr("IPVS_SVC_ATTR_SCHED_NAME") or "",
        flags=int(flags.get("flags", 0)),
        timeout=int(svc.get_attr("IPVS_SVC_ATTR_TIMEOUT") or 0),
    )


def _dest(msg: Any) -> IpvsDest:
    d = msg.get_attr("IPVS_CMD_ATTR_DEST")
    fwd = int(d.get_attr("IPVS_DEST_ATTR_FWD_METHOD") or 0) & _FWD_MASK
    return IpvsDest(
        address=d.get_attr("IPVS_DEST_ATTR_ADDR"),
        port=int(d.get_attr("IPVS_DEST_ATTR_PORT") or 0),
        forward=FORWARD.get(fwd, str(fwd)),
        weight=int(d.get_attr("IPVS_DEST_ATTR_WEIGHT") or 0),
        active_conns=int(d.get_attr("IPVS_DEST_ATTR_ACTIVE_CONNS") or 0),
        inactive_conns=int(d.get_attr("IPVS_DEST_ATTR_INACT_CONNS") or 0),
        persist_conns=int(d.get_attr("IPVS_DEST_ATTR_PERSIST_CONNS") or 0),
    )


def _read() -> tuple[IpvsService, ...]:
    if presence("ip_vs") is Presence.ABSENT:
        raise Absent("ip_vs module not loaded")
    from pyroute2 import IPVS, IPVSService
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        ipvs = IPVS()
    except NetlinkError as exc:
        if exc.code == errno.ENOENT:
            raise Absent("kernel has no IPVS") from exc
        raise
    try:
        services = []
        for msg in ipvs.service("dump"):
            svc = _service(msg)
            key = IPVSService.from_message(msg)  # fine as a key, not as a value source
            dests = tuple(_dest(dm) for dm in ipvs.dest("dump", service=key))
            services.append(IpvsService(**{**svc.__dict__, "dests": dests}))
        return tuple(services)
    finally:
        ipvs.close()


def read() -> Reading[tuple[IpvsService, ...]]:
    return timed(_read, ())
