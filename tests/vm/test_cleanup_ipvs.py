"""cleanup with IPVS and a dummy kube-ipvs0, on Debian's kernel: exact removal, foreign IPVS
services byte-identical, restore gives the node back."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests.conftest import AGENT, run_agent
from tests.dumps import dump, minus_leftovers
from tests.netns.test_cleanup import apply
from tests.recheck import changed_during_the_pause, one_more_line, refused_for

pytestmark = pytest.mark.vm
FOREIGN_IPVS = ("192.168.50.100:80", "-f 100")


@pytest.fixture(scope="module", autouse=True)
def _modules() -> None:
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "ip_vs_wlc", "dummy"], check=True)


@pytest.mark.parametrize("backend", ["nft", "legacy"])
@pytest.mark.parametrize("dual", [False, True], ids=["ipv4", "dual-stack"])
def test_cleanup_and_restore_with_ipvs(
    netns: Callable[[], str], tmp_path: Path, backend: str, dual: bool
) -> None:
    ns = netns()
    build.build(
        ns,
        realistic_node(
            dual_stack=dual,
            backend=backend,
            with_ipvs=True,
            third_party=True,
            nftables_table=True,
            old_release_orphans=True,
        ),
    )
    state = {"mode": "nftables", "families": ["IPv4", "IPv6"] if dual else ["IPv4"]}
    with start_fake_kube_proxy(ns, state, tmp_path / "kp.json"):
        before = dump(ns, ipvs=True)
        assert before["kube-ipvs0"] != [""]
        r = run_agent(
            ns,
            "cleanup",
            "--apply",
            "--backup-dir",
            str(tmp_path / "b"),
            "--lock-file",
            str(tmp_path / "l"),
        )
        assert r.rc == 0, r.stdout + r.stderr
        after = dump(ns, ipvs=True)
        expected = minus_leftovers(before)
        expected["ipvsadm"] = [
            line for line in before["ipvsadm"] if any(f in line for f in FOREIGN_IPVS)
        ]
        assert len(expected["ipvsadm"]) == 6  # keepalived: 2 services, 4 real servers
        assert after == expected
        doc = run_agent(ns, "audit", "--json").json
        assert doc["stale"] is False and doc["leftovers"]["kube_ipvs0"]["present"] is False
        assert doc["foreign"] == {"ipvs_virtual_servers": 2, "ipvs_real_servers": 4}
        (bundle,) = (tmp_path / "b").iterdir()
        rr = run_agent(ns, "restore", str(bundle))
        assert rr.rc == 0, rr.stderr
        assert dump(ns, ipvs=True) == before
        again = run_agent(ns, "restore", str(bundle))  # a second restore adds nothing
        assert again.rc == 0 and "nothing was missing" in again.stdout, again.stdout
        assert dump(ns, ipvs=True) == before


def test_a_tool_killed_mid_restore_leaves_the_node_as_before_restore(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """1,000 Services: `ipset restore` is killed while it loads; restore undoes the sets it
    made and says so, and the node is exactly the cleaned node it was before restore."""
    import signal
    import time

    from lab.scenarios import scaled_node

    ns = netns()
    build.build(ns, scaled_node(1000, with_ipvs=True, nftables_table=True))
    with start_fake_kube_proxy(ns, {"mode": "nftables", "families": ["IPv4"]}, tmp_path / "k"):
        before = dump(ns, ipvs=True)
        lock = ["--lock-file", str(tmp_path / "l")]
        r = run_agent(ns, "cleanup", "--apply", "--backup-dir", str(tmp_path / "b"), *lock)
        assert r.rc == 0, r.stdout + r.stderr
        cleaned = dump(ns, ipvs=True)
        (bundle,) = (tmp_path / "b").iterdir()
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, AGENT, "restore", *lock, str(bundle)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        killed = False
        while not killed and proc.poll() is None and time.monotonic() < deadline:
            found = subprocess.run(["pgrep", "-x", "ipset"], capture_output=True, text=True)
            for pid in found.stdout.split():
                subprocess.run(["kill", f"-{signal.SIGKILL.value}", pid], check=False)
                killed = True
            time.sleep(0.02)
        out, err = proc.communicate(timeout=300)
        assert killed, "ipset restore finished before it could be killed: " + out
        assert proc.returncode == 4, (out, err)
        assert "every change was undone: the node is as it was before restore" in err, err
        assert dump(ns, ipvs=True) == cleaned
        ok = run_agent(ns, "restore", *lock, str(bundle))  # and the bundle still restores
        assert ok.rc == 0, ok.stderr
        assert dump(ns, ipvs=True) == before


def test_the_xtables_lock_held_after_ipvs_was_flushed_leaves_the_node_as_before_cleanup(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """Another program holds the xtables lock past iptables-restore's wait
    (`-w 30`) when the cleanup reaches iptables, after it deleted every leftover virtual
    server. The cleanup stops, puts the virtual servers back from its bundle, says so, exit 4:
    the node is exactly as before the cleanup, never half-applied."""
    import time

    ns = netns()
    build.build(
        ns, realistic_node(backend="legacy", with_ipvs=True, third_party=True, nftables_table=True)
    )
    with start_fake_kube_proxy(ns, {"mode": "nftables", "families": ["IPv4"]}, tmp_path / "k"):
        before = dump(ns, ipvs=True)
        xtables_lock = tmp_path / "xtables.lock"
        holder = subprocess.Popen(["flock", str(xtables_lock), "sleep", "300"])
        try:
            while subprocess.run(["flock", "-n", str(xtables_lock), "true"]).returncode == 0:
                time.sleep(0.05)  # until the holder has it
            r = apply(ns, tmp_path, env={"XTABLES_LOCKFILE": str(xtables_lock)})
        finally:
            holder.kill()
            holder.wait()
        assert r.rc == 4, r
        assert dump(ns, ipvs=True) == before
        assert "done   delete-ipvs-service" in r.stdout, r.stdout  # IPVS went first
        assert "failed iptables-table legacy/" in r.stdout, r.stdout
        assert "xtables lock" in r.stdout, r.stdout
        assert "the node is as it was before cleanup" in r.stderr, r.stderr


# --- the re-check sees every change ----------------------------------------------------


@pytest.mark.parametrize("how", ["real-server-added", "weight-changed", "address-added"])
def test_a_changed_virtual_server_or_kube_ipvs0_after_the_backup_refuses(
    netns: Callable[[], str], tmp_path: Path, how: str
) -> None:
    """Between the backup and the re-check: a real server added to a leftover virtual server
    (its count changes: the plans differ), a real server's weight changed (same count: only
    the real-server listing compared with the bundle's ipvsadm.rules sees it), an address added
    to kube-ipvs0. Each refuses, exit 3, with the node exactly as the change left it."""
    ns = netns()
    build.build(ns, realistic_node(with_ipvs=True, third_party=True, nftables_table=True))
    with start_fake_kube_proxy(ns, {"mode": "nftables", "families": ["IPv4"]}, tmp_path / "kp"):
        before = dump(ns, ipvs=True)
        vs = "-t 10.96.0.1:443"  # default/kubernetes, one real server: the control plane
        (server,) = [line for line in before["ipvsadm"] if line.startswith(f"-a {vs} ")]
        assert server == f"-a {vs} -r 192.168.50.2:6443 -m -w 1"
        addresses = [line for line in before["kube-ipvs0"] if " inet " in line]

        def change() -> None:
            if how == "real-server-added":
                run = ["ipvsadm", "-a", *vs.split(), "-r", "192.168.50.2:6444", "-m"]
            elif how == "weight-changed":
                run = ["ipvsadm", "-e", *vs.split(), "-r", "192.168.50.2:6443", "-m", "-w", "7"]
            else:
                run = ["ip", "addr", "add", "10.96.99.99/32", "dev", "kube-ipvs0"]
            build.run(build.in_ns(ns, *run))

        r, changed = changed_during_the_pause(ns, tmp_path, change, ipvs=True)
        if how == "real-server-added":
            added = one_more_line(before, changed, "ipvsadm")
            assert added == f"-a {vs} -r 192.168.50.2:6444 -m -w 1"
            what = "virtual server TCP 10.96.0.1:443: was 'rr flags 0x2 timeout 0 "
            assert "1 real servers', now " in r.stderr and "2 real servers'" in r.stderr
        elif how == "weight-changed":
            assert {k: v for k, v in changed.items() if k != "ipvsadm"} == {
                k: v for k, v in before.items() if k != "ipvsadm"
            }
            assert [x for x in changed["ipvsadm"] if x not in before["ipvsadm"]] == [
                f"-a {vs} -r 192.168.50.2:6443 -m -w 7"
            ]
            assert len(changed["ipvsadm"]) == len(before["ipvsadm"])
            what = (
                f"virtual server {vs}: 1 real servers in the backup, 1 now "
                f"(new: '-a {vs} -r 192.168.50.2:6443 -m -w 7')"
            )
        else:
            added = one_more_line(before, changed, "kube-ipvs0")
            assert "inet 10.96.99.99/32" in added
            what = (
                f"link kube-ipvs0: {len(addresses)} addresses in the backup, "
                f"{len(addresses) + 1} now (new: '10.96.99.99/32')"
            )
        refused_for(r, what)
        assert dump(ns, ipvs=True) == changed
