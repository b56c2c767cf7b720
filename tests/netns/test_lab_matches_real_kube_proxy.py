"""The lab writes what real kube-proxy's ipvs mode wrote for the same Services: the newest
release the project tests, and v1.30.3.

The real side is recorded by the real-kube-proxy tier (tests/data/kube-proxy-<version>/states:
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
from tests.realkp.nodes import NEWEST
from tests.realkp.nodes import NODES as REALKP_NODES

pytestmark = pytest.mark.netns
DATA = Path(__file__).resolve().parents[1] / "data"
# (release, node namespace) -> the node; the newest release's nodes as tests/realkp/nodes.py
NODES = {
    ("v1.30.3", "rk-legacy-v4"): NodeNet(0, "legacy", False),
    ("v1.30.3", "rk-legacy-ds"): NodeNet(1, "legacy", True),
    ("v1.30.3", "rk-nft-v4"): NodeNet(2, "nft", False),
    ("v1.30.3", "rk-nft-ds"): NodeNet(3, "nft", True),
    **{
        (n.release, n.ns): n.net for n in REALKP_NODES if n.release == NEWEST and "C" in n.scenarios
    },
}
CASES = [pytest.param(r, n, id=f"{r}-{n}") for r, n in sorted(NODES)]


@pytest.mark.parametrize(("release", "node"), CASES)
def test_the_lab_writes_what_real_ipvs_mode_wrote(release: str, node: str) -> None:
    d = DATA / f"kube-proxy-{release}" / "states" / node
    if not (d / "state-S1.json").exists():
        pytest.fail(
            f"no recorded state in {d}: run the real-kube-proxy tier and tests/realkp/record.py"
        )
    s0 = json.loads((d / "state-S0.json").read_text())
    s1 = json.loads((d / "state-S1.json").read_text())
    sctp = any(k.startswith("SCTP ") for k in s1["ipvs"])
    assert differences(NODES[(release, node)], s0, s1, sctp) == []


@pytest.mark.parametrize(("release", "node"), CASES)
def test_the_lab_writes_what_real_iptables_mode_wrote_over_ipvs_mode(
    release: str, node: str
) -> None:
    d = DATA / f"kube-proxy-{release}" / "states" / node
    if not (d / "state-S5.json").exists():
        pytest.fail(
            f"no recorded state in {d}: run the real-kube-proxy tier and tests/realkp/record.py"
        )
    s0 = json.loads((d / "state-S0.json").read_text())
    s5 = json.loads((d / "state-S5.json").read_text())
    sctp = any(k.startswith("SCTP ") for k in s5["ipvs"])
    assert differences(NODES[(release, node)], s0, s5, sctp, iptables_mode=True) == []
