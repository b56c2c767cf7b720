"""restore attacked in content: sysctl names and values, iptables lines that do more than
re-create kube-proxy's chains, and lines iptables-restore reads otherwise than a shell. Each
refusal must be one line, exit 4, and change nothing at all. The sets and links, bundle-level
refusals and kills are in the other tests/netns/test_restore_*.py files (one file a worker)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from tests.conftest import run_agent
from tests.dumps import dump
from tests.netns.restore_lab import append_rule, cleaned, edit, refused, rehash
from tests.netns.test_cleanup import apply, node

pytestmark = pytest.mark.netns


# --- a sysctl name that leaves /proc/sys --------------------------------------------------


def test_a_sysctl_name_with_a_slash_writes_nothing_anywhere(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    target = tmp_path / "owned"
    with cleaned(netns, tmp_path) as c:
        for key in (f"x.{target}", "net.ipv4.ip_forward", "net..ipv4", "kernel.core_pattern"):
            edit(c.bundle, "sysctls.json", lambda t, k=key: json.dumps({**json.loads(t), k: "1"}))
            refused(c, c.restore(), "sysctls.json")
            assert not target.exists()
            edit(
                c.bundle,
                "sysctls.json",
                lambda t, k=key: json.dumps({n: v for n, v in json.loads(t).items() if n != k}),
            )


@pytest.mark.parametrize(
    ("name", "value"),
    [("arp_ignore", "8"), ("arp_ignore", "2"), ("arp_announce", "1")],
)
def test_an_arp_sysctl_value_cleanup_never_resets_from_is_refused(
    netns: Callable[[], str], tmp_path: Path, name: str, value: str
) -> None:
    """`arp_ignore=8` (the node answers no ARP at all) in sysctls.json and plan.json alike was
    written back. Cleanup resets only strictARP's arp_ignore=1 and arp_announce=2, so restore
    now accepts only those values: one line, exit 4, the sysctls as cleanup left them."""
    key = f"net.ipv4.conf.all.{name}"
    with cleaned(netns, tmp_path) as c:

        def plan(text: str) -> str:
            doc = json.loads(text)
            for step in doc["steps"]:
                if step["action"] == "reset-sysctl" and step["removes"]["sysctl"] == key:
                    step["removes"]["from"] = value
            return json.dumps(doc)

        edit(c.bundle, "plan.json", plan, again=False)
        edit(c.bundle, "sysctls.json", lambda t: json.dumps({**json.loads(t), key: value}))
        assert f'"from": "{value}"' in (c.bundle / "plan.json").read_text()
        refused(c, c.restore(), "sysctls.json", key)


# --- iptables files that do more than re-create kube-proxy's chains -----------------------

HOSTILE_IPTABLES = {
    "a policy": lambda t: t.replace("*filter\n", "*filter\n:INPUT DROP [0:0]\n", 1),
    "an accept-all jump": lambda t: t.replace("COMMIT", "-I INPUT 1 -j ACCEPT\nCOMMIT", 1),
    "a DNAT of port 22": lambda t: t.replace(
        "*nat\n", "*nat\n-I PREROUTING 1 -p tcp --dport 22 -j DNAT --to-destination 10.9.9.9\n", 1
    ),
    "a foreign chain deleted": lambda t: t.replace("COMMIT", "-X DOCKER-USER\nCOMMIT", 1),
    "a flush": lambda t: t.replace("COMMIT", "-F FORWARD\nCOMMIT", 1),
    "a foreign chain created": lambda t: t.replace("*filter\n", "*filter\n:EVIL - [0:0]\n", 1),
    "a rule into a built-in chain": lambda t: t.replace(
        "COMMIT", "-A INPUT -p tcp --dport 22 -j DROP\nCOMMIT", 1
    ),
    "a kube chain rule not in the dump": lambda t: t.replace(
        "-A KUBE-", "-A KUBE-FORWARD -j ACCEPT\n-A KUBE-", 1
    ),
}


@pytest.mark.parametrize("backend", ["nft", "legacy"])
@pytest.mark.parametrize("hostile", sorted(HOSTILE_IPTABLES))
def test_hostile_iptables_lines_are_refused(
    netns: Callable[[], str], tmp_path: Path, backend: str, hostile: str
) -> None:
    with cleaned(netns, tmp_path, backend) as c:
        name = f"iptables-{backend}-ipv4.restore"
        original = (c.bundle / name).read_text()
        edit(c.bundle, name, HOSTILE_IPTABLES[hostile])
        assert (c.bundle / name).read_text() != original, "the edit did not apply"
        refused(c, c.restore(), name)


# --- lines iptables-restore reads otherwise than a POSIX shell ---------------------

# iptables-restore quotes with double quotes only: the single quotes here are plain characters,
# so it reads `-p tcp --dport 22 -j DROP` and four comments, where a shell reads a jump into
# KUBE-IPVS-FILTER with kube-proxy's comment.
SMUGGLED_DROP = (
    '-m comment --comment "kubernetes ipvs access filter" -p tcp --dport 22 -j DROP '
    "-m comment --comment x' -m comment --comment \"' -j KUBE-IPVS-FILTER -m comment "
    "--comment '\" -m comment --comment 'z"
)
# and here `-j LOG` is no part of a comment for it
SMUGGLED_LOG = "-m comment --comment 'x -j LOG -m comment --comment y'"


def _jump_text(save: str, chain: str, target: str) -> str:
    """The text of `-A CHAIN ... -j TARGET` in an iptables-save dump."""
    return next(
        ln.split(" ", 2)[2]
        for ln in save.splitlines()
        if ln.startswith(f"-A {chain} ") and ln.endswith(f"-j {target}")
    )


def _plan_jump(text: str, target: str, old: str) -> str:
    """plan.json with the jump `old` of step `target` made SMUGGLED_DROP."""
    doc = json.loads(text)
    (step,) = [s for s in doc["steps"] if s.get("target") == target]
    jumps = step["removes"]["jumps"]
    assert ["INPUT", old] in jumps
    step["removes"]["jumps"] = [[c, SMUGGLED_DROP if t == old else t] for c, t in jumps]
    return json.dumps(doc)


@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_a_jump_that_iptables_restore_reads_as_a_drop_is_refused(
    netns: Callable[[], str], tmp_path: Path, backend: str
) -> None:
    """kube-proxy's INPUT jump replaced, in .restore, .save and plan.json alike, by a line a
    shell-quoting reader takes for it; restore must refuse it and change nothing."""
    with cleaned(netns, tmp_path, backend) as c:
        stem = f"iptables-{backend}-ipv4"
        old = _jump_text((c.bundle / f"{stem}.save").read_text(), "INPUT", "KUBE-IPVS-FILTER")
        for name in (f"{stem}.restore", f"{stem}.save"):
            edit(c.bundle, name, lambda t: t.replace(old, SMUGGLED_DROP), again=False)
        assert SMUGGLED_DROP in (c.bundle / f"{stem}.restore").read_text()
        edit(c.bundle, "plan.json", lambda t: _plan_jump(t, f"{backend}/ipv4/filter", old))
        refused(c, c.restore(), f"{stem}.restore", "not a kube-proxy jump")


@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_a_rule_whose_only_jump_is_between_single_quotes_is_refused(
    netns: Callable[[], str], tmp_path: Path, backend: str
) -> None:
    """A rule added to a kube-proxy chain in .restore and .save alike: for iptables-restore its
    target is LOG, which restore never re-creates."""
    with cleaned(netns, tmp_path, backend) as c:
        stem = f"iptables-{backend}-ipv4"
        for name in (f"{stem}.restore", f"{stem}.save"):
            edit(
                c.bundle,
                name,
                lambda t: append_rule(t, "filter", "KUBE-IPVS-FILTER", SMUGGLED_LOG),
                again=False,
            )
        rehash(c.bundle)
        refused(c, c.restore(), f"{stem}.restore", "target LOG")


@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_a_quote_in_a_foreign_interface_name_neither_stops_cleanup_nor_restore(
    netns: Callable[[], str], tmp_path: Path, backend: str
) -> None:
    """`-i cni'0`, as iptables-save writes it, in an unrelated rule: the backend stays readable,
    so cleanup removes the leftovers, keeps the rule, and restore gives the node back."""
    rule = "-A INPUT -i cni'0 -j ACCEPT"
    with node(netns, tmp_path, backend=backend, dual=False) as (ns, _):
        build.run(
            build.in_ns(ns, f"iptables-{backend}-restore", "-w", "10", "--noflush"),
            stdin=f"*filter\n{rule}\nCOMMIT\n",
        )
        before = dump(ns)
        assert rule in before[f"iptables-{backend}-save"]
        r = apply(ns, tmp_path)
        assert r.rc == 0, r.stdout + r.stderr
        left = run_agent(ns, "audit", "--json").json["leftovers"]
        assert (left["iptables_chains"], left["iptables_jump_rules"]) == ([], 0)
        assert rule in dump(ns)[f"iptables-{backend}-save"]
        (bundle,) = (tmp_path / "backups").iterdir()
        lock = str(tmp_path / "cleanup.lock")
        rr = run_agent(ns, "restore", "--lock-file", lock, str(bundle))
        assert rr.rc == 0, rr.stderr
        assert dump(ns) == before
