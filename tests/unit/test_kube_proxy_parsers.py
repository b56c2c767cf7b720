import pytest

from agent.readers.kube_proxy import (
    Garbage,
    parse_healthz,
    parse_metrics,
    parse_proxy_mode,
    parse_timestamp,
)

METRICS = b"""# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds [ALPHA] The last time proxy rules were successfully synced
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.7000001e+09
# HELP kubeproxy_sync_proxy_rules_nftables_sync_failures_total [ALPHA] Cumulative proxy nftables sync failures
# TYPE kubeproxy_sync_proxy_rules_nftables_sync_failures_total counter
kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 2
kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv6"} 1
"""


def test_proxy_mode_is_the_bare_word() -> None:
    assert parse_proxy_mode(200, b"nftables") == "nftables"
    assert parse_proxy_mode(200, b"ipvs\n") == "ipvs"
    for status, body in ((200, b"<html>"), (404, b"nftables"), (200, b"\xff\xfe")):
        with pytest.raises(Garbage):
            parse_proxy_mode(status, body)


def test_metrics_families_failures_and_mode_series() -> None:
    m = parse_metrics(METRICS)
    assert m.last_sync == {"ipv4": 1.7e9, "ipv6": 1.7000001e9}
    assert m.nftables_sync_failures == 3.0
    assert m.nftables_series and not m.iptables_series


@pytest.mark.parametrize("body", [b"\x00\xff garbage", b"hello world", b"go_goroutines 5\n"])
def test_metrics_garbage(body: bytes) -> None:
    with pytest.raises(Garbage):
        parse_metrics(body)


def test_both_timestamp_formats() -> None:
    new = parse_timestamp("2024-05-25T03:22:43.123456789Z")
    old = parse_timestamp("2024-05-25 03:22:43.123456789 +0000 UTC m=+12.345")
    assert new == pytest.approx(1716607363.123456789)
    assert old == pytest.approx(new)
    assert parse_timestamp("2024-05-25T05:22:43+02:00") == pytest.approx(1716607363.0)
    assert parse_timestamp("2024-05-25 03:22:43 +0000 UTC") == pytest.approx(1716607363.0)
    with pytest.raises(Garbage):
        parse_timestamp("yesterday")


def test_healthz_newest_json_with_families() -> None:
    body = (
        b'{"lastUpdated":"2024-05-25T03:22:43.5Z","currentTime":"2024-05-25T03:22:44Z",'
        b'"nodeEligible":true,"healthy":true,"status":{"IPv4":{"lastUpdated":'
        b'"2024-05-25T03:22:40Z","healthy":true}}}'
    )
    h = parse_healthz(200, body)
    assert h.healthy and h.http_status == 200
    assert h.families == {"ipv4": pytest.approx(1716607360.0)}
    assert h.current_time == pytest.approx(1716607364.0)


def test_healthz_old_format_and_503() -> None:
    body = b'{"lastUpdated": "2024-05-25 03:22:43.5 +0000 UTC m=+12.3","currentTime": "2024-05-25 03:22:44 +0000 UTC m=+13.1", "nodeEligible": true}'
    h = parse_healthz(503, body)
    assert not h.healthy and h.families == {}
    assert h.last_updated == pytest.approx(1716607363.5)


@pytest.mark.parametrize(
    ("status", "body"),
    [(200, b"ok"), (200, b"[]"), (500, b'{"lastUpdated":"2024-05-25T03:22:43Z"}'), (200, b"{}")],
)
def test_healthz_garbage(status: int, body: bytes) -> None:
    with pytest.raises(Garbage):
        parse_healthz(status, body)


def test_livez_and_node_eligibility_as_kube_proxy_1_30_writes_them() -> None:
    """pkg/proxy/healthcheck/proxier_health.go (v1.30.3): /healthz adds nodeEligible, /livez
    has none; a release before /livez answers 404, which is 'not served', not garbage."""
    from agent.readers._timing import Absent
    from agent.readers.kube_proxy import livez_url, parse_livez

    t = "2026-12-03 19:00:00.5 +0000 UTC m=+3600.1"
    body = f'{{"lastUpdated": "{t}","currentTime": "{t}", "nodeEligible": false}}'.encode()
    h = parse_healthz(503, body)
    assert (h.healthy, h.node_eligible) == (False, False)
    live = parse_livez(200, f'{{"lastUpdated": "{t}","currentTime": "{t}"}}'.encode())
    assert (live.healthy, live.node_eligible) == (True, None)
    with pytest.raises(Absent):
        parse_livez(404, b"404 page not found\n")
    assert livez_url("http://127.0.0.1:10256/healthz") == "http://127.0.0.1:10256/livez"
    assert livez_url("http://[::1]:10256") == "http://[::1]:10256/livez"
