"""precheck and verify checks on plain data; kube-proxy's flags and configuration file parsing."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.classify import classify
from agent.cli.checks import _target, parse_host_port
from agent.readers import kube_proxy_config as kpc
from agent.readers.kube_proxy_config import ConfigError, KubeProxyConfig
from agent.snapshot import (
    Ipset,
    IpvsDest,
    IpvsService,
    Kernel,
    KubeProxy,
    Link,
    Links,
    Reading,
    Snapshot,
)
from agent.views import checks
from agent.views.checks import Check, NodeIpHints, ProbeResult
from tests.unit.builders import NOW, kube_proxy, ok, snapshot

KUBEADM_CONFIG = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: "wlc"   # set by the platform team
  strictARP: true
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: "ipvs"
nodePortAddresses:
- 192.168.50.0/24
- primary
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"""

NODE = Links(kube_ipvs0=None, node_addresses=("192.168.50.10", "fd00:50::10"))


def cfg(**kw: Any) -> Reading[KubeProxyConfig | None]:
    origins = {k: f"{k} in test" for k in kw}
    return Reading("ok", KubeProxyConfig(origin="test", origins=origins, **kw))


NO_CONFIG: Reading[KubeProxyConfig | None] = Reading("absent", None, "no kube-proxy process")


def snap(
    release: str = "6.1.0",
    sysctls: dict[str, str] | None = None,
    links: Links = NODE,
    kp: KubeProxy | None = None,
    **kw: Any,
) -> Snapshot:
    s = snapshot(links=links, kp=kp, **kw)
    return replace(s, kernel=ok(Kernel(release=release, sysctls=sysctls or {})))


def with_metrics(kp: KubeProxy, **changes: Any) -> KubeProxy:
    assert kp.metrics.data is not None
    return replace(kp, metrics=ok(replace(kp.metrics.data, **changes)))


def one(result: list[Check], name: str) -> Check:
    (c,) = [c for c in result if c.name == name]
    return c


# --- kernel, mode, pinning ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "status"),
    [
        ("5.10.0-28-amd64", "fail"),
        ("5.12.19", "fail"),
        ("5.13.0", "pass"),
        ("6.1.0-18-cloud-amd64", "pass"),
        ("4.19.0", "fail"),
        ("weird", "warn"),
    ],
)
def test_kernel_gate_is_5_13(release: str, status: str) -> None:
    c = checks.check_kernel(snap(release))
    assert c.status == status
    assert release in c.evidence[0]


def test_mode_unreachable_is_a_warning_naming_proxymode() -> None:
    c = checks.check_kube_proxy_mode(snap(kp=kube_proxy(None)))
    assert c.status == "warn"
    assert c.evidence[0].startswith("could not check the mode kube-proxy runs: /proxyMode absent")


def test_mode_reported() -> None:
    c = checks.check_kube_proxy_mode(snap(kp=kube_proxy("ipvs")))
    assert c == Check(
        "kube-proxy-mode",
        "pass",
        ("/proxyMode answers ipvs (ipvs mode: the migration changes the data plane)",),
    )


def test_mode_pinned_when_config_matches_running_mode() -> None:
    c, pinned = checks.check_mode_pinned(snap(kp=kube_proxy("ipvs")), cfg(mode="ipvs"))
    assert c.status == "pass" and pinned is True
    assert "mode ipvs pinned by mode in test" in c.evidence
    assert "change it to nftables to migrate" in c.evidence


def test_mode_not_pinned_warns() -> None:
    for config in (cfg(mode=""), cfg()):
        c, pinned = checks.check_mode_pinned(snap(kp=kube_proxy("iptables")), config)
        assert c.status == "warn" and pinned is False
        assert c.evidence[-1].startswith("no mode pinned (mode is empty)")


def test_pinned_mode_that_is_not_running_warns() -> None:
    c, _ = checks.check_mode_pinned(snap(kp=kube_proxy("ipvs")), cfg(mode="nftables"))
    assert c.status == "warn"
    assert c.evidence[-1].startswith("but /proxyMode answers ipvs")


