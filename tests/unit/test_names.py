from agent import names


def test_ipv6_names_are_prefixed_and_truncated_like_kube_proxy() -> None:
    assert names.ipv6_set_name("KUBE-CLUSTER-IP") == "KUBE-6-CLUSTER-IP"
    assert (
        names.ipv6_set_name("KUBE-LOAD-BALANCER-SOURCE-CIDR") == "KUBE-6-LOAD-BALANCER-SOURCE-CID"
    )
    assert (
        names.ipv6_set_name("KUBE-NODE-PORT-LOCAL-SCTP-HASH") == "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS"
    )


def test_set_inventory_is_17_current_and_2_old_per_family() -> None:
    v6 = [n for n in names.IPVS_SETS if n.startswith("KUBE-6-")]
    assert len(names.IPVS_SETS_V4) == 17
    assert len(names.IPVS_SETS) == 38 and len(v6) == 19
    assert all(len(n) <= 31 for n in names.IPVS_SETS)


def test_eleven_chains_and_nine_jumps() -> None:
    assert sum(len(c) for c in names.IPVS_CHAINS.values()) == 11
    assert len(names.IPVS_JUMPS) == 9
