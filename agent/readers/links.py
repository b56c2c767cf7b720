"""kube-ipvs0 and the node's own addresses, over rtnetlink (pyroute2)."""

from __future__ import annotations

import ipaddress
from typing import Any

from agent.readers._timing import timed
from agent.snapshot import Link, Links, Reading

KUBE_IPVS0 = "kube-ipvs0"
_IFF_UP = 0x1


def _kind(link: Any) -> str | None:
    info = link.get_attr("IFLA_LINKINFO")
    return info.get_attr("IFLA_INFO_KIND") if info is not None else None


def _read() -> Links:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        names = {m["index"]: m.get_attr("IFLA_IFNAME") for m in ipr.get_links()}
        addrs: dict[int, list[str]] = {}
        for a in ipr.get_addr():
            addrs.setdefault(a["index"], []).append(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}")
        kube = None
        for index, name in names.items():
            if name == KUBE_IPVS0:
                link = ipr.link("get", index=index)[0]
                kube = Link(
                    name=name,
                    index=index,
                    kind=_kind(link),
                    up=bool(link["flags"] & _IFF_UP),
                    addresses=tuple(addrs.get(index, ())),
                )
    node = tuple(
        a.split("/")[0]
        for index, lst in addrs.items()
        if names.get(index) != KUBE_IPVS0
        for a in lst
        # kube-proxy's NodePort addresses: no loopback, no IPv6 link-local
        if not (
            ipaddress.ip_address(a.split("/")[0]).is_loopback
            or ipaddress.ip_address(a.split("/")[0]).is_link_local
        )
    )
    return Links(kube_ipvs0=kube, node_addresses=node)


def read() -> Reading[Links]:
    return timed(_read, Links(kube_ipvs0=None))
