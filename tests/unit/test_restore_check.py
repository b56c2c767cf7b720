"""restore's line checker on plain data: what a cleanup's bundle holds is accepted, and each
kind of line beyond it is refused with the file and line named."""

from __future__ import annotations

import json

import pytest

from agent.cleanup.bundle import BundleError
from agent.cleanup.restore_check import check

SAVE = """\
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:DOCKER-USER - [0:0]
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -m comment --comment "kubernetes forwarding rules" -j ACCEPT
COMMIT
"""
RESTORE = """\
*filter
:KUBE-FORWARD - [0:0]
-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -m comment --comment "kubernetes forwarding rules" -j ACCEPT
-I FORWARD 1 -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
COMMIT
"""
SETS = """\
create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1a2b3c4d
add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
add KUBE-NODE-PORT-TCP 30080
"""
LINK = {
    "name": "kube-ipvs0",
    "index": 7,
    "kind": "dummy",
    "up": False,
    "addresses": ["10.96.0.1/32", "fd00::1/128"],
}
IPVS = "-A -t 10.96.0.1:443 -s rr\n-a -t 10.96.0.1:443 -r 10.0.0.5:6443 -m -w 1\n"


def plan(**extra_steps: dict[str, object]) -> dict[str, object]:
    steps: list[dict[str, object]] = [
        {
            "action": "delete-ipvs-service",
            "target": "x",
            "removes": {"ipvs_service": "-t 10.96.0.1:443"},
        },
        {"action": "delete-link", "target": "kube-ipvs0", "removes": {"link": "kube-ipvs0"}},
        {
            "action": "iptables-table",
            "target": "nft/ipv4/filter",
            "removes": {
                "chains": ["KUBE-FORWARD"],
                "jumps": [
                    [
                        "FORWARD",
                        '-m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD',
                    ]
                ],
            },
        },
        {
            "action": "destroy-ipset",
            "target": "KUBE-CLUSTER-IP",
            "removes": {"ipset": "KUBE-CLUSTER-IP"},
        },
        {
            "action": "destroy-ipset",
            "target": "KUBE-NODE-PORT-TCP",
            "removes": {"ipset": "KUBE-NODE-PORT-TCP"},
        },
        {
            "action": "reset-sysctl",
            "target": "net.ipv4.conf.all.arp_ignore",
            "removes": {"sysctl": "net.ipv4.conf.all.arp_ignore", "from": "1", "to": "0"},
        },
    ]
    return {"agent_version": "x", "steps": steps, "kept": []}


def files(**override: str) -> dict[str, bytes]:
    out = {
        "plan.json": json.dumps(plan()),
        "iptables-nft-ipv4.save": SAVE,
        "iptables-nft-ipv4.restore": RESTORE,
        "ipset.save": SETS,
        "kube-ipvs0.json": json.dumps(LINK),
        "ipvsadm.rules": IPVS,
        "sysctls.json": json.dumps({"net.ipv4.conf.all.arp_ignore": "1"}),
    }
    out.update(override)
    return {k: v.encode() for k, v in out.items() if v is not None}


def test_a_whole_bundle_is_accepted_as_written() -> None:
    p = check(files())
    assert [s.name for s in p.sets] == ["KUBE-CLUSTER-IP", "KUBE-NODE-PORT-TCP"]
    assert p.link is not None and p.link.addresses == ("10.96.0.1/32", "fd00::1/128")
    (t,) = p.tables
    assert t.chains == (("KUBE-FORWARD", (RESTORE.splitlines()[2][len("-A KUBE-FORWARD ") :],)),)
    assert t.jumps == (
        ("FORWARD", 1, '-m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD'),
    )
    assert [s.key for s in p.services] == ["-t 10.96.0.1:443"]
    assert p.sysctls == (("net.ipv4.conf.all.arp_ignore", "1"),)


