"""The bundle's ipvsadm.rules is printed from the reading, byte-equal to `ipvsadm -S -n`,
and `ipvsadm -R` of it gives the same table back."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable

import pytest

from lab import build

pytestmark = pytest.mark.vm
MODULES = ("ip_vs", "ip_vs_rr", "ip_vs_wlc", "ip_vs_sh", "ip_vs_pe_sip", "dummy")

# Every shape the printer claims: families, protocols, fwmarks, persistence with masks,
# a persistence engine, one-packet scheduling, scheduler flags, weights, every forwarding
# method with each tunnel type.
SHAPES = """\
-A -t 10.96.0.1:443 -s rr
-a -t 10.96.0.1:443 -r 10.244.1.5:6443 -m -w 1
-a -t 10.96.0.1:443 -r 10.244.0.3:6443 -m -w 3
-a -t 10.96.0.1:443 -r 192.168.7.9:6443 -m -w 0
-A -u 10.96.0.10:53 -s rr -p 10800
-a -u 10.96.0.10:53 -r 10.244.0.4:53 -m -w 1
-A -t 192.168.1.10:30080 -s wlc -p 300 -M 255.255.255.0
-a -t 192.168.1.10:30080 -r 10.244.0.5:8080 -g -w 2
-a -t 192.168.1.10:30080 -r 10.244.0.6:8080 -i -w 1 --tun-type ipip
-a -t 192.168.1.10:30080 -r 10.244.0.7:8080 -i -w 1 --tun-type gue --tun-port 6080 --tun-csum
-a -t 192.168.1.10:30080 -r 10.244.0.8:8080 -i -w 1 --tun-type gre --tun-nocsum
-a -t 192.168.1.10:30080 -r 10.244.0.9:8080 -i -w 1 --tun-type gue --tun-port 6081 --tun-remcsum
-A --sctp-service 172.16.0.5:9000 -s rr
-a --sctp-service 172.16.0.5:9000 -r 10.244.0.10:9000 -m -w 1
-A -t 203.0.113.5:80 -s sh -b sh-fallback,sh-port
-A -u 10.96.0.21:5060 -s rr -p 60 --pe sip
-A -u 10.96.0.22:5061 -s rr -o
-A -t [fd00:96::1]:443 -s rr
-a -t [fd00:96::1]:443 -r [fd00:10::4]:443 -m -w 1
-a -t [fd00:96::1]:443 -r [fd00:10::3]:443 -m -w 1
-A -u [fd00:96::a]:53 -s rr -p 60 -M 64
-A -f 100 -s rr
-a -f 100 -r 10.244.0.9:0 -g -w 1
-A -f 200 -6 -s rr
-A -f 2000000000 -s rr
"""


def _wrapping_services(n: int) -> str:
    """Services and real servers 2^31 or more apart: ipvsadm's comparator wraps there."""
    rnd = random.Random(15)
    lines = []
    for i in range(n):
        vip = f"{rnd.choice((10, 172, 192, 203))}.{rnd.randrange(256)}.{rnd.randrange(256)}.{i % 250 + 1}"
        key = f"-t {vip}:{rnd.randrange(1, 65536)}"
        lines.append(f"-A {key} -s rr")
        for _ in range(rnd.randrange(4)):
            rs = f"{rnd.choice((10, 192))}.{rnd.choice((244, 168))}.{rnd.randrange(256)}.{rnd.randrange(1, 255)}"
            lines.append(f"-a {key} -r {rs}:{rnd.randrange(1, 65536)} -m -w {rnd.randrange(5)}")
    return "".join(f"{line}\n" for line in lines)


# Run in the node: every generic-netlink request the agent makes is listed in `dumps`.
COUNTING = """\
from agent.readers import netlink
dumps = []
request = netlink.GenericNetlink.request
def counting(self, msg_type, cmd, version, body, dump=True):
    dumps.append(cmd)
    return request(self, msg_type, cmd, version, body, dump)
netlink.GenericNetlink.request = counting
"""

PRINT = (
    COUNTING
    + """\
import sys
from agent.cleanup.backup import ipvsadm_rules
from agent.readers.ipvs_wire import CMD_GET_DEST
from agent.cleanup.ipvsadm_save import supported
from agent.readers import ipvs
services = ipvs.read().data
# the read counts real servers in /proc/net/ip_vs: not one destination dump
assert dumps.count(CMD_GET_DEST) == 0, dumps.count(CMD_GET_DEST)
text = ipvsadm_rules(list(services))
# the bundle takes real servers from /proc/net/ip_vs; only the one service with tunnels
# (whose type, port and flags /proc does not list) is dumped over netlink
assert dumps.count(CMD_GET_DEST) == 1, dumps.count(CMD_GET_DEST)
with ipvs.RealServers() as servers:
    unsupported = [s.key for s in services if not supported(s, servers)]
assert not unsupported, unsupported
sys.stdout.write(text)
"""
)


def _node(netns: Callable[[], str]) -> str:
    subprocess.run(["modprobe", "-a", *MODULES], check=True)
    ns = netns()
    # real servers need a unicast route
    for cmd in (
        "ip link add rs0 type dummy",
        "ip link set rs0 up",
        "ip route add 10.0.0.0/8 dev rs0",
        "ip route add 192.168.0.0/16 dev rs0",
        "ip -6 route add fd00::/8 dev rs0",
    ):
        subprocess.run(build.in_ns(ns, *cmd.split()), check=True)
    return ns


