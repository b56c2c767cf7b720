"""The lab writes what real kube-proxy v1.30.3's ipvs mode wrote for the same Services.

The real side is recorded by the real-kube-proxy tier (tests/data/kube-proxy-v1.30.3/states:
the node before (S0) and after (S1) ipvs mode); the lab side is built here, in a throwaway
namespace, from the same Service mix (tests/realkp/mix.py). IPVS and kube-ipvs0 are compared
as the lab renders them (this kernel has no IPVS).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.realkp.lab_compare import differences
from tests.realkp.node import NodeNet

pytestmark = pytest.mark.netns
STATES = Path(__file__).resolve().parents[1] / "data" / "kube-proxy-v1.30.3" / "states"
NODES = {
    "rk-legacy-v4": NodeNet(0, "legacy", False),
    "rk-legacy-ds": NodeNet(1, "legacy", True),
    "rk-nft-v4": NodeNet(2, "nft", False),
    "rk-nft-ds": NodeNet(3, "nft", True),
}


@pytest.mark.parametrize("node", sorted(NODES))
def test_the_lab_writes_what_real_ipvs_mode_wrote(node: str) -> None:
    d = STATES / node
    if not (d / "state-S1.json").exists():
        pytest.fail(
            f"no recorded state in {d}: run the real-kube-proxy tier and tests/realkp/record.py"
        )
    s0 = json.loads((d / "state-S0.json").read_text())
    s1 = json.loads((d / "state-S1.json").read_text())
    sctp = any(k.startswith("SCTP ") for k in s1["ipvs"])
    assert differences(NODES[node], s0, s1, sctp) == []


@pytest.mark.parametrize("node", sorted(NODES))
def test_the_lab_writes_what_real_iptables_mode_wrote_over_ipvs_mode(node: str) -> None:
    d = STATES / node
    if not (d / "state-S5.json").exists():
        pytest.fail(
            f"no recorded state in {d}: run the real-kube-proxy tier and tests/realkp/record.py"
        )
    s0 = json.loads((d / "state-S0.json").read_text())
    s5 = json.loads((d / "state-S5.json").read_text())
    sctp = any(k.startswith("SCTP ") for k in s5["ipvs"])
    assert differences(NODES[node], s0, s5, sctp, iptables_mode=True) == []