def test_the_link_queue_length_is_kept_and_may_be_absent() -> None:
    """kube-proxy v1.34+ makes kube-ipvs0 with queue length 0 (`ip link add` gives 1000): a
    bundle keeps it so restore gives the same link back; older bundles have none."""
    p = check(files(**{"kube-ipvs0.json": json.dumps({**LINK, "txqlen": 0})}))
    assert p.link is not None and p.link.txqlen == 0
    p = check(files())
    assert p.link is not None and p.link.txqlen is None


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("sysctls.json", json.dumps({"x./tmp/f": "1"}), "not a sysctl cleanup may reset"),
        ("sysctls.json", json.dumps({"net.ipv4.ip_forward": "1"}), "not a sysctl"),
        ("sysctls.json", json.dumps({"net.ipv4.conf.all.arp_ignore": "2"}), "not what plan.json"),
        ("sysctls.json", json.dumps({"net.ipv4.conf.all.arp_ignore": 1}), "not what plan.json"),
        ("sysctls.json", "[1]", "must map"),
        ("sysctls.json", "{", "not valid JSON"),
        ("kube-ipvs0.json", json.dumps({**LINK, "name": "lo"}), "only kube-ipvs0"),
        ("kube-ipvs0.json", json.dumps({**LINK, "kind": "bridge"}), "kind dummy"),
        ("kube-ipvs0.json", json.dumps({**LINK, "index": True}), "positive integer"),
        ("kube-ipvs0.json", json.dumps({**LINK, "addresses": ["10.0.0.0/8"]}), "/32 or /128"),
        ("kube-ipvs0.json", json.dumps({**LINK, "extra": 1}), "exactly"),
        ("kube-ipvs0.json", json.dumps({**LINK, "txqlen": -1}), "txqlen"),
        ("kube-ipvs0.json", json.dumps({**LINK, "txqlen": "0"}), "txqlen"),
        ("kube-ipvs0.json", json.dumps({**LINK, "txqlen": 2**32}), "txqlen"),
        ("ipvsadm.rules", "-C\n", "only the -A and -a"),
        ("ipvsadm.rules", IPVS + "-D -t 10.96.0.1:443\n", "only the -A and -a"),
        ("ipvsadm.rules", IPVS + "-A -t 10.96.0.2:80 -s rr\n", "exactly the virtual servers"),
        ("ipvsadm.rules", IPVS + "-a -t 10.96.0.9:1 -r 10.0.0.5:1 -m -w 1\n", "no service"),
        ("ipvsadm.rules", IPVS + IPVS, "added twice"),
        ("ipset.save", SETS + "destroy FOREIGN\n", "only `create` and `add`"),
        ("ipset.save", SETS + "add FOREIGN 1.2.3.4\n", "does not create"),
        ("ipset.save", SETS + "create FOREIGN hash:ip family inet\n", "not a kube-proxy set"),
        ("ipset.save", SETS.replace("hash:ip,port", "hash:net", 1), "not a kube-proxy set"),
        (
            "ipset.save",
            SETS + "add KUBE-CLUSTER-IP 10.0.0.1,tcp:80;reboot\n",
            "not an ipset member",
        ),
        ("ipset.save", SETS + "add KUBE-CLUSTER-IP 10.0.0.1,tcp:80 -exist x\n", "member option"),
        ("ipset.save", SETS.replace(" bucketsize 12", " bucketsize x"), "create option"),
        ("ipset.save", "create KUBE-CLUSTER-IP hash:ip,port family inet\n", "exactly the sets"),
        (
            "iptables-nft-ipv4.restore",
            RESTORE.replace("*filter\n", "*filter\n:INPUT DROP [0:0]\n"),
            "line 2",
        ),
        (
            "iptables-nft-ipv4.restore",
            RESTORE.replace("COMMIT", "-I INPUT 1 -j ACCEPT\nCOMMIT"),
            "not a kube-proxy jump",
        ),
        (
            "iptables-nft-ipv4.restore",
            RESTORE.replace("COMMIT", "-X DOCKER-USER\nCOMMIT"),
            "line 5",
        ),
        ("iptables-nft-ipv4.restore", RESTORE.replace("COMMIT", "-F FORWARD\nCOMMIT"), "line 5"),
        (
            "iptables-nft-ipv4.restore",
            RESTORE.replace("COMMIT", "-A FORWARD -j DROP\nCOMMIT"),
            "only into the chains",
        ),
        (
            "iptables-nft-ipv4.restore",
            RESTORE.replace("-j ACCEPT", "-j EVIL"),
            "no Kubernetes chain",
        ),
        (
            "iptables-nft-ipv4.restore",
            RESTORE.replace("-j ACCEPT", "-j DROP"),
            "differs from the dump",
        ),
        (
            "iptables-nft-ipv4.restore",
            RESTORE.replace("FORWARD 1 ", "FORWARD 2 "),
            "not in the dump",
        ),
        ("iptables-nft-ipv4.restore", RESTORE.replace("\nCOMMIT\n", "\n"), "no COMMIT"),
        (
            "iptables-nft-ipv4.restore",
            RESTORE.replace("*filter", "*nat"),
            "line 2",
        ),
        ("iptables-nft-ipv4.restore", RESTORE.replace("*filter", "*bogus"), "expected a table"),
        ("iptables-nft-ipv4.restore", RESTORE + "# comment\n", "expected a table"),
        ("iptables-nft-ipv4.restore", RESTORE.replace("[0:0]", "[0:0]\x1b"), "control character"),
        ("iptables-evil-ipv4.restore", RESTORE, "no file cleanup writes"),
        ("plan.json", "{}", "no list of steps"),
        ("plan.json", json.dumps({"steps": [{"action": "rm -rf", "removes": {}}]}), "not a step"),
        (
            "plan.json",
            json.dumps({"steps": [{"action": "destroy-ipset", "removes": {}}]}),
            "malformed",
        ),
        ("extra.sh", "x", "no file cleanup writes"),
    ],
)
def test_each_hostile_line_is_refused(name: str, text: str, said: str) -> None:
    with pytest.raises(BundleError) as err:
        check(files(**{name: text}))
    assert said in str(err.value)


