"""Lost evidence, with real kube-proxy (the newest release) on one node of the VM.

Real ipvs mode programs the node with nodePortAddresses 192.168.80.0/27 on two node addresses
(.10 and .20); then one of its set members is lost (web's ClusterIP member of KUBE-CLUSTER-IP:
ipvs mode adds members one `ipset add` at a time) and the node loses .20. Real nftables mode
then runs beside the leftovers (no `modprobe` on its PATH: its start-up cleanup of them returns
at once, scenario B). Two virtual servers an operator made look like kube-proxy's to weak
evidence and must stay: one on web's ClusterIP (bound on kube-ipvs0) at a port no Service has,
one on the keepalived VIP at web's NodePort number, outside nodePortAddresses.

The agent must attribute web's ClusterIP and .20's NodePorts by nftables mode's own service maps
and /configz (docs/contract.md#ownership), remove them, and keep exactly the operator's three
virtual servers and, while one of them uses its address, kube-ipvs0; once that one is gone,
kube-ipvs0 goes too. Before this evidence existed, web's ClusterIP stayed "unknown" and kept
kube-ipvs0 for good.

The node (tests/realkp/nodes.py SOLO) has a control plane of its own, apart from the session
run's nodes.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import upstream
from tests.realkp import mix
from tests.realkp.cluster import RealAPI
from tests.realkp.node import KubeProxy, delete_namespace, ns_run, probe, setup_namespace
from tests.realkp.nodes import NEWEST, SOLO
from tests.realkp.pipeline import agent

pytestmark = pytest.mark.realkp

NET = SOLO[0]  # IPv4 only, its own control plane
_SUBNET = NET.v4.rsplit(".", 1)[0]
LOST_ADDRESS = f"{_SUBNET}.20"
NODE_PORT_CIDR = f"{_SUBNET}.0/27"  # .10 and .20; not the keepalived VIP .100
OPERATOR_ON_CLUSTER_IP = f"{mix.WEB_CLUSTER_IP}:8443"
OPERATOR_AT_NODE_PORT = f"{mix.keepalived_vip(NET)}:{mix.WEB_NODE_PORT}"
KEEPALIVED = f"{mix.keepalived_vip(NET)}:80"


class PinnedKubeProxy(KubeProxy):
    """kube-proxy serving NodePorts on a /27 of the node's addresses, not one /32."""

    def args(self, mode: str, binary: Path | None = None) -> list[str]:
        return [
            f"--nodeport-addresses={NODE_PORT_CIDR}" if a.startswith("--nodeport-addresses") else a
            for a in super().args(mode, binary)
        ]


def virtual_servers(ns: str) -> set[str]:
    """`TCP 10.96.1.1:80` for each virtual server, as ipvsadm -Ln prints them."""
    out = ns_run(ns, "ipvsadm", "-Ln")
    return {
        " ".join(line.split()[:2])
        for line in out.splitlines()
        if line.split()[:1] in (["TCP"], ["UDP"], ["SCTP"])
    }


def links(ns: str) -> str:
    return ns_run(ns, "ip", "-o", "link", "show")


SYSCTLS = r"^net\.ipv4\.(vs\.|ip_forward |conf\.all\.arp_)"


def sysctls(ns: str) -> dict[str, str]:
    """The sysctls ipvs mode may set, and every net.ipv4.vs.*, of namespace `ns`."""
    out = ns_run(ns, "sh", "-c", f"sysctl -a 2>/dev/null | grep -E '{SYSCTLS}'", check=False)
    return dict(line.split(" = ", 1) for line in out.splitlines() if " = " in line)


