"""Live connections through the virtual servers a cleanup deletes (docs/contract.md#live-connections),
on plain data: the counts /proc/net/ip_vs gives, the plan that shows them, the wait and its
refusal, what plan.json records."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from agent import exitcodes
from agent.classify import classify
from agent.cleanup import drain, procedure
from agent.cleanup.backup import plan_json
from agent.cleanup.plan import describe, make_plan
from agent.cleanup.stop import Stop
from agent.readers.ipvs import proc_services, proc_tally
from agent.snapshot import Ipset, IpvsDest, IpvsService
from tests.unit.builders import NOW, snapshot

HEAD = (
    "IP Virtual Server version 1.2.1 (size=4096)\n"
    "Prot LocalAddress:Port Scheduler Flags\n"
    "  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n"
)
PROC = HEAD + (
    "TCP  0A600707:1538 rr\n"
    "  -> 0AF4000A:2382      Masq    1      2          1         \n"
    "  -> 0AF4010B:2382      Masq    1      1          0         \n"
    "TCP  0A600708:0050 rr\n"
    "  -> 0AF4000A:1F90      Masq    1      0          4         \n"
    "UDP  0A60000A:0035 rr\n"
)
CLUSTER_IP = Ipset(
    "KUBE-CLUSTER-IP", "hash:ip,port", 4, 2, 0, ("10.96.7.7,tcp:5432", "10.96.7.8,tcp:80")
)


def svc(addr: str, port: int, active: int = 0, inactive: int = 0) -> IpvsService:
    s = IpvsService(
        4, "TCP", addr, port, None, "rr", 2, 0, (IpvsDest("10.244.0.10", 9090, "masq", 1),)
    )
    object.__setattr__(s, "active_conns", active)
    object.__setattr__(s, "inactive_conns", inactive)
    return s


def plan_of(*services: IpvsService) -> procedure.Plan:
    snap = snapshot(ipvs=services, ipsets=(CLUSTER_IP,))
    return make_plan(snap, classify(snap, NOW))


def test_proc_counts_each_virtual_servers_connections() -> None:
    """ActiveConn and InActConn summed over each service's real servers."""
    assert proc_tally(io.StringIO(PROC)) == {
        ("TCP", "10.96.7.7", 5432): (2, 3, 1),
        ("TCP", "10.96.7.8", 80): (1, 0, 4),
        ("UDP", "10.96.0.10", 53): (0, 0, 0),
    }
    parsed = proc_services(io.StringIO(PROC))
    assert parsed is not None
    assert [(s.key, s.active_conns, s.inactive_conns) for s in parsed[0]] == [
        ("TCP 10.96.7.7:5432", 3, 1),
        ("TCP 10.96.7.8:80", 0, 4),
        ("UDP 10.96.0.10:53", 0, 0),
    ]


def test_connections_are_not_part_of_a_virtual_servers_identity() -> None:
    """Two reads of an unchanged node differ in their counts: the re-check's comparison of the
    plan with its backup must not see a change."""
    assert svc("10.96.7.7", 5432, 3, 1) == svc("10.96.7.7", 5432)
    assert (
        plan_of(svc("10.96.7.7", 5432, 3)).contents() == plan_of(svc("10.96.7.7", 5432)).contents()
    )


def test_the_plan_shows_each_virtual_servers_connections() -> None:
    plan = plan_of(svc("10.96.7.7", 5432, 3, 1), svc("10.96.7.8", 80, 0, 4))
    lines = describe(plan)
    at = lines.index("  1. delete-ipvs-service TCP 10.96.7.7:5432")
    assert lines[at + 2] == "       connections: 3 active, 1 inactive"
    at = lines.index("  2. delete-ipvs-service TCP 10.96.7.8:80")
    assert lines[at + 2] == "       connections: 0 active, 4 inactive"
    live = drain.of_plan(plan)
    assert (live.active, live.inactive) == (3, 5)
    assert live.describe() == (
        "3 active connections (5 inactive) through 1 virtual server: TCP 10.96.7.7:5432 (3)"
    )


