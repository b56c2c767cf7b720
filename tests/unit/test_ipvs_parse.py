"""IPVS answers built byte for byte as ip_vs_genl_fill_service/_dest lay them out."""

import socket
import struct

from agent.readers.ipvs import parse_dest, service_of
from agent.readers.ipvs_wire import service_key
from agent.readers.netlink import NLA_F_NESTED, attr, attrs
from agent.snapshot import IpvsService

GENL = struct.pack("=BBH", 1, 1, 0)


def _service(af: int, addr: bytes, port: int, proto: int, fwmark: int = 0) -> memoryview:
    inner = b"".join(
        [
            attr(1, struct.pack("=H", af)),
            attr(2, struct.pack("=H", proto)) if not fwmark else attr(5, struct.pack("=I", fwmark)),
            attr(3, addr.ljust(16, b"\0")),
            attr(4, struct.pack("!H", port)),
            attr(6, b"wlc\0"),
            attr(7, struct.pack("=II", 3, 0xFFFFFFFF)),
            attr(8, struct.pack("=I", 10800)),
            attr(9, struct.pack("=I", 128)),
            attr(10 | NLA_F_NESTED, attr(1, struct.pack("=I", 5))),  # stats, ignored
        ]
    )
    return memoryview(GENL + attr(1 | NLA_F_NESTED, inner))


def parse_service(payload: memoryview) -> tuple[IpvsService, bytes]:
    """A service from one IPVS_CMD_NEW_SERVICE answer, and the key to ask for its dests."""
    service = service_of(payload)
    return service, service_key(service)


def test_ipv6_persistent_service_and_its_dest_key() -> None:
    raw = socket.inet_pton(socket.AF_INET6, "fd00::1")
    svc, key = parse_service(_service(socket.AF_INET6, raw, 443, 6))
    assert (svc.family, svc.protocol, svc.address, svc.port) == (6, "TCP", "fd00::1", 443)
    assert (svc.scheduler, svc.flags, svc.timeout, svc.fwmark) == ("wlc", 3, 10800, None)
    assert svc.key == "TCP [fd00::1]:443"
    nested = attrs(key)[1]
    assert set(attrs(nested)) == {1, 2, 3, 4}  # af, protocol, addr, port only


def test_fwmark_service_key_has_af_and_mark() -> None:
    svc, key = parse_service(_service(socket.AF_INET, b"", 0, 0, fwmark=16384))
    assert (svc.protocol, svc.fwmark, svc.address, svc.port) == ("FWM", 16384, None, None)
    assert set(attrs(attrs(key)[1])) == {1, 5}


def test_dest_fields_come_from_the_raw_attributes() -> None:
    inner = b"".join(
        [
            attr(1, socket.inet_aton("10.244.0.3").ljust(16, b"\0")),
            attr(2, struct.pack("!H", 8443)),
            attr(3, struct.pack("=I", 0)),  # masq: pyroute2's from_message() said 3 (route)
            attr(4, struct.pack("=I", 2)),
            attr(7, struct.pack("=I", 4)),
            attr(8, struct.pack("=I", 1)),
            attr(11, struct.pack("=H", socket.AF_INET)),
        ]
    )
    d = parse_dest(memoryview(GENL + attr(2 | NLA_F_NESTED, inner)), socket.AF_INET)
    assert (d.address, d.port, d.forward, d.weight, d.active_conns, d.inactive_conns) == (
        "10.244.0.3",
        8443,
        "masq",
        2,
        4,
        1,
    )
