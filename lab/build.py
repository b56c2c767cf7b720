"""Apply a rendered Node inside a network namespace with the tools an operator would use."""

from __future__ import annotations

import subprocess

from lab import render
from lab.model import Node, family_of

NODE_LINK = "eth0"
# The peer stays in the same namespace: it only gives eth0 a carrier (no dummy driver here).
NODE_PEER = "eth0-peer"

_RESTORE = {
    ("legacy", "ipv4"): "iptables-legacy-restore",
    ("legacy", "ipv6"): "ip6tables-legacy-restore",
    ("nft", "ipv4"): "iptables-nft-restore",
    ("nft", "ipv6"): "ip6tables-nft-restore",
}


class LabError(RuntimeError):
    pass


def run(args: list[str], stdin: str | None = None) -> str:
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def in_ns(netns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", netns, *args]


def create_netns(name: str) -> None:
    """Create an empty namespace with lo up; refuses a name that already exists."""
    run(["ip", "netns", "add", name])
    run(["ip", "-n", name, "link", "set", "lo", "up"])


def delete_netns(name: str) -> None:
    """Delete the namespace; a missing one is fine."""
    existing = run(["ip", "netns", "list"]).split()
    if name in existing:
        run(["ip", "netns", "del", name])


def build(netns: str, node: Node) -> None:
    """Build node's state in an existing namespace, in the order a real node acquires it."""
    _node_link(netns, node)
    _sysctls(netns, node)
    ipsets = render.ipset_restore(node)
    if ipsets:
        run(in_ns(netns, "ipset", "restore", "-exist"), ipsets)
    for family in node.families:
        tables = render.iptables_restore(node, family)
        if tables:
            binary = _RESTORE[(node.backend, family)]
            run(in_ns(netns, binary, "-w", "10", "--noflush"), "".join(tables.values()))
    batch = render.ip_batch(node)
    if batch:
        run(["ip", "-n", netns, "-batch", "-"], batch)
    if node.with_ipvs:
        _real_server_routes(netns, node)
        ipvs = render.ipvsadm_restore(node)
        if ipvs:
            run(in_ns(netns, "ipvsadm", "-R"), ipvs)
    script = render.nft_script(node)
    if script:
        run(in_ns(netns, "nft", "-f", "-"), script)


def _node_link(netns: str, node: Node) -> None:
    ip = ["ip", "-n", netns]
    run([*ip, "link", "add", NODE_LINK, "type", "veth", "peer", "name", NODE_PEER])
    for cidr in node.node_ips:
        extra = ["nodad"] if family_of(cidr) == "ipv6" else []
        run([*ip, "address", "add", cidr, "dev", NODE_LINK, *extra])
    run([*ip, "link", "set", NODE_PEER, "up"])
    run([*ip, "link", "set", NODE_LINK, "up"])


def _sysctls(netns: str, node: Node) -> None:
    values: dict[str, str] = {}
    if node.ipvs_leftovers:
        values["net.ipv4.ip_forward"] = "1"
        if node.with_ipvs:  # these exist only once ip_vs is loaded
            values.update(
                {
                    "net.ipv4.vs.conntrack": "1",
                    "net.ipv4.vs.expire_nodest_conn": "1",
                    "net.ipv4.vs.expire_quiescent_template": "1",
                }
            )
    if node.strict_arp:
        values.update({"net.ipv4.conf.all.arp_ignore": "1", "net.ipv4.conf.all.arp_announce": "2"})
    for key, value in values.items():
        run(in_ns(netns, "sysctl", "-q", "-w", f"{key}={value}"))


def _real_server_routes(netns: str, node: Node) -> None:
    # IPVS refuses real servers without a unicast route ("address not unicast").
    for cidr in (*node.pod_cidrs, *node.extra_routes):
        if family_of(cidr) in node.families:
            run(["ip", "-n", netns, "route", "replace", cidr, "dev", NODE_LINK])
