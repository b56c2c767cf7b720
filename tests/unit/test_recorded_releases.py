"""What real kube-proxy releases served (tests/data/kube-proxy-<release>/<mode>/, recorded by the
real-kube-proxy tier right after each mode's first full sync) against the agent's parsers and
the lab's fake kube-proxy with that release's profile.

Parametrized over whatever `<mode>/metrics.txt` exist, so a re-recorded or newly recorded
release is checked without a change here. The oracle for /metrics is prometheus_client's
parser, not the agent's."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.readers import kube_proxy as kp
from lab import fake_kube_proxy as fake

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDED = sorted(
    (p.parts[-3].removeprefix("kube-proxy-"), p.parts[-2])
    for p in DATA.glob("kube-proxy-v*/*/metrics.txt")
)
IDS = [f"{r}-{m}" for r, m in RECORDED]
# Go's %q of a time.Time with its monotonic reading (releases before 1.33)
GO_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d*[1-9])? \+0000 UTC m=[+-]\d+\.\d{9}$")
# encoding/json of a time.Time: RFC 3339 with up to nine fraction digits, trailing zeros dropped
RFC3339NANO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{0,8}[1-9])?Z$")

# kube-proxy's spelling of a family (what it serves) -> the model's (what the agent reads)
MODEL = {"IPv4": "ipv4", "IPv6": "ipv6"}


def _version(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.removeprefix("v").split("."))


def _read(release: str, mode: str, name: str) -> tuple[int, str]:
    d = DATA / f"kube-proxy-{release}" / mode
    ext = "txt" if name in ("proxyMode", "metrics") else "json"
    return int((d / f"{name}.status").read_text()), (d / f"{name}.{ext}").read_text()


def _doc(release: str, mode: str, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_read(release, mode, name)[1])
    return doc


def _json_health(release: str) -> bool:
    return _version(release) >= (1, 33)


def _unix(stamp: str) -> float:
    """An RFC 3339 "...Z" time in Unix seconds, without the agent's parser."""
    whole, _, frac = stamp.removesuffix("Z").partition(".")
    base = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    return base + (float(f"0.{frac}") if frac else 0.0)


def _families(text: str) -> dict[str, Any]:
    return {
        f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("kubeproxy_")
    }


def _shape(text: str) -> dict[str, tuple[str, str, frozenset[str]]]:
    """Per kubeproxy_ family: type, HELP and the label names of its samples."""
    return {
        name: (f.type, f.documentation, frozenset(k for s in f.samples for k in s.labels))
        for name, f in _families(text).items()
    }


def _total(fams: dict[str, Any], name: str) -> float | None:
    f = fams.get(name.removesuffix("_total"))  # the parser names a counter without _total
    return None if f is None else sum(s.value for s in f.samples if s.name == name)


def test_recorded_releases_are_found_and_each_has_a_profile() -> None:
    releases = {r for r, _ in RECORDED}
    assert {"v1.30.3", "v1.34.4", "v1.37.2"} <= releases
    assert releases <= set(fake.PROFILES)
    assert max(fake.PROFILES, key=_version) == fake.NEWEST


@pytest.mark.parametrize(("release", "mode"), RECORDED, ids=IDS)
def test_the_agent_reads_proxy_mode(release: str, mode: str) -> None:
    status, body = _read(release, mode, "proxyMode")
    assert kp.parse_proxy_mode(status, body.encode()) == mode


