"""Host side of the cluster tier: the control plane on this host, the images as archives, then
CMD (scripts/vm-run --user-net ... pytest tests/cluster), whose VM is the node.

    python -m tests.cluster.launch --dir $VM_OUT/cluster -- scripts/vm-run --user-net ... -- pytest ...

The control plane is a cluster's (tests/control_plane.py): etcd, kube-apiserver,
kube-controller-manager and kube-scheduler on free ports of 127.0.0.1, which the guest reaches
at 10.0.2.2 through QEMU's user network. DIR gets what the node reads: control-plane.json, ca.crt,
guest-admin.kubeconfig (kubectl, as the operator), kubelet.kubeconfig (user system:node:NAME in
system:nodes, what kubeadm's join leaves the kubelet), kube-proxy.kubeconfig (system:kube-proxy),
and images/ with the agent's image and the sandbox image as OCI archives (tests/cluster/images.py),
plus images.json naming them. The agent's image is $IPVS_LEFTOVERS_IMAGE when set (scripts/test
built it), else scripts/build-image builds it.

Exit code: CMD's; 1 if the control plane or an image could not be made.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster import images
from tests.control_plane import KUBE_PROXY, ControlPlane, ControlPlaneError

NODE_NAME = "node-0"
KUBELET: tuple[str, list[str]] = (f"system:node:{NODE_NAME}", ["system:nodes"])


def prepare_images(out: Path) -> dict[str, str]:
    """The archives under out/images and what each holds: {"agent": ref, "pause": ref}."""
    d = out / "images"
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    agent = os.environ.get("IPVS_LEFTOVERS_IMAGE") or images.agent_image()
    pause = images.pause_image()
    images.oci_archive(agent, d / "agent.oci.tar")
    images.oci_archive(pause, d / "pause.oci.tar")
    refs = {"agent": agent, "pause": pause}
    (out / "images.json").write_text(json.dumps(refs, indent=1) + "\n")
    print(f"cluster: images {refs} archived in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return refs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.launch")
    parser.add_argument("--dir", required=True)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command after --")
    out = Path(args.dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda signum, _f: sys.exit(128 + signum))
    cp = ControlPlane(out / "work", controller_manager=True, scheduler=True)
    try:
        prepare_images(out)
        t0 = time.monotonic()
        cp.start()
        cp.write_dir(out)
        (out / "kubelet.kubeconfig").write_text(cp.kubeconfig(*KUBELET, server=cp.guest_url))
        (out / "kube-proxy.kubeconfig").write_text(cp.kubeconfig(*KUBE_PROXY, server=cp.guest_url))
        print(f"cluster: control plane {cp.url} ready in {time.monotonic() - t0:.1f} s "
              f"{cp.start_seconds}", file=sys.stderr)  # fmt: skip
        return subprocess.call(cmd, env={**os.environ, "IPVS_LEFTOVERS_CONTROL_PLANE": str(out)})
    except (ControlPlaneError, RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 1
    finally:
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
