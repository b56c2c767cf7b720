"""IPVS generic-netlink numbers (include/uapi/linux/ip_vs.h) and the service key encoding.

Shared by the reader (dumps) and the executor (deletes), so both name a virtual server the
same way the kernel does.
"""

from __future__ import annotations

import socket
import struct
from typing import TYPE_CHECKING

from agent.readers.netlink import NLA_F_NESTED, attr

if TYPE_CHECKING:  # restore's path (the numbers only) imports no dataclasses
    from agent.snapshot import IpvsProtocol, IpvsService

GENL_VERSION = 1
CMD_NEW_SERVICE, CMD_DEL_SERVICE, CMD_GET_SERVICE, CMD_NEW_DEST, CMD_GET_DEST = 1, 3, 4, 5, 8
ATTR_SERVICE, ATTR_DEST = 1, 2
SVC_AF, SVC_PROTOCOL, SVC_ADDR, SVC_PORT, SVC_FWMARK = 1, 2, 3, 4, 5
SVC_SCHED, SVC_FLAGS, SVC_TIMEOUT, SVC_NETMASK, SVC_PE_NAME = 6, 7, 8, 9, 11
DEST_ADDR, DEST_PORT, DEST_FWD, DEST_WEIGHT, DEST_U_THRESH, DEST_L_THRESH = 1, 2, 3, 4, 5, 6
DEST_ACTIVE, DEST_INACT, DEST_PERSIST, DEST_FAMILY = 7, 8, 9, 11
DEST_TUN_TYPE, DEST_TUN_PORT, DEST_TUN_FLAGS = 13, 14, 15
PROTOCOLS: dict[int, IpvsProtocol] = {6: "TCP", 17: "UDP", 132: "SCTP"}
PROTOCOL_NUMBERS = {name: number for number, name in PROTOCOLS.items()}


def _protocol_number(protocol: IpvsProtocol | int) -> int:
    if isinstance(protocol, int):  # one the reader has no name for
        return protocol
    if protocol not in PROTOCOL_NUMBERS:
        raise ValueError(f"{protocol} is no IP protocol (a firewall-mark service has a mark)")
    return PROTOCOL_NUMBERS[protocol]


def service_key(svc: IpvsService) -> bytes:
    """The nested IPVS_CMD_ATTR_SERVICE that names `svc` (as ipvsadm sends it)."""
    return key_of(svc.family, svc.protocol, svc.address, svc.port, svc.fwmark)


def key_of(
    family: int,
    protocol: IpvsProtocol | int,
    address: str | None,
    port: int | None,
    fwmark: int | None,
) -> bytes:
    """service_key from the fields that name a virtual server."""
    af = socket.AF_INET6 if family == 6 else socket.AF_INET
    parts = [attr(SVC_AF, struct.pack("=H", af))]
    if fwmark:
        parts.append(attr(SVC_FWMARK, struct.pack("=I", fwmark)))
    else:
        if address is None or port is None:
            raise ValueError("a virtual server without a firewall mark has an address and a port")
        packed = socket.inet_pton(af, address).ljust(16, b"\0")
        parts += [
            attr(SVC_PROTOCOL, struct.pack("=H", _protocol_number(protocol))),
            attr(SVC_ADDR, packed),
            attr(SVC_PORT, struct.pack("!H", port)),
        ]
    return attr(ATTR_SERVICE | NLA_F_NESTED, b"".join(parts))
