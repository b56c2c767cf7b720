"""`ipvsadm -R` of a bundle's `ipvsadm -S -n` lines, as batched IPVS generic-netlink requests.

`ipvsadm -R` sends one request per line and waits for its answer, in a process that first
parses the whole line with popt: at 10,000 Services (44,000 lines) it took 46 s of the
benchmark's VM, most of a restore. Here the lines become IPVS_CMD_NEW_SERVICE and
IPVS_CMD_NEW_DEST requests, many to a send (agent.readers.netlink), services first.

Only the words `ipvsadm -S -n` prints (agent.cleanup.ipvsadm_save writes the same) are understood; a
line with anything else (a tunnel's options, a word of a newer ipvsadm) makes `parse` return
None and the caller hands the whole text to `ipvsadm -R`, so nothing is loaded half.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import NamedTuple

from agent.cleanup.ipvsadm_save import (
    F_ONEPACKET,
    F_PERSISTENT,
    OTHER_SCHED_FLAGS,
    PROTOCOL_OPTIONS,
    SCHED_FLAGS,
)
from agent.readers.ipvs_wire import (
    ATTR_DEST,
    ATTR_SERVICE,
    CMD_NEW_DEST,
    CMD_NEW_SERVICE,
    DEST_ADDR,
    DEST_FAMILY,
    DEST_FWD,
    DEST_L_THRESH,
    DEST_PORT,
    DEST_U_THRESH,
    DEST_WEIGHT,
    GENL_VERSION,
    PROTOCOL_NUMBERS,
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
)
from agent.readers.netlink import NLA_F_NESTED, attr, attrs

# The printer's word tables (agent.cleanup.ipvsadm_save), read the other way, so the two
# cannot drift apart.
_PROTOCOL_OPTIONS: dict[str, int] = {  # ipvsadm's option -> the protocol's number
    option: PROTOCOL_NUMBERS[name]
    for name, option in PROTOCOL_OPTIONS.items()
    if not isinstance(name, int)
}
# ipvsadm's forwarding switches -> IP_VS_CONN_F_* (masq 0, droute 3; tunnels are not handled)
_FORWARD = {"-m": 0, "-g": 3}
_SCHED_FLAGS = {
    name: bit for table in (*SCHED_FLAGS.values(), OTHER_SCHED_FLAGS) for bit, name in table
}


def _number(text: str, most: int) -> int | None:
    """A decimal number up to `most`, or None. Not str.isdigit alone: it is true of "²" and
    "١", which int() refuses."""
    if not (text.isascii() and text.isdigit()) or len(text) > 10 or int(text) > most:
        return None
    return int(text)


class Requests(NamedTuple):
    """The bodies of the NEW_SERVICE and NEW_DEST requests, in the order of the lines (a
    NamedTuple: importing dataclasses was ~0.9 s of a cold restore in the benchmark's VM)."""

    services: tuple[bytes, ...]
    dests: tuple[bytes, ...]
    service_lines: tuple[str, ...]
    dest_lines: tuple[str, ...]


def _host_port(text: str) -> tuple[int, bytes, int] | None:
    """`1.2.3.4:80` or `[fd00::1]:80` -> (family, 16-byte address, port)."""
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        family = socket.AF_INET6
    else:
        host, sep, port = text.rpartition(":")
        family = socket.AF_INET
    number = _number(port, 0xFFFF) if sep else None
    if number is None:
        return None
    try:
        raw = socket.inet_pton(family, host)
    except (OSError, ValueError):  # ValueError: a NUL in the host
        return None
    return family, raw.ljust(16, b"\0"), number


def _service_key(words: list[str]) -> tuple[bytes, int, list[str]] | None:
    """The nested service key of `-t|-u|--sctp-service HOST:PORT` or `-f MARK [-6]` at the
    start of `words`: (key attributes, family, the words after it)."""
    if len(words) < 2:
        return None
    option, value, rest = words[0], words[1], words[2:]
    if option == "-f":
        # printed with %d: a mark above 2^31 reads negative
        magnitude = _number(value[1:] if value.startswith("-") else value, 0xFFFFFFFF)
        if magnitude is None:
            return None
        family: int = socket.AF_INET
        if rest[:1] == ["-6"]:
            family, rest = socket.AF_INET6, rest[1:]
        mark = int(value) & 0xFFFFFFFF
        parts = attr(SVC_AF, struct.pack("=H", family)) + attr(SVC_FWMARK, struct.pack("=I", mark))
        return parts, family, rest
    protocol = _PROTOCOL_OPTIONS.get(option)
    where = _host_port(value) if protocol is not None else None
    if protocol is None or where is None:
        return None
    family, raw, port = where
    parts = attr(SVC_AF, struct.pack("=H", family))
    parts += attr(SVC_PROTOCOL, struct.pack("=H", protocol))
    parts += attr(SVC_ADDR, raw) + attr(SVC_PORT, struct.pack("!H", port))
    return parts, family, rest


def _service_body(words: list[str]) -> tuple[bytes, bytes] | None:
    """An `-A` line's words after `-A`: (its full NEW_SERVICE body, its key)."""
    found = _service_key(words)
    if found is None:
        return None
    key, family, rest = found
    sched, flags, timeout, pe = "", 0, 0, ""
    netmask = struct.pack("=I", 128 if family == socket.AF_INET6 else 0xFFFFFFFF)
    i = 0
    while i < len(rest):
        word = rest[i]
        value = rest[i + 1] if i + 1 < len(rest) else None
        if word == "-o":
            flags |= F_ONEPACKET
            i += 1
            continue
        if value is None:
            return None
        if word == "-s":
            sched = value
        elif word == "-p" and _number(value, 0xFFFFFFFF) is not None:
            flags, timeout = flags | F_PERSISTENT, int(value)
        elif word == "-M" and family == socket.AF_INET6 and _number(value, 128) is not None:
            netmask = struct.pack("=I", int(value))
        elif word == "-M" and family == socket.AF_INET:
            try:  # the mask travels as the address's own bytes (a be32 in a u32)
                netmask = socket.inet_aton(value)
            except (OSError, ValueError):  # ValueError: a NUL in it
                return None
        elif word == "--pe":
            pe = value
        elif word == "-b" and all(f in _SCHED_FLAGS for f in value.split(",")):
            for name in value.split(","):
                flags |= _SCHED_FLAGS[name]
        else:
            return None
        i += 2
    # the kernel's names: ASCII, at most 15 bytes and a NUL (IP_VS_SCHEDNAME_MAXLEN, _PENAME_)
    if not sched or any(not n.isascii() or len(n) > 15 for n in (sched, pe)):
        return None
    body = key + attr(SVC_SCHED, sched.encode() + b"\0")
    if pe:
        body += attr(SVC_PE_NAME, pe.encode() + b"\0")
    body += attr(SVC_FLAGS, struct.pack("=II", flags, 0xFFFFFFFF))
    body += attr(SVC_TIMEOUT, struct.pack("=I", timeout)) + attr(SVC_NETMASK, netmask)
    return attr(ATTR_SERVICE | NLA_F_NESTED, body), key


def _dest_body(words: list[str]) -> bytes | None:
    """An `-a` line's words after `-a`: its NEW_DEST body (service key + destination)."""
    found = _service_key(words)
    if found is None:
        return None
    key, _, rest = found
    service_port = attrs(key).get(SVC_PORT)
    if len(rest) != 5 or rest[0] != "-r" or rest[2] not in _FORWARD or rest[3] != "-w":
        return None
    where, weight = _host_port(rest[1]), _number(rest[4], 0xFFFF)
    if where is None or weight is None:
        return None
    family, raw, port = where
    if service_port is not None and rest[2] == "-g":
        # ipvsadm gives a direct-routing real server its service's port, whatever it was told
        port = struct.unpack("!H", service_port)[0]
    dest = attr(DEST_ADDR, raw) + attr(DEST_PORT, struct.pack("!H", port))
    dest += attr(DEST_FWD, struct.pack("=I", _FORWARD[rest[2]]))
    dest += attr(DEST_WEIGHT, struct.pack("=I", weight))
    dest += attr(DEST_U_THRESH, struct.pack("=I", 0)) + attr(DEST_L_THRESH, struct.pack("=I", 0))
    dest += attr(DEST_FAMILY, struct.pack("=H", family))
    return attr(ATTR_SERVICE | NLA_F_NESTED, key) + attr(ATTR_DEST | NLA_F_NESTED, dest)


def parse(text: str) -> Requests | None:
    """The requests for `text`, or None when a line is not one this module knows."""
    services: list[bytes] = []
    dests: list[bytes] = []
    service_lines: list[str] = []
    dest_lines: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "-A":
            made = _service_body(words[1:])
            if made is None:
                return None
            services.append(made[0])
            service_lines.append(line)
        elif words[0] == "-a":
            body = _dest_body(words[1:])
            if body is None:
                return None
            dests.append(body)
            dest_lines.append(line)
        else:
            return None
    return Requests(tuple(services), tuple(dests), tuple(service_lines), tuple(dest_lines))


def load(requests: Requests) -> None:
    """Send the services, then their real servers; the first refusal raises NetlinkError
    naming its line (the kernel handled the requests before it, as `ipvsadm -R` would have)."""
    from agent.readers.netlink import GenericNetlink, NetlinkError

    with GenericNetlink("IPVS") as genl:
        for cmd, bodies, lines in (
            (CMD_NEW_SERVICE, requests.services, requests.service_lines),
            (CMD_NEW_DEST, requests.dests, requests.dest_lines),
        ):
            codes = genl.family_commands(cmd, GENL_VERSION, bodies)
            for line, code in zip(lines, codes, strict=True):
                if code:
                    raise NetlinkError(code, f"{line}: {os.strerror(code)}")
