"""A live connection through a virtual server ipvs mode left: cleanup waits for it, refuses
without changing the node, and cuts it only when told (docs/contract.md#live-connections).

Real kube-proxy (the newest release) programs one node in ipvs mode; a client on the node opens a
TCP connection to a ClusterIP and keeps it open, as a database or gRPC client does; then
nftables mode starts without `modprobe` on its PATH (scenario B: its start-up cleanup of ipvs
mode's state returns at once). The connection keeps going through IPVS (an established flow
keeps its conntrack entry; nftables mode's DNAT only acts on new ones), and IPVS counts it
active. The API server is tests/fake_apiserver.py inside the node's namespace, as in the
namespace tier's real-kube-proxy test: this test is about the kernel's connection tracking, and
a control plane of its own on the host would cost the tier a start for one Service.

`cleanup --apply` with its defaults waits `--drain-timeout` (30 s), refuses with exit 5 and the
count, and the node is as it was (every object the standard CLIs list, the connection still
echoing); with `--cut-connections` it proceeds, says it cut 1 active connection (its output,
plan.json in the bundle), and the connection is gone.

Its cost to the tier, measured alone in one boot at host load 10-15: 419 s (ipvs mode programmed
168 s after the node was made, the refused cleanup 36 s); at load 30-60, 1,404 s. The fake API
server serves no ServiceCIDRs (kube-proxy v1.37 logs its failed list every few seconds); a real
control plane (tests/realkp/control_planes.py) may start ipvs mode sooner: not measured.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import upstream
from tests.fake_apiserver import Cluster, Endpoint, FakeAPIServer, Node, Port, Service
from tests.realkp import state as st
from tests.realkp.node import (
    KubeProxy,
    NodeNet,
    delete_namespace,
    in_netns,
    ns_run,
    setup_namespace,
)
from tests.realkp.pipeline import AgentRun, agent

pytestmark = pytest.mark.realkp

# An index no node of tests/realkp/nodes.py uses: 192.168.100.10, namespace rkdrain-nft-v4.
NET = NodeNet(40, "nft", False, "drain")
POD = "10.244.0.10"  # a local endpoint: on the namespace's lo (tests/realkp/node.py)
DB = Service(
    "db",
    ("10.96.7.7",),
    (Port(5432, target_port=9090, name="pg"),),
    endpoints=(Endpoint(POD, NET.name),),
)
# a second Service, with no connection: deleted too, never named in the refusal
WEB = Service(
    "web", ("10.96.7.8",), (Port(80, target_port=8080, name="http"),),
    endpoints=(Endpoint(POD, NET.name),),
)  # fmt: skip
DB_VS = "TCP 10.96.7.7:5432"
WEB_VS = "TCP 10.96.7.8:80"


def _echo_server(ns: str) -> socket.socket:
    """A server that echoes every connection until its client closes it (the database)."""
    server = in_netns(ns, lambda: socket.create_server((POD, 9090)))

    def echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server


def echoes(conn: socket.socket, timeout: float = 10.0) -> bool:
    """True when a message sent on the open connection comes back."""
    conn.settimeout(timeout)
    try:
        conn.sendall(b"ping\n")
        return conn.recv(16) == b"ping\n"
    except OSError:  # reset, or no answer within the timeout
        return False


def _wait(what: str, ready: Callable[[], bool], kp: KubeProxy, timeout: float = 900.0) -> None:
    """Until `ready`; gives up with what the last poll saw and the end of kube-proxy's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(5)  # each poll starts processes: keep them rare under TCG
    ipvs = ns_run(NET.ns, "ipvsadm", "-S", "-n", check=False)
    sets = ns_run(NET.ns, "ipset", "list", "-n", check=False).split()
    raise AssertionError(
        f"{what} not reached within {timeout}s; kube-proxy: {kp.last_seen}; IPVS: {ipvs!r}; "
        f"sets: {sets}; its log: {kp.tail(4000)}"
    )


@dataclass
class Run:
    """What the module's one node showed, read by the tests below."""

    ipvs_active: str  # /proc/net/ip_vs with the connection open, in nftables mode
    audit: AgentRun
    textfile: str
    plan: AgentRun
    refused: AgentRun
    refused_backups: list[str]
    before: st.State
    after_refusal: st.State
    raw_before: str
    raw_after_refusal: str
    alive_after_refusal: bool
    cut: AgentRun
    plan_json: dict[str, object]
    after_cut: st.State
    alive_after_cut: bool
    timings: dict[str, float]


