"""precheck and verify on lab nodes in namespaces: each precheck condition flagged when present
and passing when absent; verify failing on leftovers, a stale or other-mode kube-proxy, and
passing on a cleaned node with a real TCP connection. Foreign IPVS services: tests/vm."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lab import build
from lab.kube_proxy import start_fake_kube_proxy
from lab.scenarios import realistic_node
from tests import oracle
from tests.conftest import Result, listener, run_agent

pytestmark = pytest.mark.netns
CONFIRMED = {"mode": "nftables", "families": ["IPv4", "IPv6"], "last_sync_age": 2.0}
IPVS = {"mode": "ipvs", "families": ["IPv4", "IPv6"]}
PINNED_IPVS = (
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n"
)
NO_ENV = {"KUBERNETES_SERVICE_HOST": "", "KUBERNETES_SERVICE_PORT": ""}


def lab_node(netns: Callable[[], str], **kw: Any) -> str:
    ns = netns()
    opts: dict[str, Any] = {"dual_stack": True, "third_party": True, "nftables_table": True}
    build.build(ns, realistic_node(**{**opts, **kw}))
    return ns


def config_file(tmp: Path, text: str = PINNED_IPVS) -> str:
    path = tmp / "kube-proxy.yaml"
    path.write_text(text)
    return str(path)


def checks(r: Result) -> dict[str, tuple[str, list[str]]]:
    doc = r.json
    assert doc["schema"] == 1
    return {c["name"]: (c["status"], c["evidence"]) for c in doc["checks"]}


def statuses(r: Result) -> dict[str, str]:
    return {name: status for name, (status, _) in checks(r).items()}


def precheck(ns: str, *args: str) -> Result:
    return run_agent(ns, "precheck", "--json", *args)


def ip(ns: str, *args: str) -> None:
    build.run(["ip", "-n", ns, *args])


@contextmanager
def process(ns: str, *argv: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process in ns whose command line is argv (argv[0] included); it only sleeps."""
    script = 'exec -a "$0" "$PY" -c "import time; time.sleep(600)" "$@"'
    cmd = ["ip", "netns", "exec", ns, "env", f"PY={sys.executable}", "bash", "-c", script, *argv]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


# --- precheck -------------------------------------------------------------------------------


