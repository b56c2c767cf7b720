"""precheck's checks (agent.views.checks.precheck) on plain data."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.classify import classify
from agent.readers.kube_proxy_config import KubeProxyConfig
from agent.snapshot import (
    Links,
    Reading,
)
from agent.views import checks
from agent.views.checks import Check, NodeIpHints
from tests.unit.builders import NOW, kube_proxy
from tests.unit.checks_builders import (
    BOUND,
    CLUSTER_IP,
    KEEPALIVED,
    KUBE_VS,
    NO_CONFIG,
    cfg,
    snap,
    with_metrics,
)

# --- kernel, mode, pinning ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "status"),
    [
        ("5.10.0-28-amd64", "fail"),
        ("5.12.19", "fail"),
        ("5.13.0", "pass"),
        ("6.1.0-18-cloud-amd64", "pass"),
        ("4.19.0", "fail"),
        ("weird", "warn"),
    ],
)
def test_kernel_gate_is_5_13(release: str, status: str) -> None:
    c = checks.check_kernel(snap(release))
    assert c.status == status
    assert release in c.evidence[0]


def test_mode_unreachable_is_a_warning_naming_proxymode() -> None:
    c = checks.check_kube_proxy_mode(snap(kp=kube_proxy(None)))
    assert c.status == "warn"
    assert c.evidence[0].startswith("could not check the mode kube-proxy runs: /proxyMode absent")


def test_mode_reported() -> None:
    c = checks.check_kube_proxy_mode(snap(kp=kube_proxy("ipvs")))
    assert c == Check(
        "kube-proxy-mode",
        "pass",
        ("/proxyMode answers ipvs (ipvs mode: the migration changes the data plane)",),
    )


def test_mode_pinned_when_config_matches_running_mode() -> None:
    c, pinned = checks.check_mode_pinned(snap(kp=kube_proxy("ipvs")), cfg(mode="ipvs"))
    assert c.status == "pass" and pinned is True
    assert "mode ipvs pinned by mode in test" in c.evidence
    assert "change it to nftables to migrate" in c.evidence


def test_mode_not_pinned_warns() -> None:
    for config in (cfg(mode=""), cfg()):
        c, pinned = checks.check_mode_pinned(snap(kp=kube_proxy("iptables")), config)
        assert c.status == "warn" and pinned is False
        assert c.evidence[-2].startswith("no mode pinned (mode is empty)")
        # kube-proxy v1.37's own warning (cmd/kube-proxy/app/server_linux.go)
        assert "becomes nftables in Kubernetes 1.40" in c.evidence[-1]


def test_pinned_mode_that_is_not_running_warns() -> None:
    c, _ = checks.check_mode_pinned(snap(kp=kube_proxy("ipvs")), cfg(mode="nftables"))
    assert c.status == "warn"
    assert c.evidence[-1].startswith("but /proxyMode answers ipvs")


def test_unreadable_config_warns_and_names_why() -> None:
    c, pinned = checks.check_mode_pinned(snap(), NO_CONFIG)
    assert (c.status, pinned) == ("warn", None)
    assert c.evidence == ("kube-proxy's configuration could not be read: no kube-proxy process",)


def test_ignored_flags_are_reported() -> None:
    config = Reading(
        "ok",
        KubeProxyConfig(
            origin="kube-proxy pid 7",
            config_file="/var/lib/kube-proxy/config.conf",
            mode="ipvs",
            ignored_flags=("--proxy-mode",),
            origins={"mode": "mode: in /var/lib/kube-proxy/config.conf (pid 7)"},
        ),
    )
    c, _ = checks.check_mode_pinned(snap(kp=kube_proxy("ipvs")), config)
    assert "flags ignored because --config is given: --proxy-mode" in c.evidence


# --- NodePort addresses ---------------------------------------------------------------------


def test_single_addresses_keep_their_nodeports() -> None:
    c = checks.check_nodeport_addresses(snap(), cfg(), NodeIpHints())
    assert c.status == "pass"
    assert "NodePorts keep answering on 192.168.50.10, fd00:50::10" in c.evidence


def test_secondary_address_stops_answering() -> None:
    links = Links(None, ("192.168.50.10", "192.168.50.11", "10.244.0.1"))
    hints = NodeIpHints(route_sources={"ipv4": "192.168.50.10"})
    c = checks.check_nodeport_addresses(snap(links=links), cfg(), hints)
    assert c.status == "warn"
    assert "primary ipv4 192.168.50.10: source address of the default route" in c.evidence
    assert (
        "NodePorts stop answering on the secondary address(es) 192.168.50.11, 10.244.0.1; set "
        "nodePortAddresses to keep them" in c.evidence
    )


def test_primary_from_node_ip_then_bind_address() -> None:
    links = Links(None, ("192.168.50.10", "192.168.50.11"))
    c = checks.check_nodeport_addresses(
        snap(links=links), cfg(), NodeIpHints(explicit=("192.168.50.11",))
    )
    assert "primary ipv4 192.168.50.11 from --node-ip" in c.evidence
    assert any("secondary address(es) 192.168.50.10;" in e for e in c.evidence)
    c = checks.check_nodeport_addresses(
        snap(links=links), cfg(bind_address="192.168.50.10"), NodeIpHints()
    )
    assert "primary ipv4 192.168.50.10 from kube-proxy's bindAddress" in c.evidence


def test_unknown_primary_warns() -> None:
    links = Links(None, ("192.168.50.10", "192.168.50.11"))
    c = checks.check_nodeport_addresses(snap(links=links), cfg(), NodeIpHints())
    assert c.status == "warn"
    assert (
        "cannot tell the primary ipv4 address among 192.168.50.10, 192.168.50.11 (no default "
        "route, no bindAddress): pass --node-ip" in c.evidence
    )


def test_explicit_node_port_addresses_pass() -> None:
    links = Links(None, ("192.168.50.10", "192.168.50.11", "10.0.0.5"))
    c = checks.check_nodeport_addresses(
        snap(links=links), cfg(node_port_addresses=("192.168.50.0/24",)), NodeIpHints()
    )
    assert c.status == "pass"
    assert "node addresses inside: 192.168.50.10, 192.168.50.11" in c.evidence


def test_nodeport_addresses_without_config_warn() -> None:
    c = checks.check_nodeport_addresses(snap(), NO_CONFIG, NodeIpHints())
    assert c.status == "warn"
    assert c.evidence[0] == (
        "could not check nodePortAddresses: kube-proxy's configuration was not read (see "
        "mode-pinned)"
    )


# --- counters -------------------------------------------------------------------------------


def test_counters() -> None:
    ipt = kube_proxy("iptables")
    zero = with_metrics(ipt, localhost_nodeport_packets=0.0, ct_state_invalid_dropped=0.0)
    seen = with_metrics(ipt, localhost_nodeport_packets=17.0, ct_state_invalid_dropped=3.0)
    assert checks.check_localhost_nodeports(snap(kp=zero)).status == "pass"
    c = checks.check_localhost_nodeports(snap(kp=seen))
    assert c.status == "warn"
    assert c.evidence[0].startswith(
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total = 17: clients reach"
    )
    assert checks.check_conntrack_invalid(snap(kp=zero)).status == "pass"
    c = checks.check_conntrack_invalid(snap(kp=seen))
    assert c.status == "warn" and " = 3: " in c.evidence[0]
    # absent series: fine in ipvs mode, unknowable in iptables mode
    assert checks.check_localhost_nodeports(snap(kp=kube_proxy("ipvs"))).status == "pass"
    assert checks.check_conntrack_invalid(snap(kp=ipt)).status == "warn"
    c = checks.check_localhost_nodeports(snap(kp=kube_proxy(None)))
    assert c.status == "warn"
    assert c.evidence[0].startswith(
        "could not check kubeproxy_iptables_localhost_nodeports_accepted_packets_total: "
        "kube-proxy /metrics absent"
    )


# --- foreign references ---------------------------------------------------------------------

IPVS_NODE = """\
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-SVC-ABC - [0:0]
:CNI-HOSTPORT-SETMARK - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-SVC-ABC -j KUBE-MARK-MASQ
-A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ
COMMIT
*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-NODEPORTS - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m set --match-set KUBE-6-CLUSTER-IP dst,dst -j ACCEPT
-A OUTPUT -m set --match-set office-allow src -j ACCEPT
COMMIT
"""


def test_foreign_references_in_both_backends() -> None:
    s = snap(legacy=IPVS_NODE, nft=IPVS_NODE)
    refs = checks.foreign_references(s, classify(s, NOW))
    assert refs == [
        f"{b}/ipv4/nat -A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ (jumps to KUBE-MARK-MASQ)"
        if t == "nat"
        else f"{b}/ipv4/filter -A INPUT -m set --match-set KUBE-6-CLUSTER-IP dst,dst -j ACCEPT "
        "(matches set KUBE-6-CLUSTER-IP)"
        for b in ("legacy", "nft")
        for t in ("nat", "filter")
    ]
    c, n = checks.check_foreign_references(s, classify(s, NOW))
    assert (c.status, n) == ("fail", 4)


def test_foreign_jump_from_a_builtin_chain_with_another_comment() -> None:
    text = (
        "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n"
        '-A INPUT -m comment --comment "site firewall" -j KUBE-PROXY-FIREWALL\nCOMMIT\n'
    )
    s = snap(legacy=text)
    assert checks.foreign_references(s, classify(s, NOW)) == [
        'legacy/ipv4/filter -A INPUT -m comment --comment "site firewall" -j '
        "KUBE-PROXY-FIREWALL (jumps to KUBE-PROXY-FIREWALL)"
    ]


def test_a_jump_after_a_backslash_is_a_foreign_reference_in_the_metric() -> None:
    """iptables-save writes an interface name raw: `-i ext\\` ends with the backslash (a plain
    character for iptables-restore) and the rule jumps into KUBE-MARK-MASQ; the gauge the
    fleet's `foreign` check reads counts it."""
    text = IPVS_NODE.replace(
        "-A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ",
        "-A CNI-HOSTPORT-SETMARK -i ext\\ -j KUBE-MARK-MASQ",
    )
    s = snap(legacy=text, kp=kube_proxy("iptables"))
    assert checks.foreign_references(s, classify(s, NOW)) == [
        "legacy/ipv4/nat -A CNI-HOSTPORT-SETMARK -i ext\\ -j KUBE-MARK-MASQ "
        "(jumps to KUBE-MARK-MASQ)",
        "legacy/ipv4/filter -A INPUT -m set --match-set KUBE-6-CLUSTER-IP dst,dst -j ACCEPT "
        "(matches set KUBE-6-CLUSTER-IP)",
    ]
    metrics = checks.readiness_metrics(s, classify(s, NOW), cfg(mode="iptables"))
    assert metrics["ipvs_leftovers_foreign_references"] == 2.0


