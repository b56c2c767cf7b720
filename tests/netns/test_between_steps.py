"""The node changed after the re-check, between two steps of `cleanup --apply`: a rule added
to a chain still to be removed, a member added to a set still to be destroyed. Neither is in
the bundle, so removing them would lose them for good. The table's transaction deletes each
backed-up rule by its text and then the chain, so the kernel itself refuses a chain that gained
a rule; a set is destroyed only while it holds exactly the backed-up members. The step fails,
every change is undone, and the node ends as the change left it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from tests.conftest import AGENT_HOOKS
from tests.dumps import dump
from tests.netns.test_cleanup import node

pytestmark = pytest.mark.netns

OPERATOR_RULE = "-p tcp -m tcp --dport 31999 -m comment --comment operator-rule -j RETURN"
MEMBER = "fd00:10:96::99,tcp:8080"


def _between_steps(
    ns: str, tmp: Path, change: Callable[[], None], not_yet: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, list[str]]]:
    """`cleanup --apply` one step at a time (1 s apart), `change` made right after its first
    step is done; `not_yet` is a step that must not have run by then. The run, and the node as
    the change left it."""
    cmd = [*build.in_ns(ns, *AGENT_HOOKS), "cleanup", "--apply", "--step-delay", "1"]
    cmd += ["--backup-dir", str(tmp / "b"), "--lock-file", str(tmp / "l")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("done "):
            break
    assert not any(ln.startswith("done ") and not_yet in ln for ln in seen), seen
    change()
    changed = dump(ns)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(seen) + out, err), changed


def _as_before_plus(
    before: dict[str, list[str]], changed: dict[str, list[str]], where: str, line: str
) -> dict[str, list[str]]:
    """`before` with `line` added to `where`, as `changed` holds it (the change was made
    after a step in another source had run)."""
    assert [ln for ln in changed[where] if ln not in before[where]] == [line]
    assert len(changed[where]) == len(before[where]) + 1
    return {**before, where: changed[where]}


def _undone(r: subprocess.CompletedProcess[str], step: str, why: str) -> None:
    assert r.returncode == 4, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"ipvs-leftovers: {step}: "), lines[0]
    assert why in lines[0], lines[0]
    assert "every change was undone" in lines[0], lines[0]
    assert f"failed iptables-table {step.split()[-1]}" in r.stdout or step.startswith("destroy")


@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_a_rule_added_to_a_chain_between_two_steps_makes_the_kernel_refuse_its_removal(
    netns: Callable[[], str], tmp_path: Path, backend: str
) -> None:
    """The rule was deleted with ip6 nat KUBE-POSTROUTING (`-F`, `-X`), exit 0, in no bundle.
    Now each backed-up rule goes by `-D` and then the chain by `-X`, which the kernel refuses
    for a chain still holding a rule: the transaction aborts, the steps before it are undone,
    exit 4, and the node is as before plus the operator's rule."""
    with node(netns, tmp_path, backend) as (ns, _):
        before = dump(ns)
        tool = f"ip6tables-{backend}"
        chain = "KUBE-POSTROUTING"
        assert f":{chain} - [0:0]" in before[f"{tool}-save"]

        def add_rule() -> None:
            build.run(build.in_ns(ns, tool, "-t", "nat", "-A", chain, *OPERATOR_RULE.split()))

        r, changed = _between_steps(ns, tmp_path, add_rule, f"{backend}/ipv6/nat")
        want = _as_before_plus(before, changed, f"{tool}-save", f"-A {chain} {OPERATOR_RULE}")
        _undone(r, f"iptables-table {backend}/ipv6/nat", "")
        assert dump(ns) == want


def test_a_member_added_to_a_set_between_two_steps_keeps_the_set(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """KUBE-6-CLUSTER-IP was destroyed with the member added after the re-check, exit 0, in no
    bundle. Now a set is destroyed only while its members are the backed-up ones: the step
    fails naming the new member, the steps before it are undone, exit 4, and the node is as
    before plus that member."""
    with node(netns, tmp_path) as (ns, _):
        before = dump(ns)
        name = "KUBE-6-CLUSTER-IP"
        assert any(line.startswith(f"create {name} ") for line in before["ipset"])

        def add_member() -> None:
            build.run(build.in_ns(ns, "ipset", "add", name, MEMBER))

        r, changed = _between_steps(ns, tmp_path, add_member, f"destroy-ipset {name}")
        want = _as_before_plus(before, changed, "ipset", f"add {name} {MEMBER}")
        _undone(r, f"destroy-ipset {name}", f"new: 'add {name} {MEMBER}'")
        assert dump(ns) == want
