"""Real kube-proxy (the newest release) in iptables mode, in a namespace of this kernel (iptables mode needs
no IPVS): over a lab node's ipvs-mode leftovers, as on a node that went ipvs -> iptables ->
nftables. What the real binary wrote must be classified with no unknown-kube and no foreign
KUBE-* object, and cleanup must remove both modes and leave the rest byte-identical.

The binary: the newest release the project builds from its Go module
(scripts/build-upstream, run by scripts/install-deps). The API server: tests/fake_apiserver.py, the
real-kube-proxy tier used to run against. Either missing, the test fails: it is not skipped."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from lab import build, render
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests import upstream
from tests.conftest import REPO, run_agent
from tests.dumps import dump, minus_leftovers
from tests.netns.test_cleanup import apply

pytestmark = [pytest.mark.netns, pytest.mark.upstream]


def kube_proxy_binary(tmp: Path) -> str:
    del tmp
    try:
        return str(upstream.kube_proxy())
    except RuntimeError as exc:
        pytest.fail(f"no kube-proxy: {exc}", pytrace=False)


def run_real_kube_proxy(ns: str, tmp: Path, mode: str) -> None:
    log = tmp / f"kube-proxy-{mode}.log"
    cmd = [sys.executable, "-m", "tests.run_kube_proxy", kube_proxy_binary(tmp), mode, str(log)]
    p = subprocess.run(
        ["ip", "netns", "exec", ns, *cmd], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr + (log.read_text() if log.exists() else "")


def test_real_iptables_mode_after_ipvs_is_classified_and_cleaned(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    # the nft backend: the iptables on PATH, which kube-proxy uses, is iptables-nft here
    node = realistic_node(backend="nft", third_party=True, nftables_table=True)
    ns = netns()
    build.build(ns, replace(node, nftables_table=False))
    run_real_kube_proxy(ns, tmp_path, "iptables")
    # then the move to nftables mode (iptables mode's start deletes `ip kube-proxy`, so the
    # table comes after it)
    build.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], render.nft_script(node))

    doc = run_agent(ns, "audit", "--json").json
    classes: dict[str, list[str]] = {}
    for f in doc["findings"]:
        classes.setdefault(f["class"], []).append(f["name"])
    assert "unknown-kube" not in classes, classes.get("unknown-kube")
    assert not [n for n in classes["foreign"] if "KUBE-" in n]
    chains = {c["chain"] for c in doc["iptables_leftovers"]["chains"]}
    assert {"KUBE-NODEPORTS", "KUBE-EXTERNAL-SERVICES", "KUBE-PROXY-CANARY"} <= chains
    prefixes = {c[:9] for c in chains if c.startswith(("KUBE-SVC-", "KUBE-SEP-", "KUBE-EXT-"))}
    assert prefixes == {"KUBE-SVC-", "KUBE-SEP-", "KUBE-EXT-"}
    assert any(c.startswith("KUBE-FW-") for c in chains) and any(
        c.startswith("KUBE-SVL-") for c in chains
    )
    # the shared names: iptables mode rewrote nat KUBE-SERVICES (its rules decide); the ipvs
    # chains still there make the rules both modes write (KUBE-MARK-MASQ) ipvs-mode
    ipvs = {(c["table"], c["chain"]) for c in doc["leftovers"]["iptables_chains"]}
    assert ("nat", "KUBE-SERVICES") not in ipvs and "KUBE-SERVICES" in chains
    assert ("nat", "KUBE-MARK-MASQ") in ipvs and ("nat", "KUBE-NODE-PORT") in ipvs

    with start_fake_kube_proxy(
        ns, {"mode": "nftables", "families": ["IPv4"], "last_sync_age": 2.0}, tmp_path / "kp.json"
    ):
        before = dump(ns)
        r = apply(ns, tmp_path)
        assert r.rc == 0, r.stdout + r.stderr  # before: exit 1, KUBE-MARK-MASQ kept
        assert dump(ns) == minus_leftovers(before)
        after = run_agent(ns, "audit", "--json").json
    assert after["iptables_leftovers"] == {"chains": [], "jump_rules": 0}
    assert after["leftovers"]["iptables_chains"] == []
