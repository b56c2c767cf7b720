"""Is the bench's state what real kube-proxy programs? python -m bench.realstate N OUT BINARY.

In the VM: builds the bench node of N Services (lab) in one namespace and, in another, lets
real kube-proxy (BINARY, ipvs mode) program the same Services, served by the real-kube-proxy
tier's fake API server (tests/fake_apiserver.py). Then compares the ipvs-mode objects'
counts and shapes: IPVS virtual and real servers (scheduler, forwarding, weight, flags),
kube-ipvs0 and its addresses, every KUBE- set's type and size, and the iptables KUBE- chains,
their rules and the jumps into them. Writes OUT/realstate-N.txt; exit 1 when they differ.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import fastbuild
from lab import build as lab_build
from tests.fake_apiserver import Cluster, Endpoint, Node, Port, Service

LOCAL = ipaddress.ip_network("10.244.0.0/24")  # the lab node's own pod CIDR
# the kubelet's chains, which the lab builds too (a node has them) and kube-proxy does not
KUBELET = {"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"}


def cluster(n: int) -> Cluster:
    node = fastbuild.bench_node(n)
    services = []
    for s in node.services:
        eps = tuple(
            Endpoint(ip, "node-a" if ipaddress.ip_address(ip) in LOCAL else None)
            for ip in s.endpoints
        )
        ports = tuple(Port(p.port, p.protocol, p.target_port, p.node_port, p.name) for p in s.ports)
        services.append(Service(s.name, s.cluster_ips, ports, s.type, s.namespace, endpoints=eps))
    return Cluster(Node("node-a", ("192.168.50.10",), ("10.244.0.0/24",)), services)


def sh(ns: str, *cmd: str) -> str:
    return subprocess.run(lab_build.in_ns(ns, *cmd), capture_output=True, text=True).stdout


def counts(ns: str) -> dict[str, Any]:
    """The ipvs-mode objects of a namespace, as counts and shapes."""
    rules = sh(ns, "ipvsadm", "-S", "-n").splitlines()
    services = [r for r in rules if r.startswith("-A ")]
    dests = [r for r in rules if r.startswith("-a ")]
    addrs = sh(ns, "ip", "-o", "addr", "show", "dev", "kube-ipvs0").splitlines()
    link = sh(ns, "ip", "-d", "-o", "link", "show", "kube-ipvs0")
    sets: dict[str, str] = {}
    name = ""
    for line in sh(ns, "ipset", "list", "-t").splitlines():
        if line.startswith("Name: "):
            name = line.split()[1]
        elif line.startswith("Type: ") and name.startswith("KUBE-"):
            sets[name] = line.split()[1]
        elif line.startswith("Number of entries: ") and name.startswith("KUBE-"):
            sets[name] += f" {line.split()[-1]} entries"
    ipt: dict[str, int] = collections.Counter()
    texts: dict[str, list[str]] = collections.defaultdict(list)
    table = ""
    for line in sh(ns, "iptables-nft-save").splitlines():
        words = line.split()
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":KUBE-") and words[0][1:] not in KUBELET:
            ipt[f"{table} chain {words[0][1:]}"] += 1
        elif line.startswith("-A KUBE-") and words[1] not in KUBELET:
            ipt[f"{table} rules in {words[1]}"] += 1
            texts[f"{table} {words[1]}"].append(line)
        elif line.startswith("-A ") and re.search(r" -j KUBE-", line):
            target = line.split(" -j ")[1].split()[0]
            if target not in KUBELET:
                ipt[f"{table} jump {words[1]} -> {target}"] += 1
    return {
        "ipvs virtual servers": len(services),
        "ipvs real servers": len(dests),
        "ipvs service shapes": dict(collections.Counter(" ".join(r.split()[3:]) for r in services)),
        "ipvs real-server shapes": dict(
            collections.Counter(" ".join(r.split()[5:]) for r in dests)
        ),
        "kube-ipvs0": {"dummy": " dummy " in link, "addresses": len(addrs)},
        "sets": dict(sorted(sets.items())),
        "iptables": dict(sorted(ipt.items())),
        # ipvs mode's chains are fixed (no per-Service chain): their rules, word for word
        "iptables rules": {k: sorted(v) for k, v in sorted(texts.items())},
    }


def real_kube_proxy(ns: str, n: int, binary: str, log: Path) -> float:
    for cmd in (
        "ip link set lo up",
        "ip link add eth0 type dummy",
        "ip addr add 192.168.50.10/24 dev eth0",
        "ip link set eth0 up",
        "ip route add 10.244.0.0/16 dev eth0",
    ):
        subprocess.run(lab_build.in_ns(ns, *cmd.split()), check=True)
    want = 4 * (n + len(range(0, n, 10)))  # virtual + real servers, as the lab model says
    code = f"""
