"""cleanup on lab nodes in namespaces: exact removal, refusals, foreign references,
idempotence, interruption and restore. IPVS and kube-ipvs0 are covered in tests/vm."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lab import build
from lab.kube_proxy import FakeKubeProxy, start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests.conftest import AGENT_HOOKS, agent_for, run_agent
from tests.dumps import dump, minus_leftovers
from tests.recheck import changed_during_the_pause, one_more_line, refused_for

pytestmark = pytest.mark.netns
CONFIRMED = {"mode": "nftables", "families": ["IPv4", "IPv6"], "last_sync_age": 2.0}


@contextmanager
def node(
    netns: Callable[[], str],
    tmp: Path,
    backend: str = "nft",
    dual: bool = True,
    state: dict[str, Any] | None = None,
    **kw: Any,
) -> Iterator[tuple[str, FakeKubeProxy]]:
    ns = netns()
    build.build(
        ns,
        realistic_node(
            dual_stack=dual,
            backend=backend,
            third_party=True,
            nftables_table=True,
            old_release_orphans=True,
            **kw,
        ),
    )
    families = {"families": ["IPv4", "IPv6"] if dual else ["IPv4"]}
    with start_fake_kube_proxy(ns, {**(state or CONFIRMED), **families}, tmp / "kp.json") as kp:
        yield ns, kp


def apply(ns: str, tmp: Path, *extra: str, env: dict[str, str] | None = None) -> Any:
    return run_agent(
        ns,
        "cleanup",
        "--apply",
        "--backup-dir",
        str(tmp / "backups"),
        "--lock-file",
        str(tmp / "cleanup.lock"),
        *extra,
        env=env,
    )


@pytest.mark.parametrize("backend", ["nft", "legacy"])
@pytest.mark.parametrize("dual", [False, True], ids=["ipv4", "dual-stack"])
def test_apply_removes_exactly_the_leftovers_and_restore_gives_them_back(
    netns: Callable[[], str], tmp_path: Path, backend: str, dual: bool
) -> None:
    with node(netns, tmp_path, backend, dual) as (ns, _):
        before = dump(ns)
        r = apply(ns, tmp_path)
        assert r.rc == 0, r.stdout + r.stderr
        after = dump(ns)
        assert after == minus_leftovers(before)
        assert run_agent(ns, "audit", "--json").json["leftovers"]["ipsets"] == {
            "ipv4": 0,
            "ipv6": 0,
        }
        second = apply(ns, tmp_path)  # a second run is a no-op
        assert second.rc == 0 and "nothing to remove" in second.stdout
        assert dump(ns) == after
        (bundle,) = (tmp_path / "backups").iterdir()
        assert {p.name for p in bundle.iterdir()} >= {"plan.json", "ipset.save"}
        rr = run_agent(ns, "restore", "--lock-file", str(tmp_path / "cleanup.lock"), str(bundle))
        assert rr.rc == 0, rr.stderr
        assert dump(ns) == before


def test_dry_run_changes_nothing_and_prints_the_ordered_plan(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    with node(netns, tmp_path) as (ns, _):
        before = dump(ns)
        r = run_agent(ns, "cleanup")
        assert r.rc == 1
        assert dump(ns) == before
    steps = [
        line.split()[1] for line in r.stdout.splitlines() if line[:4].strip().rstrip(".").isdigit()
    ]
    assert steps == sorted(steps, key=["iptables-table", "destroy-ipset"].index)
    assert "evidence: kube-proxy ipvs-mode set" in r.stdout
    assert r.stdout.splitlines()[-1] == "nftables mode confirmed: --apply would run this plan"


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ({"mode": "ipvs"}, "kube-proxy does not say nftables"),
        ({"mode": "iptables"}, "kube-proxy does not say nftables"),
        ({"mode": "nftables", "healthy": False}, "kube-proxy is stuck"),
        (  # a release before /livez: /healthz decides
            {"mode": "nftables", "healthy": False, "healthz_format": "oldest"},
            "/healthz answers HTTP 503: unhealthy",
        ),
        ({"garbage": True}, "/proxyMode error"),
    ],
    ids=["ipvs", "iptables", "stuck", "unhealthy-without-livez", "garbage"],
)
def test_refused_with_nothing_changed(
    netns: Callable[[], str], tmp_path: Path, state: dict[str, Any], reason: str
) -> None:
    with node(netns, tmp_path, state={**CONFIRMED, **state}) as (ns, _):
        before = dump(ns)
        r = apply(ns, tmp_path)
        assert r.rc == 3, r.stdout + r.stderr
        line = r.stderr.strip().splitlines()[-1]
        assert line.startswith("ipvs-leftovers: refused: nftables mode is not confirmed")
        assert reason in line
        assert dump(ns) == before
        assert not (tmp_path / "backups").exists()


def test_refused_when_kube_proxy_is_unreachable(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = netns()
    build.build(ns, realistic_node())
    before = dump(ns)
    r = apply(ns, tmp_path)
    assert r.rc == 3 and "unreachable" in r.stderr
    assert dump(ns) == before


def test_refused_when_kube_proxy_switches_back_to_ipvs_before_execution(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    with node(netns, tmp_path) as (ns, kp):
        before = dump(ns)
        cmd = [
            "ip",
            "netns",
            "exec",
            ns,
            *AGENT_HOOKS,
            "cleanup",
            "--apply",
            "--backup-dir",
            str(tmp_path / "b"),
            "--lock-file",
            str(tmp_path / "l"),
            "--pause-before-execute",
            "5",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        assert proc.stderr.readline().strip() == "re-checking the gate"  # plan + backup done
        kp.set(mode="ipvs")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 3, out + err
        assert "refused: nftables mode is not confirmed" in err
        assert dump(ns) == before


def test_one_cleanup_at_a_time(netns: Callable[[], str], tmp_path: Path) -> None:
    import fcntl

    with node(netns, tmp_path) as (ns, _):
        before = dump(ns)
        with open(tmp_path / "cleanup.lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            r = apply(ns, tmp_path)
        assert r.rc == 3 and "another cleanup holds" in r.stderr
        assert dump(ns) == before


def test_foreign_references_keep_their_targets_untouched(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    with node(netns, tmp_path, backend="legacy", dual=False) as (ns, _):
        ipt = ["ip", "netns", "exec", ns, "iptables-legacy"]
        # CNI portmap marks for masquerade through kube-proxy's chain; a firewall trusts a set.
        subprocess.run([*ipt, "-t", "nat", "-N", "CNI-HOSTPORT-SETMARK"], check=True)
        subprocess.run(
            [*ipt, "-t", "nat", "-A", "CNI-HOSTPORT-SETMARK", "-j", "KUBE-MARK-MASQ"], check=True
        )
        subprocess.run(
            [
                *ipt,
                "-A",
                "INPUT",
                "-m",
                "set",
                "--match-set",
                "KUBE-CLUSTER-IP",
                "dst,dst",
                "-j",
                "ACCEPT",
            ],
            check=True,
        )
        before = dump(ns)
        r = apply(ns, tmp_path)
        assert r.rc == 1, r.stdout + r.stderr  # something remains
        assert (
            "kept chain legacy/ipv4/nat KUBE-MARK-MASQ: referenced by legacy/ipv4/nat "
            "-A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ" in r.stdout
        )
        assert "kept ipset KUBE-CLUSTER-IP: referenced by legacy/ipv4/filter -A INPUT" in r.stdout
        assert dump(ns) == minus_leftovers(
            before, kept_chains={"KUBE-MARK-MASQ"}, kept_sets={"KUBE-CLUSTER-IP"}
        )
        again = apply(ns, tmp_path)
        assert again.rc == 1 and "nothing to remove" in again.stdout


def test_kept_mark_masq_keeps_its_masquerade_when_nftables_mode_uses_another_mark(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """The CNI rule's packets are marked 0x4000 by KUBE-MARK-MASQ; nftables mode
    here masquerades 0x8000 only, so KUBE-POSTROUTING (and what it uses) must stay."""
    with node(netns, tmp_path, backend="legacy", dual=False) as (ns, _):
        ipt = ["ip", "netns", "exec", ns, "iptables-legacy", "-t", "nat"]
        subprocess.run([*ipt, "-N", "CNI-HOSTPORT-SETMARK"], check=True)
        subprocess.run([*ipt, "-A", "CNI-HOSTPORT-SETMARK", "-j", "KUBE-MARK-MASQ"], check=True)
        nft = ["ip", "netns", "exec", ns, "nft"]
        subprocess.run([*nft, "flush", "chain", "ip", "kube-proxy", "masquerading"], check=True)
        for rule in ("mark and 0x8000 == 0 return", "masquerade fully-random"):
            subprocess.run([*nft, f"add rule ip kube-proxy masquerading {rule}"], check=True)
        before = dump(ns)
        r = apply(ns, tmp_path)
        assert r.rc == 1, r.stdout + r.stderr
        assert (
            "kept chain legacy/ipv4/nat KUBE-POSTROUTING: it masquerades what KUBE-MARK-MASQ "
            "marks" in r.stdout
        )
        assert "masquerades 0x8000, not KUBE-MARK-MASQ's 0x4000" in r.stdout
        assert dump(ns) == minus_leftovers(
            before,
            kept_chains={"KUBE-MARK-MASQ", "KUBE-POSTROUTING"},
            kept_sets={"KUBE-LOOP-BACK"},
        )


def kill_after_lines(ns: str, args: list[str], prefix: str, k: int) -> int:
    """The agent with `args` in `ns`, killed with SIGKILL once it has printed `k` lines starting
    with `prefix` (run it with a step delay, so that the kill lands between two steps); how
    many such lines it printed (fewer than k: it finished first)."""
    cmd = ["ip", "netns", "exec", ns, *agent_for(*args), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        seen += line.startswith(prefix)
        if seen == k:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait()
    time.sleep(0.2)
    return seen


def kill_cleanup_after(ns: str, tmp: Path, steps_done: int) -> None:
    """`cleanup --apply` (one step at a time, 2 s apart) killed after `steps_done` steps; its
    bundle under tmp/backups, its lock tmp/cleanup.lock."""
    args = ["cleanup", "--apply", "--backup-dir", str(tmp / "backups")]
    args += ["--lock-file", str(tmp / "cleanup.lock"), "--step-delay", "2"]
    assert kill_after_lines(ns, args, "done ", steps_done) == steps_done


def test_an_interrupted_run_is_completed_by_the_next(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    with node(netns, tmp_path) as (ns, _):
        before = dump(ns)
        kill_cleanup_after(ns, tmp_path, 3)  # half-way through the tables
        middle = dump(ns)
        assert middle != before and middle != minus_leftovers(before)
        r = apply(ns, tmp_path)
        assert r.rc == 0, r.stdout + r.stderr
        assert dump(ns) == minus_leftovers(before)


def test_arp_sysctls_change_only_when_asked(netns: Callable[[], str], tmp_path: Path) -> None:
    with node(netns, tmp_path, strict_arp=True) as (ns, _):

        def arp() -> tuple[str, str]:
            return tuple(
                build.run(
                    ["ip", "netns", "exec", ns, "sysctl", "-n", f"net.ipv4.conf.all.{k}"]
                ).strip()
                for k in ("arp_ignore", "arp_announce")
            )  # type: ignore[return-value]

        forward = build.run(["ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.ip_forward"])
        assert apply(ns, tmp_path).rc == 0
        assert arp() == ("1", "2")
        earlier = set((tmp_path / "backups").iterdir())
        r = apply(ns, tmp_path, "--reset-arp-sysctls")
        assert r.rc == 0, r.stdout + r.stderr
        assert arp() == ("0", "0")
        assert (
            build.run(["ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.ip_forward"]) == forward
        )
        # the bundle this apply made, whatever the names: both applies may fall in one second
        (bundle,) = set((tmp_path / "backups").iterdir()) - earlier
        lock = str(tmp_path / "cleanup.lock")
        assert run_agent(ns, "restore", "--lock-file", lock, str(bundle)).rc == 0
        assert arp() == ("1", "2")


def test_restore_of_a_folder_that_is_no_bundle(netns: Callable[[], str], tmp_path: Path) -> None:
    folder = tmp_path / "not-a-bundle"
    folder.mkdir()
    r = run_agent(netns(), "restore", "--lock-file", str(tmp_path / "cleanup.lock"), str(folder))
    assert r.rc == 4 and "not a complete bundle" in r.stderr and "Traceback" not in r.stderr


def test_a_kube_ipvs0_that_is_not_dummy_is_never_deleted(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = netns()
    build.build(
        ns, realistic_node(with_kube_ipvs0=True, kube_ipvs0_kind="bridge", nftables_table=True)
    )
    with start_fake_kube_proxy(
        ns, {"mode": "nftables", "families": ["IPv4"]}, tmp_path / "kp.json"
    ):
        r = run_agent(
            ns,
            "cleanup",
            "--apply",
            "--backup-dir",
            str(tmp_path / "b"),
            "--lock-file",
            str(tmp_path / "l"),
        )
    # not kube-proxy's (unknown-kube): reported by audit, never part of a plan
    assert r.rc == 0, r.stdout + r.stderr
    assert "delete-link" not in r.stdout
    link = build.run(["ip", "netns", "exec", ns, "ip", "-d", "-o", "link", "show", "kube-ipvs0"])
    assert " bridge " in link


def test_set_destroy_maps_the_kernels_answers(netns: Callable[[], str]) -> None:
    """The executor's own netlink destroy: a set held by a list:set (which no reader follows)
    is kept, a free one is destroyed, a missing one is gone, and no other set is touched."""
    ns = netns()
    for cmd in (
        "create KUBE-LOOP-BACK hash:ip,port,ip",
        "create KUBE-CLUSTER-IP hash:ip,port",
        "create user-list list:set",
        "add user-list KUBE-CLUSTER-IP",
    ):
        build.run(["ip", "netns", "exec", ns, "ipset", *cmd.split()])
    code = (
        "from agent.cleanup.executor import execute; from agent.cleanup.plan import DestroySet;"
        "from agent.snapshot import Ipset;"
        "steps = [DestroySet(n, (), Ipset(n, 'hash:ip', 4, 0, 0))"
        " for n in ('KUBE-CLUSTER-IP', 'KUBE-LOOP-BACK', 'KUBE-LOOP-BACK')];"
        "print(' '.join(o.result for o in execute(steps, lambda o: None)))"
    )
    out = build.run(["ip", "netns", "exec", ns, "python", "-c", code]).split()
    assert out == ["kept", "done", "gone"]
    left = build.run(["ip", "netns", "exec", ns, "ipset", "list", "-n"]).split()
    assert sorted(left) == ["KUBE-CLUSTER-IP", "user-list"]


def test_a_tool_past_its_timeout_refuses_before_any_change(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """At 20,000 Services under the VM, `ipset save` outran the 60 s tool timeout: the cleanup
    must then stop before the first change, say which tool and how to raise the limit. The
    bundle's only tool run left is the whole-table iptables dump: the first run (the read)
    passes, the backup's is slow."""
    slow = tmp_path / "bin"
    slow.mkdir()
    real = shutil.which("iptables-nft-save", path="/usr/sbin:/sbin:/usr/bin")
    marker = tmp_path / "read-once"
    (slow / "iptables-nft-save").write_text(
        f'#!/bin/sh\nif [ -e {marker} ]; then sleep 30; fi\ntouch {marker}\nexec {real} "$@"\n'
    )
    (slow / "iptables-nft-save").chmod(0o755)
    with node(netns, tmp_path, state=CONFIRMED) as (ns, _):
        before = dump(ns)
        r = run_agent(
            ns,
            "cleanup",
            "--apply",
            "--tool-timeout",
            "1",
            "--backup-dir",
            str(tmp_path / "backup"),
            "--lock-file",
            str(tmp_path / "lock"),
            env={"PATH": f"{slow}:{os.environ['PATH']}"},
        )
        assert r.rc == 4, r
        assert r.stderr.strip().splitlines() == [
            f"ipvs-leftovers: cannot write the backup under {tmp_path / 'backup'}: "
            "iptables-nft-save did not finish within 1s; nothing was changed"
        ]
        assert dump(ns) == before


