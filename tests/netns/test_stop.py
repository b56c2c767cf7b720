"""A stop (SIGTERM, SIGINT) during a change to a lab node: `cleanup --apply` (also as PID 1 of
its PID namespace, as in the image), serve's auto-cleanup (a DaemonSet's rolling update) and
restore's undo (a second signal). Each ends with the node exactly as before the command, one
line saying so, and no tool left running."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from tests.conftest import AGENT, AGENT_HOOKS, agent_for, run_agent
from tests.dumps import dump
from tests.netns.test_cleanup import node

pytestmark = pytest.mark.netns
STEP = re.compile(r"^(done|gone|kept|failed) ")
UNDONE = "every change was undone"


def _cleanup(ns: str, tmp: Path, *extra: str, prefix: tuple[str, ...] = ()) -> list[str]:
    return [
        "ip", "netns", "exec", ns, *prefix, *agent_for(*extra), "cleanup", "--apply",
        "--backup-dir", str(tmp / "backups"), "--lock-file", str(tmp / "cleanup.lock"), *extra,
    ]  # fmt: skip


@contextmanager
def started(cmd: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """The command in its own session (a signal the test sends to its group reaches nothing
    else); killed with its group after 120 s, or at the end, whatever happens."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})}, start_new_session=True,
    )  # fmt: skip
    watchdog = threading.Timer(120, _killpg, (proc,))
    watchdog.start()
    try:
        yield proc
    finally:
        watchdog.cancel()
        _killpg(proc)
        proc.communicate(timeout=60)