def test_unreadable_config_warns_and_names_why() -> None:
    c, pinned = checks.check_mode_pinned(snap(), NO_CONFIG)
    assert (c.status, pinned) == ("warn", None)
    assert c.evidence == ("kube-proxy's configuration could not be read: no kube-proxy process",)


def test_ignored_flags_are_reported() -> None:
    config = Reading(
        "ok",
        KubeProxyConfig(
            origin="kube-proxy pid 7",
            config_file="/var/lib/kube-proxy/config.conf",
            mode="ipvs",
            ignored_flags=("--proxy-mode",),
            origins={"mode": "mode: in /var/lib/kube-proxy/config.conf (pid 7)"},
        ),
    )
    c, _ = checks.check_mode_pinned(snap(kp=kube_proxy("ipvs")), config)
    assert "flags ignored because --config is given: --proxy-mode" in c.evidence


# --- kube-proxy's flags and configuration file ----------------------------------------------


def test_flags_in_every_pflag_spelling() -> None:
    argv = [
        "/usr/local/bin/kube-proxy",
        "--v=2",
        "--proxy-mode",
        "ipvs",
        "--config=/var/lib/kube-proxy/config.conf",
        "--ipvs-strict-arp",
        "--hostname-override",
        "node-1",
        "-nodeport-addresses=10.0.0.0/8,primary",
    ]
    assert kpc.is_kube_proxy(argv)
    assert kpc.parse_flags(argv) == {
        "proxy-mode": "ipvs",
        "config": "/var/lib/kube-proxy/config.conf",
        "ipvs-strict-arp": "true",
        "nodeport-addresses": "10.0.0.0/8,primary",
    }


def test_which_processes_are_kube_proxy() -> None:
    assert kpc.is_kube_proxy(["kube-proxy"])
    assert kpc.is_kube_proxy(["/hyperkube", "kube-proxy", "--v=2"])
    assert not kpc.is_kube_proxy(["/usr/bin/python3", "kube-proxy"])
    assert not kpc.is_kube_proxy(["kube-proxy-agent"])
    assert not kpc.is_kube_proxy([])


def test_kubeadm_config_map() -> None:
    doc = kpc.parse_config_text(KUBEADM_CONFIG)
    assert doc["ipvs"]["scheduler"] == "wlc"
    assert doc["logging"]["options"]["json"]["infoBufferSize"] == "0"
    values = kpc.settings(doc, "config.conf")
    assert values == {
        "mode": "ipvs",
        "node_port_addresses": ("192.168.50.0/24", "primary"),
        "bind_address": "0.0.0.0",
        "ipvs_scheduler": "wlc",
        "ipvs_strict_arp": True,
        "_origins": {
            "mode": "mode: in config.conf",
            "node_port_addresses": "nodePortAddresses: in config.conf",
            "bind_address": "bindAddress: in config.conf",
            "ipvs_scheduler": "ipvs.scheduler: in config.conf",
            "ipvs_strict_arp": "ipvs.strictARP: in config.conf",
        },
    }


