"""Upstream's own signals (docs/contract.md#upstream-signals): the KubeProxyIPVS feature gate
from /metrics, in the audit and precheck; the sysctls ipvs mode set, attributed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agent.classify import classify
from agent.readers.kube_proxy import parse_metrics
from agent.snapshot import Kernel, KubeProxyConfigz, Reading
from agent.views.checks.upstream import check_ipvs_deprecation
from agent.views.report import document, render
from agent.views.signals import ipvs_feature_gate
from agent.views.sysctls import attribute
from tests.unit.builders import NOW, kube_proxy, ok, snapshot

DATA = Path(__file__).resolve().parents[1] / "data"
GATE = b'kubernetes_feature_enabled{name="KubeProxyIPVS",stage="DEPRECATED"} 1\n'
BASE = b'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7e9\n'


def with_metrics(body: bytes) -> object:
    kp = kube_proxy()
    return dataclasses.replace(kp, metrics=Reading("ok", parse_metrics(body)))


def test_the_gate_series_is_read_as_v1_37_exposes_it() -> None:
    assert parse_metrics(BASE + GATE).ipvs_feature_gate == (1.0, "DEPRECATED")
    assert parse_metrics(BASE).ipvs_feature_gate is None
    other = b'kubernetes_feature_enabled{name="NFTablesProxyMode",stage=""} 1\n'
    assert parse_metrics(BASE + other).ipvs_feature_gate is None


def test_the_audit_and_precheck_say_what_the_gate_means() -> None:
    kp = with_metrics(BASE + GATE)
    line = ipvs_feature_gate(kp)  # type: ignore[arg-type]
    assert line == (
        'kubernetes_feature_enabled{name="KubeProxyIPVS"} = 1, stage DEPRECATED '
        "(pkg/features/kube_features.go): ipvs mode allowed; off by default in Kubernetes "
        "1.40, removed in 1.43"
    )
    snap = snapshot(kp=kp)  # type: ignore[arg-type]
    c = classify(snap, NOW)
    assert f"  - {line}" in render(snap, c).splitlines()
    assert document(snap, c)["kube_proxy"]["ipvs_feature_gate"] == {
        "value": 1.0,
        "stage": "DEPRECATED",
    }
    check = check_ipvs_deprecation(snap)
    assert (check.status, check.evidence) == ("pass", (line,))
    older = ipvs_feature_gate(with_metrics(BASE))  # type: ignore[arg-type]
    assert older.endswith(
        "absent: a release before v1.37 (ipvs mode deprecated from v1.35, "
        "the IPVSDeprecation event, not yet behind a feature gate)"
    )
    gone = snapshot(kp=kube_proxy(None))
    assert check_ipvs_deprecation(gone).status == "warn"


def test_the_real_v1_37_metrics_carry_the_gate() -> None:
    """The /metrics real kube-proxy v1.37.2 served in each mode (tests/data)."""
    for mode in ("ipvs", "iptables", "nftables"):
        body = (DATA / "kube-proxy-v1.37.2" / mode / "metrics.txt").read_bytes()
        assert parse_metrics(body).ipvs_feature_gate == (1.0, "DEPRECATED"), mode


def test_sysctls_ipvs_mode_set_are_attributed_and_left_alone() -> None:
    kernel = Kernel(
        "6.1.0",
        sysctls={
            "net.ipv4.ip_forward": "1",
            "net.ipv4.vs.conntrack": "1",
            "net.ipv4.vs.expire_nodest_conn": "1",
            "net.ipv4.vs.expire_quiescent_template": "0",
            "net.ipv4.vs.conn_reuse_mode": "1",
            "net.ipv4.vs.sloppy_tcp": "0",
            "net.ipv4.conf.all.arp_ignore": "1",
            "net.ipv4.conf.all.arp_announce": "2",
        },
    )
    notes = {n.name: n for n in attribute(kernel, KubeProxyConfigz(strict_arp=True))}
    assert notes["net.ipv4.vs.conntrack"].by_ipvs_mode
    assert notes["net.ipv4.vs.conntrack"].note == (
        "the value ipvs mode sets (sysctlVSConnTrack, pkg/proxy/ipvs/proxier.go NewProxier); "
        "left alone: it exists only while ip_vs is loaded and goes with the module"
    )
    assert notes["net.ipv4.vs.expire_nodest_conn"].by_ipvs_mode
    # the kernel's defaults are not attributed: 5.9+ leaves conn_reuse_mode as is
    assert not notes["net.ipv4.vs.expire_quiescent_template"].by_ipvs_mode
    assert not notes["net.ipv4.vs.conn_reuse_mode"].by_ipvs_mode
    assert notes["net.ipv4.vs.sloppy_tcp"].note == "not a sysctl kube-proxy sets"
    assert notes["net.ipv4.conf.all.arp_ignore"].note.endswith(
        "kept: changed only with cleanup --reset-arp-sysctls; /configz ipvs.strictARP is true"
    )
    assert "after a reboot" in notes["net.ipv4.ip_forward"].note
    snap = dataclasses.replace(snapshot(), kernel=ok(kernel))
    text = render(snap, classify(snap, NOW))
    assert (
        "  net.ipv4.vs.conntrack = 1: the value ipvs mode sets (sysctlVSConnTrack, "
        "pkg/proxy/ipvs/proxier.go NewProxier); left alone: it exists only while ip_vs is "
        "loaded and goes with the module"
    ) in text.splitlines()
    assert (
        "  not as ipvs mode set them: net.ipv4.vs.conn_reuse_mode=1, "
        "net.ipv4.vs.expire_quiescent_template=0, net.ipv4.vs.sloppy_tcp=0"
    ) in text.splitlines()