def _ipvsadm(ns: str, *args: str, stdin: str | None = None) -> str:
    p = subprocess.run(
        build.in_ns(ns, "ipvsadm", *args), input=stdin, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize("wrapping", [0, 300], ids=["shapes", "shapes+wrapping"])
def test_printed_rules_equal_ipvsadm_save_and_restore_back(
    netns: Callable[[], str], wrapping: int
) -> None:
    ns = _node(netns)
    _ipvsadm(ns, "-R", stdin=SHAPES + _wrapping_services(wrapping))
    want = _ipvsadm(ns, "-S", "-n")
    p = subprocess.run(build.in_ns(ns, sys.executable, "-c", PRINT), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout == want
    assert want.count("\n") > (300 if wrapping else 20)
    _ipvsadm(ns, "-C")
    _ipvsadm(ns, "-R", stdin=p.stdout)
    assert _ipvsadm(ns, "-S", "-n") == want


LOAD = """
import sys
from agent.cleanup import ipvsadm_rules
from agent.readers.netlink import NetlinkError
requests = ipvsadm_rules.parse(sys.stdin.read())
assert requests is not None, "a line ipvsadm_rules does not know"
try:
    ipvsadm_rules.load(requests)
except NetlinkError as exc:
    sys.exit(f"refused: {exc}")
print(len(requests.services), len(requests.dests))
"""


def test_netlink_load_gives_the_table_ipvsadm_restore_gives(netns: Callable[[], str]) -> None:
    """restore's batched load: every shape but tunnels (those go to `ipvsadm -R`)."""
    text = "".join(
        line for line in (SHAPES + _wrapping_services(300)).splitlines(True) if " -i " not in line
    )
    ns = _node(netns)
    _ipvsadm(ns, "-R", stdin=text)
    want = _ipvsadm(ns, "-S", "-n")
    _ipvsadm(ns, "-C")
    load = build.in_ns(ns, sys.executable, "-c", LOAD)
    p = subprocess.run(load, input=text, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    services = sum(1 for line in text.splitlines() if line.startswith("-A "))
    assert p.stdout.split() == [str(services), str(text.count("\n") - services)]
    assert _ipvsadm(ns, "-S", "-n") == want
    # loading it again is refused at its first line, which the message names
    p = subprocess.run(load, input=text, capture_output=True, text=True)
    first = text.splitlines()[0]
    assert (p.returncode, p.stderr.strip()) == (1, f"refused: [Errno 17] {first}: File exists")


DELETE = """
import sys
from agent.cleanup.executor import execute
from agent.cleanup.plan import DeleteService
from agent.readers import ipvs
services = sorted(ipvs.read().data, key=lambda s: s.port)
doomed = services[:200] + services[:1]  # the repeated one is gone by then
steps = tuple(DeleteService(s.key, (), s) for s in doomed)
print(" ".join(o.result for o in execute(steps, lambda o: None)))
"""


def test_batched_deletions_answer_each_service_and_touch_no_other(
    netns: Callable[[], str],
) -> None:
    subprocess.run(["modprobe", "-a", *MODULES], check=True)
    ns = netns()
    _ipvsadm(ns, "-R", stdin="".join(f"-A -t 10.96.0.1:{p} -s rr\n" for p in range(1, 301)))
    p = subprocess.run(
        build.in_ns(ns, sys.executable, "-c", DELETE), capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["done"] * 200 + ["gone"]
    left = _ipvsadm(ns, "-S", "-n").splitlines()
    assert left == [f"-A -t 10.96.0.1:{p} -s rr" for p in range(201, 301)]


SUMMARY = (
    COUNTING
    + """\
import json, sys
from agent.readers import ipvs
from agent.readers.ipvs_wire import CMD_GET_SERVICE
def fields(services):
    return sorted(
        [s.family, s.protocol, s.address, s.port, s.fwmark, s.scheduler, s.flags, len(s.dests)]
        for s in services
    )
summary = ipvs.read(detail=False)
summary_dumps = dumps.count(CMD_GET_SERVICE)
full = ipvs.read()
assert summary.status == full.status == "ok", (summary.error, full.error)
json.dump({"summary": fields(summary.data), "full": fields(full.data), "dumps": summary_dumps},
          sys.stdout)
"""
)


@pytest.mark.parametrize("fwmark", [False, True], ids=["addresses", "with-fwmark"])
def test_the_scrape_reads_the_services_proc_lists_as_netlink_does(
    netns: Callable[[], str], fwmark: bool
) -> None:
    """serve's scrapes and audit read the virtual servers from /proc/net/ip_vs: every field
    the metrics, the classifier and the report use and every real-server count equal
    netlink's, with one service dump (it vouches for /proc, which skips services while other
    namespaces change IPVS: README, Decisions) and no real-server dump; a fwmark service (no
    family in /proc) sends the read to the checked netlink read (two service dumps)."""
    import json

    ns = _node(netns)
    shapes = [line for line in SHAPES.splitlines() if fwmark or " -f " not in line]
    _ipvsadm(ns, "-R", stdin="\n".join(shapes) + "\n" + _wrapping_services(300))
    p = subprocess.run(
        build.in_ns(ns, sys.executable, "-c", SUMMARY), capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)

    # flags: netlink's as the kernel keeps them, /proc's from its words (hashed, persistent,
    # one-packet); the sh scheduler's own flags are not in /proc
    def comparable(rows: list[list[object]]) -> list[list[object]]:
        return [[*r[:6], int(r[6]) & 0x7, r[7]] for r in rows]  # type: ignore[call-overload]

    assert comparable(got["summary"]) == comparable(got["full"])
    assert len(got["full"]) == 300 + (12 if fwmark else 9)
    assert got["dumps"] == (2 if fwmark else 1)