@pytest.mark.parametrize(
    ("text", "mode", "npa"),
    [
        ("kind: KubeProxyConfiguration\nmode: nftables\n", "nftables", None),
        ("kind: KubeProxyConfiguration\nmode:\nnodePortAddresses: null\n", "", ()),
        (
            "kind: KubeProxyConfiguration\nnodePortAddresses: ['10.0.0.0/8', \"::/0\"]\n",
            None,
            ("10.0.0.0/8", "::/0"),
        ),
        (
            "kind: KubeProxyConfiguration\nnodePortAddresses:\n  - 10.0.0.0/8  # lan\n",
            None,
            ("10.0.0.0/8",),
        ),
        ("kind: KubeProxyConfiguration\nnodePortAddresses: []\n", None, ()),
        (
            '{"kind": "KubeProxyConfiguration", "mode": "ipvs", "nodePortAddresses": ["primary"]}',
            "ipvs",
            ("primary",),
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\n---\nkind: KubeProxyConfiguration\nmode: 'ipvs'\n",
            "ipvs",
            None,
        ),
        ("# comment\nmode: ipvs # trailing\n", "ipvs", None),
        # What the hand-written parser refused and kube-proxy accepts:
        (
            "kind: KubeProxyConfiguration\nfeatureGates: {A: true, B: false}\nmode: nftables\n",
            "nftables",
            None,
        ),
        (
            "kind: KubeProxyConfiguration\nnodePortAddresses: &lan [10.0.0.0/8]\n"
            "x-copy: *lan\nmode: &m ipvs\nclusterCIDR: *m\n",
            "ipvs",
            ("10.0.0.0/8",),
        ),
        ("kind: KubeProxyConfiguration\nmode: >-\n  nftables\n", "nftables", None),
        # `|` keeps the newline: kube-proxy gets "ipvs\n" too (and refuses it as a mode)
        ("kind: KubeProxyConfiguration\nmode: |\n  ipvs\n", "ipvs\n", None),
        (
            "kind: KubeProxyConfiguration\nnodePortAddresses: [\n  10.0.0.0/8,\n  primary]\n",
            None,
            ("10.0.0.0/8", "primary"),
        ),
    ],
    ids=[
        "plain",
        "empty",
        "flow",
        "block",
        "empty-list",
        "json",
        "multi-doc",
        "no-kind",
        "flow-mapping",
        "anchors",
        "folded-block-scalar",
        "literal-block-scalar",
        "multi-line-flow",
    ],
)
def test_config_shapes(text: str, mode: str | None, npa: tuple[str, ...] | None) -> None:
    values = kpc.settings(kpc.parse_config_text(text), "f")
    assert values.get("mode") == mode
    assert values.get("node_port_addresses") == npa


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: KubeletConfiguration\nmode: ipvs\n", "kind KubeletConfiguration"),
        (
            "kind: KubeProxyConfiguration\nmode: ipvs\n   stray: 1\n",
            "^not YAML: mapping values are not allowed here, line 3 column 9$",
        ),
        ("kind: KubeProxyConfiguration\nmode: *nowhere\n", "^not YAML: found undefined alias"),
        ("kind: KubeProxyConfiguration\nmode: !!python/name:os.system ''\n", "^not YAML: "),
        ("{not json", "not JSON"),
        ("just text\n", "no KubeProxyConfiguration document in it"),
        ("kind: KubeProxyConfiguration\nnodePortAddresses: 10.0.0.0/8\n", "not a list"),
        ("kind: KubeProxyConfiguration\nipvs:\n  strictARP: maybe\n", "not a boolean"),
    ],
)
def test_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        kpc.settings(kpc.parse_config_text(text), "f")


def test_read_file(tmp_path: Path) -> None:
    path = tmp_path / "kp.yaml"
    path.write_text(KUBEADM_CONFIG)
    r = kpc.read_file(str(path))
    assert r.status == "ok" and r.data is not None
    assert (r.data.mode, r.data.ipvs_scheduler, r.data.ipvs_strict_arp) == ("ipvs", "wlc", True)
    assert r.data.origin == f"--kube-proxy-config {path}"
    missing = kpc.read_file(str(tmp_path / "nope.yaml"))
    assert missing.status == "error"
    assert (
        missing.error
        == f"cannot read --kube-proxy-config {tmp_path}/nope.yaml: No such file or directory"
    )
    path.write_text("kind: Pod\n")
    assert kpc.read_file(str(path)).error == (
        f"cannot parse --kube-proxy-config {path}: kind Pod, not KubeProxyConfiguration"
    )


def _fake_proc(root: Path, procs: dict[int, tuple[list[str], bool]]) -> Path:
    """A /proc with cmdline, ns/net (hard links: same inode = same namespace) and root/."""
    proc = root / "proc"
    (root / "netns-a").write_text("")
    (root / "netns-b").write_text("")
    (proc / "self/ns").mkdir(parents=True)
    os.link(root / "netns-a", proc / "self/ns/net")
    for pid, (argv, same) in procs.items():
        (proc / str(pid) / "ns").mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        os.link(root / ("netns-a" if same else "netns-b"), proc / str(pid) / "ns/net")
        (proc / str(pid) / "root").mkdir()
    return proc


