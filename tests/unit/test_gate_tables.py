"""The gate's table check (docs/contract.md#the-cleanup-gate): kube-proxy's `kube-proxy` table must hold
kube-proxy's own chains, not merely exist."""

from __future__ import annotations

from agent.classify import classify
from agent.names import NFTABLES_MODE_CHAINS
from agent.snapshot import Family, NftTable
from tests.unit.builders import NOW, kube_proxy, snapshot


def _mode(*tables: NftTable, families: tuple[Family, ...] = ("ipv4",)):  # type: ignore[no-untyped-def]
    return classify(snapshot(nftables=tables, kp=kube_proxy("nftables", families)), NOW).mode


def test_an_empty_kube_proxy_table_does_not_satisfy_the_gate() -> None:
    """An `ip kube-proxy` table with no chains (made by hand, or by anyone) confirmed nftables
    mode as long as kube-proxy's endpoints said so."""
    mode = _mode(NftTable("ip", "kube-proxy"))
    assert not mode.nftables_confirmed
    assert mode.failed == (
        "nftables table ip kube-proxy lacks kube-proxy's chains services, masquerading (IPv4)",
    )


def test_a_table_with_some_of_the_chains_does_not_either() -> None:
    mode = _mode(NftTable("ip", "kube-proxy", 1, kube_proxy_chains=("services",)))
    assert not mode.nftables_confirmed
    assert "lacks kube-proxy's chains masquerading (IPv4)" in mode.failed[0]


def test_kube_proxys_own_table_satisfies_it_in_each_active_family() -> None:
    full = NftTable("ip", "kube-proxy", 12, kube_proxy_chains=NFTABLES_MODE_CHAINS)
    mode = _mode(full)
    assert mode.nftables_confirmed, mode.failed
    assert "nftables table ip kube-proxy exists (IPv4)" in mode.evidence
    # 1.34+ makes no ip6 table on an IPv4-only node: none is required there ...
    assert _mode(full, NftTable("ip6", "kube-proxy")).nftables_confirmed
    # ... but a dual-stack node needs both, each with kube-proxy's chains
    dual = _mode(full, NftTable("ip6", "kube-proxy"), families=("ipv4", "ipv6"))
    assert not dual.nftables_confirmed
    assert "nftables table ip6 kube-proxy lacks" in dual.failed[0]


def test_the_required_chains_are_regular_chains_every_release_makes() -> None:
    """1.29-1.37 all create these with the table (setupNFTables); base chains were renamed in
    1.34 (filter-prerouting -> filter-prerouting-pre-dnat) and mark-for-masquerade is gone
    from 1.36 (inlined into masquerading): neither is required."""
    assert set(NFTABLES_MODE_CHAINS) == {"services", "masquerading"}
    assert not any(c.startswith(("filter-", "nat-")) for c in NFTABLES_MODE_CHAINS)
