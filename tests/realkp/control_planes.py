"""Start one real control plane per node of the real-kube-proxy tier, on this host, then run CMD.

    python -m tests.realkp.control_planes --dir DIR -- scripts/vm-run --user-net ... -- pytest ...

Each node (tests/realkp/nodes.py, NODES and SOLO) is a one-node cluster of its own: etcd and kube-apiserver as
scripts/build-upstream builds them (tests/control_plane.py), on free ports of 127.0.0.1, which a
VM guest on QEMU's user network reaches at 10.0.2.2. DIR/<node namespace>/ gets what the guest
reads (tests/realkp/cluster.py): control-plane.json, guest-admin.kubeconfig and
kube-proxy.kubeconfig (user system:kube-proxy, server the node's veth peer, where the guest
forwards to the API server). The API server advertises the peer's address and maintains no
endpoint of its own `kubernetes` Service (--endpoint-reconciler-type=none): the tests write it,
the forwarder, which pods on the node can reach as they reach a real cluster's API server.

DIR must be the VM's $VM_OUT/control-plane. Exit code: CMD's; 1 if a control plane did not start.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.control_plane import KUBE_PROXY, SERVICE_CIDRS, ControlPlane, ControlPlaneError
from tests.realkp.cluster import API_PORT
from tests.realkp.node import NodeNet
from tests.realkp.nodes import NEWEST, NODES, SOLO


def _start(net: NodeNet, version: str, out: Path) -> ControlPlane:
    cp = ControlPlane(
        out / "work" / net.ns,
        advertise_address=net.peer,
        apiserver_flags=("--endpoint-reconciler-type=none",),
        version=version,
        # a single-stack IPv6 cluster's Services are IPv6 only
        service_cidrs=SERVICE_CIDRS if net.ipv4 else (SERVICE_CIDRS[1],),
    )
    cp.start()
    cp.write_dir(out / net.ns)
    (out / net.ns / "kube-proxy.kubeconfig").write_text(
        cp.kubeconfig(
            *KUBE_PROXY, server=f"https://{net.api_host}:{API_PORT}", tls_server_name="kubernetes"
        )
    )
    return cp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.realkp.control_planes")
    parser.add_argument("--dir", required=True)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command after --")
    out = Path(args.dir).resolve()
    signal.signal(signal.SIGTERM, lambda signum, _f: sys.exit(128 + signum))
    planes: list[ControlPlane] = []
    t0 = time.monotonic()
    # Two starts at a time (each is CPU-bound for seconds on a 2-core machine). The pool lives
    # until the end: the programs die with the thread that started them (PR_SET_PDEATHSIG).
    pool = ThreadPoolExecutor(2)
    try:
        nets = [(spec.net, spec.apiserver) for spec in NODES] + [(net, NEWEST) for net in SOLO]
        futures = [pool.submit(_start, net, version, out) for net, version in nets]
        for f in futures:
            with contextlib.suppress(ControlPlaneError, RuntimeError):
                planes.append(f.result())
        for f in futures:
            f.result()  # the first failure, once every started one is known
        rss = sum(v or 0 for cp in planes for v in cp.rss_kib().values())
        print(
            f"control-planes: {len(planes)} started in {time.monotonic() - t0:.1f} s, "
            f"RSS {rss // 1024} MiB",
            file=sys.stderr,
        )
        return subprocess.call(cmd)
    except (ControlPlaneError, RuntimeError) as exc:
        print(f"control-planes: {exc}", file=sys.stderr)
        return 1
    finally:
        for cp in planes:
            cp.stop()
        pool.shutdown()


if __name__ == "__main__":
    sys.exit(main())
