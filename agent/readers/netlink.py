"""A minimal generic-netlink client, for dumps on the scrape's hot path.

pyroute2 costs about 1 ms of Python per request (measured: 1,000 `link get` took 1.3 s), and
IPVS needs one destination dump per virtual server, so 10,000 Services cost 10 s a scrape
through it. Here a request is a struct.pack and a dump is a loop over struct.unpack_from.
The cleanup's deletions use it too: importing pyroute2 alone cost 5.6 s of a 24 s cleanup in
the benchmark's VM (about 0.3 s on a real node), for a few dozen requests.
"""

from __future__ import annotations

import builtins
import errno
import os
import socket
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, Self, TypeVar

T = TypeVar("T")

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP_INTR = 0x10  # the kernel's "this dump saw a concurrent change" mark
NLM_F_DUMP = 0x300
NLM_F_EXCL = 0x200
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
NLA_F_NESTED = 0x8000
NLA_F_NET_BYTEORDER = 0x4000
_NLMSG = struct.Struct("=IHHII")
_NLA = struct.Struct("=HH")
# For the readers' one-pass attribute walks (hot paths where attrs()' dict costs): an
# attribute's header, and the mask that clears its nested / byte-order flags from its type.
NLA_HEADER = _NLA
NLA_KIND = ~(NLA_F_NESTED | NLA_F_NET_BYTEORDER)
_GENL = struct.Struct("=BBH")  # genlmsghdr: cmd, version, reserved
_RECV = 1 << 20
# Requests per send in NetlinkSocket.commands. Each ACK is charged to the receive buffer at
# its skb's true size (~800 bytes, not its 36): with the default 208 KiB buffer 512 ACKs of one
# send overflowed it (ENOBUFS) and 256 fit; 128 leaves room for errors, which echo the request.
_BATCH_MESSAGES = 128
_BATCH_BYTES = 1 << 15


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    length = _NLA.size + len(payload)
    return _NLA.pack(length, kind) + payload + b"\0" * (-length % 4)


def attrs(data: bytes | memoryview, offset: int = 0) -> dict[int, memoryview]:
    """The attributes in `data` from `offset`, by type (nested flag cleared)."""
    out: dict[int, memoryview] = {}
    view = memoryview(data)
    end = len(view)
    while offset + _NLA.size <= end:
        length, kind = _NLA.unpack_from(view, offset)
        if length < _NLA.size:
            break
        out[kind & NLA_KIND] = view[offset + _NLA.size : offset + length]
        offset += (length + 3) & ~3
    return out


def nul_text(view: memoryview | None) -> str:
    """A NUL-terminated string attribute; an absent one reads as "". Bytes that are not UTF-8
    (a link may be named so) read as backslash escapes: a strict decode made one such foreign
    link fail the whole link reading, and with it every cleanup plan."""
    return bytes(view or b"").split(b"\0", 1)[0].decode(errors="backslashreplace")


class NetlinkError(OSError):
    pass


class DumpInterrupted(NetlinkError):
    """A dump carried NLM_F_DUMP_INTR: the object list changed while it was read.

    The kernel still sends every message, but some objects may be missing or doubled: taking
    such a dump as the node's state could make a link or a table look absent.
    """

    def __init__(self, message: str = "netlink dump interrupted by a concurrent change") -> None:
        super().__init__(errno.EINTR, message)

    def __str__(self) -> str:
        return str(self.strerror)


# How often a reading is started again after an interrupted dump. A change between two
# reads of a few milliseconds is rare; four in a row means the node is churning, and the
# reading is better reported as an error than retried for ever.
DUMP_ATTEMPTS = 4


def consistent(read: Callable[[], T], attempts: int = DUMP_ATTEMPTS) -> T:
    """Run `read` (which makes whole dumps) again while one of its dumps is interrupted."""
    for _ in range(attempts - 1):
        try:
            return read()
        except DumpInterrupted:
            continue
    try:
        return read()
    except DumpInterrupted as exc:
        raise DumpInterrupted(
            f"netlink dump interrupted by concurrent changes {attempts} times in a row; "
            "the node is changing too fast to read a consistent state, try again"
        ) from exc


