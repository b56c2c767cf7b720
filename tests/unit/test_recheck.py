"""The re-check's comparisons on plain data (agent.cleanup.recheck, Plan.contents): what counts
as a change, what does not, and the one line that names it."""

from __future__ import annotations

from typing import Any

from agent.cleanup import recheck
from agent.cleanup.plan import (
    ChangeTable,
    DeleteLink,
    DeleteService,
    DestroySet,
    Plan,
    TableChange,
)
from agent.snapshot import Ipset, IptRule, IpvsService, Link


def rule(chain: str, text: str) -> IptRule:
    return IptRule(chain, text, None, None)


def plan(
    chain_rules: tuple[str, ...] = ("-j RETURN",),
    position: int = 3,
    addresses: tuple[str, ...] = ("10.96.0.1/32", "10.96.0.10/32"),
    members: int = 5,
    real_servers: int = 1,
) -> Plan:
    jump = rule("PREROUTING", "-m comment --comment kubernetes -j KUBE-SERVICES")
    table = TableChange(
        "nft",
        "ipv4",
        "nat",
        (jump,),
        ("KUBE-SERVICES",),
        (position,),
        (("KUBE-SERVICES", tuple(rule("KUBE-SERVICES", r) for r in chain_rules)),),
    )
    svc = IpvsService(4, "TCP", "10.96.0.1", 443, None, "rr", 2, 0, dests=(None,) * real_servers)  # type: ignore[arg-type]
    return Plan(
        (
            DeleteService("TCP 10.96.0.1:443", (), svc),
            DeleteLink("kube-ipvs0", (), Link("kube-ipvs0", 7, "dummy", False, addresses)),
            ChangeTable("nft/ipv4/nat", (), table),
            DestroySet(
                "KUBE-CLUSTER-IP", (), Ipset("KUBE-CLUSTER-IP", "hash:ip,port", 4, members, 0)
            ),
        )
    )


def test_equal_readings_are_no_change() -> None:
    assert recheck.plan_change(plan().contents(), plan().contents()) is None
    # the link's addresses in another order are the same addresses
    again = plan(addresses=("10.96.0.10/32", "10.96.0.1/32")).contents()
    assert recheck.plan_change(plan().contents(), again) is None


def test_each_change_in_a_plan_is_named() -> None:
    before = plan().contents()
    cases = {
        "chain nft/ipv4/nat KUBE-SERVICES: 1 rules in the backup, 2 now (new: '-j ACCEPT')": plan(
            chain_rules=("-j RETURN", "-j ACCEPT")
        ),
        "jump rules in nft/ipv4/nat: 1 rules in the backup, 1 now (new: '4 -A PREROUTING": plan(
            position=4
        ),
        "link kube-ipvs0: 2 addresses in the backup, 3 now (new: '10.96.9.9/32')": plan(
            addresses=("10.96.0.1/32", "10.96.0.10/32", "10.96.9.9/32")
        ),
        "set KUBE-CLUSTER-IP: was 'hash:ip,port family 4; 5 members', now 'hash:ip,port "
        "family 4; 6 members'": plan(members=6),
        "virtual server TCP 10.96.0.1:443: was 'rr flags 0x2 timeout 0 netmask 4294967295 "
        "pe -; 1 real servers', now": plan(real_servers=2),
    }
    for reason, now in cases.items():
        found = recheck.plan_change(before, now.contents())
        assert found is not None and found.startswith(reason), (reason, found)


def test_a_step_gone_or_new_is_named() -> None:
    full = plan()
    fewer = Plan(full.steps[:-1])
    assert recheck.plan_change(full.contents(), fewer.contents()) == (
        "set KUBE-CLUSTER-IP: no longer in the plan"
    )
    assert recheck.plan_change(fewer.contents(), full.contents()) == (
        "set KUBE-CLUSTER-IP: new in the plan"
    )


SAVED = (
    "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n"
    "add KUBE-CLUSTER-IP 10.96.0.1,tcp:443\n"
    "add KUBE-CLUSTER-IP 10.96.0.10,udp:53\n"
    "create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536\n"
)


def test_set_listings_in_another_order_or_with_moved_counters_are_equal() -> None:
    lines = SAVED.splitlines()
    reordered = "\n".join([lines[0], lines[2], lines[1], lines[3]]) + "\n"
    assert recheck.set_change(SAVED, reordered) is None
    timed = SAVED.replace("udp:53\n", "udp:53 timeout 30\n")
    assert recheck.set_change(timed, timed.replace("timeout 30", "timeout 12")) is None


