"""Apply a rendered Node inside a network namespace with the tools an operator would use."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

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
    """Delete the namespace; a missing one is fine.

    A process left in it is killed first: the namespace lives on while one runs (a churn
    loop killed by its shell's pid kept its pipeline's children changing IPVS through every
    later test). Its IPVS table is flushed while it still exists: the kernel frees a dying
    namespace's services later, one by one, in the one table every namespace shares, and
    each removal shifts another namespace's service dump (ipvsadm's and the agent's) under
    it."""
    if name not in run(["ip", "netns", "list"]).split():
        return
    _kill_all(run(["ip", "netns", "pids", name]).split())
    run(in_ns(name, "sh", "-c", "test ! -e /proc/net/ip_vs || ipvsadm -C"))
    run(["ip", "netns", "del", name])


def _kill_all(pids: list[str], timeout: float = 10.0) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise LabError(f"processes {' '.join(pids)} outlived SIGKILL for {timeout:.0f}s")
        time.sleep(0.05)


def _running(pid: str) -> bool:
    """Not gone and not a zombie (a child of the test's own that nobody waited for yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


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
    _wait_settled(netns, (NODE_LINK, NODE_PEER))


def _wait_settled(netns: str, links: tuple[str, ...], timeout: float = 30.0) -> None:
    """Until the kernel has finished bringing the links up: the veth carrier and each link's
    IPv6 link-local address past duplicate address detection. Both come a moment after `ip
    link set up`, later under load; a test that dumped the node before then saw them appear
    between its two dumps and blamed the agent."""
    deadline = time.monotonic() + timeout
    sysctl = "net.ipv6.conf.{}.disable_ipv6"
    v6 = tuple(
        link
        for link in links
        if run(in_ns(netns, "sysctl", "-n", sysctl.format(link))).strip() == "0"
    )
    while True:
        shown = json.loads(run(["ip", "-n", netns, "-j", "address", "show"]))
        pending = _unsettled(shown, links, v6)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise LabError(f"links of {netns} not settled after {timeout:.0f}s: {pending}")
        time.sleep(0.05)


def _unsettled(
    shown: list[dict[str, Any]], links: tuple[str, ...], v6: tuple[str, ...]
) -> list[str]:
    """What is still coming of these links in `ip -j address show`'s answer (a link-local
    address only on the links `v6` names: IPv6 is disabled on the others)."""
    pending = []
    for link in shown:
        if link.get("ifname") not in links:
            continue
        if link.get("operstate") != "UP":
            pending.append(f"{link['ifname']} {link.get('operstate')}")
        if link["ifname"] not in v6:
            continue
        local = [a for a in link.get("addr_info", []) if a.get("scope") == "link"]
        local6 = [a for a in local if a.get("family") == "inet6"]
        if not local6 or any(a.get("tentative") for a in local6):
            pending.append(f"{link['ifname']} link-local address")
    return pending


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