def test_precheck_passes_on_a_ready_ipvs_node(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = lab_node(netns, old_release_orphans=True)
    with start_fake_kube_proxy(ns, IPVS, tmp_path / "kp.json"):
        r = precheck(ns, "--kube-proxy-config", config_file(tmp_path))
        human = run_agent(ns, "precheck", "--kube-proxy-config", config_file(tmp_path))
    assert r.rc == 0, r.stdout + r.stderr
    assert set(statuses(r).values()) == {"pass"}
    assert list(statuses(r)) == [
        "kernel",
        "kube-proxy-mode",
        "mode-pinned",
        "nodeport-addresses",
        "localhost-nodeports",
        "conntrack-invalid",
        "foreign-references",
        "foreign-ipvs-services",
        "ipvs-scheduler",
        "strict-arp",
        "ipvs-deprecation",
    ]
    c = checks(r)
    assert c["mode-pinned"][1] == [
        f"read from --kube-proxy-config {tmp_path}/kube-proxy.yaml",
        f"configuration file {tmp_path}/kube-proxy.yaml",
        f"mode ipvs pinned by mode: in {tmp_path}/kube-proxy.yaml",
        "change it to nftables to migrate",
    ]
    assert c["nodeport-addresses"][1][1:4] == [
        "primary ipv4 192.168.50.10: the node's only ipv4 address",
        "primary ipv6 fd00:50::10: the node's only ipv6 address",
        "NodePorts keep answering on 192.168.50.10, fd00:50::10",
    ]
    assert c["localhost-nodeports"][1] == [
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total not exported: kube-proxy "
        "runs ipvs mode, where no rule counts them"
    ]
    assert human.rc == 0 and human.stdout.splitlines()[-1] == "READY: 0 fail, 0 warn, 11 pass"


def test_mode_pin_read_from_kube_proxy_in_the_process_table(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = lab_node(netns)
    conf = config_file(tmp_path)
    with (
        start_fake_kube_proxy(ns, IPVS, tmp_path / "kp.json"),
        process(ns, "/usr/local/bin/kube-proxy", f"--config={conf}", "--proxy-mode=iptables") as p,
    ):
        r = precheck(ns)
    status, evidence = checks(r)["mode-pinned"]
    assert status == "pass", evidence
    assert evidence == [
        f"read from kube-proxy pid {p.pid} (/proc/{p.pid}/cmdline)",
        f"configuration file {conf}",
        "flags ignored because --config is given: --proxy-mode",
        f"mode ipvs pinned by mode: in {conf} (pid {p.pid})",
        "change it to nftables to migrate",
    ]


def test_mode_pinned_by_flag_only_and_a_mismatch(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = lab_node(netns)
    with (
        start_fake_kube_proxy(ns, IPVS, tmp_path / "kp.json"),
        process(ns, "kube-proxy", "--proxy-mode", "nftables", "--v=2") as p,
    ):
        r = precheck(ns)
    assert r.rc == 1
    status, evidence = checks(r)["mode-pinned"]
    assert status == "warn"
    assert evidence[1:] == [
        f"mode nftables pinned by --proxy-mode flag (pid {p.pid})",
        "but /proxyMode answers ipvs: the configuration changed and kube-proxy has not "
        "restarted, or another configuration is in effect",
    ]


def test_unpinned_mode_warns(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = lab_node(netns)
    conf = config_file(tmp_path, 'kind: KubeProxyConfiguration\nmode: ""\n')
    with start_fake_kube_proxy(ns, {**IPVS, "mode": "iptables"}, tmp_path / "kp.json"):
        r = precheck(ns, "--kube-proxy-config", conf)
    assert r.rc == 1
    status, evidence = checks(r)["mode-pinned"]
    assert status == "warn" and evidence[-2].startswith("no mode pinned (mode is empty)")
    assert "becomes nftables in Kubernetes 1.40" in evidence[-1]  # v1.37's own warning


def test_no_kube_proxy_process_visible_warns_for_what_needs_the_config(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = lab_node(netns)
    with start_fake_kube_proxy(ns, IPVS, tmp_path / "kp.json"):
        r = precheck(ns)
    assert r.rc == 1
    s = statuses(r)
    assert {k for k, v in s.items() if v == "warn"} == {
        "mode-pinned",
        "nodeport-addresses",
        "ipvs-scheduler",
        "strict-arp",
    }
    c = checks(r)
    assert c["mode-pinned"][1][0].startswith(
        "kube-proxy's configuration could not be read: no kube-proxy process sharing this "
        "network namespace in /proc"
    )
    assert c["mode-pinned"][1][0].endswith(
        "the agent's pod needs hostPID: true, or pass --kube-proxy-config FILE"
    )
    for name, what in (
        ("nodeport-addresses", "nodePortAddresses"),
        ("ipvs-scheduler", "ipvs.scheduler"),
        ("strict-arp", "ipvs.strictARP"),
    ):
        assert c[name][1][0] == (
            f"could not check {what}: kube-proxy's configuration was not read (see mode-pinned)"
        )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read --kube-proxy-config {path}: No such file or directory"),
        (
            "kind: Pod\nspec: {}\n",
            "cannot parse --kube-proxy-config {path}: kind Pod, not KubeProxyConfiguration",
        ),
        (
            "mode: ipvs\n  bad: indent\n",
            "cannot parse --kube-proxy-config {path}: not YAML: mapping values are not "
            "allowed here, line 2 column 6",
        ),
    ],
    ids=["missing", "wrong-kind", "garbage"],
)
def test_unreadable_config_file_warns_naming_it(
    netns: Callable[[], str], tmp_path: Path, content: str | None, message: str
) -> None:
    ns = lab_node(netns)
    path = tmp_path / "kube-proxy.yaml"
    if content is not None:
        path.write_text(content)
    with start_fake_kube_proxy(ns, IPVS, tmp_path / "kp.json"):
        r = precheck(ns, "--kube-proxy-config", str(path))
    assert r.rc == 1 and "Traceback" not in r.stderr
    status, evidence = checks(r)["mode-pinned"]
    assert status == "warn"
    assert evidence == [
        "kube-proxy's configuration could not be read: " + message.format(path=path)
    ]


def test_secondary_address_loses_its_nodeports(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = lab_node(netns, dual_stack=False)
    ip(ns, "address", "add", "192.168.50.11/24", "dev", "eth0")
    ip(ns, "route", "add", "default", "via", "192.168.50.1", "dev", "eth0")
    with start_fake_kube_proxy(ns, IPVS, tmp_path / "kp.json"):
        r = precheck(ns, "--kube-proxy-config", config_file(tmp_path))
        pinned = config_file(tmp_path, PINNED_IPVS + "nodePortAddresses:\n- 192.168.50.0/24\n")
        kept = precheck(ns, "--kube-proxy-config", pinned)
        chosen = precheck(
            ns, "--kube-proxy-config", config_file(tmp_path), "--node-ip", "192.168.50.11"
        )
    assert r.rc == 1
    status, evidence = checks(r)["nodeport-addresses"]
    assert status == "warn"
    assert evidence[1:] == [
        "primary ipv4 192.168.50.10: source address of the default route",
        "NodePorts stop answering on the secondary address(es) 192.168.50.11; set "
        "nodePortAddresses to keep them",
        "NodePorts on loopback (127.0.0.1, ::1) are never served in nftables mode; see "
        "localhost-nodeports",
    ]
    assert kept.rc == 0, kept.stdout
    assert checks(kept)["nodeport-addresses"][1][:2] == [
        f"nodePortAddresses 192.168.50.0/24 (nodePortAddresses: in {pinned}): nftables mode "
        "serves NodePorts on the same addresses",
        "node addresses inside: 192.168.50.10, 192.168.50.11",
    ]
    assert (
        "NodePorts stop answering on the secondary address(es) 192.168.50.10; set "
        "nodePortAddresses to keep them" in checks(chosen)["nodeport-addresses"][1]
    )


def test_primary_unknown_among_several_addresses_warns(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = lab_node(netns, dual_stack=False)
    ip(ns, "address", "add", "10.1.0.5/24", "dev", "eth0")
    with start_fake_kube_proxy(ns, IPVS, tmp_path / "kp.json"):
        r = precheck(ns, "--kube-proxy-config", config_file(tmp_path))
    status, evidence = checks(r)["nodeport-addresses"]
    assert status == "warn"
    assert (
        "cannot tell the primary ipv4 address among 192.168.50.10, 10.1.0.5 (no default route, "
        "no bindAddress): pass --node-ip" in evidence
    )


def test_counters_of_an_iptables_mode_kube_proxy(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = lab_node(netns)
    conf = config_file(tmp_path, PINNED_IPVS.replace("ipvs", "iptables"))
    with start_fake_kube_proxy(ns, {**IPVS, "mode": "iptables"}, tmp_path / "kp.json"):
        r = precheck(ns, "--kube-proxy-config", conf)
    c = checks(r)
    assert c["localhost-nodeports"] == (
        "pass",
        [
            "kubeproxy_iptables_localhost_nodeports_accepted_packets_total = 0 since kube-proxy started"
        ],
    )
    assert c["conntrack-invalid"] == (
        "pass",
        ["kubeproxy_iptables_ct_state_invalid_dropped_packets_total = 0 since kube-proxy started"],
    )
    assert c["kube-proxy-mode"][1] == [
        "/proxyMode answers iptables (iptables mode: the migration changes the data plane)"
    ]


def test_unreachable_metrics_warn_naming_them(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = lab_node(netns)
    r = precheck(ns, "--kube-proxy-config", config_file(tmp_path))
    assert r.rc == 1
    c = checks(r)
    assert c["kube-proxy-mode"][0] == "warn"
    assert c["kube-proxy-mode"][1][0].startswith(
        "could not check the mode kube-proxy runs: /proxyMode absent: "
        "http://127.0.0.1:10249/proxyMode unreachable"
    )
    for name, metric in (
        ("localhost-nodeports", "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"),
        ("conntrack-invalid", "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"),
    ):
        assert c[name][0] == "warn"
        assert c[name][1][0].startswith(
            f"could not check {metric}: kube-proxy /metrics absent: "
            "http://127.0.0.1:10249/metrics unreachable"
        )


@pytest.mark.parametrize("backend", ["legacy", "nft"])
def test_foreign_references_are_blockers(
    netns: Callable[[], str], tmp_path: Path, backend: str
) -> None:
    ns = lab_node(netns, backend=backend, dual_stack=False, old_release_orphans=True)
    ipt = ["ip", "netns", "exec", ns, f"iptables-{backend}"]
    build.run([*ipt, "-t", "nat", "-N", "CNI-HOSTPORT-SETMARK"])
    build.run([*ipt, "-t", "nat", "-A", "CNI-HOSTPORT-SETMARK", "-j", "KUBE-MARK-MASQ"])
    build.run(
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
        ]
    )
    with start_fake_kube_proxy(ns, IPVS, tmp_path / "kp.json"):
        r = precheck(ns, "--kube-proxy-config", config_file(tmp_path))
    assert r.rc == 1
    status, evidence = checks(r)["foreign-references"]
    assert status == "fail"
    assert evidence == [
        "2 rule(s) outside kube-proxy's chains reference KUBE-* chains or sets; they break "
        "silently when nftables mode removes them:",
        f"{backend}/ipv4/filter -A INPUT -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT "
        "(matches set KUBE-CLUSTER-IP)",
        f"{backend}/ipv4/nat -A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ (jumps to KUBE-MARK-MASQ)",
    ]
    assert {k for k, v in statuses(r).items() if v != "pass"} == {"foreign-references"}


def test_strict_arp_and_scheduler_become_dead_configuration(
    netns: Callable[[], str], tmp_path: Path
) -> None:
    ns = lab_node(netns, strict_arp=True)
    conf = config_file(tmp_path, PINNED_IPVS + "ipvs:\n  scheduler: wlc\n  strictARP: true\n")
    with start_fake_kube_proxy(ns, IPVS, tmp_path / "kp.json"):
        r = precheck(ns, "--kube-proxy-config", conf)
    assert r.rc == 1
    c = checks(r)
    assert c["ipvs-scheduler"] == (
        "warn",
        [
            f"ipvs.scheduler wlc (ipvs.scheduler: in {conf}) becomes dead configuration: "
            "nftables mode has no schedulers (it picks endpoints at random); remove it"
        ],
    )
    assert c["strict-arp"] == (
        "warn",
        [
            f"ipvs.strictARP true (ipvs.strictARP: in {conf}) becomes dead configuration in "
            "nftables mode; remove it",
            "net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 (strictARP's values) "
            "stay after the migration: no kube-proxy mode resets them; keep them if "
            "MetalLB/kube-vip L2 needs them, else cleanup --reset-arp-sysctls",
        ],
    )


# --- verify ---------------------------------------------------------------------------------


def verify(ns: str, *args: str, env: dict[str, str] | None = None) -> Result:
    return run_agent(ns, "verify", "--json", *args, env={**NO_ENV, **(env or {})})


def test_verify_fails_on_a_node_with_leftovers(netns: Callable[[], str], tmp_path: Path) -> None:
    node = realistic_node(dual_stack=True, third_party=True, nftables_table=True)
    ns = netns()
    build.build(ns, node)
    want = oracle.expected(node)
    chains, sets = len(want["iptables_chains"]), sum(want["ipsets"].values())
    jumps = want["iptables_jump_rules"]
    with start_fake_kube_proxy(ns, CONFIRMED, tmp_path / "kp.json"), listener(ns) as port:
        r = verify(ns, "--probe-address", f"127.0.0.1:{port}")
    assert r.rc == 1
    assert statuses(r) == {
        "nftables-mode": "pass",
        "no-leftovers": "fail",
        "kube-ipvs0-gone": "pass",
        "nftables-sync": "pass",
        "service-probe": "pass",
        "ip-forward": "warn",  # the lab's ipvs node: ip_forward=1, as ipvs mode sets it
    }
    evidence = checks(r)["no-leftovers"][1]
    assert evidence[0] == (
        f"{chains + sets + jumps} ipvs-mode object(s) remain: {chains} chain, {sets} ipset, "
        f"{jumps} jump-rule (ipvs-leftovers cleanup removes them)"
    )
    assert len(evidence) == 1 + 10 + 1  # ten listed, then "... and N more"
    assert r.json["ok"] is False


STUCK = (
    "/livez answers HTTP 503: an update has been queued longer than kube-proxy's healthz "
    "timeout (kube-proxy is stuck)"
)


@pytest.mark.parametrize(
    ("state", "lines"),
    [
        ({"mode": "ipvs"}, {"nftables-mode": "/proxyMode answers ipvs, not nftables"}),
        ({"mode": "iptables"}, {"nftables-mode": "/proxyMode answers iptables, not nftables"}),
        (
            {"sync_failures": 3},
            {"nftables-sync": "kubeproxy_sync_proxy_rules_nftables_sync_failures_total = 6"},
        ),
        ({"healthy": False}, {"nftables-sync": STUCK}),
        (
            {"healthy": False, "healthz_format": "oldest"},  # a release without /livez
            {"nftables-sync": "/healthz answers HTTP 503: unhealthy"},
        ),
    ],
    ids=["ipvs", "iptables", "sync-failures", "stuck", "unhealthy-without-livez"],
)
def test_verify_fails_when_kube_proxy_is_not_a_healthy_nftables_proxy(
    netns: Callable[[], str], tmp_path: Path, state: dict[str, Any], lines: dict[str, str]
) -> None:
    ns = lab_node(netns, ipvs_leftovers=False)
    with (
        start_fake_kube_proxy(ns, {**CONFIRMED, **state}, tmp_path / "kp.json"),
        listener(ns) as port,
    ):
        r = verify(ns, "--probe-address", f"127.0.0.1:{port}")
    assert r.rc == 1
    assert {k for k, v in statuses(r).items() if v == "fail"} == set(lines)
    for check, line in lines.items():
        assert checks(r)[check][1][0] == line


def test_verify_passes_on_a_cleaned_node(netns: Callable[[], str], tmp_path: Path) -> None:
    """On an idle kube-proxy (an hour since its last sync) of a node being drained: kube-proxy
    itself calls that healthy (/livez), so do cleanup and verify."""
    ns = lab_node(netns, old_release_orphans=True)
    idle = {**CONFIRMED, "last_sync_age": 3600.0, "node_eligible": False}
    with start_fake_kube_proxy(ns, idle, tmp_path / "kp.json"), listener(ns) as port:
        before = verify(ns, "--probe-address", f"127.0.0.1:{port}")
        cleaned = run_agent(
            ns,
            "cleanup",
            "--apply",
            "--backup-dir",
            str(tmp_path / "backups"),
            "--lock-file",
            str(tmp_path / "cleanup.lock"),
        )
        assert cleaned.rc == 0, cleaned.stdout + cleaned.stderr
        r = verify(ns, "--probe-address", f"127.0.0.1:{port}")
        from_env = verify(
            ns,
            env={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)},
        )
        human = run_agent(ns, "verify", "--probe-address", f"127.0.0.1:{port}")
    assert before.rc == 1
    assert r.rc == 0, r.stdout
    # ip_forward=1, as the lab's ipvs mode left it: a warning, which the exit code ignores
    assert {k: v for k, v in statuses(r).items() if v != "pass"} == {"ip-forward": "warn"}
    c = checks(r)
    assert c["ip-forward"][1][0].startswith("net.ipv4.ip_forward = 1, the value ipvs mode sets")
    assert c["no-leftovers"][1] == ["no ipvs-mode object on the node"]
    assert c["nftables-mode"][1] == [
        "/proxyMode answers nftables",
        "nftables table ip kube-proxy exists (IPv4)",
        "nftables table ip6 kube-proxy exists (IPv6)",
    ]  # no kubeproxy_sync_proxy_rules_nftables_* series: real kube-proxy has none before a failure
    assert c["nftables-sync"][1][:2] == [
        "/livez answers HTTP 200: no update stuck",
        "/healthz reports nodeEligible false (node being deleted or tainted "
        "ToBeDeletedByClusterAutoscaler): not a proxier failure",
    ]
    assert c["service-probe"][1][0].startswith(
        f"TCP connect to 127.0.0.1:{port} (--probe-address): connected in "
    )
    assert from_env.rc == 0
    assert checks(from_env)["service-probe"][1][0].startswith(
        f"TCP connect to 127.0.0.1:{port} (KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT): "
    )
    assert human.rc == 0 and human.stdout.splitlines()[-1] == "OK: 0 fail, 1 warn, 5 pass"


def test_verify_probe_without_target_or_listener(netns: Callable[[], str], tmp_path: Path) -> None:
    ns = lab_node(netns, ipvs_leftovers=False)
    with start_fake_kube_proxy(ns, CONFIRMED, tmp_path / "kp.json"):
        none = verify(ns)
        with listener(ns) as port:
            pass  # the port is closed again: nobody listens on it
        refused = verify(ns, "--probe-address", f"127.0.0.1:{port}")
    assert none.rc == 1 and refused.rc == 1
    assert checks(none)["service-probe"] == (
        "fail",
        [
            "no probe target: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set (the "
            "agent runs outside a pod) and no --probe-address "
            "HOST:PORT was given"
        ],
    )
    assert checks(refused)["service-probe"] == (
        "fail",
        [f"TCP connect to 127.0.0.1:{port} (--probe-address): connection refused"],
    )
    assert {k for k, v in statuses(refused).items() if v == "fail"} == {"service-probe"}


def test_verify_with_kube_proxy_unreachable(netns: Callable[[], str]) -> None:
    ns = lab_node(netns, ipvs_leftovers=False)
    with listener(ns) as port:
        r = verify(ns, "--probe-address", f"127.0.0.1:{port}")
    assert r.rc == 1
    c = checks(r)
    assert c["nftables-mode"][0] == "fail"
    assert c["nftables-mode"][1][0].startswith(
        "/proxyMode absent: http://127.0.0.1:10249/proxyMode unreachable"
    )
    assert c["nftables-sync"][0] == "fail"
    assert c["nftables-sync"][1][0].startswith("/healthz absent: ")
    assert c["nftables-sync"][1][1].startswith("/metrics absent: ")


def test_bad_probe_address_is_a_usage_error(netns: Callable[[], str]) -> None:
    r = run_agent(netns(), "verify", "--probe-address", "10.96.0.1")
    assert r.rc == 2 and "is not HOST:PORT" in r.stderr and "Traceback" not in r.stderr