def test_a_refusal_names_the_busiest_virtual_servers_first() -> None:
    c = drain.tally(
        [
            ("TCP a:1", 1, 0),
            ("TCP b:2", 5, 0),
            ("TCP c:3", 0, 9),
            ("TCP d:4", 2, 0),
            ("TCP e:5", 1, 1),
        ]
    )
    assert c.describe() == (
        "9 active connections (10 inactive) through 4 virtual servers: TCP b:2 (5), "
        "TCP d:4 (2), TCP a:1 (1) and 1 more"
    )


def test_reread_takes_a_virtual_server_gone_from_proc_as_without_connections() -> None:
    services = [svc("10.96.7.7", 5432), svc("10.96.7.9", 443)]
    now = drain.reread(services, lambda: {("TCP", "10.96.7.7", 5432): (2, 1)})
    assert (now.active, now.inactive, now.busiest) == (2, 1, (("TCP 10.96.7.7:5432", 2),))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_wait_reads_again_each_second_until_no_connection_is_active() -> None:
    clock = Clock()
    readings = iter([drain.tally([("v", 2, 0)]), drain.tally([("v", 0, 3)])])
    done = drain.wait(
        drain.tally([("v", 2, 0)]), lambda: next(readings), 30, clock=clock, sleep=clock.sleep
    )
    assert done == drain.Drain(drain.Connections(0, 3), 2.0)
    assert clock.slept == [1.0, 1.0]


def test_wait_gives_up_at_the_deadline_with_the_last_reading() -> None:
    clock = Clock()
    reads = []

    def again() -> drain.Connections:
        reads.append(clock.now)
        return drain.tally([("v", 1, 0)])

    done = drain.wait(drain.tally([("v", 1, 0)]), again, 2.5, clock=clock, sleep=clock.sleep)
    assert done.connections.active == 1 and done.waited == 2.5
    assert reads == [1.0, 2.0, 2.5]  # each second, and once more at the deadline


def test_no_wait_with_a_timeout_of_0_or_no_active_connection() -> None:
    def never() -> drain.Connections:
        raise AssertionError("read again")

    assert drain.wait(drain.tally([("v", 4, 0)]), never, 0).connections.active == 4
    assert drain.wait(drain.tally([("v", 0, 7)]), never, 30).connections.inactive == 7


def _settings(tmp_path: Path, **kw: object) -> procedure.Settings:
    return procedure.Settings(backup_dir=tmp_path / "b", lock_file=tmp_path / "l", **kw)  # type: ignore[arg-type]


def test_the_drain_refuses_with_exit_5_and_the_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        drain.ipvs, "connections_of", lambda _: {("TCP", "10.96.7.7", 5432): (1, 0)}
    )
    plan = plan_of(svc("10.96.7.7", 5432, 2))
    said: list[str] = []
    with pytest.raises(procedure.LiveConnections) as refused:
        procedure._drain(plan, _settings(tmp_path, drain_timeout=0.2), said.append, Stop())
    assert refused.value.code == exitcodes.LIVE_CONNECTIONS == 5
    assert str(refused.value).startswith(
        "refused: 1 active connection (0 inactive) through 1 virtual server: "
        "TCP 10.96.7.7:5432 (1) still open after waiting 0.2s (--drain-timeout); "
    )
    assert said == [
        "connections: 2 active connections (0 inactive) through 1 virtual server: "
        "TCP 10.96.7.7:5432 (2); waiting up to 0.2s for the active ones to close (--drain-timeout)"
    ]


def test_the_drain_goes_on_when_told_to_cut_or_when_they_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        drain.ipvs, "connections_of", lambda _: {("TCP", "10.96.7.7", 5432): (1, 0)}
    )
    plan = plan_of(svc("10.96.7.7", 5432, 2))
    settings = _settings(tmp_path, drain_timeout=0.0, cut_connections=True)
    done = procedure._drain(plan, settings, lambda _: None, Stop())
    assert done.connections.active == 2  # no wait: the plan's own reading
    monkeypatch.setattr(drain.ipvs, "connections_of", lambda _: {})
    done = procedure._drain(plan, _settings(tmp_path, drain_timeout=5.0), lambda _: None, Stop())
    assert done.connections.active == 0 and done.waited < 5


