"""nftables tables over nfnetlink (pyroute2); chains and set/map sizes of kube-proxy's tables."""

from __future__ import annotations

from collections import Counter
from typing import Any

from agent.kernel import Presence, presence
from agent.readers._timing import Absent, timed
from agent.snapshot import NftSet, NftTable, Reading

FAMILIES = {1: "inet", 2: "ip", 3: "arp", 5: "netdev", 7: "bridge", 10: "ip6"}
_FAMILY_NUMBERS = {v: k for k, v in FAMILIES.items()}
# Tables whose set and map elements are counted: kube-proxy's nftables-mode tables.
DETAILED = frozenset({("ip", "kube-proxy"), ("ip6", "kube-proxy")})


def _flags(value: Any) -> frozenset[str]:
    return value if isinstance(value, frozenset) else frozenset()


def _count_elements(family: str, table: str, name: str) -> int:
    from pyroute2.netlink.nfnetlink.nftsocket import NFT_MSG_GETSETELEM, nft_set_elem_list_msg
    from pyroute2.nftables.main import NFTables

    # The high-level set_elems('get') of pyroute2 0.9.7 is broken and reads only the first
    # message; the element dump must go out with the table's own family.
    with NFTables(nfgen_family=_FAMILY_NUMBERS[family]) as nft:
        msg = nft_set_elem_list_msg()
        msg["attrs"] = [["NFTA_SET_ELEM_LIST_TABLE", table], ["NFTA_SET_ELEM_LIST_SET", name]]
        return sum(
            len(m.get_attr("NFTA_SET_ELEM_LIST_ELEMENTS") or ())
            for m in nft.request_get(msg, NFT_MSG_GETSETELEM)
        )


def _read() -> tuple[NftTable, ...]:
    if presence("nf_tables") is Presence.ABSENT:
        raise Absent("nf_tables module not loaded")
    from pyroute2.netlink.exceptions import NetlinkError
    from pyroute2.nftables.main import NFTables

    try:
        with NFTables(nfgen_family=0) as nft:
            tables = [
                (
                    FAMILIES.get(m["nfgen_family"], str(m["nfgen_family"])),
                    m.get_attr("NFTA_TABLE_NAME"),
                )
                for m in nft.get_tables()
            ]
            chains = Counter(
                (FAMILIES.get(m["nfgen_family"], ""), m.get_attr("NFTA_CHAIN_TABLE"))
                for m in nft.get_chains()
            )
            sets: dict[tuple[str, str], list[tuple[str, bool]]] = {}
            for m in nft.get_sets():
                flags = _flags(m.get_attr("NFTA_SET_FLAGS"))
                if "NFT_SET_ANONYMOUS" in flags:
                    continue
                key = (FAMILIES.get(m["nfgen_family"], ""), m.get_attr("NFTA_SET_TABLE"))
                sets.setdefault(key, []).append(
                    (m.get_attr("NFTA_SET_NAME"), "NFT_SET_MAP" in flags)
                )
    except NetlinkError as exc:
        if exc.code == 22:  # nfnetlink: subsystem not registered
            raise Absent("kernel has no nf_tables") from exc
        raise
    out = []
    for family, name in tables:
        detailed = (family, name) in DETAILED
        table_sets = tuple(
            NftSet(s, is_map, _count_elements(family, name, s) if detailed else None)
            for s, is_map in sets.get((family, name), [])
        )
        out.append(NftTable(family, name, chains[(family, name)], table_sets))
    return tuple(out)


def read() -> Reading[tuple[NftTable, ...]]:
    return timed(_read, ())
