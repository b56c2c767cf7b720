"""restore attacked through the sets, the link, IPVS lines and kube-ipvs0's addresses: each
refusal one line, exit 4, nothing changed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from tests.dumps import dump
from tests.netns.restore_lab import add_step, cleaned, edit, refused

pytestmark = pytest.mark.netns


# --- sets, link, IPVS and sysctls beyond what cleanup removed -----------------------------


@pytest.mark.parametrize(
    "change",
    [
        "destroy FOREIGN-SET\n",
        "flush KUBE-CLUSTER-IP\n",
        "add FOREIGN-SET 10.1.2.3\n",
        "create FOREIGN-SET hash:ip family inet hashsize 1024 maxelem 65536\n",
        "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n",
        "-exist\n",
    ],
)
def test_hostile_ipset_lines_are_refused(
    netns: Callable[[], str], tmp_path: Path, change: str
) -> None:
    with cleaned(netns, tmp_path) as c:
        edit(c.bundle, "ipset.save", lambda t: t + change)
        refused(c, c.restore(), "ipset.save")


@pytest.mark.parametrize(
    "doc",
    [
        {"name": "lo", "index": 1, "kind": "dummy", "up": True, "addresses": ["10.9.9.9/32"]},
        {"name": "kube-ipvs0", "index": 99, "kind": "bridge", "up": True, "addresses": []},
        {
            "name": "kube-ipvs0",
            "index": 99,
            "kind": "dummy",
            "up": True,
            "addresses": ["0.0.0.0/0"],
        },
        {"name": "kube-ipvs0", "index": 99, "kind": "dummy", "up": True, "addresses": ["x"]},
    ],
)
def test_a_link_other_than_kube_ipvs0_is_refused(
    netns: Callable[[], str], tmp_path: Path, doc: dict[str, object]
) -> None:
    with cleaned(netns, tmp_path) as c:
        add_step(
            c.bundle,
            {
                "action": "delete-link",
                "target": "kube-ipvs0",
                "removes": {"link": str(doc["name"])},
            },
        )
        edit(c.bundle, "kube-ipvs0.json", lambda _: json.dumps(doc))
        refused(c, c.restore(), "kube-ipvs0.json")
        links = build.run(["ip", "netns", "exec", c.ns, "ip", "-o", "link"])
        assert "kube-ipvs0" not in links and "10.9.9.9" not in dump(c.ns)["addresses"]


@pytest.mark.parametrize(
    ("address", "in_plan", "said"),
    [
        ("192.168.50.1/32", False, "192.168.50.1/32 is not a Service IP plan.json recorded"),
        ("192.168.50.1/32", True, "192.168.50.1/32 is the next hop of a route"),
        ("192.168.50.4/32", True, "192.168.50.4/32 is the next hop of a route"),
        ("fd00:50::1/128", True, "fd00:50::1/128 is the next hop of a route"),
        ("192.168.50.10/32", True, "192.168.50.10/32 is an address of link"),
    ],
    ids=["not-recorded", "gateway", "multipath-hop", "ipv6-gateway", "node-address"],
)
def test_a_kube_ipvs0_address_the_node_uses_elsewhere_is_refused(
    netns: Callable[[], str], tmp_path: Path, address: str, in_plan: bool, said: str
) -> None:
    """Any /32 went onto kube-ipvs0, the node's gateway or its own address included: the node
    then answers it itself and is cut off. Now only a Service IP plan.json recorded on
    kube-ipvs0 is accepted, and none the node has on another link or routes through."""
    with cleaned(netns, tmp_path) as c:
        ip = ["ip", "-n", c.ns]
        build.run([*ip, "route", "add", "default", "via", "192.168.50.1"])
        hops = ["nexthop", "via", "192.168.50.3", "nexthop", "via", "192.168.50.4"]
        build.run([*ip, "route", "add", "10.50.0.0/16", *hops])
        build.run([*ip, "-6", "route", "add", "default", "via", "fd00:50::1"])
        recorded = ["10.96.0.1/32", address] if in_plan else ["10.96.0.1/32"]
        add_step(
            c.bundle,
            {
                "action": "delete-link",
                "target": "kube-ipvs0",
                "removes": {"link": "kube-ipvs0", "addresses": recorded},
            },
        )
        doc = {"name": "kube-ipvs0", "index": 99, "kind": "dummy", "up": True}
        edit(c.bundle, "kube-ipvs0.json", lambda _: json.dumps({**doc, "addresses": [address]}))
        refused(c, c.restore(), "kube-ipvs0.json", said)
        assert "kube-ipvs0" not in build.run(["ip", "netns", "exec", c.ns, "ip", "-o", "link"])


@pytest.mark.parametrize(
    "line",
    ["-C", "-D -t 10.96.0.1:443", "-E -t 10.96.0.1:443 -s rr", "-A -t 10.96.0.1:443 -s rr\n-C"],
)
def test_ipvsadm_lines_other_than_adds_never_reach_ipvsadm(
    netns: Callable[[], str], tmp_path: Path, line: str
) -> None:
    with cleaned(netns, tmp_path) as c:
        add_step(
            c.bundle,
            {
                "action": "delete-ipvs-service",
                "target": "TCP/10.96.0.1/443",
                "removes": {"ipvs_service": "-t 10.96.0.1:443"},
            },
        )
        edit(c.bundle, "ipvsadm.rules", lambda _: line + "\n")
        refused(c, c.restore(), "ipvsadm.rules")
