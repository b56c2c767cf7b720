"""The nodes of the real-kube-proxy tier: which releases each runs and which scenarios.

Scenarios (tests/realkp/pipeline.py):
  B  nftables mode started where ipvs mode ran, its start-up cleanup of ipvs mode's state did
     not happen: from v1.34 it arises by itself when kube-proxy's PATH has no `modprobe` (the
     cleanup returns at once when `modprobe -va ip_vs` fails); before, the state is put back.
  A  nftables mode started where ipvs mode ran, its start-up cleanup done.
  T  A's leftovers again, with the Node tainted ToBeDeletedByClusterAutoscaler (from v1.33
     /healthz answers 503 then, /livez does not).
  C  ipvs mode, then iptables mode, then nftables mode with the cleanup failed.
  U  the upgrade: ipvs mode on the release before, nftables mode on this one (a cluster that
     upgrades and switches mode in one go).

The newest release runs the whole matrix (both iptables backends x IPv4-only and dual-stack),
each older release A and B on both backends, dual-stack: the costs of the tier under software
emulation decide how many nodes one VM boot can run (README "Decisions"). The older releases'
legacy-backend nodes carry the other node shapes (tests/realkp/shapes.py), one node each, and
talk to a kube-apiserver their version-skew policy allows other than the newest (kube-proxy
may be up to three minors older than the API server, never newer): v1.34.4 and v1.35.4 to
v1.35.4.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.realkp.node import NodeNet
from tests.realkp.shapes import Shape

NEWEST = "v1.37.2"
OLDER = ("v1.34.4", "v1.35.4", "v1.36.3")
RELEASES = (*OLDER, NEWEST)
APISERVERS = ("v1.35.4", NEWEST)  # the kube-apiserver releases scripts/build-upstream builds


def minor(version: str) -> tuple[int, int]:
    major, mnr = version.lstrip("v").split(".")[:2]
    return int(major), int(mnr)


@dataclass(frozen=True)
class NodeSpec:
    net: NodeNet
    release: str  # kube-proxy's release in nftables (and iptables) mode
    scenarios: tuple[str, ...]
    ipvs_release: str = ""  # ipvs mode's release when it differs (U)
    apiserver: str = NEWEST  # the node's kube-apiserver release
    shape: Shape = Shape()

    @property
    def ns(self) -> str:
        return self.net.ns

    @property
    def ipvs_on(self) -> str:
        return self.ipvs_release or self.release

    def at_least(self, version: str) -> bool:
        return minor(self.release) >= minor(version)


def _tag(version: str) -> str:
    return "".join(str(n) for n in minor(version))


def _nodes() -> list[NodeSpec]:
    t = _tag(NEWEST)
    nodes = [
        NodeSpec(NodeNet(0, "legacy", False, t), NEWEST, ("B", "A", "C")),
        NodeSpec(NodeNet(1, "legacy", True, t), NEWEST, ("B", "A", "C")),
        # an IPv4-only node without IPv6: from v1.34 no `ip6 kube-proxy` table at all
        NodeSpec(NodeNet(2, "nft", False, t, ipv6=False), NEWEST, ("B", "A", "C")),
        NodeSpec(NodeNet(3, "nft", True, t), NEWEST, ("B", "A", "T", "C")),
    ]
    for i, version in enumerate(OLDER):
        nodes.append(NodeSpec(NodeNet(4 + i, "nft", True, _tag(version)), version, ("B", "A")))
    # Both backends for every release; the legacy ones carry the other shapes: no `ipset` on
    # nftables mode's PATH; kubeadm's (a --config file in kube-proxy's own root, strictARP,
    # nodePortAddresses unset); an IPv6-only node.
    kubeadm = Shape(kubeadm=True, strict_arp=True, pinned_node_ports=False)
    for i, (version, apiserver, shape, ipv4) in enumerate(
        (
            ("v1.34.4", "v1.35.4", Shape(ipset=False), True),
            ("v1.35.4", "v1.35.4", kubeadm, True),
            ("v1.36.3", NEWEST, Shape(), False),
        )
    ):
        net = NodeNet(8 + i, "legacy", ipv4, _tag(version) + shape.tag, ipv4=ipv4)
        nodes.append(NodeSpec(net, version, ("B", "A"), apiserver=apiserver, shape=shape))
    before = OLDER[-1]
    nodes.append(
        NodeSpec(
            NodeNet(7, "nft", True, f"{_tag(before)}to{t}"), NEWEST, ("U",), ipvs_release=before
        )
    )
    return nodes


NODES = _nodes()
BY_NS = {n.ns: n for n in NODES}
# Nodes a test file runs on its own, outside the session run (each with a control plane of its
# own: an API server's objects are made once, `kubectl create`). tests/realkp/test_lost_evidence.py.
SOLO = (NodeNet(20, "nft", False, f"{_tag(NEWEST)}lost", ipv6=False),)
