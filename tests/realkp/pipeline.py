"""The real-kube-proxy run of one node: kube-proxy in each mode in turn, the agent after each.

Per node (one namespace, one backend, IPv4-only or dual-stack, its own API server), in one
sequence that shares the kube-proxy phases between the scenarios (tests/realkp/nodes.py):

  S0 third-party state -> ipvs mode (S1; what it made = S1 - S0) -> CNI hostport rule ->
  nftables mode without `modprobe` on its PATH: scenario B (from v1.34 its start-up cleanup
  returns at once; before, the saved ipvs-mode state is put back) -> restart with `modprobe`,
  its cleanup runs: scenario A -> the Node tainted: scenario T -> a Service pushed through the
  API server -> stop; `kube-proxy --cleanup` on B's state -> iptables mode (S4 -> S5; what it
  made = S5 - S4) -> nftables mode, the saved state put back: scenario C.
  U: ipvs mode on the release before, then nftables mode on the node's release.

Each scenario records everything the tests assert on (`Scenario`); nothing is asserted here, so
one failing expectation never hides the others. Every scenario's restore gives the node back
the state the scenario started from, which the next phase starts from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import upstream
from tests.fake_apiserver import Port, Service
from tests.realkp import mix, shape_steps
from tests.realkp import state as st
from tests.realkp.cluster import RealAPI
from tests.realkp.node import (
    KubeProxy,
    NodeNet,
    delete_namespace,
    endpoints,
    http_get,
    ns_run,
    probe,
    save_json,
    setup_namespace,
)
from tests.realkp.nodes import NodeSpec
from tests.realkp.shapes import Shape

TAINT = "ToBeDeletedByClusterAutoscaler"  # the cluster autoscaler's, which /healthz honours

IPTABLES_NFT_TABLES = {"filter", "nat", "mangle", "raw", "security"}
AGENT = str(Path(sys.executable).with_name("ipvs-leftovers"))


@dataclass
class AgentRun:
    args: list[str]
    rc: int
    stdout: str
    stderr: str
    seconds: float

    def json(self) -> Any:
        return json.loads(self.stdout)


# Under TCG on a loaded host one iptables-save can take longer than the agent's 5 s default
# (that read is then an error and audit exits 4): the tier gives every read a minute.
AGENT_TIMEOUT = ("--timeout", "60")


def agent(ns: str, *args: str) -> AgentRun:
    t = time.monotonic()
    cmd = ["ip", "netns", "exec", ns, AGENT, *AGENT_TIMEOUT, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return AgentRun(list(args), p.returncode, p.stdout, p.stderr, time.monotonic() - t)


@dataclass
class Scenario:
    name: str
    net: NodeNet
    before: st.State  # the node as the agent meets it
    made_ipvs: set[str]  # objects real ipvs mode created (S1 - S0)
    made_iptables: set[str]  # objects real iptables mode created (C only)
    rewritten: set[str] = field(default_factory=set)  # ipvs-mode chains iptables mode rewrote
    audit: AgentRun | None = None
    textfile: str = ""
    healthz: list[int] = field(default_factory=list)  # /healthz codes before, after, after 2nd
    livez: list[int] = field(default_factory=list)  # /livez codes at the same moments
    probes_before: dict[str, str] = field(default_factory=dict)
    probes_after: dict[str, str] = field(default_factory=dict)
    cleanup: AgentRun | None = None
    after: st.State | None = None
    verify: AgentRun | None = None
    cleanup2: AgentRun | None = None
    after2: st.State | None = None
    restore: AgentRun | None = None
    restored: st.State | None = None
    kube_proxy_alive: bool = True

    @property
    def made(self) -> set[str]:
        return self.made_ipvs | self.made_iptables

    @property
    def leftovers(self) -> set[str]:
        """What a mode made that is still on the node when the agent looks; not iptables-nft's
        base tables (`ip6 nat`...: the backend's, like legacy's tables, never removed), not
        iptables mode's copy of kubelet's KUBE-FIREWALL (kept as kubelet's)."""
        return {
            o
            for o in self.made & self.before.objects()
            if o.split()[-1] not in IPTABLES_NFT_TABLES or not o.startswith("nft ")
        }


@dataclass
class NodeRun:
    net: NodeNet
    timings: dict[str, float] = field(default_factory=dict)
    endpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    states: dict[str, st.State] = field(default_factory=dict)
    scenarios: dict[str, Scenario] = field(default_factory=dict)
    error: str = ""
    kp_cleanup: tuple[int, str] = (-1, "")
    watch: dict[str, bool] = field(default_factory=dict)
    logs: list[Path] = field(default_factory=list)
    # B: what kube-proxy's no-modprobe start left of ipvs mode's objects, before any put-back
    start_removed: list[str] = field(default_factory=list)
    deprecation_events: list[dict[str, Any]] = field(default_factory=list)  # IPVSDeprecation
    deprecation_log: list[str] = field(default_factory=list)  # ipvs mode's log lines saying so
    server_version: str = ""  # the node's kube-apiserver, as `kubectl version` reports it
    # what a node of another shape recorded (tests/realkp/shape_steps.py): "arp" sysctls per
    # state, per scenario its own checks
    shape: dict[str, Any] = field(default_factory=dict)


_T0 = time.monotonic()
OUT = Path(os.environ.get("VM_OUT", "/tmp")) / "realkp"


def note(net: NodeNet, what: str) -> None:
    """One progress line in $VM_OUT/realkp/progress.log: a slow VM run can be followed."""
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "progress.log", "a") as f:
        f.write(f"{time.monotonic() - _T0:7.1f} {net.ns} {what}\n")


