"""The node shapes beyond the default one (tests/realkp/shapes.py): what each shape adds to the
checks every scenario of every node gets (classes, exact counts, exact cleanup, restore,
verify).

Collected through tests/realkp/test_real_kube_proxy.py (`from ... import *`), so that they read
its session run (its `runs` fixture) instead of starting a second one: a fixture imported into
a second test module is a second fixture, run again.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.realkp import state as st
from tests.realkp.nodes import BY_NS, NODES, RELEASES, minor
from tests.realkp.pipeline import NodeRun
from tests.realkp.shapes import ARP, CONFIG
from tests.realkp.test_real_kube_proxy import _audit, _scenario, _texts

__all__ = [
    "test_every_release_runs_b_and_a_on_both_backends",
    "test_api_server_release_within_skew",
    "test_kubeadm_config_read_through_proc_root",
    "test_strict_arp_sysctls_reported_kept_and_reset_exactly",
    "test_default_node_port_addresses_every_local_address",
    "test_start_without_ipset_keeps_every_set",
    "test_ipv6_only_node_is_all_ipv6",
]


def _ids(pred: Any) -> list[str]:
    return [n.ns for n in NODES if pred(n)]


def _run(runs: dict[str, NodeRun], node: str) -> NodeRun:
    run = runs[node]
    assert not run.error, f"{node}: the run stopped: {run.error}"
    return run


def test_every_release_runs_b_and_a_on_both_backends() -> None:
    """The matrix itself: no release/backend pair is left out of B and A."""
    have = {(n.release, n.net.backend) for n in NODES if {"B", "A"} <= set(n.scenarios)}
    assert have == {(r, b) for r in RELEASES for b in ("legacy", "nft")}
    # and at least one node talks to an API server older than the newest release
    assert {n.apiserver for n in NODES} - {RELEASES[-1]}


@pytest.mark.parametrize("node", [n.ns for n in NODES])
def test_api_server_release_within_skew(runs: dict[str, NodeRun], node: str) -> None:
    """The node's kube-apiserver is the release planned, by its own answer, and kube-proxy's
    version-skew policy allows it: kube-proxy no newer than the API server and at most three
    minors older (https://kubernetes.io/releases/version-skew-policy/#kube-proxy)."""
    spec = BY_NS[node]
    run = _run(runs, node)
    assert run.server_version == spec.apiserver
    for proxy in {spec.release, spec.ipvs_on}:
        skew = minor(spec.apiserver)[1] - minor(proxy)[1]
        assert 0 <= skew <= 3, (proxy, spec.apiserver)


KUBEADM = _ids(lambda n: n.shape.kubeadm)
STRICT_ARP = _ids(lambda n: n.shape.strict_arp)
DEFAULT_NODE_PORTS = _ids(lambda n: not n.shape.pinned_node_ports)
NO_IPSET = _ids(lambda n: not n.shape.ipset)


def _check(doc: dict[str, Any], name: str) -> dict[str, Any]:
    checks = {c["name"]: c for c in doc["checks"]}
    assert name in checks, sorted(checks)
    check: dict[str, Any] = checks[name]
    return check


@pytest.mark.parametrize(
    ("node", "name"), [pytest.param(n, s, id=f"{n}-{s}") for n in KUBEADM for s in ("B", "A")]
)
def test_kubeadm_config_read_through_proc_root(
    runs: dict[str, NodeRun],
    node: str,
    name: str,
) -> None:
    """kube-proxy runs as kubeadm's DaemonSet runs it: `--config` naming a file that exists only
    in its own root filesystem. The agent's precheck reads it (through /proc/PID/root): the
    mode it pins, strictARP, and nodePortAddresses unset, each named with the file it came from."""
    run = _run(runs, node)
    doc = run.shape["scenarios"][name]
    assert doc["vm_root_has_config"] is False, "the VM's own root has the file: proves nothing"
    pid = doc["pid"]
    pre = json.loads(doc["precheck"]["stdout"])
    origin = f"in {CONFIG} (pid {pid})"
    text = json.dumps(pre)
    assert "could not be read" not in text and "cannot read" not in text, text
    strict = _check(pre, "strict-arp")
    assert f"ipvs.strictARP true (ipvs.strictARP: {origin}) becomes dead" in " ".join(
        strict["evidence"]
    ), strict
    # kubeadm writes `nodePortAddresses: null` (the reader takes it as empty: both are unset to
    # kube-proxy); ipvs mode served NodePorts on every address, nftables mode will not
    npa = _check(pre, "nodeport-addresses")
    assert npa["status"] == "warn", npa
    assert npa["evidence"][0] == (
        f"nodePortAddresses empty (nodePortAddresses: {origin}): nftables mode serves NodePorts "
        "on the primary node IP(s) only"
    ), npa
    assert (
        "NodePorts stop answering on the secondary address(es) 10.244.0.10, fd00:244::10; set "
        "nodePortAddresses to keep them"
    ) in npa["evidence"], npa
    pinned = _check(pre, "mode-pinned")
    assert f"mode nftables pinned by mode: {origin}" in pinned["evidence"], pinned


def _arp_diff(a: dict[str, str], b: dict[str, str]) -> dict[str, tuple[str, str]]:
    """The values that changed, on the interfaces both readings have (kube-ipvs0 comes and goes
    with its link, its own values untouched)."""
    return {k: (a[k], b[k]) for k in sorted(set(a) & set(b)) if a[k] != b[k]}


@pytest.mark.parametrize("node", STRICT_ARP)
def test_strict_arp_sysctls_reported_kept_and_reset_exactly(
    runs: dict[str, NodeRun],
    node: str,
) -> None:
    """ipvs mode with strictARP set exactly net.ipv4.conf.all.arp_ignore=1 and arp_announce=2
    (pkg/proxy/ipvs/proxier.go); the audit reports them, the default cleanup keeps them and
    says so, `cleanup --reset-arp-sysctls` sets those two back to 0 and nothing else besides
    what the default cleanup removes, and `restore` gives both back."""
    run = _run(runs, node)
    arp = run.shape["arp"]
    ignore, announce = ARP
    assert _arp_diff(arp["S0"], arp["S1"]) == {ignore: ("0", "1"), announce: ("0", "2")}
    assert set(arp["S0"]) ^ set(arp["S1"]) == {k for k in arp["S1"] if ".kube-ipvs0." in k}
    sc = _scenario(runs, node, "B")
    sysctls = _audit(sc)["sysctls"]
    assert (sysctls.get(ignore), sysctls.get(announce)) == ("1", "2"), sysctls
    assert sc.cleanup is not None
    for k, v in ((ignore, "1"), (announce, "2")):
        assert f"kept sysctl {k}={v}: strictARP value" in sc.cleanup.stdout, sc.cleanup.stdout
    reset = run.shape["scenarios"]["B"]["reset"]
    assert reset["arp_before"] == arp["S1"]
    assert _arp_diff(reset["arp_before"], reset["arp_after"]) == {
        ignore: ("1", "0"),
        announce: ("2", "0"),
    }
    assert reset["cleanup"]["rc"] in (0, 1), reset["cleanup"]
    before, after = st.State(**reset["before"]), st.State(**reset["after"])
    assert sc.after is not None
    # the same objects go as in the scenario's default cleanup, nothing more
    assert before.objects() - after.objects() == sc.before.objects() - sc.after.objects()
    assert reset["restore"] is not None and reset["restore"]["rc"] == 0, reset["restore"]
    assert reset["arp_restored"] == reset["arp_before"]
    restored = st.State(**reset["restored"])
    assert _texts(restored, set()) == _texts(before, set())


def _node_port_addresses(s: st.State) -> dict[str, set[str]]:
    """Upstream's NodePort addresses when nodePortAddresses is unset: every local address but
    kube-ipvs0's, loopback and IPv6 link-local (GetAllLocalAddressesExcept, isValidForSet)."""
    out: dict[str, set[str]] = {"inet": set(), "inet6": set()}
    for link, addrs in s.addrs.items():
        if link == "kube-ipvs0":
            continue
        for a in addrs:
            fam, cidr = a.split()
            ip = cidr.split("/")[0]
            if ip.startswith("127.") or ip == "::1" or ip.lower().startswith("fe80:"):
                continue
            out[fam].add(ip)
    return out


@pytest.mark.parametrize("node", DEFAULT_NODE_PORTS)
def test_default_node_port_addresses_every_local_address(
    runs: dict[str, NodeRun],
    node: str,
) -> None:
    """nodePortAddresses unset: ipvs mode made each NodePort's virtual server on every local
    address (more than one per family here: the node IP and the local pod address on lo),
    and the agent attributes every one of them to ipvs mode and removes it."""
    sc = _scenario(runs, node, "B")
    want = _node_port_addresses(sc.before)
    assert len(want["inet"]) > 1 and len(want["inet6"]) > 1, want
    ports = {"30080": "inet", "30082": "inet6"}  # web (IPv4), v6-only (IPv6)
    for port, fam in ports.items():
        got = {
            name.split()[1].rsplit(":", 1)[0].strip("[]")
            for name in sc.before.ipvs
            if name.startswith("TCP ") and name.endswith(f":{port}")
        }
        assert got == want[fam], (port, got, want[fam])
        vs = {f"ipvs {n}" for n in sc.before.ipvs if n.endswith(f":{port}")}
        assert vs <= sc.made_ipvs
    classes = {f["name"]: f["class"] for f in _audit(sc)["findings"] if f["kind"] == "ipvs-service"}
    nodeports = [n for n in classes if n.endswith((":30080", ":30082"))]
    assert len(nodeports) == len(want["inet"]) + len(want["inet6"]), nodeports
    assert {classes[n] for n in nodeports} == {"ipvs-leftover"}, classes


@pytest.mark.parametrize("node", NO_IPSET)
def test_start_without_ipset_keeps_every_set(runs: dict[str, NodeRun], node: str) -> None:
    """No `ipset` on nftables mode's PATH: its start-up cleanup (modprobe there, so it ran)
    skips the sets without a word, IPv4's too; the agent finds all of them, both families."""
    run = _run(runs, node)
    sc = _scenario(runs, node, "A")
    made = {o for o in sc.made_ipvs if o.startswith("ipset ")}
    assert made and made <= sc.before.objects()
    assert not sc.before.ipvs and "link kube-ipvs0" not in sc.before.links
    counts = _audit(sc)["leftovers"]["ipsets"]
    v6 = sum(o.startswith("ipset KUBE-6-") for o in made)
    assert counts == {"ipv4": len(made) - v6, "ipv6": v6}
    assert v6 and len(made) - v6
    errors = [x for x in run.shape["scenarios"]["A"]["ipset_log"] if x.startswith("E")]
    assert errors == []
    assert sc.after is not None
    assert not {o for o in sc.after.objects() if o.startswith("ipset KUBE-")}


V6_ONLY = _ids(lambda n: not n.net.ipv4)


@pytest.mark.parametrize("node", V6_ONLY)
def test_ipv6_only_node_is_all_ipv6(runs: dict[str, NodeRun], node: str) -> None:
    """A single-stack IPv6 cluster (IPv6 Service CIDR, the node's only IP IPv6): ipvs mode's
    Services, kube-ipvs0's addresses and every set with members are IPv6 (`KUBE-6-*`); the
    audit counts them as IPv6 and nftables mode's `ip6 kube-proxy` table serves the Services."""
    sc = _scenario(runs, node, "B")
    made = sc.made_ipvs
    vs = [o.split(" ", 1)[1] for o in made if o.startswith("ipvs ")]
    assert vs and all("[" in name for name in vs), vs
    addrs = sc.before.addrs.get("kube-ipvs0", [])
    assert addrs and all(a.startswith("inet6 ") for a in addrs), addrs
    sets = {o.split()[1] for o in made if o.startswith("ipset ")}
    with_members = {s for s in sets if len(sc.before.ipsets.get(s, [])) > 1}
    assert with_members and all(s.startswith("KUBE-6-") for s in with_members), with_members
    doc = _audit(sc)
    left = doc["leftovers"]
    assert left["ipset_entries"]["ipv4"] == 0, left["ipset_entries"]
    assert left["kube_ipvs0"]["addresses"] == {"ipv4": 0, "ipv6": len(addrs)}
    assert "fd00:96::101" in sc.before.nft_tables["ip6 kube-proxy"]
