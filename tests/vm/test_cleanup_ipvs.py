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