def test_set_changes_are_named() -> None:
    replaced = SAVED.replace("10.96.0.10,udp:53", "10.96.0.11,udp:53")
    assert recheck.set_change(SAVED, replaced) == (
        "set KUBE-CLUSTER-IP: 2 members in the backup, 2 now "
        "(new: 'add KUBE-CLUSTER-IP 10.96.0.11,udp:53')"
    )
    removed = SAVED.replace("add KUBE-CLUSTER-IP 10.96.0.1,tcp:443\n", "")
    assert recheck.set_change(SAVED, removed) == (
        "set KUBE-CLUSTER-IP: 2 members in the backup, 1 now "
        "(gone: 'add KUBE-CLUSTER-IP 10.96.0.1,tcp:443')"
    )
    resized = SAVED.replace("hashsize 1024 maxelem 65536\nadd", "hashsize 2048 maxelem 65536\nadd")
    found = recheck.set_change(SAVED, resized)
    assert found is not None and found.startswith("set KUBE-CLUSTER-IP: was 'create KUBE-CLUSTER")
    gone = SAVED.split("create KUBE-LOOP-BACK")[0]
    assert recheck.set_change(SAVED, gone) == "set KUBE-LOOP-BACK: gone"


RULES = (
    "-A -t 10.96.0.1:443 -s rr\n"
    "-a -t 10.96.0.1:443 -r 192.168.50.2:6443 -m -w 1\n"
    "-A -f 100 -6 -s rr\n"
    "-a -f 100 -6 -r [fd00::2]:0 -g -w 1\n"
    "-A -f 100 -s rr\n"
)


def test_real_server_changes_are_named_per_virtual_server() -> None:
    assert recheck.ipvs_change(RULES, RULES) is None
    weight = RULES.replace("6443 -m -w 1", "6443 -m -w 7")
    assert recheck.ipvs_change(RULES, weight) == (
        "virtual server -t 10.96.0.1:443: 1 real servers in the backup, 1 now "
        "(new: '-a -t 10.96.0.1:443 -r 192.168.50.2:6443 -m -w 7')"
    )
    # the IPv4 and the IPv6 fwmark service with one mark are told apart
    added = RULES + "-a -f 100 -r 192.168.50.3:0 -g -w 1\n"
    assert recheck.ipvs_change(RULES, added) == (
        "virtual server -f 100: 0 real servers in the backup, 1 now "
        "(new: '-a -f 100 -r 192.168.50.3:0 -g -w 1')"
    )
    scheduler = RULES.replace("-A -t 10.96.0.1:443 -s rr", "-A -t 10.96.0.1:443 -s wlc")
    assert recheck.ipvs_change(RULES, scheduler) == (
        "virtual server -t 10.96.0.1:443: was '-A -t 10.96.0.1:443 -s rr', "
        "now '-A -t 10.96.0.1:443 -s wlc'"
    )


def test_the_recheck_lists_the_backups_ipvs_lines_in_any_order(monkeypatch: Any) -> None:
    """recheck._ipvs_rules prints what backup.ipvsadm_rules prints, without ipvsadm's sort."""
    from agent.cleanup import backup
    from agent.readers import ipvs
    from agent.snapshot import IpvsDest

    monkeypatch.setattr(ipvs, "read_proc_dests", lambda: {})  # each service's own real servers
    services = [
        IpvsService(
            4,
            "TCP",
            f"10.96.{i // 250}.{i % 250 + 1}" if i % 7 else f"192.168.50.{i % 200 + 1}",
            443 if i % 7 else 30000 + i,
            None,
            "rr",
            2,
            0,
            dests=tuple(IpvsDest(f"10.244.{i % 200}.{k + 1}", 8443, "masq", 1) for k in range(3)),
        )
        for i in range(300)
    ]
    services += [
        IpvsService(
            6, "FWM", None, None, 100, "rr", 2, 0, dests=(IpvsDest("fd00::2", 0, "route", 1),)
        ),
        IpvsService(4, "UDP", "10.96.0.10", 53, None, "sh", 0x1B, 180, dests=()),
    ]
    mine, saved = recheck._ipvs_rules(services, 5), backup.ipvsadm_rules(services, 5)
    assert mine != saved and sorted(mine.splitlines()) == sorted(saved.splitlines())
    assert recheck.ipvs_change(saved, mine) is None