def _probes(net: NodeNet) -> dict[str, str]:
    return {
        "clusterip": probe(net, mix.web_cluster_ip(net), 80),
        "nodeport": probe(net, net.addr, mix.WEB_NODE_PORT),
    }


def _healthz(net: NodeNet) -> int:
    return http_get(net.ns, "http://127.0.0.1:10256/healthz")[0]


def _livez(net: NodeNet) -> int:
    return http_get(net.ns, "http://127.0.0.1:10256/livez")[0]


def _health(sc: Scenario) -> None:
    sc.healthz.append(_healthz(sc.net))
    sc.livez.append(_livez(sc.net))


def run_scenario(sc: Scenario, kp: KubeProxy, work: Path) -> None:
    net = sc.net
    ns = net.ns
    textfile = work / f"{ns}-{sc.name}.prom"
    backups = work / f"{ns}-{sc.name}-backups"
    common = ["--backup-dir", str(backups), "--lock-file", str(work / f"{ns}.lock")]
    note(net, f"scenario {sc.name}")
    _health(sc)
    sc.probes_before = _probes(net)
    sc.audit = agent(ns, "audit", "--json", "--textfile", str(textfile))
    sc.textfile = textfile.read_text() if textfile.exists() else ""
    note(net, f"audit {sc.audit.rc} {sc.audit.seconds:.1f}s")
    sc.cleanup = agent(ns, "cleanup", "--apply", *common)
    note(net, f"cleanup {sc.cleanup.rc} {sc.cleanup.seconds:.1f}s")
    sc.after = st.read(net)
    _health(sc)
    sc.probes_after = _probes(net)
    web = mix.web_cluster_ip(net)
    target = f"[{web}]:80" if ":" in web else f"{web}:80"
    sc.verify = agent(ns, "verify", "--json", "--probe-address", target)
    sc.cleanup2 = agent(ns, "cleanup", "--apply", *common)
    sc.after2 = st.read(net)
    _health(sc)
    bundles = sorted(p for p in backups.glob("*") if p.is_dir()) if backups.exists() else []
    if bundles:
        # the first run's bundle holds what the cleanup removed
        sc.restore = agent(ns, "restore", "--lock-file", str(work / f"{ns}.lock"), str(bundles[0]))
    sc.restored = st.read(net)
    sc.kube_proxy_alive = kp.alive()


LATE = Service("late", ("10.96.2.1",), (Port(80, target_port=8080),), endpoints=())
LATE_V6 = Service("late", ("fd00:96::201",), (Port(80, target_port=8080),), endpoints=())


