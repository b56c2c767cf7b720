"""The floor: a minimal raw netlink dump of the objects the shell pipeline counts.

Plain `socket` + `struct`, no pyroute2, nothing decoded beyond what a count needs:

  ipvs      generic netlink: resolve family "IPVS", dump services (IPVS_CMD_GET_SERVICE,
            NLM_F_DUMP), then per service dump its dests (IPVS_CMD_GET_DEST with the service
            nested attribute: AF, PROTOCOL, ADDR, PORT, FWMARK copied from the service message)
  addrs     rtnetlink RTM_GETADDR dump, filtered by the kernel to kube-ipvs0's ifindex
            (NETLINK_GET_STRICT_CHK + ifa_index in the request)
  ipsets    nfnetlink ipset IPSET_CMD_LIST, IPSET_FLAG_LIST_HEADER, protocol 7: KUBE- sets and the
            sum of their IPSET_ATTR_ELEMENTS
  nftables  NFT_MSG_GETTABLE dump (all families): number of tables
  nat       NFT_MSG_GETRULE dump of table ip nat (the iptables-nft backend; legacy x_tables has
            no netlink): rules whose chain is KUBE-*
            (= `iptables-save -t nat | grep -c '^-A KUBE-'`)

Run inside the namespace: python bench/floor.py [--json]. Prints the counts and the in-process
dump time (interpreter start excluded).
"""

from __future__ import annotations

import errno
import json
import socket
import struct
import sys
import time

NETLINK_ROUTE, NETLINK_NETFILTER, NETLINK_GENERIC = 0, 12, 16
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
SOL_NETLINK, NETLINK_GET_STRICT_CHK = 270, 12

GENL_ID_CTRL, CTRL_CMD_GETFAMILY = 0x10, 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
IPVS_CMD_GET_SERVICE, IPVS_CMD_GET_DEST = 4, 8
IPVS_CMD_ATTR_SERVICE = 1
IPVS_SVC_KEY_ATTRS = (1, 2, 3, 4, 5)  # AF, PROTOCOL, ADDR, PORT, FWMARK

RTM_GETADDR, RTM_NEWADDR = 22, 20

NFNL_SUBSYS_IPSET, NFNL_SUBSYS_NFTABLES = 6, 10
IPSET_CMD_LIST = 7
IPSET_ATTR_PROTOCOL, IPSET_ATTR_SETNAME, IPSET_ATTR_FLAGS, IPSET_ATTR_DATA = 1, 2, 6, 7
IPSET_ATTR_ELEMENTS = 24
IPSET_PROTOCOL = 7
IPSET_FLAG_LIST_HEADER = 4
NFT_MSG_GETTABLE, NFT_MSG_GETRULE = 1, 7
NFTA_RULE_TABLE, NFTA_RULE_CHAIN = 1, 2
NFPROTO_UNSPEC, NFPROTO_IPV4 = 0, 2

_HDR = struct.Struct("=IHHII")
_NLA = struct.Struct("=HH")


class Floor(Exception):
    pass


def nla(atype: int, payload: bytes) -> bytes:
    n = _NLA.size + len(payload)
    return _NLA.pack(n, atype) + payload + b"\0" * (-n % 4)


def attrs(buf: bytes | memoryview, off: int, end: int) -> dict[int, memoryview]:
    """Top-level attributes of one message (first occurrence of each type)."""
    out: dict[int, memoryview] = {}
    mv = memoryview(buf)
    while off + 4 <= end:
        n, t = _NLA.unpack_from(mv, off)
        if n < 4:
            break
        out.setdefault(t & NLA_TYPE_MASK, mv[off + 4 : off + n])
        off += (n + 3) & ~3
    return out


class Sock:
    def __init__(self, proto: int) -> None:
        self.s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto)
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.s.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.s.close()

    def dump(self, mtype: int, body: bytes, flags: int = NLM_F_REQUEST | NLM_F_DUMP):
        """Send one request; yield (type, buffer, payload offset, end) per reply message."""
        self.seq += 1
        self.s.send(_HDR.pack(_HDR.size + len(body), mtype, flags, self.seq, 0) + body)
        while True:
            data = self.s.recv(1 << 20)
            off = 0
            while off + _HDR.size <= len(data):
                length, t, _f, seq, _pid = _HDR.unpack_from(data, off)
                if length < _HDR.size:
                    raise Floor("truncated netlink message")
                if seq == self.seq:
                    if t == NLMSG_DONE:
                        return
                    if t == NLMSG_ERROR:
                        (err,) = struct.unpack_from("=i", data, off + _HDR.size)
                        if err:
                            raise Floor(f"netlink error {errno.errorcode.get(-err, err)}")
                        if not flags & NLM_F_DUMP:
                            return
                    else:
                        yield t, data, off + _HDR.size, off + length
                        if not flags & NLM_F_DUMP:
                            return
                off += (length + 3) & ~3


