"""The probe target of `verify` (agent.cli.checks)."""

from __future__ import annotations

import pytest

from agent.cli.checks import parse_host_port, probe_target


def test_probe_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_host_port("10.96.0.1:443") == ("10.96.0.1", 443)
    assert parse_host_port("[fd00:10:96::1]:443") == ("fd00:10:96::1", 443)
    assert parse_host_port("kubernetes.default:443") == ("kubernetes.default", 443)
    for bad in ("10.96.0.1", "fd00::1:443", ":443", "h:0", "h:x"):
        with pytest.raises(ValueError):
            parse_host_port(bad)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert probe_target(None) == (
        "[fd00:10:96::1]:443",
        "KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT",
    )
    assert probe_target("10.0.0.1:80") == ("10.0.0.1:80", "--probe-address")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")
    target, why = probe_target(None)
    assert target is None and why.startswith("no probe target: KUBERNETES_SERVICE_HOST/")