def test_read_process_follows_config_into_the_process_root(tmp_path: Path) -> None:
    proc = _fake_proc(
        tmp_path,
        {
            40: (["kube-proxy", "--proxy-mode=iptables"], False),  # another namespace
            41: (
                [
                    "/usr/local/bin/kube-proxy",
                    "--config=/etc/kp/config.conf",
                    "--proxy-mode=iptables",
                ],
                True,
            ),
            42: (["bash"], True),
        },
    )
    (proc / "41/root/etc/kp").mkdir(parents=True)
    (proc / "41/root/etc/kp/config.conf").write_text(KUBEADM_CONFIG)
    r = kpc.read_process(proc)
    assert r.status == "ok" and r.data is not None
    assert r.data.pid == 41 and r.data.mode == "ipvs"
    assert r.data.ignored_flags == ("--proxy-mode",)
    assert r.data.origins["mode"] == "mode: in /etc/kp/config.conf (pid 41)"


def test_read_process_flags_only_and_unreadable_config(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {9: (["kube-proxy", "--proxy-mode", "ipvs"], True)})
    r = kpc.read_process(proc)
    assert r.status == "ok" and r.data is not None
    assert r.data.mode == "ipvs" and r.data.origins["mode"] == "--proxy-mode flag (pid 9)"
    (proc / "9/cmdline").write_bytes(b"kube-proxy\0--config\0/missing.conf\0")
    r = kpc.read_process(proc)
    assert r.status == "error" and r.data is not None and r.data.config_file == "/missing.conf"
    assert (
        r.error
        == f"cannot read kube-proxy's --config {proc}/9/root/missing.conf: No such file or directory"
    )


def test_read_process_without_kube_proxy(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {3: (["kube-proxy"], False), 4: (["sshd"], True)})
    r = kpc.read_process(proc)
    assert r.status == "absent"
    assert r.error == (
        f"no kube-proxy process sharing this network namespace in {proc} (1 in other network "
        "namespaces): the agent's pod needs hostPID: true, or pass --kube-proxy-config FILE"
    )


# --- NodePort addresses ---------------------------------------------------------------------


def test_single_addresses_keep_their_nodeports() -> None:
    c = checks.check_nodeport_addresses(snap(), cfg(), NodeIpHints())
    assert c.status == "pass"
    assert "NodePorts keep answering on 192.168.50.10, fd00:50::10" in c.evidence


def test_secondary_address_stops_answering() -> None:
    links = Links(None, ("192.168.50.10", "192.168.50.11", "10.244.0.1"))
    hints = NodeIpHints(route_sources={"ipv4": "192.168.50.10"})
    c = checks.check_nodeport_addresses(snap(links=links), cfg(), hints)
    assert c.status == "warn"
    assert "primary ipv4 192.168.50.10: source address of the default route" in c.evidence
    assert (
        "NodePorts stop answering on the secondary address(es) 192.168.50.11, 10.244.0.1; set "
        "nodePortAddresses to keep them" in c.evidence
    )


def test_primary_from_node_ip_then_bind_address() -> None:
    links = Links(None, ("192.168.50.10", "192.168.50.11"))
    c = checks.check_nodeport_addresses(
        snap(links=links), cfg(), NodeIpHints(explicit=("192.168.50.11",))
    )
    assert "primary ipv4 192.168.50.11 from --node-ip" in c.evidence
    assert any("secondary address(es) 192.168.50.10;" in e for e in c.evidence)
    c = checks.check_nodeport_addresses(
        snap(links=links), cfg(bind_address="192.168.50.10"), NodeIpHints()
    )
    assert "primary ipv4 192.168.50.10 from kube-proxy's bindAddress" in c.evidence


def test_unknown_primary_warns() -> None:
    links = Links(None, ("192.168.50.10", "192.168.50.11"))
    c = checks.check_nodeport_addresses(snap(links=links), cfg(), NodeIpHints())
    assert c.status == "warn"
    assert (
        "cannot tell the primary ipv4 address among 192.168.50.10, 192.168.50.11 (no default "
        "route, no bindAddress): pass --node-ip" in c.evidence
    )


