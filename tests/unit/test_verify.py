"""verify's checks (agent.views.checks.verify) on plain data."""

from __future__ import annotations

from dataclasses import replace

from agent.classify import classify
from agent.snapshot import (
    Reading,
)
from agent.views import checks
from agent.views.checks import Check, ProbeResult
from tests.unit.builders import NOW, kube_proxy, ok
from tests.unit.checks_builders import (
    BOUND,
    CLUSTER_IP,
    KUBE_VS,
    nft_snap,
    one,
    run_verify,
    with_metrics,
)


def test_verify_passes_on_a_clean_nftables_node() -> None:
    result = run_verify(nft_snap())
    assert [(c.name, c.status) for c in result] == [
        ("nftables-mode", "pass"),
        ("no-leftovers", "pass"),
        ("kube-ipvs0-gone", "pass"),
        ("nftables-sync", "pass"),
        ("service-probe", "pass"),
        ("ip-forward", "pass"),
    ]
    assert one(result, "nftables-sync").evidence == (
        "/livez answers HTTP 200: no update stuck",
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total = 0",
    )
    doc = checks.document("verify", result)
    assert doc["ok"] is True and doc["summary"] == {"pass": 6, "warn": 0, "fail": 0}


def test_verify_mode_failures() -> None:
    c = one(run_verify(nft_snap(kp=kube_proxy("ipvs"))), "nftables-mode")
    assert c.status == "fail"
    assert c.evidence[0] == "/proxyMode answers ipvs, not nftables"
    # the nftables series are extra evidence, never required (1.30 exposes none at start)
    c = one(
        run_verify(nft_snap(kp=kube_proxy("nftables", ("ipv4", "ipv6"), series=False))),
        "nftables-mode",
    )
    assert c.status == "pass"
    s = replace(nft_snap(), nftables=ok(()))
    c = one(run_verify(s), "nftables-mode")
    assert "no nftables table ip6 kube-proxy for active family IPv6" in c.evidence


def test_verify_leftovers_and_kube_ipvs0() -> None:
    s = nft_snap(ipvs=(KUBE_VS,), links=BOUND, ipsets=CLUSTER_IP)
    result = run_verify(s)
    c = one(result, "no-leftovers")
    assert c.status == "fail"
    assert c.evidence[0] == (
        "3 ipvs-mode object(s) remain: 1 ipset, 1 ipvs-service, 1 link "
        "(ipvs-leftovers cleanup removes them)"
    )
    c = one(result, "kube-ipvs0-gone")
    assert c.evidence == (
        "kube-ipvs0 exists (kind dummy, down) with 1 addresses: the node still claims those "
        "Service IPs",
    )
    broken = replace(nft_snap(), ipsets=Reading("error", (), "EPERM"))
    c = one(run_verify(broken), "no-leftovers")
    assert c == Check("no-leftovers", "fail", ("could not read ipsets: EPERM",))


def test_verify_sync() -> None:
    idle = nft_snap(kp=kube_proxy("nftables", ("ipv4",), sync_age=3600))
    assert one(run_verify(idle), "nftables-sync").status == "pass"  # hourly re-sync
    c = checks.check_nftables_sync(idle, classify(idle, NOW), NOW, 300.0)
    assert c.status == "fail"
    assert "metric last sync IPv4 older than --max-sync-age 300s" in c.evidence
    no_counter = nft_snap(kp=with_metrics(kube_proxy("nftables"), nftables_sync_failures=None))
    c = one(run_verify(no_counter), "nftables-sync")
    assert c.status == "pass"
    assert "no kubeproxy_sync_proxy_rules_nftables_sync_failures_total counted yet" in c.evidence
    failing = nft_snap(kp=with_metrics(kube_proxy("nftables"), nftables_sync_failures=4.0))
    c = one(run_verify(failing), "nftables-sync")
    assert c.evidence[0] == "kubeproxy_sync_proxy_rules_nftables_sync_failures_total = 4"
    unhealthy = nft_snap(kp=kube_proxy("nftables", healthy=False, livez=False))
    assert (
        "/healthz answers HTTP 503: unhealthy"
        in one(run_verify(unhealthy), "nftables-sync").evidence
    )
    gone = nft_snap(kp=kube_proxy(None))
    result = run_verify(gone)
    assert one(result, "nftables-sync").evidence[:2] == (
        "/healthz absent: unreachable",
        "/metrics absent: unreachable",
    )
    assert one(result, "nftables-mode").evidence[0] == "/proxyMode absent: unreachable"


def test_verify_probe() -> None:
    none = ProbeResult(None, "", False, "no probe target: ...")
    assert one(run_verify(nft_snap(), none), "service-probe") == Check(
        "service-probe", "fail", ("no probe target: ...",)
    )
    refused = ProbeResult("127.0.0.1:9", "--probe-address", False, "connection refused")
    c = one(run_verify(nft_snap(), refused), "service-probe")
    assert c.evidence == ("TCP connect to 127.0.0.1:9 (--probe-address): connection refused",)


def test_ip_forward_ipvs_mode_set_is_a_warning_that_says_what_to_do() -> None:
    """Only ipvs mode, of kube-proxy's modes, sets ip_forward=1 (pkg/proxy/ipvs/proxier.go
    sysctlForward) and nothing sets it again after a reboot: verify says so, and its exit code
    does not count it (the node may need forwarding, set by its own configuration)."""
    s = nft_snap()
    on = replace(s, kernel=ok(replace(s.kernel.data, sysctls={"net.ipv4.ip_forward": "1"})))
    result = run_verify(on)
    c = one(result, "ip-forward")
    assert c.status == "warn"
    assert c.evidence[0].startswith(
        "net.ipv4.ip_forward = 1, the value ipvs mode sets (sysctlForward, "
        "pkg/proxy/ipvs/proxier.go NewProxier)"
    )
    assert "persist it in /etc/sysctl.d or let the CNI set it" in c.evidence[1]
    doc = checks.document("verify", result)
    assert doc["ok"] is True and doc["summary"] == {"pass": 5, "warn": 1, "fail": 0}
    assert not checks.ready(result) and checks.ready(result, warn_ok=True)
