"""What real kube-proxy v1.30.3 served (tests/data/kube-proxy-v1.30.3, recorded by the
real-kube-proxy tier) against the agent's parsers and the lab's fake kube-proxy."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.readers import kube_proxy as kp
from lab import fake_kube_proxy as fake

DATA = Path(__file__).resolve().parents[1] / "data" / "kube-proxy-v1.30.3"
MODES = ("ipvs", "iptables", "nftables")
GO_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \+0000 UTC m=\+\d+\.\d+$")


def _read(mode: str, name: str) -> tuple[int, str]:
    ext = "txt" if name in ("proxyMode", "metrics") else "json"
    status = int((DATA / mode / f"{name}.status").read_text())
    return status, (DATA / mode / f"{name}.{ext}").read_text()


def _shape(text: str) -> dict[str, tuple[str, str, frozenset[str]]]:
    """Per kubeproxy_ family: type, help and the label names of its samples."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("kubeproxy_"):
            labels = frozenset(k for s in fam.samples for k in s.labels if k != "le")
            out[fam.name] = (fam.type, fam.documentation, labels)
    return out


@pytest.mark.parametrize("mode", MODES)
def test_the_agent_parses_what_v1_30_3_serves(mode: str) -> None:
    assert kp.parse_proxy_mode(*(lambda s, b: (s, b.encode()))(*_read(mode, "proxyMode"))) == mode
    status, body = _read(mode, "healthz")
    health = kp.parse_healthz(status, body.encode())
    assert status == 200 and health.healthy and health.families == {}
    assert health.current_time == health.last_updated  # 200: lastUpdated is "now"
    metrics = kp.parse_metrics(_read(mode, "metrics")[1].encode())
    # one sync timestamp without an ip_family label, and no mode-specific series at all
    assert list(metrics.last_sync) == [""]
    assert metrics.nftables_series is False
    assert metrics.iptables_series is False


@pytest.mark.parametrize("mode", MODES)
def test_healthz_and_livez_shapes(mode: str) -> None:
    for name, keys in (
        ("healthz", ["lastUpdated", "currentTime", "nodeEligible"]),
        ("livez", ["lastUpdated", "currentTime"]),
    ):
        doc: dict[str, Any] = json.loads(_read(mode, name)[1])
        assert list(doc) == keys
        assert GO_TIME.match(doc["lastUpdated"]) and GO_TIME.match(doc["currentTime"])


def _fake_answers(mode: str) -> dict[str, Any]:
    state = {**fake.DEFAULT_STATE, "mode": mode, "release": "v1.30.3"}
    now = time.time()
    code, healthz = fake.healthz_body({**state, "healthz_format": "old"}, now)
    _, livez = fake.healthz_body({**state, "healthz_format": "old"}, now, livez=True)
    return {"metrics": fake.metrics_body(state, now), "healthz": healthz, "livez": livez}


@pytest.mark.parametrize("mode", MODES)
def test_the_fake_serves_the_same_shapes(mode: str) -> None:
    got = _fake_answers(mode)
    assert _shape(got["metrics"]) == _shape(_read(mode, "metrics")[1])
    for name in ("healthz", "livez"):
        real = json.loads(_read(mode, name)[1])
        doc = json.loads(got[name])
        assert list(doc) == list(real)
        assert all(GO_TIME.match(doc[k]) for k in ("lastUpdated", "currentTime"))
