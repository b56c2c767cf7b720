"""restore's netlink load of `ipvsadm -S -n` lines: what each word becomes, and the words it
leaves to `ipvsadm -R`."""

from __future__ import annotations

import socket
import struct

import pytest

from agent.cleanup.ipvsadm_rules import parse
from agent.readers import ipvs_wire as w
from agent.readers.netlink import attrs


def _service(body: bytes) -> dict[int, bytes]:
    outer = attrs(body)
    return {k: bytes(v) for k, v in attrs(outer[w.ATTR_SERVICE]).items()}


def _u32(raw: bytes) -> int:
    return int(struct.unpack("=I", raw)[0])


def test_a_persistent_service_with_a_mask_and_its_real_server() -> None:
    r = parse(
        "-A -t 192.168.1.10:30080 -s wlc -p 300 -M 255.255.255.0\n"
        "-a -t 192.168.1.10:30080 -r 10.244.0.5:8080 -g -w 2\n"
    )
    assert r is not None and len(r.services) == 1 and len(r.dests) == 1
    svc = _service(r.services[0])
    assert svc[w.SVC_AF] == struct.pack("=H", socket.AF_INET)
    assert svc[w.SVC_PROTOCOL] == struct.pack("=H", 6)
    assert svc[w.SVC_ADDR] == socket.inet_aton("192.168.1.10").ljust(16, b"\0")
    assert svc[w.SVC_PORT] == struct.pack("!H", 30080)
    assert svc[w.SVC_SCHED] == b"wlc\0"
    assert svc[w.SVC_FLAGS] == struct.pack("=II", 0x1, 0xFFFFFFFF)
    assert _u32(svc[w.SVC_TIMEOUT]) == 300
    assert svc[w.SVC_NETMASK] == socket.inet_aton("255.255.255.0")
    outer = attrs(r.dests[0])
    key = {k: bytes(v) for k, v in attrs(outer[w.ATTR_SERVICE]).items()}
    assert key == {k: svc[k] for k in (w.SVC_AF, w.SVC_PROTOCOL, w.SVC_ADDR, w.SVC_PORT)}
    dest = {k: bytes(v) for k, v in attrs(outer[w.ATTR_DEST]).items()}
    assert dest[w.DEST_ADDR] == socket.inet_aton("10.244.0.5").ljust(16, b"\0")
    # as `ipvsadm -R` does: a direct-routing real server gets the service's port
    assert dest[w.DEST_PORT] == struct.pack("!H", 30080)
    assert _u32(dest[w.DEST_FWD]) == 3  # -g: direct routing
    assert _u32(dest[w.DEST_WEIGHT]) == 2
    assert _u32(dest[w.DEST_U_THRESH]) == _u32(dest[w.DEST_L_THRESH]) == 0


def test_defaults_flags_fwmarks_and_ipv6() -> None:
    r = parse(
        "-A -u 10.96.0.22:5061 -s rr -o\n"
        "-A -t 203.0.113.5:80 -s sh -b sh-fallback,sh-port\n"
        "-A -u [fd00:96::a]:53 -s rr -p 60 -M 64\n"
        "-A -f 200 -6 -s rr\n"
        "-A -f -2 -s rr --pe sip\n"
        "-a -t [fd00:96::1]:443 -r [fd00:10::4]:443 -m -w 1\n"
    )
    assert r is not None
    onepacket, sh, v6, mark6, pe = map(_service, r.services)
    assert onepacket[w.SVC_FLAGS][:4] == struct.pack("=I", 0x4)
    assert _u32(onepacket[w.SVC_TIMEOUT]) == 0
    assert onepacket[w.SVC_NETMASK] == struct.pack("=I", 0xFFFFFFFF)
    assert sh[w.SVC_FLAGS][:4] == struct.pack("=I", 0x18)
    assert v6[w.SVC_AF] == struct.pack("=H", socket.AF_INET6)
    assert _u32(v6[w.SVC_NETMASK]) == 64 and _u32(v6[w.SVC_TIMEOUT]) == 60
    assert mark6[w.SVC_AF] == struct.pack("=H", socket.AF_INET6)
    assert _u32(mark6[w.SVC_FWMARK]) == 200 and _u32(mark6[w.SVC_NETMASK]) == 128
    assert _u32(pe[w.SVC_FWMARK]) == 0xFFFFFFFE  # ipvsadm prints the mark with %d
    assert pe[w.SVC_PE_NAME] == b"sip\0"
    dest = attrs(attrs(r.dests[0])[w.ATTR_DEST])
    assert bytes(dest[w.DEST_FAMILY]) == struct.pack("=H", socket.AF_INET6)
    assert _u32(bytes(dest[w.DEST_FWD])) == 0  # -m: masquerading


@pytest.mark.parametrize(
    "line",
    [
        "-a -t 1.2.3.4:80 -r 10.0.0.1:80 -i -w 1 --tun-type ipip",  # tunnels: ipvsadm -R
        "-a -t 1.2.3.4:80 -r 10.0.0.1:80 -i -w 1",
        "-a -t 1.2.3.4:80 -r 10.0.0.1:80 -m -w 1 -x 5 -y 1",
        "-A -t 1.2.3.4:80",  # no scheduler
        "-A -t 1.2.3.4:80 -s rr --unknown 1",
        "-A -t 1.2.3.4 -s rr",
        "-A -t 1.2.3.400:80 -s rr",
        "-A -t 1.2.3.4:70000 -s rr",
        "-A -t 1.2.3.4:80 -s rr -b sh-everything",
        "-A -t 1.2.3.4:80 -s rr -M nonsense",
        "-E -t 1.2.3.4:80 -s rr",
        "-C",
    ],
)
def test_a_line_it_does_not_know_leaves_the_whole_text_to_ipvsadm(line: str) -> None:
    assert parse(f"-A -t 10.96.0.1:443 -s rr\n{line}\n") is None
