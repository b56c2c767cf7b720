"""iptables chains and rules in both backends, read with the backends' own save tools.

Why a subprocess and not python-iptables in process: `import iptc` runs `modprobe ip_tables`,
reading a table with it creates that table (docs/contract.md#safety-rules forbids both), it
redirects fd 1 while it prints rules (a deadlock with any other writer), and it cannot see the
nft backend at all.
`iptables-legacy-save` without `-t` dumps only the tables the kernel already lists in
/proc/net/ip*_tables_names, so reading creates nothing.
"""

from __future__ import annotations

from agent.readers import iptables_save, tools
from agent.readers._timing import Absent, timed
from agent.readers.kernel import Presence, presence, read_text
from agent.readers.netlink import NfTables, attrs, nul_text
from agent.snapshot import Family, IptTable, Reading

TABLES = ("nat", "filter", "mangle")
_FAMILIES: dict[Family, tuple[str, str]] = {
    "ipv4": ("iptables", "ip_tables"),
    "ipv6": ("ip6tables", "ip6_tables"),
}
_NFPROTO: dict[int, Family] = {2: "ipv4", 10: "ipv6"}  # nfgenmsg family of an nf_tables table
NFT_MSG_GETTABLE = 1


def _save(tool: str, timeout: float) -> str:
    return tools.run([tool], timeout=timeout)


def _keep(tables: tuple[IptTable, ...]) -> list[IptTable]:
    return [t for t in tables if t.name in TABLES]


def _read_legacy(timeout: float) -> tuple[IptTable, ...]:
    out: list[IptTable] = []
    seen = False
    for family, (prefix, module) in _FAMILIES.items():
        if presence(module) is not Presence.LOADED:
            continue  # no x_tables for this family: nothing to read, nothing to create
        seen = True
        names = read_text(f"/proc/net/{module}_names").split()
        if not set(names) & set(TABLES):
            continue
        text = _save(f"{prefix}-legacy-save", timeout)
        out.extend(_keep(iptables_save.parse(text, "legacy", family)))
    if not seen:
        raise Absent("no legacy x_tables in this kernel")
    return tuple(out)


def _nft_families_with_tables() -> set[Family] | None:
    """The families (ipv4, ipv6) with an nf_tables table that iptables-nft would print among
    TABLES (it keeps them as ordinary tables named nat/filter/mangle in family ip/ip6); None
    when that cannot be told. A save tool run costs a process start (~0.4 s under the
    benchmark's VM) and prints nothing of TABLES for a family without such a table."""
    try:
        with NfTables() as nft:
            found: set[Family] = set()
            for p in nft.dump(NFT_MSG_GETTABLE):
                if p[0] in _NFPROTO and nul_text(attrs(p, 4).get(1)) in TABLES:
                    found.add(_NFPROTO[p[0]])
            return found
    except OSError:
        return None


def _read_nft(timeout: float) -> tuple[IptTable, ...]:
    if presence("nf_tables") is Presence.ABSENT:
        raise Absent("nf_tables module not loaded")
    out: list[IptTable] = []
    present = _nft_families_with_tables()
    for family, (prefix, _) in _FAMILIES.items():
        if present is not None and family not in present:
            continue
        text = _save(f"{prefix}-nft-save", timeout)
        out.extend(_keep(iptables_save.parse(text, "nft", family)))
    return tuple(out)


def read_legacy(timeout: float = 10.0) -> Reading[tuple[IptTable, ...]]:
    return timed(lambda: _read_legacy(timeout), ())


def read_nft(timeout: float = 10.0) -> Reading[tuple[IptTable, ...]]:
    return timed(lambda: _read_nft(timeout), ())
