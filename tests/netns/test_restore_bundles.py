"""restore of bundles that are not this node's, not safely kept, truncated, partial or
malformed, run twice, beside a held lock, after a killed cleanup, or failing part-way."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_agent
from tests.dumps import dump, minus_leftovers
from tests.netns.restore_lab import append_rule, cleaned, edit, refused, rehash
from tests.netns.test_cleanup import kill_cleanup_after, node

pytestmark = pytest.mark.netns


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
        edit(c.bundle, name, lambda t: append_rule(t, table, chain, rule), again=False)
        edit(c.bundle, "iptables-nft-ipv6.save", lambda t: append_rule(t, table, chain, rule))
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