@pytest.mark.parametrize("how", ["killed", "stalled"])
def test_a_tool_failing_after_the_first_change_leaves_the_node_as_before_cleanup(
    netns: Callable[[], str], tmp_path: Path, how: str
) -> None:
    """The second iptables-restore of the cleanup (one table already changed)
    is killed, or stops taking its input; the cleanup stops there, puts back what it removed
    from its own bundle, says so, exit 4, and the node is exactly as before the cleanup."""
    wrap = tmp_path / "bin"
    wrap.mkdir()
    calls = tmp_path / "calls"
    second = "kill -9 $$" if how == "killed" else "exec sleep 30"
    for tool in ("iptables-nft-restore", "ip6tables-nft-restore"):
        real = shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin")
        (wrap / tool).write_text(
            f"#!/bin/sh\necho {tool} >> {calls}\n"
            f'if [ "$(wc -l < {calls})" -eq 2 ]; then {second}; fi\nexec {real} "$@"\n'
        )
        (wrap / tool).chmod(0o755)
    with node(netns, tmp_path, state=CONFIRMED) as (ns, _):
        before = dump(ns)
        r = apply(ns, tmp_path, "--tool-timeout", "2", env={"PATH": f"{wrap}:{os.environ['PATH']}"})
        assert r.rc == 4, r
        assert dump(ns) == before
        assert calls.read_text().count("\n") >= 3, calls.read_text()  # undo re-ran the tool
        done = [x for x in r.stdout.splitlines() if x.startswith("done   iptables-table")]
        assert len(done) == 1, r.stdout  # one table was changed before the failure
        assert "every change was undone" in r.stderr, r.stderr
        assert "the node is as it was before cleanup" in r.stderr, r.stderr