def test_explicit_node_port_addresses_pass() -> None:
    links = Links(None, ("192.168.50.10", "192.168.50.11", "10.0.0.5"))
    c = checks.check_nodeport_addresses(
        snap(links=links), cfg(node_port_addresses=("192.168.50.0/24",)), NodeIpHints()
    )
    assert c.status == "pass"
    assert "node addresses inside: 192.168.50.10, 192.168.50.11" in c.evidence


def test_nodeport_addresses_without_config_warn() -> None:
    c = checks.check_nodeport_addresses(snap(), NO_CONFIG, NodeIpHints())
    assert c.status == "warn"
    assert c.evidence[0] == (
        "could not check nodePortAddresses: kube-proxy's configuration was not read (see "
        "mode-pinned)"
    )


# --- counters -------------------------------------------------------------------------------


def test_counters() -> None:
    ipt = kube_proxy("iptables")
    zero = with_metrics(ipt, localhost_nodeport_packets=0.0, ct_state_invalid_dropped=0.0)
    seen = with_metrics(ipt, localhost_nodeport_packets=17.0, ct_state_invalid_dropped=3.0)
    assert checks.check_localhost_nodeports(snap(kp=zero)).status == "pass"
    c = checks.check_localhost_nodeports(snap(kp=seen))
    assert c.status == "warn"
    assert c.evidence[0].startswith(
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total = 17: clients reach"
    )
    assert checks.check_conntrack_invalid(snap(kp=zero)).status == "pass"
    c = checks.check_conntrack_invalid(snap(kp=seen))
    assert c.status == "warn" and " = 3: " in c.evidence[0]
    # absent series: fine in ipvs mode, unknowable in iptables mode
    assert checks.check_localhost_nodeports(snap(kp=kube_proxy("ipvs"))).status == "pass"
    assert checks.check_conntrack_invalid(snap(kp=ipt)).status == "warn"
    c = checks.check_localhost_nodeports(snap(kp=kube_proxy(None)))
    assert c.status == "warn"
    assert c.evidence[0].startswith(
        "could not check kubeproxy_iptables_localhost_nodeports_accepted_packets_total: "
        "kube-proxy /metrics absent"
    )


# --- foreign references ---------------------------------------------------------------------

IPVS_NODE = """\
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-SVC-ABC - [0:0]
:CNI-HOSTPORT-SETMARK - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-SVC-ABC -j KUBE-MARK-MASQ
-A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ
COMMIT
*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-NODEPORTS - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m set --match-set KUBE-6-CLUSTER-IP dst,dst -j ACCEPT
-A OUTPUT -m set --match-set office-allow src -j ACCEPT
COMMIT
"""


def test_foreign_references_in_both_backends() -> None:
    s = snap(legacy=IPVS_NODE, nft=IPVS_NODE)
    refs = checks.foreign_references(s, classify(s, NOW))
    assert refs == [
        f"{b}/ipv4/nat -A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ (jumps to KUBE-MARK-MASQ)"
        if t == "nat"
        else f"{b}/ipv4/filter -A INPUT -m set --match-set KUBE-6-CLUSTER-IP dst,dst -j ACCEPT "
        "(matches set KUBE-6-CLUSTER-IP)"
        for b in ("legacy", "nft")
        for t in ("nat", "filter")
    ]
    c, n = checks.check_foreign_references(s, classify(s, NOW))
    assert (c.status, n) == ("fail", 4)


def test_foreign_jump_from_a_builtin_chain_with_another_comment() -> None:
    text = (
        "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n"
        '-A INPUT -m comment --comment "site firewall" -j KUBE-PROXY-FIREWALL\nCOMMIT\n'
    )
    s = snap(legacy=text)
    assert checks.foreign_references(s, classify(s, NOW)) == [
        'legacy/ipv4/filter -A INPUT -m comment --comment "site firewall" -j '
        "KUBE-PROXY-FIREWALL (jumps to KUBE-PROXY-FIREWALL)"
    ]