def _killpg(proc: subprocess.Popen[str]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def wait_for(stream: object, match: Callable[[str], bool]) -> list[str]:
    """The lines read up to and including the first that matches (all of them if none)."""
    seen = []
    for line in stream:  # type: ignore[attr-defined]
        seen.append(line)
        if match(line):
            break
    return seen


def _in(ns: str, *cmd: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, check=True
    ).stdout


def nft_blocks(ruleset: str) -> list[str]:
    """`nft list ruleset` as its tables and their chains, sets and maps, each whole, in sorted
    order and with counters left out: a chain put back is listed after those that stayed, and
    the agent's own connections to kube-proxy count packets."""
    table, block, out = "", [], []
    for line in ruleset.splitlines():
        line = re.sub(r"counter packets \d+ bytes \d+", "counter", line)
        if line.startswith("table "):
            table = line
            out.append(line)
        elif block:
            block.append(line)
            if line == "\t}":
                out.append("\n".join(block))
                block = []
        elif re.match(r"\t\S.* \{$", line):
            block = [table, line]
    return sorted(out)


def node_state(ns: str) -> dict[str, list[str]]:
    """dump() (iptables-save of both backends, ipset save, nftables' own tables, links and
    addresses: `ip -o addr` without the lifetimes), `nft list ruleset` as above and the whole
    `ipset list`."""
    out = dump(ns)
    out["nft list ruleset"] = nft_blocks(_in(ns, "nft", "list", "ruleset"))
    out["ipset list"] = _in(ns, "ipset", "list").splitlines()
    return out


def tools_in(ns: str) -> list[str]:
    """The netfilter tools (or their shims) running in the namespace `ns`."""
    netns = os.stat(f"/run/netns/{ns}").st_ino
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino != netns:
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone, or not ours to read
            continue
        if re.search(r"tables|ipset|sleep", cmd):
            found.append(f"{pid} {cmd}")
    return found


# --- row 6: cleanup --apply stopped after its first step -----------------------------------


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT-to-the-group"])
def test_a_stop_after_the_first_step_undoes_to_the_before_state(
    netns: Callable[[], str], tmp_path: Path, how: str
) -> None:
    """SIGTERM (a Job's activeDeadlineSeconds, `kubectl delete job`) or a terminal's ^C (SIGINT
    to the whole foreground group, the tools included) once step 1 is done: the cleanup ends
    the step it is in, puts back what it removed, says so in one line, exit 4."""
    with node(netns, tmp_path) as (ns, _):
        before = node_state(ns)
        with started(_cleanup(ns, tmp_path, "--step-delay", "1")) as proc:
            seen = wait_for(proc.stdout, STEP.match)
            assert seen[-1].startswith("done   iptables-table"), seen
            if how == "SIGTERM":
                proc.send_signal(signal.SIGTERM)
            else:
                os.killpg(proc.pid, signal.SIGINT)
            out, err = proc.communicate(timeout=90)
        assert tools_in(ns) == []
        assert node_state(ns) == before
    sig = how.split("-")[0]
    steps = [line for line in seen + out.splitlines(True) if STEP.match(line)]
    assert proc.returncode == 4, (proc.returncode, out, err)
    assert len(steps) in (1, 2), steps  # the step under way when the signal came ends whole
    (bundle,) = (tmp_path / "backups").iterdir()
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert re.fullmatch(
        rf"ipvs-leftovers: stopped by {sig} after step {len(steps)} of \d+; {UNDONE} \(\d+ "
        rf"objects put back from {re.escape(str(bundle))}\): the node is as it was before cleanup",
        lines[0],
    ), lines[0]


def _pid1(unshare: subprocess.Popen[str]) -> int:
    """The agent unshare forked: PID 1 of the new PID namespace."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        kids = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()
        if kids:
            status = Path(f"/proc/{kids[0]}/status").read_text()
            nspid = re.search(r"^NSpid:\s+(.*)$", status, re.M)
            assert nspid and nspid.group(1).split()[-1] == "1", status
            return int(kids[0])
        time.sleep(0.05)
    raise AssertionError("unshare started no agent")


def test_a_sigterm_reaches_the_agent_as_pid_1_and_undoes(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """As in the image: the agent is PID 1 of its PID namespace, where a signal with no handler
    is dropped. SIGTERM after step 1 stops and undoes it all the same."""
    pid_ns = ("unshare", "--pid", "--fork", "--mount-proc")
    with node(netns, tmp_path) as (ns, _):
        before = node_state(ns)
        with started(_cleanup(ns, tmp_path, "--step-delay", "1", prefix=pid_ns)) as proc:
            agent = _pid1(proc)
            seen = wait_for(proc.stdout, STEP.match)
            assert seen[-1].startswith("done   iptables-table"), seen
            os.kill(agent, signal.SIGTERM)
            out, err = proc.communicate(timeout=90)
        assert node_state(ns) == before
    assert proc.returncode == 4, (proc.returncode, out, err)
    assert re.fullmatch(
        rf"ipvs-leftovers: stopped by SIGTERM after step [12] of \d+; {UNDONE} .*: the node is "
        "as it was before cleanup\n",
        err,
    ), err


# --- row 7: serve --auto-cleanup stopped during its cleanup ----------------------------------


def _slow_restore_tools(folder: Path) -> dict[str, str]:
    """iptables-nft-restore and ip6tables-nft-restore first on PATH, each taking 1 s longer:
    the tool is running when serve is stopped."""
    folder.mkdir()
    for tool in ("iptables-nft-restore", "ip6tables-nft-restore"):
        real = shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin")
        (folder / tool).write_text(f'#!/bin/sh\nsleep 1\nexec {real} "$@"\n')
        (folder / tool).chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def _since(state: Path) -> float | None:
    return json.loads(state.read_text())["since"]


def test_stopping_serve_during_its_auto_cleanup_undoes_and_keeps_the_hold_down(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    """A DaemonSet's rolling update: SIGTERM once the auto-cleanup has removed its first table,
    while the next table's tool runs. serve waits for that tool, undoes the cleanup, logs one
    line saying so, exits 0; no tool outlives it, and the state file keeps the streak's start
    (the next pod does not wait a whole hold-down again)."""
    state = tmp_path / "run" / "auto-cleanup.json"
    args = [
        "serve", "--listen", "127.0.0.1:9437", "--auto-cleanup", "--auto-cleanup-hold-down", "3s",
        "--auto-cleanup-interval", "0.5", "--min-interval", "0", "--backup-dir",
        str(tmp_path / "b"), "--lock-file", str(tmp_path / "l"), "--auto-cleanup-state", str(state),
    ]  # fmt: skip
    env = _slow_restore_tools(tmp_path / "bin")
    with node(netns, tmp_path, dual=True) as (ns, _):
        before = node_state(ns)
        with started(["ip", "netns", "exec", ns, AGENT, *args], env) as proc:
            seen = wait_for(proc.stderr, lambda line: "done   iptables-table" in line)
            assert "done   iptables-table" in seen[-1], seen
            since = json.loads(state.read_text())  # written before the run
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=90)
            left = tools_in(ns)
            time.sleep(2)  # a tool left behind would still be changing the node
            assert node_state(ns) == before
        assert left == []
    log = "".join(seen) + err
    assert proc.returncode == 0, log
    stops = [line for line in log.splitlines() if "stopped by SIGTERM" in line]
    assert len(stops) == 1, log
    assert re.search(
        rf"stopped by SIGTERM after step [12] of \d+; {UNDONE} \(\d+ objects put back from "
        r".*\): the node is as it was before cleanup$",
        stops[0],
    ), stops[0]
    assert log.splitlines()[-1].endswith("stopped"), log
    saved = json.loads(state.read_text())
    assert since["since"] is None  # the run restarts the hold-down on disk (a SIGKILL) ...
    assert saved["since"] is not None  # ... and a stop puts its start back
    assert saved["since"] <= saved["last_seen"] - 3


# --- row 9: a second signal during restore's undo --------------------------------------------


@pytest.mark.parametrize("second", [("SIGTERM", "SIGTERM"), ("SIGINT", "SIGTERM")])
def test_a_second_signal_during_restores_undo_is_reported_not_obeyed(
    netns: Callable[[], str], tmp_path: Path, second: tuple[str, str]
) -> None:
    """restore is stopped after its second step; while it undoes (slowed by --step-delay),
    two more signals come: each is reported on stderr, the undo completes, and the node is
    exactly as before restore."""
    with node(netns, tmp_path) as (ns, _):
        r = run_agent(ns, *_cleanup(ns, tmp_path)[5:])
        assert r.rc == 0, r
        (bundle,) = (tmp_path / "backups").iterdir()
        cleaned = node_state(ns)
        cmd = ["ip", "netns", "exec", ns, *AGENT_HOOKS, "restore", str(bundle), "--lock-file",
               str(tmp_path / "cleanup.lock"), "--step-delay", "1"]  # fmt: skip
        with started(cmd) as proc:
            seen = wait_for(proc.stdout, lambda line: line.startswith("restored iptables"))
            assert seen[-1].startswith("restored iptables"), seen
            proc.send_signal(signal.SIGTERM)
            seen += wait_for(proc.stdout, lambda line: "undoing" in line)
            assert "undoing" in seen[-1], seen
            for name in second:
                proc.send_signal(getattr(signal, name))
                time.sleep(0.2)
            out, err = proc.communicate(timeout=90)
        assert node_state(ns) == cleaned
    assert proc.returncode == 4, (proc.returncode, out, err)
    lines = err.splitlines()
    assert lines[:2] == [
        f"ipvs-leftovers: {name} received while undoing: ignored until the undo ends"
        for name in second
    ], err
    assert len(lines) == 3, err
    assert re.fullmatch(
        rf"ipvs-leftovers: restore of {re.escape(str(bundle))}: stopped by SIGTERM; {UNDONE}: "
        "the node is as it was before restore",
        lines[2],
    ), lines[2]