class NetlinkSocket:
    """One netlink socket of one protocol, used from one thread."""

    def __init__(self, protocol: int) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol)
        self._sock.bind((0, 0))
        self._seq = 0
        # One receive buffer per socket; each answer is copied out at its own size. recv()
        # would malloc 1 MiB per call, and the IPVS reader keeps views of every answer (its
        # real servers are decoded lazily): at 5,000 Services that pinned ~40 MB of pages.
        self._buf = bytearray(_RECV)
        self._view = memoryview(self._buf)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._view.release()
        self._sock.close()

    def raw_request(
        self, msg_type: int, payload: bytes, dump: bool = True, flags: int = 0
    ) -> Iterator[memoryview]:
        """Send one request; yield each answer's payload (after the netlink header).

        A dump any of whose messages carries NLM_F_DUMP_INTR is read to its end (the socket
        must be free for the next dump) and then raises DumpInterrupted: whatever the caller
        made of the answers so far is to be thrown away (see `consistent`).
        """
        self._seq += 1
        flags |= NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        self._sock.send(
            _NLMSG.pack(_NLMSG.size + len(payload), msg_type, flags, self._seq, 0) + payload
        )
        interrupted = False
        while True:
            received = self._sock.recv_into(self._buf)
            data = memoryview(self._view[:received].tobytes())
            offset = 0
            while offset + _NLMSG.size <= len(data):
                length, kind, msg_flags, seq, _ = _NLMSG.unpack_from(data, offset)
                body = data[offset + _NLMSG.size : offset + length]
                offset += (length + 3) & ~3
                if seq != self._seq:
                    continue
                # The kernel marks every message after the change, NLMSG_DONE included.
                interrupted |= bool(msg_flags & NLM_F_DUMP_INTR)
                if kind == NLMSG_DONE:
                    if interrupted:
                        raise DumpInterrupted()
                    return
                if kind == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", body)[0]
                    if code == 0:  # the ACK of a non-dump request
                        return
                    raise NetlinkError(code, os.strerror(code))
                yield body

    def command(self, msg_type: int, payload: bytes, flags: int = 0) -> None:
        """Send one change request and wait for its ACK; a refusal raises NetlinkError."""
        for _ in self.raw_request(msg_type, payload, dump=False, flags=flags):
            pass

    def commands(self, requests: Sequence[tuple[int, bytes, int]]) -> list[int]:
        """Change requests (type, payload, flags), many to one send, then their ACKs: each
        request's errno, 0 when done. The kernel handles the messages of one send in order,
        one by one (netlink_rcv_skb), so a refusal stops nothing after it. Sends are cut at
        _BATCH_MESSAGES so the ACKs of one send fit the receive buffer."""
        codes: list[int] = []
        i = 0
        while i < len(requests):
            buf = bytearray()
            first, start = self._seq + 1, i
            while i < len(requests) and i - start < _BATCH_MESSAGES and len(buf) < _BATCH_BYTES:
                msg_type, payload, flags = requests[i]
                self._seq += 1
                length = _NLMSG.size + len(payload)
                flags |= NLM_F_REQUEST | NLM_F_ACK
                buf += _NLMSG.pack(length, msg_type, flags, self._seq, 0) + payload
                buf += b"\0" * (-length % 4)
                i += 1
            self._sock.send(buf)
            codes += self._acks(first, self._seq)
        return codes

    def _acks(self, first: int, last: int) -> list[int]:
        got: dict[int, int] = {}
        while len(got) < last - first + 1:
            received = self._sock.recv_into(self._buf)
            offset = 0
            while offset + _NLMSG.size <= received:
                length, kind, _, seq, _ = _NLMSG.unpack_from(self._buf, offset)
                if kind == NLMSG_ERROR and first <= seq <= last:
                    got[seq] = -struct.unpack_from("=i", self._buf, offset + _NLMSG.size)[0]
                offset += max((length + 3) & ~3, _NLMSG.size)
        return [got[seq] for seq in range(first, last + 1)]


class GenericNetlink(NetlinkSocket):
    """A NETLINK_GENERIC socket bound to one family."""

    def __init__(self, family: str) -> None:
        super().__init__(16)  # NETLINK_GENERIC
        try:
            self.family_id = self._resolve(family)
        except BaseException:
            self.close()
            raise

    def _resolve(self, name: str) -> int:
        request = attr(CTRL_ATTR_FAMILY_NAME, name.encode() + b"\0")
        for payload in self.request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, request, dump=False):
            found = attrs(payload, 4).get(CTRL_ATTR_FAMILY_ID)
            if found is not None:
                return int(struct.unpack_from("=H", found)[0])
        raise NetlinkError(errno.ENOENT, f"generic netlink family {name} not found")

    def request(
        self, msg_type: int, cmd: int, version: int, body: bytes, dump: bool = True
    ) -> Iterator[memoryview]:
        """Yield each answer's payload, the 4-byte genl header included."""
        return self.raw_request(msg_type, _GENL.pack(cmd, version, 0) + body, dump)

    def family_command(self, cmd: int, version: int, body: bytes) -> None:
        """One change request to the bound family; waits for its ACK."""
        self.command(self.family_id, _GENL.pack(cmd, version, 0) + body)

    def family_commands(self, cmd: int, version: int, bodies: Sequence[bytes]) -> list[int]:
        """Many change requests to the bound family, batched (NetlinkSocket.commands)."""
        header = _GENL.pack(cmd, version, 0)
        return self.commands([(self.family_id, header + body, 0) for body in bodies])


class NfTables(NetlinkSocket):
    """A NETLINK_NETFILTER socket speaking to the nf_tables subsystem."""

    SUBSYS = 10  # NFNL_SUBSYS_NFTABLES

    def __init__(self) -> None:
        super().__init__(12)  # NETLINK_NETFILTER

    def dump(self, msg: int, family: int = 0, body: bytes = b"") -> Iterator[memoryview]:
        """Yield each answer's payload, the 4-byte nfgenmsg header included."""
        header = struct.pack("=BBH", family, 0, 0)
        return self.raw_request((self.SUBSYS << 8) | msg, header + body)


