"""serve on an IPVS lab node: a real HTTP scrape equals audit --json."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests.conftest import run_agent
from tests.serving import audit_view, metrics_view, scrape, serving

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module", autouse=True)
def _modules() -> None:
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "ip_vs_wlc", "dummy"], check=True)


def test_scrape_equals_audit_with_ipvs(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = netns()
    build.build(
        ns, realistic_node(dual_stack=True, with_ipvs=True, third_party=True, nftables_table=True)
    )
    state = {"mode": "nftables", "families": ["IPv4", "IPv6"]}
    with start_fake_kube_proxy(ns, state, tmp_path / "kp.json"), serving(ns):
        samples = scrape(ns, "http://127.0.0.1:9437/metrics")["samples"]
        doc = run_agent(ns, "audit", "--json").json
    view = metrics_view(samples)
    assert view == audit_view(doc)
    assert view["vs"] > 0 and view["foreign_vs"] == 2 and view["present"] is True
    assert samples['ipvs_leftovers_subsystem_loaded{subsystem="ip_vs"}'] == 1
    assert all("node=" not in key for key in samples)
