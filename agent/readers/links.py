"""kube-ipvs0 and the node's own addresses, over rtnetlink (agent.netlink).

kube-ipvs0 holds one address per Service IP, tens of thousands on a large node; two raw dumps
read them without pyroute2's per-attribute decoding.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from agent.netlink import RtNetlink, attrs
from agent.readers._timing import timed
from agent.snapshot import Link, Links, Reading

KUBE_IPVS0 = "kube-ipvs0"
_IFF_UP = 0x1
IFLA_IFNAME, IFLA_LINKINFO, IFLA_INFO_KIND = 3, 18, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2


def _text(view: memoryview | None) -> str | None:
    return None if view is None else bytes(view).split(b"\0", 1)[0].decode()


def _read() -> Links:
    with RtNetlink() as rt:
        kube: tuple[int, str | None, bool] | None = None
        for p in rt.links():
            _, _, index, flags, _ = struct.unpack_from("=BxHiII", p)
            a = attrs(p, 16)
            name = _text(a.get(IFLA_IFNAME)) or ""
            if name == KUBE_IPVS0:
                info = a.get(IFLA_LINKINFO)
                kind = _text(attrs(info).get(IFLA_INFO_KIND)) if info is not None else None
                kube = (index, kind, bool(flags & _IFF_UP))
        kube_addrs: list[str] = []
        node: list[str] = []
        for p in rt.addresses():
            family, prefix, _, _, index = struct.unpack_from("=BBBBI", p)
            a = attrs(p, 8)
            raw = (
                a.get(IFA_LOCAL)
                if family == socket.AF_INET and IFA_LOCAL in a
                else a.get(IFA_ADDRESS)
            )
            if raw is None:
                continue
            ip = ipaddress.ip_address(bytes(raw))
            if kube is not None and index == kube[0]:
                kube_addrs.append(f"{ip}/{prefix}")
            elif not (ip.is_loopback or ip.is_link_local):
                # kube-proxy's NodePort addresses: no loopback, no IPv6 link-local
                node.append(str(ip))
    link = None
    if kube is not None:
        link = Link(KUBE_IPVS0, kube[0], kube[1], kube[2], tuple(kube_addrs))
    return Links(kube_ipvs0=link, node_addresses=tuple(node))


def read() -> Reading[Links]:
    return timed(_read, Links(kube_ipvs0=None))