def fresh_sysctls() -> dict[str, str]:
    """The same in a namespace nothing ran in: the kernel's defaults, ip_vs loaded."""
    ns = f"{NET.ns}-fresh"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        return sysctls(ns)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=True)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("lost-evidence")
    listener = setup_namespace(NET)
    api: RealAPI | None = None
    kp: PinnedKubeProxy | None = None
    seen: dict[str, Any] = {}
    try:
        ns_run(NET.ns, "ip", "addr", "add", f"{LOST_ADDRESS}/24", "dev", "eth0")
        for cmd, stdin in mix.third_party_before(NET).items():
            ns_run(NET.ns, *cmd.split(), stdin=stdin)
        api = RealAPI.open(NET)
        api.apply(mix.cluster(NET, False))
        binary = upstream.kube_proxy(version=NEWEST)
        kp = PinnedKubeProxy(NET, binary, work, api.kube_proxy_kubeconfig())
        kp.start("ipvs")
        kp.wait_synced()
        kp.stop()
        seen["ipvs_made"] = virtual_servers(NET.ns)
        # what ipvs mode set: its namespace's values that differ from a fresh namespace's
        fresh, mine = fresh_sysctls(), sysctls(NET.ns)
        seen["sysctls_set"] = {k for k, v in mine.items() if fresh.get(k) != v}
        # the losses: a member ipvs mode never added, an address the node no longer has
        ns_run(NET.ns, "ipset", "del", "KUBE-CLUSTER-IP", f"{mix.WEB_CLUSTER_IP},tcp:80")
        ns_run(NET.ns, "ip", "addr", "del", f"{LOST_ADDRESS}/24", "dev", "eth0")
        operator = (
            f"-A -t {OPERATOR_ON_CLUSTER_IP} -s rr\n-a -t {OPERATOR_ON_CLUSTER_IP} -r {NET.v4_peer}:8443 -m\n"
            f"-A -t {OPERATOR_AT_NODE_PORT} -s rr\n-a -t {OPERATOR_AT_NODE_PORT} -r {NET.v4_peer}:80 -m\n"
        )
        ns_run(NET.ns, "ipvsadm", "-R", stdin=operator)
        kp.start("nftables", modprobe=False)
        kp.wait_synced()
        time.sleep(2)
        common = ["--backup-dir", str(work / "backups"), "--lock-file", str(work / "lock")]
        seen["audit"] = agent(NET.ns, "audit", "--json")
        seen["cleanup"] = agent(NET.ns, "cleanup", "--apply", *common)
        seen["after"] = virtual_servers(NET.ns)
        seen["links_after"] = links(NET.ns)
        ns_run(NET.ns, "ipvsadm", "-D", "-t", OPERATOR_ON_CLUSTER_IP)
        seen["cleanup2"] = agent(NET.ns, "cleanup", "--apply", *common)
        seen["after2"] = virtual_servers(NET.ns)
        seen["links_after2"] = links(NET.ns)
        probe_at = f"{mix.WEB_CLUSTER_IP}:80"
        seen["verify"] = agent(NET.ns, "verify", "--json", "--probe-address", probe_at)
        seen["probes"] = {
            "clusterip": probe(NET, mix.WEB_CLUSTER_IP, 80),
            "nodeport": probe(NET, NET.v4, mix.WEB_NODE_PORT),
        }
        seen["kube_proxy_alive"] = kp.alive()
        yield seen
    finally:
        if kp is not None:
            kp.stop()
        if api is not None:
            api.close()
        listener.kill()
        listener.wait()
        delete_namespace(NET)


