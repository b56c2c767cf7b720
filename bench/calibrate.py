"""How much slower Python runs under the VM than on the host: the same pure-Python workload
(decode 30,000 IPVS real-server messages, classify a 10,000-service snapshot), CPU seconds.

    .venv/bin/python -m bench.calibrate                  # on the host
    scripts/vm-run -- python -m bench.calibrate          # in the VM (TCG)

The ratio converts the VM's CPU figures for serve into an estimate for a real node
(daemonset/README.md); ratios between measures of one run never need it.
"""

from __future__ import annotations

import functools
import json
import socket
import struct
import time

from agent import classify
from agent.readers.ipvs import parse_dest
from agent.readers.ipvs_wire import (
    ATTR_DEST,
    DEST_ADDR,
    DEST_FAMILY,
    DEST_FWD,
    DEST_PORT,
    DEST_WEIGHT,
)
from agent.readers.netlink import NLA_F_NESTED, attr
from agent.snapshot import (
    Ipset,
    IpvsService,
    Kernel,
    KubeProxy,
    LazyDests,
    Link,
    Links,
    Reading,
    Snapshot,
)

N = 10_000


def _dest(ip: str) -> memoryview:
    body = (
        attr(DEST_ADDR, socket.inet_aton(ip).ljust(16, b"\0"))
        + attr(DEST_PORT, struct.pack("!H", 8080))
        + attr(DEST_FWD, struct.pack("=I", 0))
        + attr(DEST_WEIGHT, struct.pack("=I", 1))
        + attr(DEST_FAMILY, struct.pack("=H", socket.AF_INET))
    )
    return memoryview(b"\0" * 4 + attr(ATTR_DEST | NLA_F_NESTED, body))


def workload() -> float:
    start = time.process_time()
    decode = functools.partial(parse_dest, service_family=socket.AF_INET)
    services = []
    for i in range(N):
        raw = tuple(_dest(f"10.244.{j}.{i % 250 + 1}") for j in range(3))
        dests = LazyDests(raw, decode)
        assert len(tuple(dests)) == 3
        ip = f"10.96.{i // 250}.{i % 250 + 1}"
        services.append(IpvsService(4, "TCP", ip, 80, 0, "rr", 0, 0, dests))
    addrs = tuple(f"{s.address}/32" for s in services)
    # an IPVS service is kube-proxy's when a KUBE- set member names its address and port
    members = tuple(f"{s.address},tcp:{s.port}" for s in services)
    cluster_ip = Ipset("KUBE-CLUSTER-IP", "hash:ip,port", 4, N, 1, members)
    snap = Snapshot(
        ipvs=Reading("ok", tuple(services)),
        ipsets=Reading("ok", (cluster_ip,)),
        iptables_legacy=Reading("ok", ()),
        iptables_nft=Reading("ok", ()),
        nftables=Reading("ok", ()),
        links=Reading("ok", Links(Link("kube-ipvs0", 9, "dummy", False, addrs), ())),
        kernel=Reading("ok", Kernel(release="6.1.0")),
        kube_proxy=KubeProxy(
            Reading("absent", None), Reading("absent", None), Reading("absent", None)
        ),
    )
    found = classify.classify(snap, time.time())
    assert len(found.leftovers) >= N
    return time.process_time() - start


if __name__ == "__main__":
    runs = sorted(workload() for _ in range(3))
    print(json.dumps({"calibrate_s": runs[1], "runs": runs}))