def genl_family(g: Sock, name: str) -> int:
    body = struct.pack("=BBH", CTRL_CMD_GETFAMILY, 1, 0) + nla(
        CTRL_ATTR_FAMILY_NAME, name.encode() + b"\0"
    )
    for _t, data, off, end in g.dump(GENL_ID_CTRL, body, NLM_F_REQUEST):
        a = attrs(data, off + 4, end)
        return struct.unpack("=H", a[CTRL_ATTR_FAMILY_ID][:2])[0]
    raise Floor(f"generic netlink family {name} not found")


def ipvs_counts() -> tuple[int, int]:
    g = Sock(NETLINK_GENERIC)
    try:
        fam = genl_family(g, "IPVS")
        hdr_svc = struct.pack("=BBH", IPVS_CMD_GET_SERVICE, 1, 0)
        keys: list[bytes] = []
        for _t, data, off, end in g.dump(fam, hdr_svc):
            svc = attrs(data, off + 4, end)[IPVS_CMD_ATTR_SERVICE]
            inner = attrs(svc, 0, len(svc))
            keys.append(b"".join(nla(t, bytes(inner[t])) for t in IPVS_SVC_KEY_ATTRS if t in inner))
        hdr_dest = struct.pack("=BBH", IPVS_CMD_GET_DEST, 1, 0)
        dests = 0
        for key in keys:
            body = hdr_dest + nla(IPVS_CMD_ATTR_SERVICE | NLA_F_NESTED, key)
            dests += sum(1 for _ in g.dump(fam, body))
        return len(keys), dests
    finally:
        g.close()


def addr_count(ifname: str = "kube-ipvs0") -> int:
    try:
        index = socket.if_nametoindex(ifname)
    except OSError:
        return 0
    r = Sock(NETLINK_ROUTE)
    try:
        r.s.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
        body = struct.pack("=BBBBI", socket.AF_UNSPEC, 0, 0, 0, index)
        n = 0
        for t, data, off, _end in r.dump(RTM_GETADDR, body):
            if t == RTM_NEWADDR and struct.unpack_from("=I", data, off + 4)[0] == index:
                n += 1
        return n
    finally:
        r.close()


def _nfgen(family: int) -> bytes:
    return struct.pack("=BBH", family, 0, 0)


def ipset_counts(prefix: bytes = b"KUBE-") -> tuple[int, int]:
    s = Sock(NETLINK_NETFILTER)
    try:
        body = (
            _nfgen(socket.AF_INET)
            + nla(IPSET_ATTR_PROTOCOL, bytes([IPSET_PROTOCOL]))
            + nla(IPSET_ATTR_FLAGS | 0x4000, struct.pack(">I", IPSET_FLAG_LIST_HEADER))
        )
        sets = elements = 0
        for _t, data, off, end in s.dump((NFNL_SUBSYS_IPSET << 8) | IPSET_CMD_LIST, body):
            a = attrs(data, off + 4, end)
            name = a.get(IPSET_ATTR_SETNAME)
            if name is None or not bytes(name).startswith(prefix):
                continue
            sets += 1
            d = a.get(IPSET_ATTR_DATA)
            if d is not None:
                el = attrs(d, 0, len(d)).get(IPSET_ATTR_ELEMENTS)
                if el is not None:
                    elements += struct.unpack(">I", el[:4])[0]
        return sets, elements
    finally:
        s.close()


def nft_counts() -> tuple[int, int]:
    s = Sock(NETLINK_NETFILTER)
    try:
        tables = sum(
            1
            for _ in s.dump((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE, _nfgen(NFPROTO_UNSPEC))
        )
        body = _nfgen(NFPROTO_IPV4) + nla(NFTA_RULE_TABLE, b"nat\0")
        kube = 0
        try:
            for _t, data, off, end in s.dump((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETRULE, body):
                chain = attrs(data, off + 4, end).get(NFTA_RULE_CHAIN)
                if chain is not None and bytes(chain[:5]) == b"KUBE-":
                    kube += 1
        except Floor as exc:
            if "ENOENT" not in str(exc):
                raise
        return tables, kube
    finally:
        s.close()


def measure() -> dict[str, float | int]:
    t0 = time.perf_counter()
    services, dests = ipvs_counts()
    addrs = addr_count()
    sets, elements = ipset_counts()
    tables, nat_rules = nft_counts()
    return {
        "ipvs_services": services,
        "ipvs_dests": dests,
        "kube_ipvs0_addrs": addrs,
        "kube_ipsets": sets,
        "kube_ipset_elements": elements,
        "nft_tables": tables,
        "nat_kube_rules": nat_rules,
        "seconds": time.perf_counter() - t0,
    }


def main() -> int:
    try:
        out = measure()
    except (Floor, OSError) as exc:
        print(f"floor: {exc}", file=sys.stderr)
        return 1
    if "--json" in sys.argv[1:]:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
