from agent import names


def test_ipv6_names_are_prefixed_and_truncated_like_kube_proxy() -> None:
    assert names.ipv6_set_name("KUBE-CLUSTER-IP") == "KUBE-6-CLUSTER-IP"
    assert (
        names.ipv6_set_name("KUBE-LOAD-BALANCER-SOURCE-CIDR") == "KUBE-6-LOAD-BALANCER-SOURCE-CID"
    )
    assert (
        names.ipv6_set_name("KUBE-NODE-PORT-LOCAL-SCTP-HASH") == "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS"
    )


def test_set_inventory_is_17_current_and_2_old_per_family_and_5_pre_kube6() -> None:
    v6 = [n for n in names.IPVS_SETS if n.startswith("KUBE-6-")]
    assert len(names.IPVS_SETS_V4) == 17
    assert len(names.IPVS_SETS) == 43 and len(v6) == 19
    # the 1.9-1.10 names never had a KUBE-6- form
    assert not any(n.startswith("KUBE-6-") for n in names.PRE_KUBE6_SETS)
    assert {"KUBE-LB-INGRESS-LOCAL", "KUBE-SERVICE-ACCESS"} <= names.PLAIN_NAME_IPV6_OK
    assert "KUBE-NODE-PORT-TCP" not in names.PLAIN_NAME_IPV6_OK  # bitmap:port has no family
    assert all(len(n) <= 31 for n in names.IPVS_SETS)


def test_eleven_chains_and_nine_jumps() -> None:
    assert sum(len(c) for c in names.IPVS_CHAINS.values()) == 11
    assert len(names.IPVS_JUMPS) == 9


def test_every_jump_of_both_modes_and_older_releases_is_known() -> None:
    assert len(names.IPTABLES_MODE_JUMPS) == 12
    # byte-identical in both modes, plus the 1.9-1.10 comment
    assert names.KUBE_PROXY_JUMPS[("filter", "FORWARD", "KUBE-FORWARD")] == {
        "kubernetes forwarding rules",
        "kubernetes forward rules",
    }
    assert names.KUBE_PROXY_JUMPS[("filter", "INPUT", "KUBE-PROXY-FIREWALL")] == {
        "kube-proxy firewall rules",
        "kubernetes load balancer firewall",
    }