def _classes(seen: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    r = seen["audit"]
    assert r.stdout, f"audit printed nothing (rc {r.rc}): {r.stderr}"
    doc = json.loads(r.stdout)
    return {
        f["name"]: (f["class"], f["evidence"])
        for f in doc["findings"]
        if f["kind"] == "ipvs-service"
    }


def test_ipvs_mode_made_what_the_losses_take_away(node: dict[str, Any]) -> None:
    made = node["ipvs_made"]
    assert f"TCP {mix.WEB_CLUSTER_IP}:80" in made
    assert f"TCP {LOST_ADDRESS}:{mix.WEB_NODE_PORT}" in made
    assert f"TCP {NET.v4}:{mix.WEB_NODE_PORT}" in made


def test_lost_evidence_is_found_in_what_nftables_mode_serves(node: dict[str, Any]) -> None:
    classes = _classes(node)
    web, why = classes[f"TCP {mix.WEB_CLUSTER_IP}:80"]
    assert web == "ipvs-leftover", why
    assert "the running nftables mode serves" in why[0]
    for name, (cls, why) in classes.items():
        if name.split()[1].startswith(f"{LOST_ADDRESS}:"):
            assert cls == "ipvs-leftover", (name, why)
            assert f"nodePortAddresses {NODE_PORT_CIDR} (/configz)" in why[0]
    assert any(n.split()[1].startswith(f"{LOST_ADDRESS}:") for n in classes)


def test_what_only_looks_like_kube_proxys_is_kept(node: dict[str, Any]) -> None:
    classes = _classes(node)
    assert classes[f"TCP {OPERATOR_ON_CLUSTER_IP}"][0] == "unknown-kube"
    assert classes[f"TCP {OPERATOR_AT_NODE_PORT}"][0] == "unknown-kube"
    assert classes[f"TCP {KEEPALIVED}"][0] == "foreign"
    # exit 1, something remains: kube-ipvs0, for the operator's service on its address
    assert node["cleanup"].rc == 1, node["cleanup"].stdout + node["cleanup"].stderr
    assert node["cleanup"].stdout.splitlines()[-1] == (
        f"  kept link kube-ipvs0: 1 IPVS service(s) not removed use its addresses: "
        f"TCP {OPERATOR_ON_CLUSTER_IP}"
    ), node["cleanup"].stdout
    assert node["after"] == {
        f"TCP {OPERATOR_ON_CLUSTER_IP}",
        f"TCP {OPERATOR_AT_NODE_PORT}",
        f"TCP {KEEPALIVED}",
    }
    assert "kube-ipvs0" in node["links_after"]  # the operator's service on its address


def test_kube_ipvs0_goes_once_nothing_uses_it(node: dict[str, Any]) -> None:
    assert node["cleanup2"].rc == 0, node["cleanup2"].stdout + node["cleanup2"].stderr
    assert node["after2"] == {f"TCP {OPERATOR_AT_NODE_PORT}", f"TCP {KEEPALIVED}"}
    assert "kube-ipvs0" not in node["links_after2"]
    assert node["probes"] == {"clusterip": "ok", "nodeport": "ok"}
    assert node["kube_proxy_alive"]


def test_the_sysctls_ipvs_mode_set_are_attributed(node: dict[str, Any]) -> None:
    """Provenance: what differs from a fresh namespace after ipvs mode ran; Debian's 6.1 kernel
    keeps conn_reuse_mode as it is (5.9+), and no strictARP was asked for."""
    assert node["sysctls_set"] == {
        "net.ipv4.ip_forward",
        "net.ipv4.vs.conntrack",
        "net.ipv4.vs.expire_nodest_conn",
        "net.ipv4.vs.expire_quiescent_template",
    }
    doc = json.loads(node["audit"].stdout)
    notes = {n["name"]: n for n in doc["sysctl_notes"]}
    assert {n for n, v in notes.items() if v["set_by_ipvs_mode"]} == node["sysctls_set"]
    assert notes["net.ipv4.vs.conntrack"]["note"].startswith(
        "the value ipvs mode sets (sysctlVSConnTrack, pkg/proxy/ipvs/proxier.go NewProxier); "
        "left alone"
    )


def test_upstream_signals_reach_the_audit_and_verify(node: dict[str, Any]) -> None:
    kp = json.loads(node["audit"].stdout)["kube_proxy"]
    assert kp["ipvs_feature_gate"] == {"value": 1.0, "stage": "DEPRECATED"}
    assert kp["configz"]["node_port_addresses"] == [NODE_PORT_CIDR]
    r = node["verify"]
    assert r.rc == 0, r.stdout + r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["ip-forward"]["status"] == "warn"
    assert checks["ip-forward"]["evidence"][0].startswith(
        "net.ipv4.ip_forward = 1, the value ipvs mode sets (sysctlForward"
    )
    assert {c["status"] for n, c in checks.items() if n != "ip-forward"} == {"pass"}
