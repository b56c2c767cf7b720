"""scripts/vm-run --cached-root, the root bench/run measures in: one VM boot (~1 min under TCG).

The benchmark's ratios of Python to the C tools depend on it, so what it promises
is checked in a real boot: the root is the host's, read-only and page-cached; /tmp (the host's
with a throwaway layer: a clone of the repo under /tmp stays visible), $VM_OUT
and network namespaces work; CMD runs in the repo with the agent venv first on PATH; CMD's
exit code comes back.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

GUEST = r"""
set -u
echo "cwd=$PWD"
awk '$2 == "/" { print "root=" $3 " " $4 }' /proc/mounts
f=$(mktemp /tmp/vm-run-probe.XXXXXX) && echo in-tmp > "$f" && echo "tmp=$(cat "$f")"
echo from-guest > "$VM_OUT/probe"
touch "$PWD/vm-run-probe" 2>/dev/null && echo repo=writable || echo repo=read-only
ip netns add vmrunprobe && ip netns exec vmrunprobe ip -o link show lo | grep -c LOOPBACK
ip netns del vmrunprobe
echo "python=$(command -v python)"
exit 7
"""


def test_cached_root_is_the_hosts_page_cached_and_read_only(tmp_path: Path) -> None:
    p = subprocess.run(
        [str(REPO / "scripts/vm-run"), "--cached-root", "--out", str(tmp_path), "--"]
        + ["bash", "-c", GUEST],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 7, p.stderr[-2000:]
    lines = {k: v for k, sep, v in (line.partition("=") for line in p.stdout.splitlines()) if sep}
    assert lines["cwd"] == str(REPO)
    fstype, opts = lines["root"].split(" ")
    assert fstype == "9p"
    assert {"ro", "loose"} <= set(opts.split(",")), opts
    assert lines["tmp"] == "in-tmp"
    assert not list(Path("/tmp").glob("vm-run-probe.*"))  # the layer never reaches the host
    assert (tmp_path / "probe").read_text() == "from-guest\n"
    # The repo is read-only, unless it lives under /tmp: then it is in the guest's writable /tmp
    # layer (a clone somewhere under /tmp), whose writes never reach the host either.
    assert lines["repo"] == ("writable" if REPO.is_relative_to("/tmp") else "read-only")
    assert not (REPO / "vm-run-probe").exists()
    assert lines["python"] == str(REPO / ".venv/bin/python")
    assert p.stdout.splitlines().count("1") == 1  # lo in the new namespace


@pytest.mark.alone  # it busies every core itself: the tests beside it would stretch
def test_user_net_is_up_when_cmd_starts_on_a_loaded_host(tmp_path: Path) -> None:
    """--user-net: CMD's first instruction reaches the host's loopback at 10.0.2.2, with the
    host's cores busy as in scripts/test (the control planes and the build beside the VM).

    A fresh clone's run: virtme-ng's init ran DHCP beside CMD; on a loaded host CMD started with no network
    at all ("Device eth0 does not exist", no route), and the real-kube-proxy tier waited 300 s
    for API servers it could never reach."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(600)
    port = server.getsockname()[1]
    accepted: list[bytes] = []

    def accept() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            accepted.append(conn.recv(64))

    threading.Thread(target=accept, daemon=True).start()
    guest = (
        "exec 3<>/dev/tcp/10.0.2.2/$1 && echo from-guest >&3 && echo connected; "
        'ip -4 -o addr show | awk \'$2 != "lo" {print "addr=" $4}\''
    )
    burners = [
        subprocess.Popen(["sh", "-c", "while :; do :; done"])  # a builtin loop: no child
        for _ in range(2 * (os.cpu_count() or 2))
    ]
    try:
        p = subprocess.run(
            [str(REPO / "scripts/vm-run"), "--user-net", "--out", str(tmp_path), "--"]
            + ["bash", "-c", guest, "guest", str(port)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        for b in burners:
            b.kill()
            b.wait()
        server.close()
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.splitlines() == ["connected", "addr=10.0.2.15/24"]
    assert accepted == [b"from-guest\n"]