def test_an_unreadable_count_is_an_error_never_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreadable(_: object) -> dict[object, tuple[int, int]]:
        raise OSError("No such file or directory")

    monkeypatch.setattr(drain.ipvs, "connections_of", unreadable)
    plan = plan_of(svc("10.96.7.7", 5432, 1))
    with pytest.raises(procedure.CleanupError, match="cannot read the IPVS connections"):
        procedure._drain(plan, _settings(tmp_path, drain_timeout=0.1), lambda _: None, Stop())


def test_the_default_is_the_kubelets_grace_period() -> None:
    assert procedure.Settings(backup_dir=Path("b"), lock_file=Path("l")).drain_timeout == 30.0
    assert procedure.Settings(backup_dir=Path("b"), lock_file=Path("l")).cut_connections is False


def test_plan_json_records_the_connections() -> None:
    plan = plan_of(svc("10.96.7.7", 5432, 3, 1), svc("10.96.7.8", 80))
    ended = {
        "active": 0,
        "inactive": 1,
        "waited_seconds": 4.2,
        "drain_timeout": 30.0,
        "cut_connections": False,
    }
    doc = json.loads(plan_json(plan, ended))
    assert doc["connections"] == ended
    steps = {s["target"]: s for s in doc["steps"]}
    assert steps["TCP 10.96.7.7:5432"]["connections"] == {"active": 3, "inactive": 1}
    assert steps["TCP 10.96.7.8:80"]["connections"] == {"active": 0, "inactive": 0}
    assert "connections" not in steps["KUBE-CLUSTER-IP"]


def test_metrics_export_the_connections_by_class_and_state() -> None:
    from agent.collection import Collection
    from agent.views.metrics import families

    foreign = svc("192.168.100.100", 80, 7, 2)  # keepalived's: no KUBE-* set names it
    snap = snapshot(
        ipvs=(svc("10.96.7.7", 5432, 3, 1), svc("10.96.7.8", 80, 0, 4), foreign),
        ipsets=(CLUSTER_IP,),
    )
    col = Collection(snap, classify(snap, NOW), 0.0)
    (fam,) = [f for f in families(col) if f.name == "ipvs_leftovers_ipvs_connections"]
    assert {(s.labels["class"], s.labels["state"]): s.value for s in fam.samples} == {
        ("kube-proxy", "active"): 3,
        ("kube-proxy", "inactive"): 5,
        ("foreign", "active"): 7,
        ("foreign", "inactive"): 2,
    }


def test_the_job_passes_the_drain_options_and_never_cuts_by_default() -> None:
    import yaml
    from click.testing import CliRunner

    from agent.cli import main
    from agent.job import Drain, InvalidName, render

    def args(**kw: object) -> list[str]:
        job = yaml.safe_load(render("w3", "img:1", apply=True, **kw))  # type: ignore[arg-type]
        return list(job["spec"]["template"]["spec"]["containers"][0]["args"])

    assert "--cut-connections" not in args() and "--drain-timeout" not in args()
    assert args(drain=Drain(120.0, True))[:5] == [
        "cleanup", "--apply", "--drain-timeout", "120s", "--cut-connections",
    ]  # fmt: skip
    with pytest.raises(InvalidName, match="not shorter than the Job's --active-deadline"):
        render("w3", "img:1", apply=True, active_deadline=600, drain=Drain(600.0))
    r = CliRunner().invoke(
        main, ["job-manifest", "--node", "w3", "--image", "i:1", "--apply", "--drain-timeout", "5m"]
    )
    assert r.exit_code == 0 and "- --drain-timeout\n        - 300s\n" in r.output, r.output
    r = CliRunner().invoke(
        main, ["job-manifest", "--node", "w3", "--image", "i:1", "--cut-connections"]
    )
    assert r.exit_code == 2 and "--drain-timeout and --cut-connections go with --apply" in r.output


