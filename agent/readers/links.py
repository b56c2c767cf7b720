"""kube-ipvs0 and the node's own addresses, over rtnetlink (agent.readers.netlink).

kube-ipvs0 holds one address per Service IP, tens of thousands on a large node; two raw dumps
read them without pyroute2's per-attribute decoding.
"""

from __future__ import annotations

import socket
import struct

from agent import names
from agent.readers._timing import timed
from agent.readers.netlink import NLA_HEADER, NLA_KIND, RtNetlink, consistent
from agent.snapshot import Link, Links, Reading

_V6_LOOPBACK = bytes(15) + b"\x01"
IFA_ADDRESS, IFA_LOCAL = 1, 2
_IFADDRMSG = struct.Struct("=BBBBI")


def _loopback_or_link_local(family: int, raw: memoryview) -> bool:
    if family == socket.AF_INET:
        return raw[0] == 127 or (raw[0] == 169 and raw[1] == 254)
    return bytes(raw) == _V6_LOOPBACK or (raw[0] == 0xFE and raw[1] & 0xC0 == 0x80)


def _address_of(payload: memoryview, family: int) -> memoryview | None:
    """An RTM_NEWADDR's address: IFA_LOCAL for IPv4 (IFA_ADDRESS is the peer's on a
    point-to-point link), else IFA_ADDRESS. One pass without a dict of every attribute:
    attrs() per address was a third of reading kube-ipvs0's 10,000 addresses."""
    offset, end = 8, len(payload)  # after struct ifaddrmsg
    address = None
    while offset + 4 <= end:
        length, kind = NLA_HEADER.unpack_from(payload, offset)
        if length < 4:
            break
        kind &= NLA_KIND
        if kind == IFA_LOCAL and family == socket.AF_INET:
            return payload[offset + 4 : offset + length]
        if kind == IFA_ADDRESS:
            address = payload[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return address


def _read() -> Links:
    with RtNetlink() as rt:
        kube = None
        for row in rt.link_rows():
            if row.name == names.KUBE_IPVS0:
                kube = row
        kube_addrs: list[str] = []
        node: list[str] = []
        for p in rt.addresses():
            family, prefix, _, _, index = _IFADDRMSG.unpack_from(p)
            raw = _address_of(p, family)
            if raw is None:
                continue
            # inet_ntop: ipaddress.ip_address per address cost a second of a 10,000-Service
            # read in the VM; it prints the same text for both families
            text = socket.inet_ntop(family, raw)
            if kube is not None and index == kube.index:
                kube_addrs.append(f"{text}/{prefix}")
            elif not _loopback_or_link_local(family, raw):
                # kube-proxy's NodePort addresses: no loopback, no IPv6 link-local
                node.append(text)
    link = None
    if kube is not None:
        link = Link(
            names.KUBE_IPVS0, kube.index, kube.kind, kube.up, tuple(kube_addrs), kube.txqlen
        )
    return Links(kube_ipvs0=link, node_addresses=tuple(node))


def read() -> Reading[Links]:
    return timed(lambda: consistent(_read), Links(kube_ipvs0=None))