@pytest.mark.parametrize(("release", "mode"), RECORDED, ids=IDS)
def test_the_recorded_health_documents(release: str, mode: str) -> None:
    """The keys and time formats each release served; the fake is held to the same below."""
    healthz, livez = _doc(release, mode, "healthz"), _doc(release, mode, "livez")
    if _json_health(release):
        keys = ["lastUpdated", "currentTime", "nodeEligible", "healthy", "status"]
        assert list(healthz) == keys
        assert list(livez) == [k for k in keys if k != "nodeEligible"]
        for doc in (healthz, livez):
            assert set(doc["status"]) == {"IPv4", "IPv6"}  # the tier's nodes run dual-stack
            stamps = [doc["lastUpdated"], doc["currentTime"]]
            stamps += [st["lastUpdated"] for st in doc["status"].values()]
            assert all(RFC3339NANO.match(s) for s in stamps), stamps
            assert all(list(st) == ["lastUpdated", "healthy"] for st in doc["status"].values())
    else:
        assert list(healthz) == ["lastUpdated", "currentTime", "nodeEligible"]
        assert list(livez) == ["lastUpdated", "currentTime"]
        for doc in (healthz, livez):
            assert GO_TIME.match(doc["lastUpdated"]) and GO_TIME.match(doc["currentTime"])


@pytest.mark.parametrize(("release", "mode"), RECORDED, ids=IDS)
def test_the_agent_reads_healthz_and_livez(release: str, mode: str) -> None:
    for name in ("healthz", "livez"):
        status, body = _read(release, mode, name)
        doc = json.loads(body)
        parse = kp.parse_healthz if name == "healthz" else kp.parse_livez
        health = parse(status, body.encode())
        assert status == 200 and health.http_status == 200 and health.healthy
        assert health.node_eligible is (True if name == "healthz" else None)
        if _json_health(release):
            assert health.last_updated == pytest.approx(_unix(doc["lastUpdated"]), abs=1e-6)
            assert health.current_time == pytest.approx(_unix(doc["currentTime"]), abs=1e-6)
            assert health.families == pytest.approx(
                {MODEL[fam]: _unix(st["lastUpdated"]) for fam, st in doc["status"].items()},
                abs=1e-6,
            )
        else:
            assert health.families == {}
            assert health.current_time == health.last_updated  # 200: lastUpdated is "now"


