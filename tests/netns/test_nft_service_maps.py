"""The nftables reader reads the keys of kube-proxy's service maps in both families
(docs/contract.md#ownership): `ipvX_addr . inet_proto . inet_service` and
`inet_proto . inet_service`, as kube-proxy declares them (pkg/proxy/nftables/proxier.go),
written here with `nft` in a namespace. Real kube-proxy's IPv4 table: tests/realkp."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.netns

TABLES = """
table ip kube-proxy {
  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict
    elements = { 10.96.0.1 . tcp . 443 : drop, 203.0.113.10 . udp . 53 : drop } }
  map no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict
    elements = { 10.96.4.80 . tcp . 80 : drop } }
  map service-nodeports { type inet_proto . inet_service : verdict
    elements = { tcp . 30080 : drop } }
  map no-endpoint-nodeports { type inet_proto . inet_service : verdict; }
}
table ip6 kube-proxy {
  map service-ips { type ipv6_addr . inet_proto . inet_service : verdict
    elements = { fd00:96::8 . tcp . 80 : drop } }
  map no-endpoint-nodeports { type inet_proto . inet_service : verdict
    elements = { sctp . 30082 : drop } }
}
table ip other {
  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict
    elements = { 10.96.9.9 . tcp . 80 : drop } }
}
"""
READ = (
    "import json\n"
    "from agent.readers import nftables\n"
    "r = nftables.read(False, services=True)\n"
    "print(json.dumps({f'{t.family} {t.name}': [sorted(t.services), sorted(t.node_ports)]"
    " for t in r.data}))\n"
)


def test_the_keys_of_both_families_maps_are_read(netns: Callable[[], str]) -> None:
    ns = netns()
    subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "-f", "-"], input=TABLES, text=True, check=True
    )
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", READ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) == {
        "ip kube-proxy": [
            [["10.96.0.1", "tcp", 443], ["10.96.4.80", "tcp", 80], ["203.0.113.10", "udp", 53]],
            [["tcp", 30080]],
        ],
        "ip6 kube-proxy": [[["fd00:96::8", "tcp", 80]], [["sctp", 30082]]],
        "ip other": [[], []],  # not kube-proxy's table: never read
    }