def test_no_foreign_references_and_unreadable_backend() -> None:
    clean = IPVS_NODE.replace("-A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ\n", "").replace(
        "-A INPUT -m set --match-set KUBE-6-CLUSTER-IP dst,dst -j ACCEPT\n", ""
    )
    s = snap(legacy=clean)
    c, n = checks.check_foreign_references(s, classify(s, NOW))
    assert (c.status, n) == ("pass", 0)
    broken = replace(s, iptables_nft=Reading("error", (), "iptables-nft-save timed out"))
    c, n = checks.check_foreign_references(broken, classify(broken, NOW))
    assert (c.status, n) == ("warn", None)
    assert c.evidence == ("could not read iptables_nft: iptables-nft-save timed out",)


# --- IPVS, scheduler, strictARP -------------------------------------------------------------

KUBE_VS = IpvsService(
    4, "TCP", "10.96.0.1", 443, None, "rr", 0, 0, (IpvsDest("10.0.0.2", 6443, "masq", 1),)
)
KEEPALIVED = IpvsService(
    4,
    "TCP",
    "192.168.50.100",
    80,
    None,
    "wlc",
    0,
    0,
    (IpvsDest("192.168.60.11", 80, "route", 1),) * 2,
)
BOUND = Links(Link("kube-ipvs0", 9, "dummy", False, ("10.96.0.1/32",)), ("192.168.50.10",))
# kube-proxy's record of KUBE_VS's address and port (docs/contract.md#ownership evidence)
CLUSTER_IP = (Ipset("KUBE-CLUSTER-IP", "hash:ip,port", 4, 1, 0, ("10.96.0.1,tcp:443",)),)


def test_foreign_ipvs_services_fail() -> None:
    s = snap(ipvs=(KUBE_VS, KEEPALIVED), links=BOUND, ipsets=CLUSTER_IP)
    c = checks.check_foreign_ipvs(s, classify(s, NOW))
    assert c.status == "fail"
    assert c.evidence[1:] == ("TCP 192.168.50.100:80 (2 real servers)",)
    s = snap(ipvs=(KUBE_VS,), links=BOUND, ipsets=CLUSTER_IP)
    c = checks.check_foreign_ipvs(s, classify(s, NOW))
    assert c == Check(
        "foreign-ipvs-services", "pass", ("1 IPVS service(s), all kube-proxy's; none foreign",)
    )
    s = replace(s, ipvs=Reading("absent", (), "ip_vs not loaded"))
    assert checks.check_foreign_ipvs(s, classify(s, NOW)).status == "pass"
    s = replace(s, ipvs=Reading("error", (), "EPERM"))
    assert checks.check_foreign_ipvs(s, classify(s, NOW)).status == "warn"


def test_scheduler() -> None:
    s = snap(ipvs=(KUBE_VS,), links=BOUND, ipsets=CLUSTER_IP)
    c = classify(s, NOW)
    warn = checks.check_ipvs_scheduler(s, c, cfg(ipvs_scheduler="wlc"))
    assert warn.status == "warn"
    assert warn.evidence[0].startswith("ipvs.scheduler wlc (ipvs_scheduler in test) becomes dead")
    assert warn.evidence[1] == "kube-proxy's IPVS services use rr (1)"
    assert checks.check_ipvs_scheduler(s, c, cfg(ipvs_scheduler="")).status == "pass"
    assert checks.check_ipvs_scheduler(s, c, NO_CONFIG).status == "warn"


def test_strict_arp() -> None:
    zero = {"net.ipv4.conf.all.arp_ignore": "0", "net.ipv4.conf.all.arp_announce": "0"}
    strict = {"net.ipv4.conf.all.arp_ignore": "1", "net.ipv4.conf.all.arp_announce": "2"}
    assert checks.check_strict_arp(snap(sysctls=zero), cfg(ipvs_strict_arp=False)).status == "pass"
    c = checks.check_strict_arp(snap(sysctls=zero), cfg(ipvs_strict_arp=True))
    assert c.status == "warn" and "becomes dead configuration" in c.evidence[0]
    c = checks.check_strict_arp(snap(sysctls=strict), cfg())
    assert c.status == "warn"
    assert c.evidence[1].startswith(
        "net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 (strictARP's values)"
    )
    assert checks.check_strict_arp(snap(sysctls=zero), NO_CONFIG).status == "warn"