def _raw(ns: str) -> str:
    """The state as the tools print it, unnormalised where no counter moves."""
    return "\n".join(
        ns_run(ns, *cmd, check=False)
        for cmd in (
            ("ipvsadm", "-S", "-n"),
            ("ipset", "save"),
            ("nft", "-s", "list", "ruleset"),
            ("ip", "-d", "-o", "link"),
            ("ip", "-o", "addr"),
        )
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    subprocess.run(["modprobe", "-a", "ip_vs", "ip_vs_rr", "dummy", "nf_conntrack"], check=True)
    work = tmp_path_factory.mktemp("drain")
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    listener = setup_namespace(NET)
    ns = NET.ns
    server = _echo_server(ns)
    cluster = Cluster(Node(NET.name, (NET.v4,), ("10.244.0.0/24",)), [DB, WEB])
    api = in_netns(ns, lambda: FakeAPIServer(cluster)).start()
    kp = KubeProxy(NET, upstream.kube_proxy(), work, api.kubeconfig())
    conn: socket.socket | None = None
    try:
        kp.start("ipvs")
        _wait("ipvs mode's virtual servers", lambda: kp.synced() and _programmed(ns), kp)
        timings["ipvs mode"] = time.monotonic() - t0
        conn = in_netns(ns, lambda: socket.create_connection(("10.96.7.7", 5432), timeout=10))
        assert echoes(conn), "the connection through IPVS does not echo"
        kp.stop()
        kp.start("nftables", modprobe=False)
        _wait("nftables mode", kp.synced, kp)
        timings["nftables mode"] = time.monotonic() - t0
        assert echoes(conn), "the connection did not survive the move to nftables mode"
        ipvs_active = ns_run(ns, "cat", "/proc/net/ip_vs")

        audit = agent(ns, "audit", "--json", "--textfile", str(work / "metrics.prom"))
        plan = agent(ns, "cleanup")
        before, raw_before = st.read(NET), _raw(ns)
        t = time.monotonic()
        lock = str(work / "cleanup.lock")
        refused = agent(
            ns, "cleanup", "--apply", "--backup-dir", str(work / "b1"), "--lock-file", lock
        )
        timings["refused cleanup"] = time.monotonic() - t
        after_refusal, raw_after = st.read(NET), _raw(ns)
        alive = echoes(conn)
        cut = agent(
            ns, "cleanup", "--apply", "--cut-connections", "--drain-timeout", "0",
            "--backup-dir", str(work / "b2"), "--lock-file", lock,
        )  # fmt: skip
        bundles = sorted((work / "b2").glob("*/plan.json"))
        plan_json = json.loads(bundles[0].read_text()) if bundles else {}
        yield Run(
            ipvs_active=ipvs_active,
            audit=audit,
            textfile=(work / "metrics.prom").read_text(),
            plan=plan,
            refused=refused,
            refused_backups=sorted(p.name for p in (work / "b1").glob("*")),
            before=before,
            after_refusal=after_refusal,
            raw_before=raw_before,
            raw_after_refusal=raw_after,
            alive_after_refusal=alive,
            cut=cut,
            plan_json=plan_json,
            after_cut=st.read(NET),
            alive_after_cut=echoes(conn, timeout=5),
            timings=timings,
        )
    finally:
        timings["total"] = time.monotonic() - t0
        print(f"live connections: {timings}")
        out = Path(os.environ.get("VM_OUT", "/tmp")) / "realkp-live-connections"
        out.mkdir(parents=True, exist_ok=True)
        for log in work.glob("*.log"):  # kube-proxy's, for a failure's post-mortem
            shutil.copy(log, out / log.name)
        if conn is not None:
            conn.close()
        kp.stop()
        api.stop()
        server.close()
        listener.kill()
        listener.wait()
        delete_namespace(NET)


def _programmed(ns: str) -> bool:
    """Both virtual servers with their real server, and the members that name them."""
    ipvs = ns_run(ns, "ipvsadm", "-S", "-n", check=False)
    sets = ns_run(ns, "ipset", "save", "KUBE-CLUSTER-IP", check=False)
    return all(
        f"-a -t {vs}" in ipvs and f"add KUBE-CLUSTER-IP {addr},tcp:{port}" in sets
        for vs, addr, port in (
            ("10.96.7.7:5432", "10.96.7.7", 5432),
            ("10.96.7.8:80", "10.96.7.8", 80),
        )
    )


def test_the_connection_goes_through_ipvs_on_the_nftables_node(run: Run) -> None:
    """The premise: IPVS counts the connection active after the move (ActiveConn 1)."""
    lines = run.ipvs_active.splitlines()
    db = next(i for i, line in enumerate(lines) if line.startswith("TCP  0A600707:1538"))
    assert lines[db + 1].split()[4:6] == ["1", "0"], run.ipvs_active


def _step(plan: str, target: str) -> list[str]:
    """A plan step's own lines (its evidence, its connections), after its heading."""
    lines = plan.splitlines()
    at = next(i for i, line in enumerate(lines) if line.endswith(f"delete-ipvs-service {target}"))
    return [
        line for line in itertools.takewhile(lambda x: x.startswith("       "), lines[at + 1 :])
    ]


def test_the_plan_audit_and_metrics_show_the_connection(run: Run) -> None:
    assert run.plan.rc == 1, run.plan.stderr
    out = run.plan.stdout
    assert "       connections: 1 active, 0 inactive" in _step(out, DB_VS), out
    assert "       connections: 0 active, 0 inactive" in _step(out, WEB_VS), out
    assert (
        f"connections: 1 active connection (0 inactive) through 1 virtual server: {DB_VS} (1); "
        "--apply would wait up to 30s for them to close (--drain-timeout), then refuse (exit 5) "
        "while any is open"
    ) in out, out
    doc = run.audit.json()
    assert doc["ipvs_connections"] == {
        "leftovers": {"active": 1, "inactive": 0},
        "foreign": {"active": 0, "inactive": 0},
    }
    assert 'ipvs_leftovers_ipvs_connections{class="kube-proxy",state="active"} 1.0' in run.textfile


def test_default_cleanup_waits_then_refuses_and_changes_nothing(run: Run) -> None:
    r = run.refused
    assert r.rc == 5, (r.rc, r.stdout, r.stderr)
    assert "waiting up to 30s for the active ones to close (--drain-timeout)" in r.stdout
    assert r.stderr.strip().splitlines()[-1] == (
        f"ipvs-leftovers: refused: 1 active connection (0 inactive) through 1 virtual server: "
        f"{DB_VS} (1) still open after waiting 30s (--drain-timeout); deleting a virtual server cuts "
        "the connections IPVS tracks through it (ipvs mode set net.ipv4.vs.expire_nodest_conn=1)"
        "; nothing was changed; run again once they have closed, give a longer --drain-timeout, "
        "or pass --cut-connections to cut them"
    ), r.stderr
    assert r.seconds >= 30
    assert run.refused_backups == []  # not even a bundle: the refusal comes before the backup
    assert run.after_refusal == run.before
    assert run.raw_after_refusal == run.raw_before
    assert run.alive_after_refusal, "the refused cleanup cut the connection"


def test_cut_connections_proceeds_and_says_how_many(run: Run) -> None:
    r = run.cut
    assert r.rc == 0, (r.rc, r.stdout, r.stderr)
    assert "connections: cutting 1 active, 0 inactive (--cut-connections)" in r.stdout
    assert "connections cut: 1 active, 0 inactive" in r.stdout
    doc = run.plan_json
    assert doc["connections"] == {
        "active": 1,
        "inactive": 0,
        "waited_seconds": 0.0,
        "drain_timeout": 0.0,
        "cut_connections": True,
    }
    steps = {s["target"]: s for s in doc["steps"]}  # type: ignore[attr-defined]
    assert steps[DB_VS]["connections"] == {"active": 1, "inactive": 0}
    assert steps[WEB_VS]["connections"] == {"active": 0, "inactive": 0}
    assert DB_VS not in run.after_cut.ipvs and WEB_VS not in run.after_cut.ipvs
    assert not run.alive_after_cut, "the connection still echoes after its virtual server went"
