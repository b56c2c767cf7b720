"""Whether this process may read the kernel state at all."""

from __future__ import annotations

from agent.readers.kernel import read_text

CAP_NET_RAW = 13
CAP_NET_ADMIN = 12


def effective_caps(status: str | None = None) -> int:
    text = status if status is not None else read_text("/proc/self/status")
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _legacy_tables_present() -> bool:
    for name in ("ip_tables_names", "ip6_tables_names"):
        try:
            if read_text(f"/proc/net/{name}").strip():
                return True
        except OSError:
            continue
    return False


def missing_capabilities(status: str | None = None, legacy_tables: bool | None = None) -> list[str]:
    """Capabilities the readers need and this process lacks.

    Netlink dumps of IPVS, ipsets and nf_tables need CAP_NET_ADMIN; iptables-legacy-save opens a
    raw socket, so it also needs CAP_NET_RAW, but only where legacy tables exist.
    """
    caps = effective_caps(status)
    missing = []
    if not caps & (1 << CAP_NET_ADMIN):
        missing.append("CAP_NET_ADMIN")
    legacy = _legacy_tables_present() if legacy_tables is None else legacy_tables
    if legacy and not caps & (1 << CAP_NET_RAW):
        missing.append("CAP_NET_RAW")
    return missing
