"""precheck and verify with IPVS and a dummy kube-ipvs0, on Debian's kernel: foreign IPVS
services (keepalived, a firewall-mark service) are blockers; verify fails while kube-ipvs0 and the
IPVS services exist and passes once cleanup removed them, foreign services left in place."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lab import build, render
from lab.kube_proxy import start_fake_kube_proxy
from lab.model import Node
from lab.scenarios import realistic_node
from tests import oracle
from tests.conftest import Result, listener, run_agent

pytestmark = pytest.mark.vm
CONFIRMED = {"mode": "nftables", "families": ["IPv4"], "last_sync_age": 2.0}
IPVS = {"mode": "ipvs", "families": ["IPv4"]}
PINNED_IPVS = "kind: KubeProxyConfiguration\nmode: ipvs\n"
NO_ENV = {"KUBERNETES_SERVICE_HOST": "", "KUBERNETES_SERVICE_PORT": ""}


@pytest.fixture(scope="module", autouse=True)
def _modules() -> None:
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "ip_vs_wlc", "dummy"], check=True)


def checks(r: Result) -> dict[str, tuple[str, list[str]]]:
    return {c["name"]: (c["status"], c["evidence"]) for c in r.json["checks"]}


def kube_schedulers(node: Node) -> str:
    """What precheck must say about kube-proxy's schedulers, from the ipvsadm text the lab fed."""
    keepalived = ("192.168.50.100:80", "-f 100")
    counts = Counter(
        re.search(r" -s (\S+)", line).group(1)  # type: ignore[union-attr]
        for line in render.ipvsadm_restore(node).splitlines()
        if line.startswith("-A ") and not any(k in line for k in keepalived)
    )
    return "kube-proxy's IPVS services use " + ", ".join(
        f"{s} ({n})" for s, n in sorted(counts.items())
    )


@pytest.mark.parametrize("third_party", [True, False], ids=["keepalived", "kube-only"])
def test_foreign_ipvs_services_are_blockers(
    netns: Callable[[], str], tmp_path: Path, third_party: bool
) -> None:
    node = realistic_node(with_ipvs=True, third_party=third_party, nftables_table=True)
    ns = netns()
    build.build(ns, node)
    conf = tmp_path / "kube-proxy.yaml"
    conf.write_text(PINNED_IPVS)
    with start_fake_kube_proxy(ns, IPVS, tmp_path / "kp.json"):
        r = run_agent(ns, "precheck", "--json", "--kube-proxy-config", str(conf))
    c = checks(r)
    kube = oracle.expected(node)["ipvs_virtual_servers"]
    if third_party:
        assert r.rc == 1
        assert c["foreign-ipvs-services"] == (
            "fail",
            [
                "2 IPVS service(s) not kube-proxy's (keepalived, kube-vip, LVS ...): kube-proxy "
                "flushes every IPVS service at each nftables-mode start; move them first",
                "TCP 192.168.50.100:80 (2 real servers)",
                "FWM 100 IPv4 (2 real servers)",
            ],
        )
    else:
        assert r.rc == 0, r.stdout
        assert c["foreign-ipvs-services"] == (
            "pass",
            [f"{kube} IPVS service(s), all kube-proxy's; none foreign"],
        )
    assert c["ipvs-scheduler"] == ("pass", ["ipvs.scheduler not set", kube_schedulers(node)])
    failed = {k for k, (s, _) in c.items() if s != "pass"}
    assert failed == ({"foreign-ipvs-services"} if third_party else set())


def test_verify_before_and_after_cleanup(netns: Callable[[], str], tmp_path: Path) -> None:
    node = realistic_node(with_ipvs=True, third_party=True, nftables_table=True)
    ns = netns()
    build.build(ns, node)
    addrs = sum(oracle.expected(node)["kube_ipvs0_addresses"].values())
    env: dict[str, Any] = NO_ENV
    with start_fake_kube_proxy(ns, CONFIRMED, tmp_path / "kp.json"), listener(ns) as port:
        probe = ("--probe-address", f"127.0.0.1:{port}")
        before = run_agent(ns, "verify", "--json", *probe, env=env)
        cleaned = run_agent(
            ns,
            "cleanup",
            "--apply",
            "--backup-dir",
            str(tmp_path / "b"),
            "--lock-file",
            str(tmp_path / "l"),
        )
        assert cleaned.rc == 0, cleaned.stdout + cleaned.stderr
        after = run_agent(ns, "verify", "--json", *probe, env=env)
        precheck = run_agent(ns, "precheck", "--json", env=env)
    assert before.rc == 1
    b = checks(before)
    assert {k for k, (s, _) in b.items() if s == "fail"} == {"no-leftovers", "kube-ipvs0-gone"}
    assert b["kube-ipvs0-gone"][1] == [
        f"kube-ipvs0 exists (kind dummy, down) with {addrs} addresses: the node still claims "
        "those Service IPs"
    ]
    assert after.rc == 0, after.stdout
    # the lab's ipvs mode left ip_forward=1: verify's one warning, which its exit code ignores
    assert {k: s for k, (s, _) in checks(after).items() if s != "pass"} == {"ip-forward": "warn"}
    # keepalived's services survive cleanup, and precheck still names them
    assert checks(precheck)["foreign-ipvs-services"][1][1:] == [
        "TCP 192.168.50.100:80 (2 real servers)",
        "FWM 100 IPv4 (2 real servers)",
    ]