def test_a_file_the_plan_needs_is_missing() -> None:
    for name in ("ipset.save", "kube-ipvs0.json", "ipvsadm.rules", "sysctls.json"):
        bundle = files()
        del bundle[name]
        with pytest.raises(BundleError):
            check(bundle)
    bundle = files()
    del bundle["iptables-nft-ipv4.restore"]
    with pytest.raises(BundleError, match="lacks the iptables files"):
        check(bundle)


def with_rule(rule: str) -> dict[str, bytes]:
    """The bundle with `-A KUBE-FORWARD RULE` in .restore and .save alike, as an attacker who
    can write the folder makes it."""
    line = f"-A KUBE-FORWARD {rule}\n"
    at = "-I FORWARD"
    return files(
        **{
            "iptables-nft-ipv4.restore": RESTORE.replace(at, line + at),
            "iptables-nft-ipv4.save": SAVE.replace("COMMIT", line + "COMMIT"),
        }
    )


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        # iptables-restore: comments "'x" and "y'", and -j LOG
        ("-m comment --comment 'x -j LOG -m comment --comment y'", "target LOG"),
        ("-p tcp --ju LOG", "target LOG"),  # getopt_long: --jump
        ("-j ACCEPT -m comment --comment x --go KUBE-FORWARD", "more than one -j or -g"),
        ('-m comment --comment "x"-j LOG', "closing quote"),
        ('-m comment --comment "x -j ACCEPT', "never closed"),
        ("-m comment --comment " + "x" * 1024 + " -j ACCEPT", "longer"),
    ],
)
def test_a_rule_iptables_restore_reads_otherwise_is_refused(rule: str, said: str) -> None:
    with pytest.raises(BundleError) as err:
        check(with_rule(rule))
    assert said in str(err.value) and "iptables-nft-ipv4.restore line 4" in str(err.value)


def test_a_quoted_comment_as_iptables_save_writes_it_is_accepted() -> None:
    rule = '-m comment --comment "a\\"b\\\\c\\\'d" -j ACCEPT'
    (t,) = check(with_rule(rule)).tables
    assert t.chains == (("KUBE-FORWARD", (RESTORE.splitlines()[2][16:], rule)),)


def test_a_jump_line_iptables_restore_reads_as_a_drop_is_refused() -> None:
    """A shell reads a jump into KUBE-FORWARD with kube-proxy's comment;
    iptables-restore reads `-j DROP` (the single quotes are plain characters)."""
    old = '-m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD'
    new = (
        '-m comment --comment "kubernetes forwarding rules" -j DROP -m comment --comment '
        "x' -m comment --comment \"' -j KUBE-FORWARD -m comment --comment '\" -m comment "
        "--comment 'z"
    )
    bundle = files(
        **{
            "plan.json": json.dumps(plan()).replace(json.dumps(old), json.dumps(new)),
            "iptables-nft-ipv4.restore": RESTORE.replace(old, new),
            "iptables-nft-ipv4.save": SAVE.replace(old, new),
        }
    )
    with pytest.raises(BundleError, match="line 4: not a kube-proxy jump"):
        check(bundle)
