"""kube-ipvs0 in a bundle: only the Service IPs the backed-up plan recorded, and never an address
the node uses elsewhere (docs/bundle.md).

A /32 or /128 on kube-ipvs0 makes the node answer that address itself: the node's gateway, a
route's next hop, another link's address or a Service's real server (the API server behind
`kubernetes`) put there would cut the node off. `check_link` judges the bundle's lines against
plan.json and ipvsadm.rules; `node_conflict` judges them against the node right before restore
changes anything.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

from agent import names
from agent.cleanup.bundle import BundleError
from agent.readers.netlink import RtNetlink, attrs, consistent

RTM_GETROUTE = 26
RTA_GATEWAY, RTA_MULTIPATH, RTA_VIA = 5, 9, 18
IFA_ADDRESS, IFA_LOCAL = 1, 2
_FAMILIES = {socket.AF_INET: 4, socket.AF_INET6: 16}


@dataclass(frozen=True)
class LinkRestore:
    name: str
    index: int
    up: bool
    addresses: tuple[str, ...]
    txqlen: int | None = None  # absent from bundles of agents before it was kept


def _ip(text: str) -> str:
    return str(ipaddress.ip_address(text))


def service_ips(services: frozenset[str]) -> frozenset[str]:
    """The addresses of the virtual servers plan.json deleted (`-t 10.96.0.1:443`,
    `-u [fd00::a]:53`; a firewall mark has none)."""
    out = set()
    for key in services:
        option, _, where = key.partition(" ")
        if option == "-f" or ":" not in where:
            continue
        host = where.rsplit(":", 1)[0].strip("[]")
        try:
            out.add(_ip(host))
        except ValueError:
            continue
    return frozenset(out)


def real_server_ips(ipvsadm_rules: str) -> frozenset[str]:
    """The addresses of the real servers in ipvsadm.rules (`-a ... -r 192.168.50.2:6443`)."""
    out = set()
    for line in ipvsadm_rules.splitlines():
        words = line.split()
        if words[:1] != ["-a"] or "-r" not in words[:-1]:
            continue
        host = words[words.index("-r") + 1].rsplit(":", 1)[0].strip("[]")
        try:
            out.add(_ip(host))
        except ValueError:
            continue
    return frozenset(out)


def _addresses(doc: dict[str, object]) -> tuple[str, ...]:
    addresses = doc["addresses"]
    if not isinstance(addresses, list):
        raise BundleError("kube-ipvs0.json: addresses must be a list")
    for a in addresses:
        try:
            iface = ipaddress.ip_interface(a)
        except (TypeError, ValueError) as exc:
            raise BundleError(f"kube-ipvs0.json: {a!r} is not an address") from exc
        if iface.network.prefixlen != iface.max_prefixlen or str(iface) != a:
            raise BundleError(f"kube-ipvs0.json: {a!r} is not a /32 or /128 Service address")
    if len(set(addresses)) != len(addresses):
        raise BundleError("kube-ipvs0.json: an address is listed twice")
    return tuple(addresses)


def _service_addresses(
    addresses: tuple[str, ...], recorded: frozenset[str], real_servers: frozenset[str]
) -> None:
    """Each address one the plan recorded as a Service IP, and none a Service's endpoint."""
    for a in addresses:
        ip = a.split("/", 1)[0]
        if ip not in recorded:
            raise BundleError(
                f"kube-ipvs0.json: {a} is not a Service IP plan.json recorded on kube-ipvs0"
            )
        if ip in real_servers:
            raise BundleError(
                f"kube-ipvs0.json: {a} is a real server in ipvsadm.rules (an endpoint, such as "
                "the API server, never a Service IP)"
            )