import subprocess, sys, tempfile, time
from pathlib import Path
from bench.realstate import cluster
from tests.fake_apiserver import FakeAPIServer
with FakeAPIServer(cluster({n})) as api, tempfile.TemporaryDirectory() as tmp:
    kc = Path(tmp) / "kubeconfig"
    kc.write_text(api.kubeconfig())
    args = [{binary!r}, f"--kubeconfig={{kc}}", "--hostname-override=node-a",
            "--proxy-mode=ipvs", "--cluster-cidr=10.244.0.0/16",
            "--nodeport-addresses=192.168.50.0/24",
            "--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256",
            "--kube-api-content-type=application/json", "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
            "--oom-score-adj=0", "-v=2"]
    with open({str(log)!r}, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        start = time.monotonic()
        try:
            while time.monotonic() - start < 3000:
                time.sleep(5)
                save = subprocess.run(["ipvsadm", "-S", "-n"], capture_output=True, text=True)
                sets = subprocess.run(["ipset", "list", "-t", "KUBE-CLUSTER-IP"],
                                      capture_output=True, text=True).stdout
                nat = subprocess.run(["iptables-nft-save", "-t", "nat"],
                                     capture_output=True, text=True).stdout
                # IPVS first, then the sets and iptables at the end of a sync
                if (save.stdout.count("\\n") >= {want} and f"entries: {n}" in sets
                        and "-A KUBE-SERVICES" in nat):
                    break
            time.sleep(30)  # a sync round more, and the other family's proxier
        finally:
            proc.terminate()
            proc.wait(30)
    print(time.monotonic() - start)
"""
    p = subprocess.run(
        lab_build.in_ns(ns, sys.executable, "-c", code), capture_output=True, text=True
    )
    if p.returncode != 0:
        raise SystemExit(f"kube-proxy run failed: {p.stderr[-2000:]}")
    return float(p.stdout.split()[-1])


def main(argv: list[str]) -> int:
    n, out, binary = int(argv[0]), Path(argv[1]), argv[2]
    subprocess.run(
        ["modprobe", "-a", "ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "dummy", "nf_conntrack"],
        check=True,
    )
    lab_ns, real_ns = f"lab-{n}", f"real-{n}"
    for ns in (lab_ns, real_ns):
        lab_build.delete_netns(ns)
        lab_build.create_netns(ns)
    try:
        fastbuild.apply(lab_ns, fastbuild.bench_node(n), fastbuild.texts(fastbuild.bench_node(n)))
        took = real_kube_proxy(real_ns, n, binary, out / f"realstate-kube-proxy-{n}.log")
        lab, real = counts(lab_ns), counts(real_ns)
    finally:
        for ns in (lab_ns, real_ns):
            lab_build.delete_netns(ns)
    keys = sorted(set(lab) | set(real))
    diff = {k: {"lab": lab.get(k), "real": real.get(k)} for k in keys if lab.get(k) != real.get(k)}
    text = (
        f"bench state (lab) vs real kube-proxy v1.30.3 in ipvs mode, {n} Services "
        f"(real kube-proxy programmed it in {took:.0f}s under TCG)\n\n"
        + ("SAME: every count and shape below is equal\n" if not diff else "DIFFERENT:\n")
        + json.dumps(diff, indent=2)
        + "\n\nlab:\n"
        + json.dumps(lab, indent=2)
        + "\n\nreal:\n"
        + json.dumps(real, indent=2)
        + "\n"
    )
    (out / f"realstate-{n}.txt").write_text(text)
    print(text[:4000])
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