def _nft_has(net: NodeNet, text: str, present: bool, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    table = ""
    family = "ip" if net.ipv4 else "ip6"
    while time.monotonic() < deadline:
        table = ns_run(net.ns, "nft", "list", "table", family, "kube-proxy")
        if (text in table) == present:
            return True
        time.sleep(2)
    # the recorded result is a bool: the log keeps what the last read saw
    note(net, f"{text} {'never came' if present else 'never went'} in {timeout:g}s; "
         f"the table's last read: {len(table.splitlines())} lines")  # fmt: skip
    return False


def _watch_events_reach_kube_proxy(net: NodeNet, api: RealAPI) -> dict[str, bool]:
    """A Service written to the API server while nftables mode runs shows up in its table,
    and goes again when deleted."""
    late = LATE if net.ipv4 else LATE_V6
    ip = late.cluster_ips[0]
    api.push("apply", late)
    added = _nft_has(net, ip, True)
    api.push("delete", late)
    return {"added": added, "deleted": _nft_has(net, ip, False)}


def _phase(
    run: NodeRun, kp: KubeProxy, mode: str, binary: Path | None = None, modprobe: bool = True
) -> None:
    note(run.net, f"start {mode}{'' if modprobe else ' (no modprobe)'}")
    kp.start(mode, binary, modprobe)
    run.timings[f"{mode}#{len(run.timings)}"] = kp.wait_synced()
    note(run.net, f"{mode} synced")
    run.endpoints.setdefault(mode, endpoints(run.net.ns))
    if kp.log is not None:
        run.logs.append(kp.log)


def _apply(net: NodeNet, commands: dict[str, str]) -> None:
    for cmd, stdin in commands.items():
        ns_run(net.ns, *cmd.split(), stdin=stdin)


def _wait_health(net: NodeNet, healthz: int, livez: int, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    got = (0, 0)
    while time.monotonic() < deadline:
        got = (_healthz(net), _livez(net))
        if got == (healthz, livez):
            return
        time.sleep(3)
    raise RuntimeError(f"/healthz, /livez answer {got}, not {(healthz, livez)}, after {timeout}s")


@dataclass
class NodeCtx:
    spec: NodeSpec
    run: NodeRun
    kp: KubeProxy
    api: RealAPI
    work: Path
    made_ipvs: set[str] = field(default_factory=set)
    s1c: st.State | None = None

    @property
    def net(self) -> NodeNet:
        return self.spec.net


def _ipvs_phase(ctx: NodeCtx, binary: Path) -> None:
    run, net = ctx.run, ctx.net
    s0 = run.states["S0"] = st.read(net)
    run.shape["arp"] = {"S0": shape_steps.read_arp(net)}
    _phase(run, ctx.kp, "ipvs", binary)
    run.deprecation_log = [
        line.split("] ", 1)[-1]
        for line in ctx.kp.tail(None).splitlines()
        if "ipvs proxier" in line and "deprecated" in line
    ]
    ctx.kp.stop()
    s1 = run.states["S1"] = st.read(net)
    run.shape["arp"]["S1"] = shape_steps.read_arp(net)
    ctx.made_ipvs = st.created(s0, s1)
    run.deprecation_events = ctx.api.events("IPVSDeprecation")
    _apply(net, mix.cni_hostport_rule(net))
    ctx.s1c = run.states["S1+cni"] = st.read(net)


def _scenario(ctx: NodeCtx, name: str) -> Scenario:
    sc = Scenario(name, ctx.net, st.read(ctx.net), ctx.made_ipvs, set())
    ctx.run.scenarios[name] = sc
    run_scenario(sc, ctx.kp, ctx.work)
    if ctx.spec.shape != Shape():
        scenarios = ctx.run.shape.setdefault("scenarios", {})
        shape_steps.after_scenario(
            ctx.spec.shape, name, ctx.net, ctx.kp, agent, ctx.work, scenarios
        )
    record(ctx.run, OUT)  # as it goes: a slow run can be read before it ends
    return sc


def _b_then_a(ctx: NodeCtx) -> None:
    """B: nftables mode without `modprobe`; then A: restarted with it."""
    assert ctx.s1c is not None
    _phase(ctx.run, ctx.kp, "nftables", modprobe=False)
    ctx.run.start_removed = sorted(ctx.made_ipvs - st.read(ctx.net).objects())
    if not ctx.spec.at_least("v1.34"):  # its start cleaned up all the same: put it back
        st.put_back(ctx.net, ctx.s1c, ctx.made_ipvs)
    _scenario(ctx, "B")
    ctx.kp.stop()
    _phase(ctx.run, ctx.kp, "nftables")
    _scenario(ctx, "A")


def _tainted(ctx: NodeCtx) -> None:
    """T: the node's leftovers (A's, given back by A's restore) with the Node tainted."""
    ctx.api.taint(TAINT, True)
    try:
        _wait_health(ctx.net, 503, 200)
        _scenario(ctx, "T")
    finally:
        ctx.api.taint(TAINT, False)
    _wait_health(ctx.net, 200, 200)


def _kube_proxy_cleanup(ctx: NodeCtx) -> None:
    """`kube-proxy --cleanup` on scenario B's state (kube-proxy stopped, tables kept)."""
    assert ctx.s1c is not None
    ctx.kp.stop()
    st.put_back(ctx.net, ctx.s1c, ctx.made_ipvs)
    ctx.run.states["B-stopped"] = st.read(ctx.net)
    note(ctx.net, "kube-proxy --cleanup")
    ctx.run.kp_cleanup = ctx.kp.run_cleanup()
    ctx.run.states["B-after-kube-proxy-cleanup"] = st.read(ctx.net)


def _c(ctx: NodeCtx) -> None:
    """C starts from the node as ipvs mode left it (the failed-cleanup state again)."""
    assert ctx.s1c is not None
    run, net, kp = ctx.run, ctx.net, ctx.kp
    st.put_back(net, ctx.s1c, ctx.made_ipvs)
    s4 = run.states["S4"] = st.read(net)
    _phase(run, kp, "iptables")
    kp.stop()
    s5 = run.states["S5"] = st.read(net)
    made_ipt = st.created(s4, s5)
    _phase(run, kp, "nftables")
    st.put_back(net, s5, (ctx.made_ipvs | made_ipt) & s5.objects())
    c = Scenario("C", net, st.read(net), ctx.made_ipvs, made_ipt, st.rewritten(s4, s5))
    run.scenarios["C"] = c
    run_scenario(c, kp, ctx.work)


def _sequence(ctx: NodeCtx, binaries: dict[str, Path]) -> None:
    spec = ctx.spec
    _ipvs_phase(ctx, binaries[spec.ipvs_on])
    if spec.scenarios == ("U",):
        _phase(ctx.run, ctx.kp, "nftables")
        _scenario(ctx, "U")
        return
    _b_then_a(ctx)
    if "T" in spec.scenarios:
        _tainted(ctx)
    ctx.run.watch = _watch_events_reach_kube_proxy(ctx.net, ctx.api)
    _kube_proxy_cleanup(ctx)
    if "C" in spec.scenarios:
        _c(ctx)


def _keep_kube_proxy_logs(net: NodeNet, work: Path) -> None:
    """A failed node's kube-proxy logs, whole, beside its record on the host (VM_OUT): the
    error keeps only a tail, and ci13's seven nodes whose IPv6 proxier never synced under
    load could not be read further back than it."""
    try:
        d = OUT / net.ns
        d.mkdir(parents=True, exist_ok=True)
        for log in work.glob(f"{net.ns}-*.log"):
            shutil.copyfile(log, d / log.name)
    except OSError as exc:  # the node's error stays the one to report
        print(f"{net.ns}: its kube-proxy logs not kept: {exc}")


def run_node(spec: NodeSpec, work: Path, sctp: bool) -> NodeRun:
    net = spec.net
    run = NodeRun(net)
    t0 = time.monotonic()
    binaries = {v: upstream.kube_proxy(version=v) for v in {spec.release, spec.ipvs_on}}
    listener = setup_namespace(net)
    api: RealAPI | None = None
    kp: KubeProxy | None = None
    try:
        _apply(net, mix.third_party_before(net))
        api = RealAPI.open(net)
        run.server_version = shape_steps.server_version(api.kubectl)
        api.apply(mix.cluster(net, sctp))
        kp = KubeProxy(
            net, binaries[spec.release], work, api.kube_proxy_kubeconfig(), shape=spec.shape
        )
        _sequence(NodeCtx(spec, run, kp, api, work), binaries)
    except Exception as exc:  # recorded: the tests report it per node
        run.error = f"{type(exc).__name__}: {exc}"
        _keep_kube_proxy_logs(net, work)
    finally:
        if kp is not None:
            kp.stop()
        if api is not None:
            api.close()
        listener.kill()
        listener.wait()
        delete_namespace(net)
        run.timings["total"] = time.monotonic() - t0
        note(net, f"done {run.error}")
    return run


def record(run: NodeRun, out: Path) -> None:
    """Everything observed, for the report and for tests/data (kube-proxy's endpoints)."""
    d = out / run.net.ns
    save_json(d / "timings.json", run.timings)
    save_json(d / "endpoints.json", run.endpoints)
    save_json(d / "error.json", run.error)
    save_json(d / "kube-proxy-cleanup.json", run.kp_cleanup)
    save_json(d / "watch.json", run.watch)
    save_json(d / "start-removed.json", run.start_removed)
    save_json(d / "deprecation-events.json", run.deprecation_events)
    save_json(d / "deprecation-log.json", run.deprecation_log)
    save_json(d / "server-version.json", run.server_version)
    save_json(d / "shape.json", run.shape)
    for name, s in run.states.items():
        save_json(d / f"state-{name}.json", s.__dict__)
    for name, sc in run.scenarios.items():
        doc: dict[str, Any] = {
            "before": sc.before.__dict__,
            "made_ipvs": sorted(sc.made_ipvs),
            "made_iptables": sorted(sc.made_iptables),
            "healthz": sc.healthz,
            "livez": sc.livez,
            "probes_before": sc.probes_before,
            "probes_after": sc.probes_after,
            "textfile": sc.textfile,
            "kube_proxy_alive": sc.kube_proxy_alive,
            "rewritten": sorted(sc.rewritten),
        }
        for key in ("audit", "cleanup", "verify", "cleanup2", "restore"):
            r = getattr(sc, key)
            doc[key] = r.__dict__ if r else None
        for key in ("after", "after2", "restored"):
            s = getattr(sc, key)
            doc[key] = s.__dict__ if s else None
        save_json(d / f"scenario-{name}.json", doc)
    for log in run.logs:
        target = d / log.name
        target.write_bytes(log.read_bytes())