def test_no_foreign_references_and_unreadable_backend() -> None:
    clean = IPVS_NODE.replace("-A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ\n", "").replace(
        "-A INPUT -m set --match-set KUBE-6-CLUSTER-IP dst,dst -j ACCEPT\n", ""
    )
    s = snap(legacy=clean)
    c, n = checks.check_foreign_references(s, classify(s, NOW))
    assert (c.status, n) == ("pass", 0)
    broken = replace(s, iptables_nft=Reading("error", (), "iptables-nft-save timed out"))
    c, n = checks.check_foreign_references(broken, classify(broken, NOW))
    assert (c.status, n) == ("warn", None)
    assert c.evidence == ("could not read iptables_nft: iptables-nft-save timed out",)


# --- IPVS, scheduler, strictARP -------------------------------------------------------------


def test_foreign_ipvs_services_fail() -> None:
    s = snap(ipvs=(KUBE_VS, KEEPALIVED), links=BOUND, ipsets=CLUSTER_IP)
    c = checks.check_foreign_ipvs(s, classify(s, NOW))
    assert c.status == "fail"
    assert c.evidence[1:] == ("TCP 192.168.50.100:80 (2 real servers)",)
    s = snap(ipvs=(KUBE_VS,), links=BOUND, ipsets=CLUSTER_IP)
    c = checks.check_foreign_ipvs(s, classify(s, NOW))
    assert c == Check(
        "foreign-ipvs-services", "pass", ("1 IPVS service(s), all kube-proxy's; none foreign",)
    )
    s = replace(s, ipvs=Reading("absent", (), "ip_vs not loaded"))
    assert checks.check_foreign_ipvs(s, classify(s, NOW)).status == "pass"
    s = replace(s, ipvs=Reading("error", (), "EPERM"))
    assert checks.check_foreign_ipvs(s, classify(s, NOW)).status == "warn"


