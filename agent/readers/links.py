"""kube-ipvs0 and the node's own addresses, over rtnetlink (agent.netlink).

kube-ipvs0 holds one address per Service IP, tens of thousands on a large node; two raw dumps
read them without pyroute2's per-attribute decoding.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from agent.netlink import RtNetlink, attrs, consistent
from agent.readers._timing import timed
from agent.snapshot import Link, Links, Reading

KUBE_IPVS0 = "kube-ipvs0"
IFA_ADDRESS, IFA_LOCAL = 1, 2


def _read() -> Links:
    with RtNetlink() as rt:
        kube: tuple[int, str | None, bool] | None = None
        for row in rt.link_rows():
            if row.name == KUBE_IPVS0:
                kube = (row.index, row.kind, row.up)
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
    return timed(lambda: consistent(_read), Links(kube_ipvs0=None))