def test_precheck_ready_node() -> None:
    s = snap(kp=kube_proxy("ipvs"), sysctls={})
    result = checks.precheck(s, classify(s, NOW), cfg(mode="ipvs"), NodeIpHints())
    assert [c.name for c in result] == [
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
    ]
    assert {c.status for c in result} == {"pass"}, result
    assert checks.ready(result)
    assert checks.render("precheck", result).splitlines()[-1] == "READY: 0 fail, 0 warn, 10 pass"


# --- verify ---------------------------------------------------------------------------------

PROBE_OK = ProbeResult("10.96.0.1:443", "--probe-address", True, "connected in 0.001s")


def nft_snap(kp: KubeProxy | None = None, **kw: Any) -> Snapshot:
    from agent.names import NFTABLES_MODE_CHAINS
    from agent.snapshot import NftTable

    s = snap(kp=kp or kube_proxy("nftables", ("IPv4", "IPv6")), **kw)
    own = NFTABLES_MODE_CHAINS
    tables = (
        NftTable("ip", "kube-proxy", kube_proxy_chains=own),
        NftTable("ip6", "kube-proxy", kube_proxy_chains=own),
    )
    return replace(s, nftables=ok(tables))


def run_verify(s: Snapshot, probe: ProbeResult = PROBE_OK) -> list[Check]:
    return checks.verify(s, classify(s, NOW), probe, NOW, 0.0)


def test_verify_passes_on_a_clean_nftables_node() -> None:
    result = run_verify(nft_snap())
    assert [(c.name, c.status) for c in result] == [
        ("nftables-mode", "pass"),
        ("no-leftovers", "pass"),
        ("kube-ipvs0-gone", "pass"),
        ("nftables-sync", "pass"),
        ("service-probe", "pass"),
    ]
    assert one(result, "nftables-sync").evidence == (
        "/livez answers HTTP 200: no update stuck",
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total = 0",
    )
    doc = checks.document("verify", result)
    assert doc["ok"] is True and doc["summary"] == {"pass": 5, "warn": 0, "fail": 0}


def test_verify_mode_failures() -> None:
    c = one(run_verify(nft_snap(kp=kube_proxy("ipvs"))), "nftables-mode")
    assert c.status == "fail"
    assert c.evidence[0] == "/proxyMode answers ipvs, not nftables"
    # the nftables series are extra evidence, never required (1.30 exposes none at start)
    c = one(
        run_verify(nft_snap(kp=kube_proxy("nftables", ("IPv4", "IPv6"), series=False))),
        "nftables-mode",
    )
    assert c.status == "pass"
    s = replace(nft_snap(), nftables=ok(()))
    c = one(run_verify(s), "nftables-mode")
    assert "no nftables table ip6 kube-proxy for active family IPv6" in c.evidence


def test_verify_leftovers_and_kube_ipvs0() -> None:
    s = nft_snap(ipvs=(KUBE_VS,), links=BOUND, ipsets=CLUSTER_IP)
    result = run_verify(s)
    c = one(result, "no-leftovers")
    assert c.status == "fail"
    assert c.evidence[0] == (
        "3 ipvs-mode object(s) remain: 1 ipset, 1 ipvs-service, 1 link "
        "(ipvs-leftovers cleanup removes them)"
    )
    c = one(result, "kube-ipvs0-gone")
    assert c.evidence == (
        "kube-ipvs0 exists (kind dummy, down) with 1 addresses: the node still claims those "
        "Service IPs",
    )
    broken = replace(nft_snap(), ipsets=Reading("error", (), "EPERM"))
    c = one(run_verify(broken), "no-leftovers")
    assert c == Check("no-leftovers", "fail", ("could not read ipsets: EPERM",))


