"""Self-test of the lab: build real kube-proxy ipvs-mode state in throwaway namespaces and read
it back with the operators' tools."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import names as n
from lab.build import NODE_LINK, NODE_PEER, build, create_netns, delete_netns
from lab.kube_proxy import start_fake_kube_proxy
from lab.model import Family
from lab.render import ip_batch, ipset_restore, iptables_restore, nft_script
from lab.scenarios import realistic_node

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces"),
]

SAVE = {
    ("legacy", "ipv4"): "iptables-legacy-save",
    ("legacy", "ipv6"): "ip6tables-legacy-save",
    ("nft", "ipv4"): "iptables-nft-save",
    ("nft", "ipv6"): "ip6tables-nft-save",
}


def sh(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


# The names of this module's namespaces, made by `_name()`: the only namespaces it can leave.
MADE: set[str] = set()


def _name() -> str:
    name = f"lab-st-{uuid.uuid4().hex[:8]}"
    MADE.add(name)
    return name


def _lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


BUILT_IN_CHAINS = {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}


def lab_names() -> set[tuple[str, str]]:
    """Every root-namespace object a lab build run outside its namespace would make or
    remove, by kind and name, from the lab's own renderers for the largest node this module
    builds: ipsets, non-built-in iptables chains (both backends), nftables tables, links,
    addresses."""
    names = {("link", NODE_LINK), ("link", NODE_PEER)}
    for backend in ("legacy", "nft"):
        node = realistic_node(
            dual_stack=True,
            backend=backend,
            nftables_table=True,
            third_party=True,
            old_release_orphans=True,
            strict_arp=True,
            with_kube_ipvs0=True,
        )
        names |= {("ipset", w[1]) for w in _lines(ipset_restore(node)) if w[0] == "create"}
        for family in node.families:
            for text in iptables_restore(node, family).values():
                names |= {("chain", w[0][1:]) for w in _lines(text) if w[0][:1] == ":"}
        names |= {
            ("nft", " ".join(w[2:4])) for w in _lines(nft_script(node)) if w[:2] == ["add", "table"]
        }
        for w in _lines(ip_batch(node)):
            if w[:2] == ["link", "add"]:
                names.add(("link", w[2]))
            elif w[:2] == ["address", "add"]:
                names.add(("addr", w[2]))
        names |= {("addr", cidr) for cidr in node.node_ips}
    return {(kind, name) for kind, name in names if name not in BUILT_IN_CHAINS}


def root_objects() -> set[tuple[str, str]]:
    """The root namespace's objects of the kinds lab_names() names, read without changing
    anything: the legacy tables only as /proc lists them (reading a table not there loads it)."""
    objects = {("ipset", name) for name in sh("ipset", "list", "-n").split()}
    for save, names in (("iptables", "ip_tables"), ("ip6tables", "ip6_tables")):
        tables = Path(f"/proc/net/{names}_names")
        for table in tables.read_text().split() if tables.exists() else ():
            text = sh(f"{save}-legacy-save", "-t", table)
            objects |= {("chain", w[0][1:]) for w in _lines(text) if w[0][:1] == ":"}
    for w in _lines(sh("nft", "list", "ruleset")):
        if w[0] == "table":
            objects.add(("nft", " ".join(w[1:3])))
        elif w[0] == "chain":
            objects.add(("chain", w[1]))
    for w in _lines(sh("ip", "-br", "addr")):
        objects.add(("link", w[0].partition("@")[0]))
        objects |= {("addr", a) for a in w[2:]}
    return objects


@pytest.fixture(scope="module", autouse=True)
def root_untouched() -> Iterator[None]:
    """What this module could have changed in the machine's own namespace, and only that: its
    own namespaces are gone, and no object the lab builds appeared or vanished there. Not a
    snapshot of all of it: the tests beside this one (pytest-xdist's other workers), podman
    (its links, netavark's tables) or an operator change the root namespace with no lab bug."""
    lab = lab_names()
    before = root_objects() & lab
    yield
    assert root_objects() & lab == before
    assert MADE.isdisjoint(sh("ip", "netns", "list").split()), sorted(MADE)


@pytest.fixture
def netns() -> Iterator[str]:
    name = _name()
    create_netns(name)
    try:
        yield name
    finally:
        delete_netns(name)


def ns(netns: str, *args: str) -> str:
    return sh("ip", "netns", "exec", netns, *args)


def saved_tables(text: str) -> dict[str, tuple[set[str], list[str]]]:
    """iptables-save text -> {table: (chains, rule lines)}."""
    out: dict[str, tuple[set[str], list[str]]] = {}
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
            out[table] = (set(), [])
        elif line.startswith(":"):
            out[table][0].add(line[1:].split()[0])
        elif line.startswith("-A"):
            out[table][1].append(line)
    return out


def expected_sets(family: Family) -> set[str]:
    return {n.set_name(s.name, family) for s in n.SETS}


@pytest.mark.parametrize("backend", ["legacy", "nft"])
@pytest.mark.parametrize("dual_stack", [False, True], ids=["ipv4", "dual"])
def test_realistic_node(netns: str, backend: str, dual_stack: bool) -> None:
    node = realistic_node(dual_stack=dual_stack, backend=backend, nftables_table=True)
    build(netns, node)

    sets = set(ns(netns, "ipset", "list", "-n").split())
    assert {
        s for s in sets if s.startswith("KUBE-") and not s.startswith("KUBE-6-")
    } == expected_sets("ipv4")
    assert len(expected_sets("ipv4")) == 17
    v6 = {s for s in sets if s.startswith("KUBE-6-")}
    assert v6 == (expected_sets("ipv6") if dual_stack else set())
    if dual_stack:
        assert len(v6) == 17
        assert "KUBE-6-LOAD-BALANCER-SOURCE-CID" in v6
        assert "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS" in v6

    cluster = ns(netns, "ipset", "list", "KUBE-CLUSTER-IP")
    assert "10.96.0.1,tcp:443" in cluster and "10.96.0.10,udp:53" in cluster
    assert "30080" in ns(netns, "ipset", "list", "KUBE-NODE-PORT-TCP")
    assert "203.0.113.10,tcp:80,198.51.100.0/24" in ns(
        netns, "ipset", "list", "KUBE-LOAD-BALANCER-SOURCE-CIDR"
    )
    assert "32100" in ns(netns, "ipset", "list", "KUBE-HEALTH-CHECK-NODE-PORT")

    other = "nft" if backend == "legacy" else "legacy"
    for family in node.families:
        tables = saved_tables(ns(netns, SAVE[(backend, family)]))
        for table, chains in n.CHAINS.items():
            assert set(chains) <= tables[table][0], (family, table)
        assert sum(len(c) for c in n.CHAINS.values()) == 11
        for table, builtin, target, comment in n.JUMPS:
            rule = f'-A {builtin} -m comment --comment "{comment}" -j {target}'
            assert rule in tables[table][1], (family, rule)
        assert len(n.JUMPS) == 9
        assert {n.KUBELET_HINT, n.KUBELET_CANARY} <= tables["mangle"][0]
        assert n.KUBELET_CANARY in tables["nat"][0] and n.KUBELET_CANARY in tables["filter"][0]
        loopback = "::1/128" if family == "ipv6" else "127.0.0.0/8"
        assert f"-A KUBE-SERVICES -s {loopback} -j RETURN" in tables["nat"][1]
        filter_rules = tables["filter"][1]
        if family == "ipv4":
            assert "-A INPUT -j KUBE-FIREWALL" in filter_rules
            assert "-A OUTPUT -j KUBE-FIREWALL" in filter_rules
            assert any("block incoming localnet connections" in r for r in filter_rules)
        else:
            assert n.KUBELET_FIREWALL not in tables["filter"][0]
        # Nothing leaks into the other backend.
        assert not any(
            r
            for _, (_, rules) in saved_tables(ns(netns, SAVE[(other, family)])).items()
            for r in rules
        )

    tables_out = ns(netns, "nft", "list", "tables")
    assert "table ip kube-proxy" in tables_out
    assert ("table ip6 kube-proxy" in tables_out) == dual_stack
    svc_chains = ns(netns, "nft", "list", "table", "ip", "kube-proxy")
    assert "service-" in svc_chains and "/tcp/" in svc_chains and "endpoint-" in svc_chains


def test_third_party_and_old_orphans(netns: str) -> None:
    node = realistic_node(third_party=True, old_release_orphans=True, strict_arp=True)
    build(netns, node)
    sets = set(ns(netns, "ipset", "list", "-n").split())
    assert {"office-allow", "KUBE-NODE-PORT-SCTP", "KUBE-NODE-PORT-LOCAL-SCTP"} <= sets
    tables = saved_tables(ns(netns, "iptables-nft-save"))
    assert {"KUBE-FIREWALL", "KUBE-MARK-DROP", "DOCKER", "CNI-HOSTPORT-DNAT"} <= tables["nat"][0]
    assert {"DOCKER-USER", "DOCKER-ISOLATION-STAGE-1", "KUBE-FIREWALL"} <= tables["filter"][0]
    assert "-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER" in tables["nat"][1]
    assert "-A FORWARD -j DOCKER-USER" in tables["filter"][1]
    assert "table inet filter-user" in ns(netns, "nft", "list", "tables")
    assert ns(netns, "sysctl", "-n", "net.ipv4.conf.all.arp_ignore").strip() == "1"


def test_non_dummy_kube_ipvs0(netns: str) -> None:
    # No dummy driver here: a bridge stands in, which is also the "not ours" case.
    node = realistic_node(dual_stack=True, with_kube_ipvs0=True, kube_ipvs0_kind="bridge")
    build(netns, node)
    link = json.loads(ns(netns, "ip", "-j", "-d", "addr", "show", "dev", "kube-ipvs0"))[0]
    assert link["linkinfo"]["info_kind"] == "bridge"
    assert "UP" not in link["flags"]
    addrs = {(a["local"], a["prefixlen"]) for a in link["addr_info"]}
    assert ("10.96.0.1", 32) in addrs and ("203.0.113.10", 32) in addrs
    assert ("fd00:10:96::a", 128) in addrs
    assert not any(a.startswith("192.168.50.10") for a, _ in addrs)


def test_ip_batch_skips_external_ip_on_node() -> None:
    node = realistic_node(node_ips=("192.168.50.10/24", "192.168.50.200/24"), with_ipvs=True)
    batch = ip_batch(node)
    assert "192.168.50.200" not in batch
    assert batch.startswith("link add kube-ipvs0 type dummy\n")


FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n"
    "    r = urllib.request.urlopen(sys.argv[1], timeout=5)\n"
    "except urllib.error.HTTPError as e:\n"
    "    r = e\n"
    "body = r.read()\n"
    "sys.stdout.write(repr((r.status, r.headers.get('Content-Type'), body)))\n"
)


def fetch(netns: str, url: str) -> tuple[int, str, bytes]:
    import ast
    import sys

    out = ns(netns, sys.executable, "-c", FETCH, url)
    return ast.literal_eval(out)


def test_fake_kube_proxy(netns: str, tmp_path: Path) -> None:
    state_file = tmp_path / "kp.json"
    kp = start_fake_kube_proxy(netns, {"families": ["IPv4", "IPv6"]}, state_file)
    try:
        code, ctype, body = fetch(netns, "http://127.0.0.1:10249/proxyMode")
        assert (code, ctype, body) == (200, "text/plain; charset=utf-8", b"nftables")
        _, _, metrics = fetch(netns, "http://127.0.0.1:10249/metrics")
        text = metrics.decode()
        # v1.37.2 by default: no failure counter before a failure, one per family after
        assert "nftables_sync_failures" not in text
        assert 'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}' in text
        kp.set(sync_failures=2)
        text = fetch(netns, "http://127.0.0.1:10249/metrics")[2].decode()
        assert 'kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv6"} 2' in text
        code, _, health = fetch(netns, "http://127.0.0.1:10256/healthz")
        doc = json.loads(health)
        assert (
            code == 200 and doc["nodeEligible"] is True and set(doc["status"]) == {"IPv4", "IPv6"}
        )
        assert fetch(netns, "http://127.0.0.1:10249/healthz")[2] == b"ok"
        assert "nodeEligible" not in json.loads(fetch(netns, "http://127.0.0.1:10256/livez")[2])

        kp.set(mode="ipvs", healthy=False)
        assert fetch(netns, "http://127.0.0.1:10249/proxyMode")[2] == b"ipvs"
        text = fetch(netns, "http://127.0.0.1:10249/metrics")[2].decode()
        assert (
            'kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 2' in text
        )
        assert "nftables_sync_failures" not in text
        assert "kubeproxy_sync_full_proxy_rules_duration_seconds" not in text  # not in ipvs mode
        assert fetch(netns, "http://127.0.0.1:10256/healthz")[0] == 503

        kp.set(mode="iptables", healthy=True, healthz_format="old")
        text = fetch(netns, "http://127.0.0.1:10249/metrics")[2].decode()
        assert "kubeproxy_iptables_ct_state_invalid_dropped_packets_total" in text
        body = fetch(netns, "http://127.0.0.1:10256/healthz")[2].decode()
        assert " +0000 UTC m=+" in body and '"nodeEligible": true' in body
        kp.set(healthz_format="oldest")
        assert "nodeEligible" not in fetch(netns, "http://127.0.0.1:10256/healthz")[2].decode()
        kp.set(release="v1.30.3", healthz_format=None)  # the release's own format
        text = fetch(netns, "http://127.0.0.1:10249/metrics")[2].decode()
        assert "kubeproxy_sync_proxy_rules_last_timestamp_seconds " in text  # no ip_family
        assert " +0000 UTC m=+" in fetch(netns, "http://127.0.0.1:10256/healthz")[2].decode()

        kp.set(garbage=True)
        code, _, junk = fetch(netns, "http://127.0.0.1:10249/proxyMode")
        assert code == 200 and junk not in (b"nftables", b"ipvs", b"iptables")
        with pytest.raises(UnicodeDecodeError):
            junk.decode()
    finally:
        kp.stop()
    assert kp.proc.returncode == 0
    assert not Path(f"{state_file}.pid").exists()


def test_cli_build_and_destroy() -> None:
    import sys

    name = _name()
    repo = str(Path(__file__).resolve().parents[2])
    cmd = [sys.executable, "-m", "lab"]
    try:
        subprocess.run(
            [
                *cmd,
                "build",
                name,
                "--dual-stack",
                "--backend",
                "legacy",
                "--services",
                "5",
                "--third-party",
                "--old-orphans",
            ],
            check=True,
            cwd=repo,
        )
        sets = ns(name, "ipset", "list", "-n").split()
        assert len([s for s in sets if s.startswith("KUBE-6-")]) == 17 + 2  # + old SCTP sets
    finally:
        subprocess.run([*cmd, "destroy", name], check=True, cwd=repo)
    assert name not in sh("ip", "netns", "list")


def test_delete_netns_kills_what_a_test_left_running() -> None:
    """A namespace lives on while a process runs in it; a pipeline whose shell alone was
    killed (as the IPVS churn loop's was) keeps its children running there."""
    import time

    name = _name()
    create_netns(name)
    try:
        shell = subprocess.Popen(["ip", "netns", "exec", name, "sh", "-c", "sleep 600 | sleep 600"])
        deadline = time.monotonic() + 10
        while len(sh("ip", "netns", "pids", name).split()) < 3:
            assert time.monotonic() < deadline, sh("ip", "netns", "pids", name)
            time.sleep(0.05)
        shell.kill()
        shell.wait()
        orphans = sh("ip", "netns", "pids", name).split()
        assert len(orphans) == 2, orphans
    finally:
        delete_netns(name)
    # killed: gone, or a zombie waiting for whoever adopted it to reap it
    alive = [p for p in orphans if Path(f"/proc/{p}").exists() and _state(p) != "Z"]
    assert alive == []
    assert name not in sh("ip", "netns", "list").split()


def _state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "gone"


def test_a_built_node_holds_still_once_build_returns(netns: str) -> None:
    """The kernel finishes bringing a veth up after `ip link set up` returns (the carrier,
    then each IPv6 link-local address through duplicate address detection). A test that read
    the node at once and again later saw those appear and blamed the agent; build() returns
    once they are there."""
    import time

    build(netns, realistic_node(backend="nft"))
    first = ns(netns, "ip", "-j", "address", "show")
    time.sleep(3)  # DAD takes about a second on an idle machine
    assert ns(netns, "ip", "-j", "address", "show") == first
    links = {link["ifname"]: link for link in json.loads(first)}
    for name in ("eth0", "eth0-peer"):
        assert links[name]["operstate"] == "UP", links[name]
        assert [a["family"] for a in links[name]["addr_info"] if a["scope"] == "link"] == ["inet6"]
