"""serve under load and abuse: a bounded pool of workers, a deadline for each
request, a normal listen backlog, no spin when file descriptors run out. Real clients on the
namespace's loopback, bounded in count and time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import AGENT, REPO, python_json
from tests.serving import serving

pytestmark = pytest.mark.netns
FETCH = str(REPO / "tests" / "fetch.py")

FLOOD = """
import json, socket, sys, threading, time
n, results = int(sys.argv[1]), []
go = threading.Event()
def one():
    go.wait()
    start = time.monotonic()
    ok = False
    try:
        s = socket.create_connection(("127.0.0.1", 9437), 60)
        s.sendall(b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n"
                  b"X-Prometheus-Scrape-Timeout-Seconds: 10\\r\\n\\r\\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        ok = data.split(b" ", 2)[1] == b"200" and b"ipvs_leftovers_stale" in data
    except OSError:
        pass
    results.append((time.monotonic() - start, ok))
threads = [threading.Thread(target=one) for _ in range(n)]
for t in threads:
    t.start()
go.set()
for t in threads:
    t.join()
print(json.dumps(results))
"""


@pytest.mark.alone  # p95 under 2 s: of the agent, not of five other workers on two cores
def test_two_hundred_concurrent_scrapes_are_all_answered_quickly(netns: Callable[[], str]) -> None:
    """200 scrapes at once: every one answered, p95 under 2 s. Before (one thread per
    connection, listen backlog 5) the p95 was 14 s, and here 88 of 200 got no answer in 60 s."""
    ns = netns()
    with serving(ns):
        python_json(ns, FETCH, "http://127.0.0.1:9437/metrics")  # the collection, made once
        out = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", FLOOD, "200"],
            capture_output=True,
            text=True,
            timeout=240,
            check=True,
        )
    results = json.loads(out.stdout)
    took = sorted(t for t, _ in results)
    p95 = took[int(len(took) * 0.95) - 1]
    assert sum(ok for _, ok in results) == 200, results
    assert p95 < 2.0, f"p95 {p95:.2f}s"


SLOW_CLIENTS = """
import json, socket, sys, threading, time
n, results = int(sys.argv[1]), []
def one():
    s = socket.create_connection(("127.0.0.1", 9437), 5)
    s.settimeout(1.5)
    start = time.monotonic()
    request = b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n" + b"X-Pad: " + b"a" * 100
    for i in range(len(request)):  # a byte a second, never the end of the headers
        try:
            s.sendall(request[i : i + 1])
            if s.recv(1) == b"":
                break  # the server hung up
        except socket.timeout:
            continue
        except OSError:
            break
        if time.monotonic() - start > 40:
            break
    results.append(time.monotonic() - start)
threads = [threading.Thread(target=one) for _ in range(n)]
for t in threads:
    t.start()
print("started", flush=True)
for t in threads:
    t.join()
print(json.dumps(results), flush=True)
"""


def test_slow_loris_clients_are_cut_at_the_request_deadline_and_stall_no_one(
    netns: Callable[[], str],
) -> None:
    """40 clients sending their request a byte a second hold no worker past the request
    deadline (10 s), and a real scrape meanwhile is answered at once. Before, each read had a
    30 s timeout of its own, so a byte a second kept a thread forever."""
    ns = netns()
    with serving(ns):
        slow = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", SLOW_CLIENTS, "40"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert slow.stdout is not None and slow.stdout.readline().strip() == "started"
            time.sleep(2)
            scrape = python_json(ns, FETCH, "http://127.0.0.1:9437/metrics", "--timeout", "30")
            out, _ = slow.communicate(timeout=90)
        finally:
            slow.kill()
            slow.wait()
    assert scrape.get("status") == 200, scrape
    assert scrape["seconds"] < 5, scrape["seconds"]
    held = json.loads(out)
    assert len(held) == 40
    assert max(held) < 14, f"slow clients held on for up to {max(held):.1f}s"


IDLE_CLIENTS = """
import socket, sys, threading, time
conns = []
def one():
    try:
        conns.append(socket.create_connection(("127.0.0.1", 9437), 3))
    except OSError:
        pass
threads = [threading.Thread(target=one) for _ in range(int(sys.argv[1]))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(conns), flush=True)
time.sleep(60)
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def _serve_with_fd_limit(ns: str, limit: int) -> Iterator[subprocess.Popen[str]]:
    cmd = ["ip", "netns", "exec", ns, "prlimit", f"--nofile={limit}:{limit}"]
    proc = subprocess.Popen(
        [*cmd, AGENT, "serve", "--listen", "127.0.0.1:9437"], stderr=subprocess.PIPE, text=True
    )
    try:
        for _ in range(300):
            if python_json(ns, "-c", _PROBE) or proc.poll() is not None:
                break
            time.sleep(0.2)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_PROBE = """
import json, socket
try:
    socket.create_connection(("127.0.0.1", 9437), 1).close()
    print("true")
except OSError:
    print("false")
"""


def test_out_of_file_descriptors_serve_pauses_instead_of_spinning(
    netns: Callable[[], str],
) -> None:
    """With 20 file descriptors and 100 clients that connect and say nothing, accept() fails
    with EMFILE: serve must not spin (it ran at 100 % CPU), and it serves again once the idle
    clients are gone."""
    ns = netns()
    with _serve_with_fd_limit(ns, 20) as proc:
        idle = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", IDLE_CLIENTS, "100"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert idle.stdout is not None
            connected = int(idle.stdout.readline())
            before = _cpu_seconds(proc.pid)
            time.sleep(4)
            busy = (_cpu_seconds(proc.pid) - before) / 4
        finally:
            idle.kill()
            idle.wait()
        scrape = python_json(ns, FETCH, "http://127.0.0.1:9437/healthz", "--timeout", "20")
    # here about 0.3 % (a spin on this shared 2-core machine measured 29-37 %)
    assert busy < 0.1, f"serve used {busy:.0%} of a CPU while out of file descriptors"
    assert connected == 100  # the kernel's backlog (128, was 5) holds what serve cannot accept
    assert scrape.get("status") == 200, scrape
