"""What real kube-proxy of every tested release tells the agent of itself beyond its mode: its
/configz (nodePortAddresses, ipvs.strictARP, the masquerade bits; served by every release, in
two JSON shapes) and, from v1.37, the KubeProxyIPVS feature gate on /metrics, in the audit and
precheck (docs/contract.md#ownership, #upstream-signals).

Real kube-proxy in nftables mode in a namespace of this host (no IPVS needed), a fake API
server beside it (tests/audit_beside_kube_proxy.py). Needs the project-built releases
(tests/upstream.py); a missing one fails the test: no skip."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import upstream
from tests.conftest import REPO

pytestmark = [pytest.mark.netns, pytest.mark.upstream]
RELEASES = ("v1.34.4", "v1.35.4", "v1.36.3", "v1.37.2")
FLAGS = (
    "--nodeport-addresses=192.168.50.0/24",
    "--iptables-masquerade-bit=13",
    "--ipvs-strict-arp",
)


@pytest.mark.parametrize("release", RELEASES)
def test_configz_and_the_feature_gate_reach_the_audit(
    release: str, netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = netns()
    subprocess.run(
        ["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"], check=True
    )
    subprocess.run(["ip", "-n", ns, "addr", "add", "192.168.50.10/24", "dev", "eth0"], check=True)
    for link in ("eth0", "eth1"):
        subprocess.run(["ip", "-n", ns, "link", "set", link, "up"], check=True)
    try:
        binary = str(upstream.kube_proxy(version=release))
    except RuntimeError as exc:
        pytest.fail(f"no kube-proxy {release}: {exc}", pytrace=False)
    log = tmp_path / "kube-proxy.log"
    cmd = [sys.executable, "-m", "tests.audit_beside_kube_proxy", binary, str(log), *FLAGS]
    p = subprocess.run(
        ["ip", "netns", "exec", ns, *cmd], cwd=REPO, capture_output=True, text=True, timeout=240
    )
    assert p.returncode == 0, p.stderr + (log.read_text() if log.exists() else "")
    out = json.loads(p.stdout)
    kp = out["audit"]["kube_proxy"]
    assert kp["configz"] == {
        "status": "ok",
        "error": None,
        "mode": "nftables",
        "node_port_addresses": ["192.168.50.0/24"],
        "strict_arp": True,
        "iptables_masquerade_bit": 13,
        "nftables_masquerade_bit": 14,
    }
    check = next(c for c in out["precheck"]["checks"] if c["name"] == "ipvs-deprecation")
    assert check["status"] == "pass"
    if release == "v1.37.2":
        assert kp["ipvs_feature_gate"] == {"value": 1.0, "stage": "DEPRECATED"}
        assert check["evidence"][0].startswith(
            'kubernetes_feature_enabled{name="KubeProxyIPVS"} = 1, stage DEPRECATED'
        )
    else:
        assert kp["ipvs_feature_gate"] is None
        assert "absent: a release before v1.37" in check["evidence"][0]
