"""kube-proxy's flags and configuration file (agent.readers.kube_proxy_config)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.readers import kube_proxy_config as kpc
from agent.readers.kube_proxy_config import ConfigError
from tests.unit.checks_builders import (
    KUBEADM_CONFIG,
)

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
