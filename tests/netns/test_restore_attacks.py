"""restore attacked: tampered, incomplete, unsafe, foreign and racing bundles on a cleaned lab
node. Each refusal must be one line, exit 4 (3 for the lock), and change nothing at all; each
accepted bundle must give back exactly what cleanup removed. (IPVS and kube-ipvs0 need the VM;
their files' checks are driven here through plan.json, which restore checks them against, and
in tests/unit/test_restore_check.py.)"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab import build
from tests.conftest import run_agent
from tests.dumps import dump, minus_leftovers
from tests.netns.test_cleanup import apply, kill_after_lines, kill_cleanup_after, node

pytestmark = pytest.mark.netns


@dataclass
class Cleaned:
    ns: str
    tmp: Path
    before: dict[str, list[str]]
    after: dict[str, list[str]]
    bundle: Path

    def restore(self, *extra: str, bundle: Path | None = None) -> object:
        return run_agent(
            self.ns,
            "restore",
            "--lock-file",
            str(self.tmp / "cleanup.lock"),
            *extra,
            str(bundle or self.bundle),
        )

    def arp(self) -> tuple[str, ...]:
        return tuple(
            build.run(
                ["ip", "netns", "exec", self.ns, "sysctl", "-n", f"net.ipv4.conf.all.{k}"]
            ).strip()
            for k in ("arp_ignore", "arp_announce")
        )


@contextmanager
def cleaned(
    netns: Callable[[], str], tmp: Path, backend: str = "nft", n_services: int = 12
) -> Iterator[Cleaned]:
    """A lab node cleaned with --reset-arp-sysctls, so its bundle holds every file the netns
    kernel can give (iptables both families, sets, sysctls)."""
    with node(netns, tmp, backend=backend, strict_arp=True, n_services=n_services) as (ns, _):
        before = dump(ns)
        r = apply(ns, tmp, "--reset-arp-sysctls")
        assert r.rc == 0, r.stdout + r.stderr
        (bundle,) = (tmp / "backups").iterdir()
        yield Cleaned(ns, tmp, before, dump(ns), bundle)


def rehash(bundle: Path) -> None:
    """What an attacker who can write the folder does: make the manifest agree again."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    names = [p.name for p in bundle.iterdir() if p.name != "manifest.json"]
    manifest["files"] = {n: hashlib.sha256((bundle / n).read_bytes()).hexdigest() for n in names}
    manifest["plan_sha256"] = manifest["files"]["plan.json"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def edit(bundle: Path, name: str, change: Callable[[str], str], again: bool = True) -> None:
    path = bundle / name
    path.write_text(change(path.read_text() if path.exists() else ""))
    os.chmod(path, 0o600)
    if again:
        rehash(bundle)


def add_step(bundle: Path, step: dict[str, object]) -> None:
    def change(text: str) -> str:
        doc = json.loads(text)
        doc["steps"].append(step)
        return json.dumps(doc)

    edit(bundle, "plan.json", change, again=False)


def refused(c: Cleaned, r: object, *words: str) -> None:
    rc, err = r.rc, r.stderr  # type: ignore[attr-defined]
    assert rc == 4, (rc, r.stdout, err)  # type: ignore[attr-defined]
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "nothing was changed" in err, err
    for w in words:
        assert w in err, err
    assert dump(c.ns) == c.after
    assert c.arp() == ("0", "0")


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


# --- sets, link, IPVS and sysctls beyond what cleanup removed -----------------------------


@pytest.mark.parametrize(
    "change",
    [
        "destroy FOREIGN-SET\n",
        "flush KUBE-CLUSTER-IP\n",
        "add FOREIGN-SET 10.1.2.3\n",
        "create FOREIGN-SET hash:ip family inet hashsize 1024 maxelem 65536\n",
        "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n",
        "-exist\n",
    ],
)
def test_hostile_ipset_lines_are_refused(
    netns: Callable[[], str], tmp_path: Path, change: str
) -> None:
    with cleaned(netns, tmp_path) as c:
        edit(c.bundle, "ipset.save", lambda t: t + change)
        refused(c, c.restore(), "ipset.save")


@pytest.mark.parametrize(
    "doc",
    [
        {"name": "lo", "index": 1, "kind": "dummy", "up": True, "addresses": ["10.9.9.9/32"]},
        {"name": "kube-ipvs0", "index": 99, "kind": "bridge", "up": True, "addresses": []},
        {
            "name": "kube-ipvs0",
            "index": 99,
            "kind": "dummy",
            "up": True,
            "addresses": ["0.0.0.0/0"],
        },
        {"name": "kube-ipvs0", "index": 99, "kind": "dummy", "up": True, "addresses": ["x"]},
    ],
)
def test_a_link_other_than_kube_ipvs0_is_refused(
    netns: Callable[[], str], tmp_path: Path, doc: dict[str, object]
) -> None:
    with cleaned(netns, tmp_path) as c:
        add_step(
            c.bundle,
            {
                "action": "delete-link",
                "target": "kube-ipvs0",
                "removes": {"link": str(doc["name"])},
            },
        )
        edit(c.bundle, "kube-ipvs0.json", lambda _: json.dumps(doc))
        refused(c, c.restore(), "kube-ipvs0.json")
        links = build.run(["ip", "netns", "exec", c.ns, "ip", "-o", "link"])
        assert "kube-ipvs0" not in links and "10.9.9.9" not in dump(c.ns)["addresses"]


@pytest.mark.parametrize(
    "line",
    ["-C", "-D -t 10.96.0.1:443", "-E -t 10.96.0.1:443 -s rr", "-A -t 10.96.0.1:443 -s rr\n-C"],
)
def test_ipvsadm_lines_other_than_adds_never_reach_ipvsadm(
    netns: Callable[[], str], tmp_path: Path, line: str
) -> None:
    with cleaned(netns, tmp_path) as c:
        add_step(
            c.bundle,
            {
                "action": "delete-ipvs-service",
                "target": "TCP/10.96.0.1/443",
                "removes": {"ipvs_service": "-t 10.96.0.1:443"},
            },
        )
        edit(c.bundle, "ipvsadm.rules", lambda _: line + "\n")
        refused(c, c.restore(), "ipvsadm.rules")


# --- bundles that are not this node's, or not safely kept ----------------------------------


def test_a_bundle_from_another_node_needs_from_other_node(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    with cleaned(netns, tmp_path) as c:
        manifest = json.loads((c.bundle / "manifest.json").read_text())
        manifest["node"] = {"hostname": "another-node"}
        (c.bundle / "manifest.json").write_text(json.dumps(manifest))
        refused(c, c.restore(), "another-node", "--from-other-node")
        r = c.restore("--from-other-node")
        assert r.rc == 0, r.stderr  # type: ignore[attr-defined]
        assert dump(c.ns) == c.before and c.arp() == ("1", "2")


def test_unsafe_folders_and_files_are_refused(netns: Callable[[], str], tmp_path: Path) -> None:
    with cleaned(netns, tmp_path) as c:
        os.chmod(c.bundle, 0o777)
        refused(c, c.restore(), "world-writable")
        os.chmod(c.bundle, 0o700)
        os.chown(c.bundle / "ipset.save", 65534, 65534)
        refused(c, c.restore(), "uid 65534")
        os.chown(c.bundle / "ipset.save", 0, 0)
        os.chmod(c.bundle / "ipset.save", 0o666)
        refused(c, c.restore(), "writable")
        os.chmod(c.bundle / "ipset.save", 0o600)
        elsewhere = tmp_path / "ipset.elsewhere"
        os.rename(c.bundle / "ipset.save", elsewhere)
        os.symlink(elsewhere, c.bundle / "ipset.save")
        refused(c, c.restore(), "symlink")
        os.unlink(c.bundle / "ipset.save")
        os.rename(elsewhere, c.bundle / "ipset.save")
        link = tmp_path / "bundle-link"
        os.symlink(c.bundle, link)
        refused(c, c.restore(bundle=link), "symlink")
        r = c.restore()  # the same bundle, put right again, is accepted
        assert r.rc == 0 and dump(c.ns) == c.before, r.stderr  # type: ignore[attr-defined]


def test_an_empty_or_altered_plan_is_refused(netns: Callable[[], str], tmp_path: Path) -> None:
    with cleaned(netns, tmp_path) as c:
        edit(c.bundle, "plan.json", lambda _: "", again=False)
        refused(c, c.restore(), "altered or truncated")
        rehash(c.bundle)
        refused(c, c.restore(), "plan.json is not valid JSON")


# --- twice, after a killed cleanup, while a cleanup runs ----------------------------------


def test_restore_twice_changes_nothing_the_second_time(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    with cleaned(netns, tmp_path, "legacy") as c:
        assert c.restore().rc == 0  # type: ignore[attr-defined]
        assert dump(c.ns) == c.before
        r = c.restore()
        assert r.rc == 0 and "nothing was missing" in r.stdout, r.stdout  # type: ignore[attr-defined]
        assert dump(c.ns) == c.before and c.arp() == ("1", "2")


def test_restore_waits_for_no_one_and_changes_nothing_while_the_lock_is_held(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    with cleaned(netns, tmp_path) as c, open(tmp_path / "cleanup.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = c.restore()
        assert r.rc == 3 and "holds" in r.stderr, r.stderr  # type: ignore[attr-defined]
        assert dump(c.ns) == c.after


def test_restore_after_a_killed_cleanup_gives_the_node_back(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    with node(netns, tmp_path) as (ns, _):
        before = dump(ns)
        kill_cleanup_after(ns, tmp_path, 3)
        assert dump(ns) not in (before, minus_leftovers(before))
        (bundle,) = (tmp_path / "backups").iterdir()
        r = run_agent(ns, "restore", "--lock-file", str(tmp_path / "cleanup.lock"), str(bundle))
        assert r.rc == 0, r.stderr
        assert dump(ns) == before
        again = run_agent(ns, "restore", "--lock-file", str(tmp_path / "cleanup.lock"), str(bundle))
        assert again.rc == 0 and dump(ns) == before


# --- truncated files ----------------------------------------------------------------------


def test_a_truncated_file_is_refused_before_any_change(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    with cleaned(netns, tmp_path) as c:
        cut = lambda t: t[: len(t) * 2 // 3]  # noqa: E731
        sets = (c.bundle / "ipset.save").read_text()
        edit(c.bundle, "ipset.save", cut, again=False)
        refused(c, c.restore(), "altered or truncated")
        # and with the manifest made to agree, cut inside its first line: the line itself
        edit(c.bundle, "ipset.save", lambda _: sets[: sets.index("\n") // 2])
        refused(c, c.restore(), "ipset.save line 1")
        edit(c.bundle, "ipset.save", lambda _: sets)
        edit(c.bundle, "iptables-nft-ipv4.restore", cut)
        refused(c, c.restore(), "iptables-nft-ipv4.restore")


def _append_rule(text: str, table: str, chain: str, rule: str) -> str:
    """`-A CHAIN RULE` after CHAIN's last rule (or its declaration) in TABLE's block."""
    lines = text.splitlines()
    start = lines.index(f"*{table}")
    end = lines.index("COMMIT", start)
    at = max(i for i in range(start, end) if lines[i].startswith((f"-A {chain} ", f":{chain} ")))
    lines.insert(at + 1, f"-A {chain} {rule}")
    return "\n".join(lines) + "\n"


def test_a_failure_part_way_is_undone(netns: Callable[[], str], tmp_path: Path) -> None:
    """The last table restore applies holds a rule the checker accepts (a jump to a KUBE- chain
    the dump has) and iptables refuses (no such chain on the node): the sets, the other tables
    and nothing else were applied by then, and all of it is undone."""
    with cleaned(netns, tmp_path) as c:
        name = "iptables-nft-ipv6.restore"
        text = (c.bundle / name).read_text()
        table = [ln[1:] for ln in text.splitlines() if ln.startswith("*")][-1]
        block = text[text.index(f"*{table}") :]
        chain = next(ln[1:].split()[0] for ln in block.splitlines() if ln.startswith(":"))
        rule = "-j KUBE-NO-SUCH-CHAIN"
        edit(c.bundle, name, lambda t: _append_rule(t, table, chain, rule), again=False)
        edit(c.bundle, "iptables-nft-ipv6.save", lambda t: _append_rule(t, table, chain, rule))
        r = c.restore()
        assert r.rc == 4, (r.stdout, r.stderr)  # type: ignore[attr-defined]
        assert "every change was undone" in r.stderr, r.stderr  # type: ignore[attr-defined]
        assert "restored " in r.stdout and "undoing" in r.stdout, r.stdout  # type: ignore[attr-defined]
        assert dump(c.ns) == c.after and c.arp() == ("0", "0")


# --- partial folders, malformed and extra files -----------------------------------


def test_a_partial_backup_is_never_a_bundle(netns: Callable[[], str], tmp_path: Path) -> None:
    with cleaned(netns, tmp_path) as c:
        partial = c.bundle.parent / f".partial-{c.bundle.name}"
        os.rename(c.bundle, partial)
        os.unlink(partial / "manifest.json")
        refused(c, c.restore(bundle=partial), "backup did not finish")
        only_plan = tmp_path / "only-plan"
        only_plan.mkdir(mode=0o700)
        (only_plan / "plan.json").write_text((partial / "plan.json").read_text())
        refused(c, c.restore(bundle=only_plan), "no manifest.json")


def test_malformed_json_and_extra_files_are_one_line(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    with cleaned(netns, tmp_path) as c:
        (c.bundle / "evil.sh").write_text("rm -rf /\n")
        os.chmod(c.bundle / "evil.sh", 0o600)
        refused(c, c.restore(), "evil.sh")
        rehash(c.bundle)
        refused(c, c.restore(), "evil.sh")
        os.unlink(c.bundle / "evil.sh")
        edit(c.bundle, "sysctls.json", lambda t: t[:-3])
        refused(c, c.restore(), "sysctls.json is not valid JSON")


# --- kill -9 at every step boundary of restore ----------------------------------------------------


def _kill_restore_after(c: Cleaned, steps: int) -> int:
    """restore (2 s between steps) killed with SIGKILL after `steps` "restored" lines."""
    args = ["restore", "--lock-file", str(c.tmp / "cleanup.lock"), "--step-delay", "2"]
    return kill_after_lines(c.ns, [*args, str(c.bundle)], "restored ", steps)


@pytest.mark.parametrize("size", [12, 40])
def test_restore_killed_at_every_step_boundary_is_completed_by_the_next(
    netns: Callable[[], str], tmp_path: Path, size: int
) -> None:
    """After a SIGKILL no undo runs: the node is part-restored, the lock is free again, and the
    next restore of the same bundle re-creates exactly what is missing; a cleanup instead
    converges to the cleaned node."""
    with cleaned(netns, tmp_path, n_services=size) as c:
        first = c.restore()
        assert first.rc == 0, first.stderr  # type: ignore[attr-defined]
        lines = first.stdout.splitlines()  # type: ignore[attr-defined]
        phases = sum(ln.startswith("restored ") and "re-created" not in ln for ln in lines)
        assert phases >= 4  # sets, both families' tables, sysctls
        for k in range(1, phases):
            assert apply(c.ns, c.tmp, "--reset-arp-sysctls").rc == 0
            assert dump(c.ns) == c.after
            c.bundle = sorted(p for p in (c.tmp / "backups").iterdir())[-1]
            assert _kill_restore_after(c, k) == k
            middle = (dump(c.ns), c.arp())
            ends = ((c.before, ("1", "2")), (c.after, ("0", "0")))
            assert middle not in ends, f"killed after step {k}: the node is not half-way"
            r = c.restore()
            assert r.rc == 0, (k, r.stderr)  # type: ignore[attr-defined]
            assert dump(c.ns) == c.before and c.arp() == ("1", "2"), f"after a kill at step {k}"


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
                lambda t: _append_rule(t, "filter", "KUBE-IPVS-FILTER", SMUGGLED_LOG),
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