def test_tool_timeout_out_of_range_is_a_usage_error(netns: Callable[[], str]) -> None:
    r = run_agent(netns(), "cleanup", "--tool-timeout", "0")
    assert r.rc == 2
    assert "--tool-timeout" in r.stderr


BATCHED_DESTROY = """
import sys
from agent.readers import netlink
from agent.cleanup.executor import execute
from agent.cleanup.plan import DestroySet
from agent.snapshot import Ipset

sends = []
real = netlink.NetlinkSocket.commands


class Counting:
    def __init__(self, sock):
        self._sock = sock

    def send(self, data):
        sends.append(len(data))
        return self._sock.send(data)

    def __getattr__(self, name):
        return getattr(self._sock, name)


def commands(self, requests):
    self._sock = Counting(self._sock)
    return real(self, requests)


netlink.NetlinkSocket.commands = commands
names = sys.argv[1:]
steps = [DestroySet(n, (), Ipset(n, "hash:ip", 4, 0, 0)) for n in names]
print(" ".join(o.result for o in execute(tuple(steps), lambda o: None)))
print(len(sends))
"""


def test_set_destroys_go_many_to_a_send_and_keep_each_answer(netns: Callable[[], str]) -> None:
    """3,000 destroys in a few sends (not 3,000 round trips), each answered on its own: a set
    held by a list:set is kept, a missing one is gone, the rest are destroyed, in plan order."""
    ns = netns()
    names = [f"KUBE-T{i}" for i in range(3000)]
    text = "".join(f"create {n} hash:ip\n" for n in names)
    text += "create user-list list:set\nadd user-list KUBE-T1500\n"
    subprocess.run(build.in_ns(ns, "ipset", "restore"), input=text, text=True, check=True)
    args = [*names, "KUBE-MISSING"]
    out = subprocess.run(
        build.in_ns(ns, sys.executable, "-c", BATCHED_DESTROY, *args),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    results = out[0].split()
    assert results == ["done"] * 1500 + ["kept"] + ["done"] * 1499 + ["gone"]
    assert int(out[1]) == -(-3001 // 128)  # ceil: 128 requests to a send
    left = build.run(["ip", "netns", "exec", ns, "ipset", "list", "-n"]).split()
    assert sorted(left) == ["KUBE-T1500", "user-list"]


def _read_only(folder: Path) -> tuple[str, ...]:
    """A prefix that runs the agent with `folder` bind-mounted read-only (own mount namespace)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    return ("unshare", "-m", "--propagation", "private", "sh", "-c", script, str(folder))


@pytest.mark.parametrize(
    ("which", "how"),
    [
        ("lock", "under-a-file"),
        ("lock", "read-only"),
        ("backup", "under-a-file"),
        ("backup", "read-only"),
    ],
)
def test_an_unwritable_lock_or_backup_folder_is_one_line_and_exit_4(
    netns: Callable[[], str], tmp_path: Path, which: str, how: str
) -> None:
    """A read-only hostPath or a path through a regular file: one line saying what to do, exit 4,
    nothing changed, never a traceback."""
    (tmp_path / "file").write_text("")
    folder = tmp_path / "file" if how == "under-a-file" else tmp_path / "ro"
    lock = folder / "cleanup.lock" if which == "lock" else tmp_path / "cleanup.lock"
    backups = folder / "backups" if which == "backup" else tmp_path / "backups"
    prefix = _read_only(folder) if how == "read-only" else ()
    with node(netns, tmp_path, state=CONFIRMED) as (ns, _):
        before = dump(ns)
        args = ("--backup-dir", str(backups), "--lock-file", str(lock))
        r = run_agent(ns, "cleanup", "--apply", *args, prefix=prefix)
        assert r.rc == 4, r
        reason = "Not a directory" if how == "under-a-file" else "Read-only file system"
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        if which == "lock":
            assert lines[0].startswith(f"ipvs-leftovers: cannot create the lock file {lock} ")
            assert "point --lock-file at a writable folder; nothing was changed" in lines[0]
        else:
            assert lines[0].startswith(f"ipvs-leftovers: cannot write the backup under {backups} ")
            assert "point --backup-dir at a writable folder; nothing was changed" in lines[0]
        assert reason in lines[0]
        assert dump(ns) == before


def test_xtables_lockfile_from_the_environment_is_the_lock_the_tools_take(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """From `kubectl debug node/...` the host's lock is /host/run/xtables.lock: the agent passes
    XTABLES_LOCKFILE to iptables, so a holder of that file (kube-proxy, the kubelet) is waited
    for. Here the test holds it; the legacy restore waits and runs past --tool-timeout."""
    import fcntl

    lockfile = tmp_path / "host-run" / "xtables.lock"
    lockfile.parent.mkdir()
    with node(netns, tmp_path, backend="legacy") as (ns, _), open(lockfile, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = apply(ns, tmp_path, "--tool-timeout", "3", env={"XTABLES_LOCKFILE": str(lockfile)})
    assert r.rc == 4, r
    assert "iptables-legacy-restore applied nothing more for 3." in r.stdout, r.stdout


# --- the re-check sees every change ----------------------------------------------------


OPERATOR_RULE = "-p tcp -m tcp --dport 31999 -m comment --comment operator-rule -j RETURN"


@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_a_rule_added_inside_a_leftover_chain_after_the_backup_refuses(
    netns: Callable[[], str], tmp_path: Path, backend: str
) -> None:
    """The rule was deleted with its chain, exit 0, in no bundle file. Now the
    re-check compares every removed chain's rules with the reading the backup was made from:
    exit 3, the node exactly as the change left it; the next run backs the rule up first."""
    with node(netns, tmp_path, backend, dual=False) as (ns, _):
        before = dump(ns)
        tool = f"iptables-{backend}"
        chain = "KUBE-NODE-PORT"  # ipvs mode's own nat chain, removed whole by the plan
        saved = before[f"{tool}-save"]
        nat = saved[saved.index("*nat") : saved.index("COMMIT", saved.index("*nat"))]
        assert f":{chain} - [0:0]" in nat
        rules = sum(line.startswith(f"-A {chain} ") for line in nat)

        def add_rule() -> None:
            build.run(build.in_ns(ns, tool, "-t", "nat", "-A", chain, *OPERATOR_RULE.split()))

        r, changed = changed_during_the_pause(ns, tmp_path, add_rule)
        added = one_more_line(before, changed, f"{tool}-save")
        assert added == f"-A {chain} {OPERATOR_RULE}"
        refused_for(
            r,
            f"chain {backend}/ipv4/nat {chain}: {rules} rules in the backup, {rules + 1} now "
            f"(new: '{OPERATOR_RULE}')",
        )
        assert dump(ns) == changed  # nothing removed, the operator's rule still there
        # the next run reads the rule, backs it up and removes it with the chain
        again = apply(ns, tmp_path)
        assert again.rc == 0, again.stdout + again.stderr
        (bundle,) = (tmp_path / "backups").iterdir()
        restore = (bundle / f"iptables-{backend}-ipv4.restore").read_text().splitlines()
        assert f"-A {chain} {OPERATOR_RULE}" in restore


@pytest.mark.parametrize("how", ["added", "replaced"])
def test_a_member_changed_in_a_leftover_set_after_the_backup_refuses(
    netns: Callable[[], str], tmp_path: Path, how: str
) -> None:
    """A member added (the set's count changes: the plan's contents differ) or one member
    replaced by another (same count: only the member listing, compared with the bundle's
    ipset.save, sees it) between the backup and the re-check: exit 3, nothing changed."""
    with node(netns, tmp_path, dual=False) as (ns, _):
        before = dump(ns)
        members = [m for m in before["ipset"] if m.startswith("add KUBE-CLUSTER-IP ")]
        assert members

        def change_member() -> None:
            if how == "replaced":
                build.run(build.in_ns(ns, "ipset", "del", *members[0].split()[1:]))
            build.run(build.in_ns(ns, "ipset", "add", "KUBE-CLUSTER-IP", "10.96.99.99,tcp:8080"))

        r, changed = changed_during_the_pause(ns, tmp_path, change_member)
        count = len(members)
        if how == "added":
            added = one_more_line(before, changed, "ipset")
            assert added == "add KUBE-CLUSTER-IP 10.96.99.99,tcp:8080"
            what = f"set KUBE-CLUSTER-IP: was 'hash:ip,port family 4; {count} members', now "
        else:
            assert {k: v for k, v in changed.items() if k != "ipset"} == {
                k: v for k, v in before.items() if k != "ipset"
            }
            assert set(before["ipset"]) - set(changed["ipset"]) == {members[0]}
            assert set(changed["ipset"]) - set(before["ipset"]) == {
                "add KUBE-CLUSTER-IP 10.96.99.99,tcp:8080"
            }
            what = (
                f"set KUBE-CLUSTER-IP: {count} members in the backup, {count} now "
                "(new: 'add KUBE-CLUSTER-IP 10.96.99.99,tcp:8080')"
            )
        refused_for(r, what)
        assert dump(ns) == changed
        assert len(build.run(build.in_ns(ns, "ipset", "list", "-n")).split()) == len(
            [line for line in changed["ipset"] if line.startswith("create ")]
        )