def test_autocleanup_exports_what_its_last_run_cut(tmp_path: Path) -> None:
    from agent.cleanup.autoclean import AutoCleanup, Streak

    auto = AutoCleanup(
        observe=lambda: None,  # type: ignore[arg-type,return-value]
        fresh=lambda: None,  # type: ignore[arg-type,return-value]
        settings=_settings(tmp_path),
        streak=Streak(1.0, 1.0),
        interval=1.0,
    )
    auto.last = procedure.Result(0, plan_of(), cut=drain.Connections(2, 1))
    (fam,) = [f for f in auto.metrics() if f.name == "ipvs_leftovers_cleanup_connections_cut"]
    assert {s.labels["state"]: s.value for s in fam.samples} == {"active": 2, "inactive": 1}


def test_audit_counts_the_connections_apart_from_the_objects() -> None:
    """A key of its own: `leftovers` and `foreign` keep their shape (schema 1)."""
    from agent.views.report import document, render

    foreign = svc("192.168.100.100", 80, 7, 2)
    snap = snapshot(ipvs=(svc("10.96.7.7", 5432, 3, 1), foreign), ipsets=(CLUSTER_IP,))
    c = classify(snap, NOW)
    doc = document(snap, c)
    assert doc["ipvs_connections"] == {
        "leftovers": {"active": 3, "inactive": 1},
        "foreign": {"active": 7, "inactive": 2},
    }
    assert doc["foreign"] == {"ipvs_virtual_servers": 1, "ipvs_real_servers": 1}
    assert (
        "  IPVS connections: 3 active, 1 inactive (foreign: 7 / 2)" in render(snap, c).splitlines()
    )


def test_connections_of_asks_by_key_and_adds_up_fwmark_services_of_both_families(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A service /proc did not list is asked for by key, never taken for none; a FWM line
    names no family, so an IPv4 and an IPv6 service with one mark are both asked for and
    their connections added up (the later answer must not hide the earlier one)."""
    from types import SimpleNamespace

    from agent.readers import ipvs
    from agent.snapshot import IpvsService

    tcp = IpvsService(4, "TCP", "10.96.0.1", 80, None, "rr", 2, 0)
    skipped = IpvsService(4, "TCP", "10.96.0.2", 80, None, "rr", 2, 0)
    mark4 = IpvsService(4, "TCP", None, None, 7, "rr", 2, 0)
    mark6 = IpvsService(6, "TCP", None, None, 7, "rr", 2, 0)
    answers = {  # per service key: the (active, inactive) of each real server
        ipvs.service_key(skipped): [(3, 1)],
        ipvs.service_key(mark4): [(5, 0), (1, 0)],
        ipvs.service_key(mark6): [(0, 2)],
    }
    asked: list[bytes] = []

    class FakeGenl:
        family_id = 1

        def __init__(self, name: str) -> None:
            assert name == "IPVS"

        def __enter__(self) -> FakeGenl:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def request(self, family: int, cmd: int, version: int, key: bytes) -> list[object]:
            asked.append(key)
            return list(answers[key])

    monkeypatch.setattr(ipvs, "GenericNetlink", FakeGenl)
    monkeypatch.setattr(
        ipvs,
        "parse_dest",
        lambda p, service_family: SimpleNamespace(active_conns=p[0], inactive_conns=p[1]),
    )
    # /proc lists the first service and one FWM line (one family's, or the two's: unknown)
    monkeypatch.setattr(
        ipvs, "read_connections", lambda: {ipvs.proc_key(tcp): (2, 2), ("FWM", 7): (6, 0)}
    )
    now = ipvs.connections_of([tcp, skipped, mark4, mark6])
    assert now[ipvs.proc_key(tcp)] == (2, 2)  # listed: not asked
    assert now[ipvs.proc_key(skipped)] == (3, 1)
    assert now[("FWM", 7)] == (6, 2)
    assert sorted(asked) == sorted(answers)