@pytest.mark.parametrize(("release", "mode"), RECORDED, ids=IDS)
def test_the_agent_reads_metrics(release: str, mode: str) -> None:
    text = _read(release, mode, "metrics")[1]
    fams = _families(text)
    m = kp.parse_metrics(text.encode())
    last = fams["kubeproxy_sync_proxy_rules_last_timestamp_seconds"].samples
    assert m.last_sync == {MODEL.get(s.labels.get("ip_family", "")): s.value for s in last}
    if _json_health(release):  # one last sync per family, the families /healthz reports
        assert set(m.last_sync) == {MODEL[f] for f in _doc(release, mode, "healthz")["status"]}
    else:
        assert list(m.last_sync) == [None]
    assert m.nftables_series == any(
        n.startswith("kubeproxy_sync_proxy_rules_nftables_") for n in fams
    )
    assert m.iptables_series == any(n.startswith("kubeproxy_iptables_") for n in fams)
    for got, name in (
        (m.nftables_sync_failures, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"),
        (
            m.localhost_nodeport_packets,
            "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
        ),
        (m.ct_state_invalid_dropped, "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"),
    ):
        assert got == _total(fams, name), name


def _fake_state(release: str, mode: str) -> dict[str, Any]:
    families = sorted(_doc(release, mode, "healthz").get("status") or ("IPv4", "IPv6"))
    return {**fake.DEFAULT_STATE, "mode": mode, "release": release, "families": families}


@pytest.mark.parametrize(("release", "mode"), RECORDED, ids=IDS)
def test_the_fake_serves_the_same_metrics_shapes(release: str, mode: str) -> None:
    got = fake.metrics_body(_fake_state(release, mode), time.time())
    assert _shape(got) == _shape(_read(release, mode, "metrics")[1])


@pytest.mark.parametrize(("release", "mode"), RECORDED, ids=IDS)
def test_the_fake_serves_the_same_health_documents(release: str, mode: str) -> None:
    state = _fake_state(release, mode)
    for name in ("healthz", "livez"):
        code, body = fake.healthz_body(state, time.time(), livez=name == "livez")
        doc, real = json.loads(body), _doc(release, mode, name)
        assert code == _read(release, mode, name)[0] == 200
        assert list(doc) == list(real)
        if _json_health(release):
            assert set(doc["status"]) == set(real["status"])
            assert all(list(st) == ["lastUpdated", "healthy"] for st in doc["status"].values())
            stamps = [doc["lastUpdated"], doc["currentTime"]]
            assert all(RFC3339NANO.match(s) for s in stamps), stamps
        else:
            assert all(GO_TIME.match(doc[k]) for k in ("lastUpdated", "currentTime"))


@pytest.mark.parametrize("release", sorted(fake.PROFILES))
@pytest.mark.parametrize("mode", ["ipvs", "iptables", "nftables"])
def test_every_profile_in_every_mode_is_read_by_the_agent(release: str, mode: str) -> None:
    """Also the releases and modes not recorded (yet): the agent reads what the fake serves."""
    families = ["IPv4", "IPv6"]
    state = {**fake.DEFAULT_STATE, "mode": mode, "release": release, "families": families}
    now = time.time()
    m = kp.parse_metrics(fake.metrics_body(state, now).encode())
    labelled = _json_health(release)
    assert set(m.last_sync) == ({"ipv4", "ipv6"} if labelled else {None})
    assert m.last_sync["ipv4" if labelled else None] == pytest.approx(now - 5.0)
    assert m.nftables_series is False and m.nftables_sync_failures is None
    assert m.iptables_series is (labelled and mode == "iptables")
    health = kp.parse_healthz(*(lambda c, b: (c, b.encode()))(*fake.healthz_body(state, now)))
    assert health.healthy and health.node_eligible is True
    assert set(health.families) == ({"ipv4", "ipv6"} if labelled else set())


def test_null_release_is_the_newest() -> None:
    now = time.time()
    for mode in ("ipvs", "iptables", "nftables"):
        state = {**fake.DEFAULT_STATE, "mode": mode, "families": ["IPv4", "IPv6"]}
        assert fake.metrics_body(state, now) == fake.metrics_body(
            {**state, "release": fake.NEWEST}, now
        )
        assert fake.healthz_body(state, now) == fake.healthz_body(
            {**state, "release": fake.NEWEST}, now
        )


@pytest.mark.parametrize("release", ["v1.30.3", fake.NEWEST])
def test_failures_show_once_they_move(release: str) -> None:
    """A release since 1.33 serves its failure counters once they first move; v1.30.3's
    iptables restore counter is there at 0 from the start (and it has no nftables counter)."""
    base = {**fake.DEFAULT_STATE, "release": release, "families": ["IPv4", "IPv6"]}
    now = time.time()
    nft = kp.parse_metrics(fake.metrics_body({**base, "sync_failures": 3}, now).encode())
    ipvs = _families(fake.metrics_body({**base, "mode": "ipvs", "sync_failures": 2}, now))
    restore = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
    if release == "v1.30.3":
        assert nft.nftables_sync_failures is None and not nft.nftables_series
        assert _total(ipvs, restore) == 2.0
    else:
        assert nft.nftables_sync_failures == 6.0 and nft.nftables_series  # 3 per family
        assert _total(ipvs, restore) == 4.0


def test_an_ineligible_node_as_real_kube_proxy_answers() -> None:
    """proxy_health.go: /healthz 503 with `healthy` still the proxiers' (true) and lastUpdated
    the last sync, not "now"; /livez 200 without nodeEligible."""
    state = {**fake.DEFAULT_STATE, "node_eligible": False, "last_sync_age": 60.0}
    now = time.time()
    code, body = fake.healthz_body(state, now)
    doc = json.loads(body)
    assert code == 503 and doc["nodeEligible"] is False and doc["healthy"] is True
    health = kp.parse_healthz(code, body.encode())
    assert not health.healthy and health.node_eligible is False
    assert health.last_updated == pytest.approx(now - 60.0, abs=1e-6)
    code, body = fake.healthz_body(state, now, livez=True)
    live = kp.parse_livez(code, body.encode())
    assert code == 200 and live.healthy and live.node_eligible is None