def test_verify_sync() -> None:
    idle = nft_snap(kp=kube_proxy("nftables", ("IPv4",), sync_age=3600))
    assert one(run_verify(idle), "nftables-sync").status == "pass"  # hourly re-sync
    c = checks.check_nftables_sync(idle, classify(idle, NOW), NOW, 300.0)
    assert c.status == "fail"
    assert "metric last sync IPv4 older than --max-sync-age 300s" in c.evidence
    no_counter = nft_snap(kp=with_metrics(kube_proxy("nftables"), nftables_sync_failures=None))
    c = one(run_verify(no_counter), "nftables-sync")
    assert c.status == "pass"
    assert "no kubeproxy_sync_proxy_rules_nftables_sync_failures_total counted yet" in c.evidence
    failing = nft_snap(kp=with_metrics(kube_proxy("nftables"), nftables_sync_failures=4.0))
    c = one(run_verify(failing), "nftables-sync")
    assert c.evidence[0] == "kubeproxy_sync_proxy_rules_nftables_sync_failures_total = 4"
    unhealthy = nft_snap(kp=kube_proxy("nftables", healthy=False, livez=False))
    assert (
        "/healthz answers HTTP 503: unhealthy"
        in one(run_verify(unhealthy), "nftables-sync").evidence
    )
    gone = nft_snap(kp=kube_proxy(None))
    result = run_verify(gone)
    assert one(result, "nftables-sync").evidence[:2] == (
        "/healthz absent: unreachable",
        "/metrics absent: unreachable",
    )
    assert one(result, "nftables-mode").evidence[0] == "/proxyMode absent: unreachable"


def test_verify_probe() -> None:
    none = ProbeResult(None, "", False, "no probe target: ...")
    assert one(run_verify(nft_snap(), none), "service-probe") == Check(
        "service-probe", "fail", ("no probe target: ...",)
    )
    refused = ProbeResult("127.0.0.1:9", "--probe-address", False, "connection refused")
    c = one(run_verify(nft_snap(), refused), "service-probe")
    assert c.evidence == ("TCP connect to 127.0.0.1:9 (--probe-address): connection refused",)


def test_probe_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_host_port("10.96.0.1:443") == ("10.96.0.1", 443)
    assert parse_host_port("[fd00:10:96::1]:443") == ("fd00:10:96::1", 443)
    assert parse_host_port("kubernetes.default:443") == ("kubernetes.default", 443)
    for bad in ("10.96.0.1", "fd00::1:443", ":443", "h:0", "h:x"):
        with pytest.raises(ValueError):
            parse_host_port(bad)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert _target(None) == (
        "[fd00:10:96::1]:443",
        "KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT",
    )
    assert _target("10.0.0.1:80") == ("10.0.0.1:80", "--probe-address")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")
    target, why = _target(None)
    assert target is None and why.startswith("no probe target: KUBERNETES_SERVICE_HOST/")


# --- readiness metrics ----------------------------------------------------------------------


def test_readiness_metrics() -> None:
    s = snap(
        legacy=IPVS_NODE,
        kp=with_metrics(kube_proxy("iptables"), localhost_nodeport_packets=12.0),
    )
    assert checks.readiness_metrics(s, classify(s, NOW), cfg(mode="iptables")) == {
        "ipvs_leftovers_nftables_kernel_ready": 1.0,
        "ipvs_leftovers_kube_proxy_mode_pinned": 1.0,
        "ipvs_leftovers_foreign_references": 2.0,
        "ipvs_leftovers_localhost_nodeport_packets": 12.0,
    }
    old = snap(release="5.4.0", kp=kube_proxy(None))
    assert checks.readiness_metrics(old, classify(old, NOW), NO_CONFIG) == {
        "ipvs_leftovers_nftables_kernel_ready": 0.0,
        "ipvs_leftovers_foreign_references": 0.0,
    }


def test_yaml_booleans_and_anchors_in_nested_fields() -> None:
    """YAML 1.1 as kube-proxy reads it: `yes` is true; an alias carries the anchored mapping."""
    text = (
        "kind: KubeProxyConfiguration\n"
        "defaults: &d {strictARP: yes, scheduler: rr}\n"
        "ipvs: *d\n"
        "iptables:\n  localhostNodePorts: off\n"
    )
    values = kpc.settings(kpc.parse_config_text(text), "f")
    assert values["ipvs_strict_arp"] is True
    assert values["ipvs_scheduler"] == "rr"
    assert values["localhost_node_ports"] is False
