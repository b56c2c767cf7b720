"""The gate's sync conditions on a real node (docs/contract.md#the-cleanup-gate): kube-proxy's
/livez stays 200 while its nftables transactions fail, and the cleanup must not take that for
a working nftables mode. The fake kube-proxy serves what a failing v1.37.2 serves: a change
queued after its last successful sync, or a failures counter that moves between the gate's
two reads. Refused means exit 3 and the node byte-identical."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import AGENT_HOOKS
from tests.dumps import dump, minus_leftovers
from tests.netns.test_cleanup import apply, node

pytestmark = pytest.mark.netns


def test_a_change_not_synced_for_a_sync_period_refuses_while_livez_is_200(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    # a Service was added 40 s ago, the last successful sync was 300 s ago (both families)
    with node(netns, tmp_path, state={"last_sync_age": 300.0, "queued_age": 40.0}) as (ns, kp):
        before = dump(ns)
        r = apply(ns, tmp_path)
        assert r.rc == 3, r.stdout + r.stderr
        assert (
            "refused: nftables mode is not confirmed (IPv4: a change queued 40s ago is not "
            "synced (last successful sync: 300s ago;" in r.stderr
        ), r.stderr
        assert dump(ns) == before
        kp.set(queued_age=None)  # the change was synced
        r = apply(ns, tmp_path)
        assert r.rc == 0, r.stdout + r.stderr
        assert dump(ns) == minus_leftovers(before)


def test_failures_counted_between_the_two_reads_refuse_before_any_change(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    with node(netns, tmp_path, state={"sync_failures": 2}) as (ns, kp):
        before = dump(ns)
        cmd = ["ip", "netns", "exec", ns, *AGENT_HOOKS, "cleanup", "--apply"]
        cmd += ["--backup-dir", str(tmp_path / "b"), "--lock-file", str(tmp_path / "l")]
        proc = subprocess.Popen(
            [*cmd, "--pause-before-execute", "5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        assert proc.stderr.readline().strip() == "re-checking the gate"  # first read done
        kp.set(sync_failures=3)  # a transaction failed: nothing queued, /livez still 200
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 3, out + err
        assert (
            "refused: nftables mode is not confirmed (IPv4: "
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total rose from 2 to 3 between "
            "the gate's two reads: nftables transactions are failing); nothing was changed"
        ) in err
        assert dump(ns) == before
        # the failures stopped: the counter stays at 3 and the gate confirms
        r = subprocess.run([*cmd, "--pause-before-execute", "1"], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        assert dump(ns) == minus_leftovers(before)
