"""The bundle keeps exactly the removed objects' lines out of whole-node dumps."""

from __future__ import annotations

from agent.cleanup.backup import filter_ipset_save, filter_ipvsadm_save, ipvsadm_key
from agent.snapshot import IpvsService

IPSET_SAVE = """\
create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
add KUBE-CLUSTER-IP 10.96.0.10,udp:53
create user-blocklist hash:ip family inet hashsize 1024 maxelem 65536
add user-blocklist 192.0.2.7
create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536
create KUBE-CLUSTER-IP-EXTRA hash:ip family inet hashsize 1024 maxelem 65536
add KUBE-CLUSTER-IP-EXTRA 10.96.0.2
"""


def test_ipset_save_keeps_only_the_named_sets_in_order() -> None:
    got = filter_ipset_save(IPSET_SAVE, ["KUBE-LOOP-BACK", "KUBE-CLUSTER-IP"])
    assert got == (
        "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n"
        "add KUBE-CLUSTER-IP 10.96.0.1,tcp:443\n"
        "add KUBE-CLUSTER-IP 10.96.0.10,udp:53\n"
        "create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536\n"
    )


def test_ipset_save_of_no_set_is_empty() -> None:
    assert filter_ipset_save(IPSET_SAVE, ["KUBE-NODE-PORT-TCP"]) == ""


def test_ipvsadm_save_keeps_only_the_owned_services_and_their_real_servers() -> None:
    text = (
        "-A -t 10.96.0.1:443 -s rr\n"
        "-a -t 10.96.0.1:443 -r 192.168.1.10:6443 -m -w 1\n"
        "-A -t 192.0.2.50:80 -s wlc\n"
        "-a -t 192.0.2.50:80 -r 10.0.0.5:80 -g -w 1\n"
        "-A -u [fd00:96::a]:53 -s rr\n"
        "-a -u [fd00:96::a]:53 -r [fd00:10::4]:53 -m -w 1\n"
    )
    owned = [
        IpvsService(4, "TCP", "10.96.0.1", 443, 0, "rr", 0, 0),
        IpvsService(6, "UDP", "fd00:96::a", 53, 0, "rr", 0, 0),
    ]
    got = filter_ipvsadm_save(text, {ipvsadm_key(s) for s in owned})
    assert got.splitlines() == [
        "-A -t 10.96.0.1:443 -s rr",
        "-a -t 10.96.0.1:443 -r 192.168.1.10:6443 -m -w 1",
        "-A -u [fd00:96::a]:53 -s rr",
        "-a -u [fd00:96::a]:53 -r [fd00:10::4]:53 -m -w 1",
    ]
