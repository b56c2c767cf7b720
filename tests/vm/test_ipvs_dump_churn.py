"""IPVS's service dump while another namespace changes IPVS, on Debian's kernel in the VM.

The kernel keeps one service table for every namespace and resumes a multi-part dump by
position in that whole table (ip_vs_genl_dump_services counts every namespace's services),
and IPVS never flags an interrupted dump (no NLM_F_DUMP_INTR). So a service added or removed
anywhere between two parts of the dump shifts the position: this namespace's dump skips a
service or lists one twice, and says nothing. The real-kube-proxy tier saw an audit list 30
of a node's 32 virtual servers while other nodes' kube-proxies were changing theirs.

/proc/net/ip_vs resumes each 4 KiB page the same way: under the same churn, a static
namespace of 120 services read 62-119 of them in every one of 80 reads (2026-12-07), and that
file is what `audit`, serve's scrapes, restore's check and the cleanup's drain wait read.
Every listing is now held against a second listing and the kernel's count of the
namespace's IPv4 services, and the drain asks netlink by key for a service /proc skipped.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
from collections.abc import Callable, Iterator

import pytest

from lab import build

pytestmark = pytest.mark.vm
SERVICES = 150  # a fresh socket's dump parts hold ~13 services: this one is ~12 parts
READS = 300


@pytest.fixture
def churning(netns: Callable[[], str]) -> Iterator[str]:
    """A namespace whose IPVS table changes all the time, as other nodes' do in the lab."""
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr"], check=True)
    ns = netns()
    # One long-lived `ipvsadm -R` fed a steady stream of adds and deletes: changes at any
    # moment, thousands a second (a process per change met a dump once in 300 reads).
    loop = (
        "while :; do for i in $(seq 1 40); do "
        "echo -A -t 10.99.0.$i:80 -s rr; echo -D -t 10.99.0.$i:80; done; done | ipvsadm -R"
    )
    # its own process group: killing the shell alone left the pipeline's two children
    # changing IPVS through every later test
    proc = subprocess.Popen(["ip", "netns", "exec", ns, "sh", "-c", loop], start_new_session=True)
    try:
        yield ns
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _static(netns: Callable[[], str]) -> str:
    ns = netns()
    rules = "".join(
        f"-A -t 10.{96 + i // 250}.{i % 250}.1:80 -s rr\n-a -t 10.{96 + i // 250}.{i % 250}.1:80 "
        f"-r 10.244.0.{1 + i % 200}:8080 -m\n"
        for i in range(SERVICES)
    )
    subprocess.run(["ip", "netns", "exec", ns, "ipvsadm", "-R"], input=rules.encode(), check=True)
    return ns


def _reads(ns: str, read: str, reads: int = READS, setup: str = "") -> dict[object, int]:
    """How many services each of `reads` calls of `read` returned (or its error)."""
    code = (
        "import collections\n"
        "from agent.readers import ipvs\n"
        "seen = collections.Counter()\n"
        f"{setup}"
        f"for _ in range({reads}):\n"
        "    try:\n"
        f"        r = {read}\n"
        "    except ValueError as exc:\n"
        "        seen[str(exc)] += 1\n"
        "        continue\n"
        "    if isinstance(r, dict):  # connections: the services, and their sum\n"
        "        seen[(len(r), sum(a + i for a, i in r.values()))] += 1\n"
        "    else:\n"
        "        seen[len(r.data) if r.status == 'ok' else r.error] += 1\n"
        "print(dict(seen))\n"
    )
    out = build.run(["ip", "netns", "exec", ns, "python", "-c", code]).strip()
    return ast.literal_eval(out)  # type: ignore[no-any-return]


def test_every_read_lists_exactly_the_services_of_its_namespace(
    netns: Callable[[], str], churning: str
) -> None:
    seen = _reads(_static(netns), "ipvs.read()")
    # Every read the reader returns is exact; a read it cannot make consistent says so.
    assert all(k == SERVICES or isinstance(k, str) for k in seen), seen
    assert seen.get(SERVICES, 0) >= READS * 0.9, seen


@pytest.fixture
def five_syncing(netns: Callable[[], str]) -> Iterator[None]:
    """Five namespaces that add twenty services and then delete them, a process a change, as
    five nodes' kube-proxies syncing: what made /proc/net/ip_vs skip services (the stream
    above, an add and its delete at once, never did)."""
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr"], check=True)
    loop = (
        "k=0; while :; do k=$((k % 200 + 1)); "
        "for i in $(seq 1 20); do ipvsadm -A -t 10.$k.2.$i:80 -s rr; done; "
        "for i in $(seq 1 20); do ipvsadm -D -t 10.$k.2.$i:80; done; done"
    )
    procs = [
        subprocess.Popen(
            ["ip", "netns", "exec", netns(), "sh", "-c", loop],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(5)
    ]
    try:
        yield
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _mixed(netns: Callable[[], str]) -> str:
    """120 services as a node has them: TCP with two real servers, UDP, IPv6 (15 KB of
    /proc/net/ip_vs, four pages); one connection through each UDP service (a datagram sent
    from the namespace: IPVS makes the entry at LOCAL_OUT, the dummy link drops the packet),
    kept for 900 s, so that a count read as none shows."""
    ns = netns()
    for cmd in (
        "ip link add d0 type dummy",
        "ip addr add 10.9.0.1/16 dev d0",
        "ip addr add fd00:9::1/64 dev d0 nodad",
        "ip link set d0 up",
        "ip route add default dev d0",
    ):
        subprocess.run(["ip", "-n", ns, *cmd.split()[1:]], check=True)
    rules = "".join(
        f"-A -t 10.1.0.{i}:80 -s rr\n-a -t 10.1.0.{i}:80 -r 10.9.9.9:80 -m\n"
        f"-a -t 10.1.0.{i}:80 -r 10.9.9.10:80 -m\n"
        f"-A -u 10.1.1.{i}:514 -s rr\n-a -u 10.1.1.{i}:514 -r 10.9.9.9:514 -m\n"
        f"-A -t [fd00:96::{i}]:8080 -s rr\n-a -t [fd00:96::{i}]:8080 -r [fd00:9::9]:80 -m\n"
        for i in range(1, 41)
    )
    subprocess.run(["ip", "netns", "exec", ns, "ipvsadm", "-R"], input=rules.encode(), check=True)
    send = "ipvsadm --set 0 0 900; for i in $(seq 1 40); do echo x > /dev/udp/10.1.1.$i/514; done"
    subprocess.run(["ip", "netns", "exec", ns, "bash", "-c", send], check=True)
    return ns


@pytest.mark.parametrize(
    ("read", "whole"),
    [
        ("ipvs.read(detail=False)", 120),  # audit, serve's scrapes, restore's check
        # the cleanup's drain wait: every service, and the 40 UDP connections
        ("ipvs.connections_of(svcs)", (120, 40)),
    ],
)
def test_every_proc_read_is_exact_or_says_it_could_not_be(
    netns: Callable[[], str], five_syncing: None, read: str, whole: object
) -> None:
    # the drain wait's services: the plan's, from a checked read
    setup = (
        "svcs = next(r.data for r in (ipvs.read() for _ in range(20)) if r.status == 'ok')\n"
        "assert len(svcs) == 120, len(svcs)\n"
    )
    seen = _reads(_mixed(netns), read, reads=100, setup=setup)
    assert all(k == whole or isinstance(k, str) for k in seen), seen
    # exact or an error, always; and mostly read: 89 of 100 summaries (11 gave up after four
    # attempts) with five namespaces syncing and another VM beside this one (2026-12-07)
    assert seen.get(whole, 0) >= 75, seen