def check_link(
    doc: object,
    removed_link: str | None,
    recorded: frozenset[str],
    real_servers: frozenset[str],
) -> LinkRestore:
    """kube-ipvs0.json checked: `recorded` the IPs plan.json says were on kube-ipvs0,
    `real_servers` those ipvsadm.rules names as real servers."""
    keys = {"name", "index", "kind", "up", "addresses"}
    if not isinstance(doc, dict) or not keys <= set(doc) <= keys | {"txqlen"}:
        raise BundleError(
            f"kube-ipvs0.json must hold exactly {', '.join(sorted(keys))} (and txqlen)"
        )
    txqlen = doc.get("txqlen")
    if txqlen is not None and (type(txqlen) is not int or not 0 <= txqlen < 2**32):
        raise BundleError("kube-ipvs0.json: txqlen must be an integer from 0 to 2^32-1")
    if doc["name"] != names.KUBE_IPVS0 or removed_link != names.KUBE_IPVS0:
        raise BundleError(f"kube-ipvs0.json: only {names.KUBE_IPVS0} may be restored")
    if doc["kind"] != "dummy":
        raise BundleError("kube-ipvs0.json: kube-ipvs0 is of kind dummy, nothing else")
    index, up = doc["index"], doc["up"]
    if type(index) is not int or not 0 < index < 2**31 or type(up) is not bool:
        raise BundleError("kube-ipvs0.json: index must be a positive integer and up a boolean")
    addresses = _addresses(doc)
    _service_addresses(addresses, recorded, real_servers)
    return LinkRestore(names.KUBE_IPVS0, index, up, addresses, txqlen)


# --- the node, right before restore changes anything ---------------------------------------------


def _text(family: int, raw: memoryview) -> str:
    return socket.inet_ntop(family, bytes(raw))


def _other_addresses(rt: RtNetlink, link_index: int | None) -> dict[str, int]:
    """Every address on a link other than kube-ipvs0, with its link's index."""
    out: dict[str, int] = {}
    for p in rt.addresses():
        family, _, _, _, index = struct.unpack_from("=BBBBI", p)
        if family not in _FAMILIES or index == link_index:
            continue
        a = attrs(p, 8)
        for kind in (IFA_LOCAL, IFA_ADDRESS):
            raw = a.get(kind)
            if raw is not None and len(raw) == _FAMILIES[family]:
                out[_text(family, raw)] = index
    return out


def _gateways(rt: RtNetlink) -> set[str]:
    """The next hop of every route in every table: RTA_GATEWAY, RTA_VIA, and each hop of a
    multipath route."""
    out: set[str] = set()
    for p in rt.raw_request(RTM_GETROUTE, struct.pack("=BBBBBBBBI", 0, 0, 0, 0, 0, 0, 0, 0, 0)):
        family = p[0]
        a = attrs(p, 12)
        hops = [a]
        multipath = a.get(RTA_MULTIPATH)
        offset = 0
        while multipath is not None and offset + 8 <= len(multipath):
            length = struct.unpack_from("=H", multipath, offset)[0]
            if length < 8:
                break
            hops.append(attrs(multipath[offset : offset + length], 8))
            offset += (length + 3) & ~3
        for hop in hops:
            gateway, via = hop.get(RTA_GATEWAY), hop.get(RTA_VIA)
            if gateway is not None and family in _FAMILIES:
                out.add(_text(family, gateway))
            if via is not None and len(via) >= 2:
                via_family = struct.unpack_from("=H", via)[0]
                if via_family in _FAMILIES:
                    out.add(_text(via_family, via[2 : 2 + _FAMILIES[via_family]]))
    return out


def node_conflict(link: LinkRestore) -> str | None:
    """The first of `link`'s addresses the node uses elsewhere (on another link, or as a
    route's next hop), said in one line; None when there is none."""
    with RtNetlink() as rt:
        rows = consistent(lambda: list(rt.link_rows()))
        by_index = {r.index: r.name for r in rows}
        mine = next((r.index for r in rows if r.name == link.name), None)
        others = consistent(lambda: _other_addresses(rt, mine))
        gateways = consistent(lambda: _gateways(rt))
    for a in link.addresses:
        ip = _ip(a.split("/", 1)[0])
        if ip in others:
            return f"{a} is an address of link {by_index.get(others[ip], others[ip])}"
        if ip in gateways:
            return f"{a} is the next hop of a route of this node (its gateway)"
    return None