class IpsetNetlink(NetlinkSocket):
    """A NETLINK_NETFILTER socket speaking to the ip_set subsystem."""

    SUBSYS = 6  # NFNL_SUBSYS_IPSET
    CMD_DESTROY = 3
    CMD_LIST = 7
    PROTOCOL = 6  # the oldest protocol kernels still accept; enough for listing
    FLAG_LIST_HEADER = 4

    def __init__(self) -> None:
        super().__init__(12)  # NETLINK_NETFILTER

    def list(self, name: str | None = None, header_only: bool = False) -> Iterator[memoryview]:
        """`ipset list [-t] [NAME]`: each answer's payload, 4-byte nfgenmsg header included."""
        body = attr(1, bytes([self.PROTOCOL]))
        if name is not None:
            body += attr(2, name.encode() + b"\0")
        if header_only:
            body += attr(6 | NLA_F_NET_BYTEORDER, struct.pack("!I", self.FLAG_LIST_HEADER))
        header = struct.pack("=BBH", socket.AF_INET, 0, 0)
        return self.raw_request((self.SUBSYS << 8) | self.CMD_LIST, header + body)

    def _destroy_request(self, name: str) -> tuple[int, bytes, int]:
        if not name:
            raise ValueError("refusing to destroy every set: no set name given")
        body = attr(1, bytes([self.PROTOCOL])) + attr(2, name.encode() + b"\0")
        header = struct.pack("=BBH", socket.AF_INET, 0, 0)
        # Without NLM_F_EXCL the kernel treats a missing set as `-exist` and answers success.
        return ((self.SUBSYS << 8) | self.CMD_DESTROY, header + body, NLM_F_EXCL)

    def destroy(self, name: str) -> None:
        """`ipset destroy NAME`: one set, never all (an empty name would mean all)."""
        self.command(*self._destroy_request(name))

    def destroy_many(self, names: Sequence[str]) -> builtins.list[int]:
        """`ipset destroy NAME` for each name, batched: each one's errno, 0 when destroyed."""
        return self.commands([self._destroy_request(name) for name in names])


def count_attrs(data: memoryview) -> int:
    """How many attributes `data` holds, without looking inside them."""
    n = offset = 0
    while offset + _NLA.size <= len(data):
        length = _NLA.unpack_from(data, offset)[0]
        if length < _NLA.size:
            break
        n += 1
        offset += (length + 3) & ~3
    return n


class LinkRow(NamedTuple):
    """A link as the dump gives it (a NamedTuple: restore's path imports no dataclasses)."""

    index: int  # type: ignore[assignment]  # the ifindex; shadows tuple.index on purpose
    name: str
    kind: str | None
    up: bool
    txqlen: int | None = None  # IFLA_TXQLEN


class RtNetlink(NetlinkSocket):
    """A NETLINK_ROUTE socket for link and address dumps."""

    RTM_DELLINK = 17
    RTM_GETLINK = 18
    RTM_GETADDR = 22
    IFLA_IFNAME, IFLA_TXQLEN, IFLA_LINKINFO, IFLA_INFO_KIND = 3, 13, 18, 1
    IFF_UP = 0x1

    def __init__(self) -> None:
        super().__init__(0)  # NETLINK_ROUTE

    def links(self) -> Iterator[memoryview]:
        """Each link's ifinfomsg (16 bytes) and attributes."""
        return self.raw_request(self.RTM_GETLINK, struct.pack("=BxHiII", 0, 0, 0, 0, 0))

    def link_rows(self) -> Iterator[LinkRow]:
        """Each link's index, name, kind (IFLA_INFO_KIND), whether it is up, its queue length."""
        for p in self.links():
            _, _, index, flags, _ = struct.unpack_from("=BxHiII", p)
            a = attrs(p, 16)
            info = a.get(self.IFLA_LINKINFO)
            kind = nul_text(attrs(info).get(self.IFLA_INFO_KIND)) if info is not None else None
            up = bool(flags & self.IFF_UP)
            q = a.get(self.IFLA_TXQLEN)
            txqlen = struct.unpack_from("=I", q)[0] if q is not None and len(q) >= 4 else None
            yield LinkRow(index, nul_text(a.get(self.IFLA_IFNAME)), kind or None, up, txqlen)

    def delete_link(self, index: int) -> None:
        """`ip link del` of the link with this index."""
        self.command(self.RTM_DELLINK, struct.pack("=BxHiII", 0, 0, index, 0, 0))

    def addresses(self) -> Iterator[memoryview]:
        """Each address's ifaddrmsg (8 bytes) and attributes."""
        return self.raw_request(self.RTM_GETADDR, struct.pack("=BBBBI", 0, 0, 0, 0, 0))