def test_scheduler() -> None:
    s = snap(ipvs=(KUBE_VS,), links=BOUND, ipsets=CLUSTER_IP)
    c = classify(s, NOW)
    warn = checks.check_ipvs_scheduler(s, c, cfg(ipvs_scheduler="wlc"))
    assert warn.status == "warn"
    assert warn.evidence[0].startswith("ipvs.scheduler wlc (ipvs_scheduler in test) becomes dead")
    assert warn.evidence[1] == "kube-proxy's IPVS services use rr (1)"
    assert checks.check_ipvs_scheduler(s, c, cfg(ipvs_scheduler="")).status == "pass"
    assert checks.check_ipvs_scheduler(s, c, NO_CONFIG).status == "warn"


def test_strict_arp() -> None:
    zero = {"net.ipv4.conf.all.arp_ignore": "0", "net.ipv4.conf.all.arp_announce": "0"}
    strict = {"net.ipv4.conf.all.arp_ignore": "1", "net.ipv4.conf.all.arp_announce": "2"}
    assert checks.check_strict_arp(snap(sysctls=zero), cfg(ipvs_strict_arp=False)).status == "pass"
    c = checks.check_strict_arp(snap(sysctls=zero), cfg(ipvs_strict_arp=True))
    assert c.status == "warn" and "becomes dead configuration" in c.evidence[0]
    c = checks.check_strict_arp(snap(sysctls=strict), cfg())
    assert c.status == "warn"
    assert c.evidence[1].startswith(
        "net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 (strictARP's values)"
    )
    assert checks.check_strict_arp(snap(sysctls=zero), NO_CONFIG).status == "warn"


