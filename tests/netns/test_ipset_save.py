"""The bundle's ipset.save is written from netlink, byte-equal to what `ipset save` prints."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from agent.cleanup.backup import filter_ipset_save
from lab import build

pytestmark = pytest.mark.netns

# Every shape the printer claims: kube-proxy's types and create options, both families,
# all protocols, prefixes, bitmap ranges, timeouts, counters and comments, a set whose members
# span several netlink messages; plus shapes it hands to `ipset save` (skbinfo, forceadd).
SETS = """\
create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
add KUBE-CLUSTER-IP 10.96.0.10,udp:53
add KUBE-CLUSTER-IP 10.96.0.11,sctp:9000
create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
add KUBE-NODE-PORT-TCP 30080
add KUBE-NODE-PORT-TCP 31000
create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536
add KUBE-LOOP-BACK 10.244.0.3,tcp:80,10.244.0.3
create KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net family inet hashsize 1024 maxelem 65536
add KUBE-LOAD-BALANCER-SOURCE-CIDR 192.0.2.5,tcp:80,198.51.100.0/24
add KUBE-LOAD-BALANCER-SOURCE-CIDR 192.0.2.5,tcp:80,198.51.100.7/32
create KUBE-6-CLUSTER-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536
add KUBE-6-CLUSTER-IP fd00:96::1,tcp:443
add KUBE-6-CLUSTER-IP ::ffff:10.1.2.3,udp:53
create KUBE-6-LB-SOURCE-CIDR hash:ip,port,net family inet6 hashsize 1024 maxelem 65536
add KUBE-6-LB-SOURCE-CIDR fd00::5,udp:53,fd01::/64
add KUBE-6-LB-SOURCE-CIDR fd00::5,udp:53,fd01::7/128
add KUBE-6-LB-SOURCE-CIDR fd00::5,udp:53,2001:db8::/32
create KUBE-LOAD-BALANCER-SOURCE-IP hash:net family inet hashsize 64 maxelem 1000
add KUBE-LOAD-BALANCER-SOURCE-IP 1.2.3.0/24
add KUBE-LOAD-BALANCER-SOURCE-IP 1.2.3.4/32
create KUBE-NODE-PORT-UDP bitmap:port range 1000-2000 timeout 600
add KUBE-NODE-PORT-UDP 1500 timeout 500
create KUBE-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535 counters comment
add KUBE-HEALTH-CHECK-NODE-PORT 10256 packets 0 bytes 0 comment "health"
create KUBE-EXTERNAL-IP hash:ip,port family inet hashsize 1024 maxelem 65536 timeout 3000 counters comment
add KUBE-EXTERNAL-IP 192.0.2.9,tcp:80 timeout 2000 packets 5 bytes 300 comment "a b"
create KUBE-SKB hash:ip,port family inet hashsize 1024 maxelem 65536 skbinfo
add KUBE-SKB 10.0.0.1,tcp:1 skbmark 0x10/0xff
create KUBE-FORCE hash:ip family inet hashsize 1024 maxelem 65536 forceadd
add KUBE-FORCE 1.2.3.4
create other hash:ip family inet hashsize 1024 maxelem 65536
add other 9.9.9.9
"""


def _restore(ns: str, text: str) -> None:
    subprocess.run(build.in_ns(ns, "ipset", "restore"), input=text, text=True, check=True)


def _tool(ns: str, names: list[str]) -> str:
    out = subprocess.run(build.in_ns(ns, "ipset", "save"), capture_output=True, text=True)
    return filter_ipset_save(out.stdout, names)


def _printed(ns: str, names: list[str]) -> tuple[str, list[str]]:
    code = (
        "import sys; from agent.cleanup.ipset_save import save; s = save(sys.argv[1:]); "
        "sys.stdout.write(repr(list(s.unsupported)) + '\\n' + s.text)"
    )

    out = subprocess.run(
        build.in_ns(ns, sys.executable, "-c", code, *names),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    head, _, text = out.partition("\n")
    return text, eval(head)  # noqa: S307 - our own repr of a list of names


def test_printed_sets_equal_ipset_save_byte_for_byte(netns: Callable[[], str]) -> None:
    ns = netns()
    big = "create KUBE-BIG hash:ip,port family inet hashsize 1024 maxelem 65536\n" + "".join(
        f"add KUBE-BIG 10.{i // 250}.{i % 250}.1,tcp:{i % 60000 + 1}\n" for i in range(5000)
    )
    # 40 more sets: their random initval shows a leading zero digit now and then
    many = "".join(
        f"create KUBE-S{i} hash:ip family inet hashsize 1024 maxelem 65536\n" for i in range(40)
    )
    _restore(ns, SETS + big + many)
    names = [
        line.split()[1] for line in (SETS + big + many).splitlines() if line.startswith("create")
    ]
    names.remove("other")
    text, unsupported = _printed(ns, names)
    assert unsupported == ["KUBE-SKB", "KUBE-FORCE"]
    printed = [n for n in names if n not in unsupported]
    want = _tool(ns, printed)
    # member timeouts count down between the two reads; nothing else may differ
    assert _no_timeouts(text) == _no_timeouts(want)
    assert text.count("\n") == want.count("\n") > 5000 + 40


def _no_timeouts(text: str) -> str:
    return "\n".join(
        " ".join(w for i, w in enumerate(line.split()) if not _is_countdown(line.split(), i))
        for line in text.splitlines()
    )


def _is_countdown(words: list[str], i: int) -> bool:
    # an `add` line's `timeout N` (the create line's timeout is the fixed default)
    return words[0] == "add" and (words[i] == "timeout" or (i > 0 and words[i - 1] == "timeout"))