def test_precheck_ready_node() -> None:
    s = snap(kp=kube_proxy("ipvs"), sysctls={})
    result = checks.precheck(s, classify(s, NOW), cfg(mode="ipvs"), NodeIpHints())
    assert [c.name for c in result] == [
        "kernel",
        "kube-proxy-mode",
        "mode-pinned",
        "nodeport-addresses",
        "localhost-nodeports",
        "conntrack-invalid",
        "foreign-references",
        "foreign-ipvs-services",
        "ipvs-scheduler",
        "strict-arp",
        "ipvs-deprecation",
    ]
    assert {c.status for c in result} == {"pass"}, result
    assert checks.ready(result)
    assert checks.render("precheck", result).splitlines()[-1] == "READY: 0 fail, 0 warn, 11 pass"


# --- readiness metrics ----------------------------------------------------------------------


def test_readiness_metrics() -> None:
    s = snap(
        legacy=IPVS_NODE,
        kp=with_metrics(kube_proxy("iptables"), localhost_nodeport_packets=12.0),
    )
    assert checks.readiness_metrics(s, classify(s, NOW), cfg(mode="iptables")) == {
        "ipvs_leftovers_nftables_kernel_ready": 1.0,
        "ipvs_leftovers_kube_proxy_mode_pinned": 1.0,
        "ipvs_leftovers_foreign_references": 2.0,
        "ipvs_leftovers_localhost_nodeport_packets": 12.0,
    }
    old = snap(release="5.4.0", kp=kube_proxy(None))
    assert checks.readiness_metrics(old, classify(old, NOW), NO_CONFIG) == {
        "ipvs_leftovers_nftables_kernel_ready": 0.0,
        "ipvs_leftovers_foreign_references": 0.0,
    }
